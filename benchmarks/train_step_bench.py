"""DPA-GRPO train step: JAX vs a PyTorch (transformers) implementation of the same loss, on CPU.

Both sides run one full step — score both actions of P pairs under the policy and a frozen
reference (length-normalised log-probs), the paired loss (k1, pair weights, β = 0.04), backward,
AdamW — on the same small Qwen3 model (built in transformers, loaded into JAX with `lm.load_hf`).
Prints tokens/s of each and the ratio, then the compiled peak memory of the log-prob computation
(value and gradient) at Qwen's 151,936-token vocabulary: `lm.scoring`'s vocabulary-chunked version
against the naive full-vocabulary log-softmax.

The JAX step is the trainer's (`dpa_grpo.step`: the batch in `--chunks` gradient-accumulation
chunks summed on device, parameters and optimiser state donated, metrics fetched once per step),
beside the loop the trainer used before (per-chunk grads, a separate add, host reads per chunk).

  python -m benchmarks.train_step_bench [--pairs 8 --length 256 --steps 3 --chunks 2]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import transformers
from flax import nnx

from dpa_grpo import losses
from dpa_grpo import step as step_lib
from dpa_grpo.policies import Policies
from lm import hf, scoring

BETA = 0.04
LR = 1e-5


def small_qwen3(vocab: int, *, hidden: int = 256, layers: int = 4, heads: int = 4, kv_heads: int = 2,
                head_dim: int = 64, init_std: float = 0.02) -> transformers.Qwen3ForCausalLM:  # fmt: skip
  """The benchmarks' small Qwen3 (tied embeddings, float32, seeded): 4 layers of width 256 unless
  told otherwise; the MLP is 3× the width."""
  config = transformers.Qwen3Config(
    vocab_size=vocab,
    hidden_size=hidden,
    intermediate_size=3 * hidden,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    num_key_value_heads=kv_heads,
    head_dim=head_dim,
    tie_word_embeddings=True,
    rope_theta=1e6,
    max_position_embeddings=4096,
    initializer_range=init_std,
    bos_token_id=None,
    eos_token_id=1,
    pad_token_id=0,
  )
  torch.manual_seed(0)
  return transformers.Qwen3ForCausalLM(config).eval()


def make_batch(pairs: int, length: int, vocab: int) -> dict[str, np.ndarray]:
  """P pairs of (one prompt of `length` − 16 tokens + each of two actions of 4–15 tokens), two rows
  a pair left-padded to `length`, with 0/1 rewards: the packed batch a DPA-GRPO train step scores
  (a pair's two actions answer the same prompt, `dpa_grpo.packing.Item`)."""
  rng = np.random.RandomState(0)
  prompts = [list(rng.randint(3, vocab, length - 16)) for _ in range(pairs)]
  actions = [list(rng.randint(3, vocab, rng.randint(4, 16))) for _ in range(2 * pairs)]
  batch = scoring.pack_pairs([p for p in prompts for _ in range(2)], actions, length_multiple=length)
  batch["rewards"] = rng.randint(0, 2, (pairs, 2)).astype(np.float32)
  return batch


def shared_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """`make_batch`'s pairs as one row each, the prompt once (`scoring.pack_shared_pairs`, width a
  multiple of 16; `loss.share_prompts`'s layout), with the same rewards."""
  prompt = (batch["attention_mask"] == 1) & (batch["completion_mask"] == 0)
  done = batch["completion_mask"] == 1
  rows = [(t[p].tolist(), t[c].tolist()) for t, p, c in zip(batch["tokens"], prompt, done, strict=True)]
  if any(rows[2 * i][0] != rows[2 * i + 1][0] for i in range(len(rows) // 2)):
    raise ValueError("a pair's two rows have different prompts: they cannot share one")
  shared = scoring.pack_shared_pairs(
    [rows[2 * i][0] for i in range(len(rows) // 2)],
    [(rows[2 * i][1], rows[2 * i + 1][1]) for i in range(len(rows) // 2)],
  )
  return {**shared, "rewards": batch["rewards"]}


class JaxStep:
  """The trainer's train step (`dpa_grpo.step`), full fine-tuning of a checkpoint in the trainer's
  layout: the batch in `chunks` equal gradient-accumulation chunks, each `step.accumulate`d into a
  donated on-device gradient sum, then `step.apply` (AdamW; parameters and optimiser state
  donated), the step's metrics fetched once, as `dpa_grpo.train` runs it.

  `compute_dtype` is the products' dtype (`lm.load_hf`'s): "bfloat16" keeps float32 parameters,
  gradients and AdamW state and runs every matrix product on bfloat16 operands, the counterpart of
  PyTorch's autocast (`TorchStep`'s `autocast`). `share_prompts`: the trainer's
  `loss.share_prompts`, each pair one row with its prompt once (`shared_batch`)."""

  def __init__(
    self,
    path: str,
    batch: dict[str, np.ndarray],
    chunks: int,
    compute_dtype: str = "float32",
    share_prompts: bool = False,
  ):
    model = hf.load_hf(path, dtype="float32", compute_dtype=compute_dtype)
    graphdef, params = nnx.split(model)
    self.policies = Policies(graphdef, None)
    self.trainable = {"backbone": params}
    self.frozen = jax.tree.map(jnp.copy, params)
    self.tx = optax.adamw(LR, weight_decay=0.0)
    self.opt_state = self.tx.init(self.trainable)
    self.cfg = losses.DPALossConfig(beta=BETA, kl="k1", weighting="pair")
    pairs = batch["rewards"].shape[0]
    if pairs % chunks:
      raise ValueError(f"--pairs {pairs} is not a multiple of --chunks {chunks}")
    per = pairs // chunks
    rows_a_pair = 1 if share_prompts else 2
    if share_prompts:
      batch = shared_batch(batch)
    self.inputs = []
    for i in range(chunks):
      rows = slice(rows_a_pair * i * per, rows_a_pair * (i + 1) * per)
      chunk = {k: jnp.asarray(v[rows]) for k, v in batch.items() if k != "rewards"}
      chunk |= {
        "rewards": jnp.asarray(batch["rewards"][i * per : (i + 1) * per]),
        "component": jnp.zeros((per,), jnp.int32),
        "share": jnp.full((1,), 1.0 / chunks, jnp.float32),
        "row_penalty": jnp.zeros((per, 2)),
      }
      self.inputs.append(chunk)

  def policy(self):
    """The policy as a model (views of the current, not yet donated, parameters)."""
    return self.policies.policy(self.trainable, self.frozen, "generator")

  def step(self) -> tuple[float, float]:
    """One update; (the step's loss, the global norm of its gradient) before the update."""
    grads = jax.tree.map(jnp.zeros_like, self.trainable)
    per_chunk = []
    for chunk in self.inputs:
      grads, value, parts = step_lib.accumulate(
        grads,
        self.trainable,
        self.frozen,
        chunk,
        policies=self.policies,
        role="generator",
        method="dpa_grpo",
        loss_cfg=self.cfg,
      )
      per_chunk.append(("generator", value, parts))
    self.trainable, self.opt_state, norm = step_lib.apply(self.trainable, self.opt_state, grads, tx=self.tx)
    metrics = step_lib.fetch_metrics(per_chunk)
    return metrics["generator/loss"], float(norm)


def jax_step_time(path: str, batch: dict[str, np.ndarray], steps: int, chunks: int) -> float:
  """Seconds per `JaxStep.step` (after compiling)."""
  runner = JaxStep(path, batch, chunks)
  runner.step()
  start = time.perf_counter()
  for _ in range(steps):
    runner.step()
  return (time.perf_counter() - start) / steps


def jax_loop_step_time(path: str, batch: dict[str, np.ndarray], steps: int, chunks: int) -> float:
  """The same step as the trainer ran it before: per-chunk value-and-grad, a separate jitted add,
  each chunk's metrics read to the host as it finishes, nothing donated."""
  setup = JaxStep(path, batch, chunks)
  policies, frozen, tx, cfg = setup.policies, setup.frozen, setup.tx, setup.cfg
  trainable, opt_state = setup.trainable, setup.opt_state

  @jax.jit
  def grads_of(trainable, chunk):
    def loss(params):
      return losses.dpa_loss(
        policies.policy(params, frozen, "generator"), policies.reference(frozen), chunk, cfg
      )

    (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(trainable)
    return value, metrics, grads

  add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))

  @jax.jit
  def update(trainable, opt_state, grads):
    updates, opt_state = tx.update(grads, opt_state, trainable)
    return optax.apply_updates(trainable, updates), opt_state, optax.global_norm(grads)

  def one_step(trainable, opt_state):
    grads = jax.tree.map(jnp.zeros_like, trainable)
    total = {}
    for chunk in setup.inputs:
      value, parts, g = grads_of(trainable, chunk)
      grads = add(grads, g)
      for key, val in {"loss": value, **parts}.items():
        total[key] = total.get(key, 0.0) + float(val)
    return update(trainable, opt_state, grads)

  trainable, opt_state, norm = one_step(trainable, opt_state)
  jax.block_until_ready(norm)
  start = time.perf_counter()
  for _ in range(steps):
    trainable, opt_state, norm = one_step(trainable, opt_state)
  jax.block_until_ready(norm)
  return (time.perf_counter() - start) / steps


class TorchStep:
  """The same loss written in PyTorch on the transformers model: length-normalised log-probs of
  both actions of every pair under the policy and a frozen copy (the reference), group-normalised
  advantages, pair weights 1/2, k1 with β, the mean over pairs; backward; torch AdamW, the same
  learning rate and no weight decay. One step over the whole batch (the JAX side's chunks sum to the
  same gradient). With `window`, logits only at the batch's completion window (its last K
  positions, `completion_positions`; transformers' `logits_to_keep`), as the JAX side scores.
  With `autocast` (a torch dtype, e.g. torch.bfloat16) both models' forward passes run under
  `torch.autocast("cpu", dtype=autocast)`: float32 master weights, gradients and AdamW state,
  products in that dtype; the log-softmax reads the logits cast back to float32."""

  def __init__(
    self,
    policy: transformers.Qwen3ForCausalLM,
    batch: dict[str, np.ndarray],
    window: bool = False,
    autocast: torch.dtype | None = None,
  ):
    self.autocast = autocast
    self.keep = batch["completion_positions"].shape[1] if window else 0  # 0: every position
    self.reference = copy.deepcopy(policy).eval()
    self.policy = policy.train()
    self.optimizer = torch.optim.AdamW(policy.parameters(), lr=LR, weight_decay=0.0)
    self.tokens = torch.tensor(batch["tokens"], dtype=torch.long)
    self.attention = torch.tensor(batch["attention_mask"])
    self.completion = torch.tensor(batch["completion_mask"], dtype=torch.float32)[:, 1:]
    self.positions = torch.clamp(self.attention.cumsum(-1) - 1, min=0)
    self.rewards = torch.tensor(batch["rewards"])

  def _pair_logp(self, model):
    keep = self.keep + 1 if self.keep else 0  # the positions before the last K predict them
    with torch.autocast("cpu", dtype=self.autocast) if self.autocast else contextlib.nullcontext():
      out = model(
        input_ids=self.tokens, attention_mask=self.attention, position_ids=self.positions, logits_to_keep=keep
      )
    scored = out.logits.shape[1] - 1
    targets, completion = self.tokens[:, -scored:], self.completion[:, -scored:]
    logp = torch.log_softmax(out.logits[:, :-1].float(), -1).gather(-1, targets[..., None])[..., 0]
    return ((logp * completion).sum(-1) / completion.sum(-1).clamp(min=1)).reshape(-1, 2)

  def step(self) -> tuple[float, float]:
    """One update; (the loss, the global norm of its gradient) before the update."""
    with torch.no_grad():
      ref_logp = self._pair_logp(self.reference)
    logp = self._pair_logp(self.policy)
    rewards = self.rewards
    adv = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, unbiased=False, keepdim=True) + 1e-6)
    loss = (0.5 * (-adv * logp) + BETA * 0.5 * (logp - ref_logp)).sum(-1).mean()
    self.optimizer.zero_grad()
    loss.backward()
    norm = torch.linalg.vector_norm(
      torch.stack([torch.linalg.vector_norm(p.grad) for p in self.policy.parameters() if p.grad is not None])
    )
    self.optimizer.step()
    return float(loss.detach()), float(norm)


def torch_step_time(policy, batch: dict[str, np.ndarray], steps: int) -> float:
  """Seconds per `TorchStep.step` (after one warm-up step)."""
  runner = TorchStep(policy, batch)
  runner.step()
  start = time.perf_counter()
  for _ in range(steps):
    runner.step()
  return (time.perf_counter() - start) / steps


def logprob_memory(batch: int, length: int, dim: int, vocab: int, chunk: int) -> tuple[int, int]:
  """Compiled peak bytes (arguments + outputs + temporaries) of value-and-grad of the log-probs."""
  hidden = jax.ShapeDtypeStruct((batch, length, dim), jnp.bfloat16)
  weight = jax.ShapeDtypeStruct((vocab, dim), jnp.bfloat16)
  targets = jax.ShapeDtypeStruct((batch, length), jnp.int32)

  def naive(h, w, t):
    logits = jnp.einsum("btd,vd->btv", h, w, preferred_element_type=jnp.float32)
    return jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(logits), t[..., None], -1))

  def chunked(h, w, t):
    return jnp.sum(scoring.chunked_token_logprobs(h, w, t, chunk))

  def peak(fn):
    compiled = jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(hidden, weight, targets).compile()
    m = compiled.memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes

  return peak(naive), peak(chunked)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pairs", type=int, default=8)
  parser.add_argument("--length", type=int, default=256)
  parser.add_argument("--vocab", type=int, default=8192)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--chunks", type=int, default=2, help="gradient-accumulation chunks per step")
  args = parser.parse_args()
  torch.set_num_threads(os.cpu_count() or 1)
  batch = make_batch(args.pairs, args.length, args.vocab)
  policy = small_qwen3(args.vocab)
  tokens = int(batch["attention_mask"].sum())
  with tempfile.TemporaryDirectory() as tmp:
    policy.save_pretrained(tmp)
    jax_s = jax_step_time(tmp, batch, args.steps, args.chunks)
    loop_s = jax_loop_step_time(tmp, batch, args.steps, args.chunks)
  torch_s = torch_step_time(policy, batch, args.steps)
  print(f"train step, {2 * args.pairs} rows x {args.length} tokens, Qwen3 4x256, vocab {args.vocab}, CPU:")
  print(f"  JAX    {tokens / jax_s:10.0f} tokens/s  ({jax_s:.3f} s/step; {args.chunks} chunks, donated)")
  print(f"  JAX loop{tokens / loop_s:9.0f} tokens/s  ({loop_s:.3f} s/step; host-synced loop, no donation)")
  print(f"  PyTorch{tokens / torch_s:10.0f} tokens/s  ({torch_s:.3f} s/step)")
  print(f"  ratio JAX/PyTorch: {torch_s / jax_s:.2f}x")
  naive, chunked = logprob_memory(batch=4, length=1024, dim=2560, vocab=151_936, chunk=8192)
  print("log-prob value+grad peak memory, B=4 T=1024 D=2560 V=151,936 bf16 (compiled):")
  print(f"  naive full-vocabulary {naive / 2**30:7.2f} GiB")
  print(f"  chunked (8192)        {chunked / 2**30:7.2f} GiB   ratio {naive / chunked:.1f}x")


if __name__ == "__main__":
  main()
