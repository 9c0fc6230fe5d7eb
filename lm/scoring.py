"""Log-probabilities of given completions under a model, without materialising [B, T, V] logits.

RL losses and KL terms need log π(y_t | prompt, y_<t) for sampled completions. Full-vocabulary
logits are the usual out-of-memory cause at Qwen's 151,936-token vocabulary, so the output
projection runs over vocabulary chunks with a running log-sum-exp; each chunk is rematerialised
in the backward pass, so activation memory stays [B, T, chunk].
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lm import model as model_lib
from lm.model import Qwen
from lm.shapes import pow2_bucket, round_up

Array = jax.Array


def chunked_token_logprobs(hidden: Array, weight_vd: Array, targets: Array, chunk: int = 8192) -> Array:
  """log softmax(hidden @ weightᵀ)[target] per position, computed chunk by chunk over V.

  Args:
    hidden: [B, T, D] final-norm hidden states.
    weight_vd: [V, D] output projection.
    targets: [B, T] token ids whose log-prob is wanted.
    chunk: vocabulary chunk size (V is padded up to a multiple of it).

  Returns:
    [B, T] float32 log-probs, equal to `jax.nn.log_softmax(logits)[targets]`.
  """
  vocab, dim = weight_vd.shape
  chunk = min(chunk, vocab)
  num_chunks = -(-vocab // chunk)
  padded = jnp.pad(weight_vd, ((0, num_chunks * chunk - vocab), (0, 0)))
  chunks = padded.reshape(num_chunks, chunk, dim)  # [C, chunk, D]
  starts = jnp.arange(num_chunks) * chunk

  @jax.checkpoint
  def body(carry, xs):
    running_max, running_sum, target_logit = carry
    w, start = xs
    logits = model_lib.einsum(
      "btd,vd->btv", hidden, w.astype(hidden.dtype), out_dtype=jnp.float32
    )  # [B, T, chunk]
    ids = start + jnp.arange(chunk)
    logits = jnp.where(ids < vocab, logits, -jnp.inf)
    new_max = jnp.maximum(running_max, jnp.max(logits, axis=-1))
    running_sum = running_sum * jnp.exp(running_max - new_max) + jnp.sum(
      jnp.exp(logits - new_max[..., None]), axis=-1
    )
    local = targets - start
    in_chunk = (local >= 0) & (local < chunk)
    picked = jnp.take_along_axis(logits, jnp.clip(local, 0, chunk - 1)[..., None], axis=-1)[..., 0]
    target_logit = jnp.where(in_chunk, picked, target_logit)
    return (new_max, running_sum, target_logit), None

  shape = targets.shape
  init = (
    jnp.full(shape, -jnp.inf, jnp.float32),
    jnp.zeros(shape, jnp.float32),
    jnp.zeros(shape, jnp.float32),
  )
  (running_max, running_sum, target_logit), _ = jax.lax.scan(body, init, (chunks, starts))
  return target_logit - (running_max + jnp.log(running_sum))


def token_logprobs(
  model: Qwen,
  tokens: Array,
  attention_mask: Array,
  *,
  chunk: int = 8192,
  remat: bool = False,
  positions: Array | None = None,
) -> Array:
  """Log-prob of every token given those before it: [B, T], position 0 gets 0.

  `tokens` is a left-padded batch of prompt + completion with its `attention_mask`; entries at
  padding are 0. With `positions` ([B, K] int, distinct within a row, each >= 1) only those
  positions are scored and every other entry is 0: the output projection, the largest product of
  a small model's step, then runs over K positions a row instead of T. Pure and differentiable:
  call it inside `jax.grad` / `nnx.grad` for losses.
  """
  hidden, _ = model.hidden_states(tokens, attention_mask=attention_mask, remat=remat)
  if positions is None:
    logp = chunked_token_logprobs(hidden[:, :-1], model.output_weight_vd(), tokens[:, 1:], chunk)
    logp = jnp.where(attention_mask[:, 1:] > 0, logp, 0.0)
    return jnp.pad(logp, ((0, 0), (1, 0)))
  before = jnp.take_along_axis(hidden, (positions - 1)[..., None], axis=1)  # [B, K, D]
  targets = jnp.take_along_axis(tokens, positions, axis=1)  # [B, K]
  logp = chunked_token_logprobs(before, model.output_weight_vd(), targets, chunk)
  logp = jnp.where(jnp.take_along_axis(attention_mask, positions, axis=1) > 0, logp, 0.0)
  rows = jnp.arange(tokens.shape[0])[:, None]
  return jnp.zeros(tokens.shape, logp.dtype).at[rows, positions].set(logp)


def pack_pairs(
  prompts: Sequence[Sequence[int]],
  completions: Sequence[Sequence[int]],
  *,
  pad_id: int = 0,
  length_multiple: int = 16,
) -> dict[str, np.ndarray]:
  """Left-pads prompt + completion pairs into one batch with masks for the completion tokens.

  Returns `tokens`, `attention_mask` and `completion_mask` ([B, T]; 1 on completion tokens), with T
  rounded up to `length_multiple` so repeated calls reuse compiled shapes, and
  `completion_positions` ([B, K]): the last K positions of every row, K the longest completion
  rounded up to a power of two (at least 16, at most T - 1), which hold every completion token:
  `sequence_logprobs` scores only those.
  """
  if len(prompts) != len(completions):
    raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
  lengths = [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]
  if any(len(p) == 0 for p in prompts):
    raise ValueError("every prompt needs at least one token")
  width = round_up(max(lengths), length_multiple)
  tokens = np.full((len(prompts), width), pad_id, np.int32)
  attention = np.zeros_like(tokens)
  completion = np.zeros_like(tokens)
  for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
    start = width - lengths[i]
    tokens[i, start:] = list(p) + list(c)
    attention[i, start:] = 1
    completion[i, start + len(p) :] = 1
  window = min(pow2_bucket(max(len(c) for c in completions), 16), width - 1)
  positions = np.broadcast_to(np.arange(width - window, width, dtype=np.int32), (len(prompts), window))
  return {
    "tokens": tokens,
    "attention_mask": attention,
    "completion_mask": completion,
    "completion_positions": np.ascontiguousarray(positions),
  }


def sequence_logprobs(
  model: Qwen,
  batch: dict[str, Array],
  *,
  normalize: bool = False,
  chunk: int = 8192,
  remat: bool = False,
) -> tuple[Array, Array]:
  """Per-token [B, T] (zero outside completions) and per-sequence [B] completion log-probs.

  With `normalize`, the sequence value is the mean over completion tokens (the length-normalised
  log-prob DPA-GRPO uses), else the sum. Where the batch has `completion_positions` (`pack_pairs`
  gives them), only those positions are scored; they must hold every completion token. A
  `pack_shared_pairs` batch (it has `branch`) gives per-token [P, 2, K] (0 where `score_mask` is)
  and per-completion [P, 2]: the values of the two rows each pair stands for.
  """
  if "branch" in batch:
    return _shared_pair_logprobs(model, batch, normalize=normalize, chunk=chunk, remat=remat)
  per_token = token_logprobs(
    model,
    batch["tokens"],
    batch["attention_mask"],
    chunk=chunk,
    remat=remat,
    positions=batch.get("completion_positions"),
  )
  per_token = per_token * batch["completion_mask"]
  total = jnp.sum(per_token, axis=1)
  if normalize:
    total = total / jnp.maximum(jnp.sum(batch["completion_mask"], axis=1), 1)
  return per_token, total


def pack_shared_pairs(
  prompts: Sequence[Sequence[int]],
  pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
  *,
  pad_id: int = 0,
  length_multiple: int = 16,
) -> dict[str, np.ndarray]:
  """Pairs of completions of one prompt, one row a pair: [prompt, first, second], left-padded.

  What `pack_pairs` gives as two rows [prompt, first] and [prompt, second], here with the prompt
  once: the second completion attends the prompt but not the first (`branch` 1 and 2 for the two,
  0 for the prompt; `lm.model.branch_mask`), and its positions restart where the prompt ends, so
  both completions' log-probs are those of their own rows while the prompt's forward and backward
  pass is computed once. A DPA-GRPO pair's two actions share their prompt (`dpa_grpo.packing.Item`),
  so most of a pair's tokens are computed once instead of twice.

  Returns `tokens`, `attention_mask`, `positions`, `branch` [P, T] (T rounded up to
  `length_multiple`) and, per completion token, the position of the hidden state that predicts it
  (`score_sources`: the prompt's last token for each completion's first token), its id
  (`score_targets`) and 1 where it is real (`score_mask`), [P, 2, K] with K the longest completion
  rounded up to a power of two (at least 16).
  """
  if len(prompts) != len(pairs):
    raise ValueError(f"{len(prompts)} prompts but {len(pairs)} completion pairs")
  if any(len(p) == 0 for p in prompts):
    raise ValueError("every prompt needs at least one token")
  lengths = [len(p) + len(a) + len(b) for p, (a, b) in zip(prompts, pairs, strict=True)]
  width = round_up(max(lengths), length_multiple)
  window = pow2_bucket(max(len(c) for pair in pairs for c in pair), 16)
  rows = len(prompts)
  tokens = np.full((rows, width), pad_id, np.int32)
  attention, positions, branch = (np.zeros_like(tokens) for _ in range(3))
  sources = np.zeros((rows, 2, window), np.int32)
  targets = np.full((rows, 2, window), pad_id, np.int32)
  scored = np.zeros((rows, 2, window), np.float32)
  for i, (prompt, pair) in enumerate(zip(prompts, pairs, strict=True)):
    start = width - lengths[i]
    end = start + len(prompt)  # where the first completion starts
    tokens[i, start:] = list(prompt) + list(pair[0]) + list(pair[1])
    attention[i, start:] = 1
    positions[i, start:end] = np.arange(len(prompt))
    for j, completion in enumerate(pair):
      n = len(completion)
      begin = end + (len(pair[0]) if j else 0)
      positions[i, begin : begin + n] = len(prompt) + np.arange(n)
      branch[i, begin : begin + n] = j + 1
      sources[i, j, :n] = [end - 1] + list(range(begin, begin + n - 1))
      targets[i, j, :n] = completion
      scored[i, j, :n] = 1.0
  return {
    "tokens": tokens,
    "attention_mask": attention,
    "positions": positions,
    "branch": branch,
    "score_sources": sources,
    "score_targets": targets,
    "score_mask": scored,
  }


def _shared_pair_logprobs(model: Qwen, batch: dict[str, Array], *, normalize: bool, chunk: int, remat: bool):
  hidden, _ = model.hidden_states(
    batch["tokens"],
    positions=batch["positions"],
    attention_mask=batch["attention_mask"],
    branch=batch["branch"],
    remat=remat,
  )
  rows, _, window = batch["score_sources"].shape
  sources = batch["score_sources"].reshape(rows, 2 * window)
  before = jnp.take_along_axis(hidden, sources[..., None], axis=1)  # [P, 2K, D]
  targets = batch["score_targets"].reshape(rows, 2 * window)
  logp = chunked_token_logprobs(before, model.output_weight_vd(), targets, chunk).reshape(rows, 2, window)
  per_token = jnp.where(batch["score_mask"] > 0, logp, 0.0)
  total = jnp.sum(per_token, axis=-1)
  if normalize:
    total = total / jnp.maximum(jnp.sum(batch["score_mask"], axis=-1), 1)
  return per_token, total
