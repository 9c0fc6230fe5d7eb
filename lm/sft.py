"""Supervised fine-tuning: next-token cross-entropy on completion tokens, nothing task-specific.

`train_sft(model, examples, config)` takes (prompt ids, completion ids) pairs and minimises the mean
negative log-likelihood of the completion tokens (prompt tokens are context only) with AdamW under a
linear-warmup + cosine schedule. Log-probs come from `lm.scoring`, so the vocabulary is processed in
chunks and Qwen-sized vocabularies fit in memory. Every batch is padded to one width and holds the
same number of rows, so the jitted step compiles once. Used for warm starts: the tiny maths solver of
KACE's CPU-scale runs, a tax-form warm start for DPA-GRPO.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from lm import progress, scoring, sharding
from lm.model import Qwen
from lm.shapes import round_up

_log = logging.getLogger(__name__)

Example = tuple[Sequence[int], Sequence[int]]  # (prompt ids, completion ids)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """Optimisation knobs.

  Attributes:
    steps: optimizer steps.
    batch_size: examples per step; batches are drawn epoch by epoch from a seeded permutation
      (the last partial batch of an epoch is completed from the next one, so shapes never change).
    learning_rate: peak learning rate, reached after `warmup_steps`, then cosine-decayed to
      `learning_rate * end_lr_fraction` at `steps`.
    weight_decay: AdamW decay, applied to matrices only (norm scales and biases are not decayed).
    grad_clip: global gradient-norm clip (0 disables it).
    seed: the batch order.
    length_multiple: sequence width is the longest example rounded up to this.
    bucket_by_length: False (the default): every batch is padded to the longest example of the
      whole set, one compiled shape. True: each run of `bucket_batches` consecutive batches of the
      seeded order is sorted by length and cut again into batches (whose order is then shuffled),
      and each batch is padded to its own longest example rounded up to `length_multiple`: batches
      of similar lengths, far less padding, one compilation per width (a handful). The same
      examples are visited per epoch; only which ones share a batch changes.
    bucket_batches: batches per sorted run (`bucket_by_length`).
    log_every: a metrics entry every this many steps (and at the last step).
    vocab_chunk: vocabulary chunk of the log-prob computation (see `lm.scoring`).
  """

  steps: int = 200
  batch_size: int = 32
  learning_rate: float = 1e-3
  warmup_steps: int = 20
  end_lr_fraction: float = 0.1
  weight_decay: float = 0.01
  grad_clip: float = 1.0
  seed: int = 0
  length_multiple: int = 16
  log_every: int = 10
  vocab_chunk: int = 8192
  bucket_by_length: bool = False
  bucket_batches: int = 64

  def schedule(self) -> optax.Schedule:
    return optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=self.learning_rate,
      warmup_steps=max(1, min(self.warmup_steps, self.steps - 1)),
      decay_steps=max(2, self.steps),
      end_value=self.learning_rate * self.end_lr_fraction,
    )

  def optimizer(self) -> optax.GradientTransformation:
    decay_matrices = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    adamw = optax.adamw(self.schedule(), weight_decay=self.weight_decay, mask=decay_matrices)
    return optax.chain(optax.clip_by_global_norm(self.grad_clip), adamw) if self.grad_clip > 0 else adamw


def completion_nll(
  model: Qwen, batch: dict[str, jax.Array], vocab_chunk: int = 8192
) -> tuple[jax.Array, dict]:
  """Mean negative log-likelihood per completion token of a `scoring.pack_pairs` batch.

  Returns (loss, metrics) with the completion-token count, so callers can weight averages.
  """
  per_token, _ = scoring.sequence_logprobs(model, batch, chunk=vocab_chunk)
  count = jnp.sum(batch["completion_mask"])
  loss = -jnp.sum(per_token) / jnp.maximum(count, 1)
  return loss, {"loss": loss, "tokens": count}


def _make_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, vocab_chunk: int):
  def loss_fn(params, batch):
    return completion_nll(nnx.merge(graphdef, params), batch, vocab_chunk)

  @jax.jit
  def step(params, opt_state, batch):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    metrics = {**metrics, "grad_norm": optax.global_norm(grads)}
    return optax.apply_updates(params, updates), opt_state, metrics

  return step


def _replicate_on_mesh(opt_state, params):
  """`opt_state` with its leaves that sit on no mesh (`tx.init`'s step counters) replicated on the
  parameters' mesh, where the jitted step returns them: its first call then compiles the program
  every later call runs, instead of a second, identical one for the counters' placement."""
  meshes = [
    x.sharding.mesh
    for x in jax.tree.leaves(params)
    if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)
  ]
  if not meshes:
    return opt_state
  replicated = jax.sharding.NamedSharding(meshes[0], jax.sharding.PartitionSpec())
  return jax.tree.map(
    lambda x: (
      x
      if not isinstance(x, jax.Array) or isinstance(x.sharding, jax.sharding.NamedSharding)
      else jax.device_put(x, replicated)
    ),
    opt_state,
  )


def batch_order(num_examples: int, batch_size: int, steps: int, seed: int) -> np.ndarray:
  """[steps, batch_size] example indices: consecutive seeded permutations, cut into batches."""
  rng = np.random.default_rng(seed)
  needed = steps * batch_size
  epochs = -(-needed // num_examples)
  order = np.concatenate([rng.permutation(num_examples) for _ in range(epochs)])
  return order[:needed].reshape(steps, batch_size)


def bucketed_order(lengths: Sequence[int], batch_size: int, steps: int, seed: int, run: int) -> np.ndarray:
  """`batch_order`'s [steps, batch_size] indices regrouped by length: each run of `run` consecutive
  batches is sorted by example length, cut into batches again, and those batches shuffled (seeded),
  so a batch holds examples of similar length while every epoch still visits every example."""
  order = batch_order(len(lengths), batch_size, steps, seed).reshape(-1)
  rng = np.random.default_rng([seed, 1])
  lengths = np.asarray(lengths)
  out = []
  for start in range(0, len(order), run * batch_size):
    chunk = order[start : start + run * batch_size]
    chunk = chunk[np.argsort(lengths[chunk], kind="stable")].reshape(-1, batch_size)
    out.append(chunk[rng.permutation(len(chunk))])
  return np.concatenate(out)


def train_sft(
  model: Qwen,
  examples: Sequence[Example],
  config: SFTConfig = SFTConfig(),
  *,
  pad_id: int | None = None,
  label: str = "supervised training",
) -> tuple[Qwen, list[dict[str, float]]]:
  """Trains `model` on (prompt ids, completion ids) pairs; returns the trained model and metrics.

  The completion should end with the token that stops generation (EOS) so the model learns to
  stop. `model` itself is left untouched (the result is a new module). Metrics entries hold
  `step`, `loss` (mean NLL per completion token of that step's batch), `grad_norm`, `lr`,
  `tokens` and `seconds` since the start (compilation included). It runs as the progress phase
  `label` (`lm.progress`: a line at least every 30 s whatever the log verbosity).
  """
  if not examples:
    raise ValueError("train_sft needs at least one example")
  if any(len(c) == 0 for _, c in examples):
    raise ValueError("every example needs at least one completion token")
  pad_id = pad_id if pad_id is not None else (model.config.pad_token_id or 0)
  lengths = [len(p) + len(c) for p, c in examples]
  width = round_up(max(lengths), config.length_multiple)
  graphdef, params = nnx.split(model)
  tx = config.optimizer()
  opt_state = _replicate_on_mesh(tx.init(params), params)
  step = _make_step(graphdef, tx, config.vocab_chunk)
  schedule = config.schedule()
  history = []
  start = time.perf_counter()
  if config.bucket_by_length:
    order = bucketed_order(lengths, config.batch_size, config.steps, config.seed, config.bucket_batches)
  else:
    order = batch_order(len(examples), config.batch_size, config.steps, config.seed)
  with progress.phase(label, f"{config.steps} steps"):
    for i, rows in enumerate(order):
      packed = scoring.pack_pairs(
        [examples[r][0] for r in rows],
        [examples[r][1] for r in rows],
        pad_id=pad_id,
        length_multiple=config.length_multiple if config.bucket_by_length else width,
      )
      params, opt_state, metrics = step(params, opt_state, {k: jnp.asarray(v) for k, v in packed.items()})
      if (i + 1) % config.log_every == 0 or i + 1 == config.steps:
        entry = {k: float(v) for k, v in sharding.to_host(metrics).items()}
        entry.update(step=i + 1, lr=float(schedule(i)), seconds=time.perf_counter() - start)
        history.append(entry)
        _log.info("sft step %d loss %.4f", i + 1, entry["loss"])
      progress.note(f"step {i + 1}/{config.steps}" + (f", loss {history[-1]['loss']:.4f}" if history else ""))
  return nnx.merge(graphdef, params), history
