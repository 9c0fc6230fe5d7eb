"""DPA-GRPO train step: JAX vs a PyTorch (transformers) implementation of the same loss, on CPU.

Both sides run one full step — score both actions of P pairs under the policy and a frozen
reference (length-normalised log-probs), the paired loss (k1, pair weights, β = 0.04), backward,
AdamW — on the same small Qwen3 model (built in transformers, loaded into JAX with `lm.load_hf`).
Prints tokens/s of each and the ratio, then the compiled peak memory of the log-prob computation
(value and gradient) at Qwen's 151,936-token vocabulary: `lm.scoring`'s vocabulary-chunked version
against the naive full-vocabulary log-softmax.

  python -m benchmarks.train_step_bench [--pairs 8 --length 256 --steps 3]
"""

from __future__ import annotations

import argparse
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
from lm import hf, scoring

BETA = 0.04


def small_qwen3(vocab: int) -> transformers.Qwen3ForCausalLM:
  config = transformers.Qwen3Config(
    vocab_size=vocab,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    tie_word_embeddings=True,
    rope_theta=1e6,
    max_position_embeddings=4096,
  )
  torch.manual_seed(0)
  return transformers.Qwen3ForCausalLM(config).eval()


def make_batch(pairs: int, length: int, vocab: int) -> dict[str, np.ndarray]:
  rng = np.random.RandomState(0)
  prompts = [list(rng.randint(3, vocab, length - 16)) for _ in range(pairs) for _ in range(2)]
  actions = [list(rng.randint(3, vocab, rng.randint(4, 16))) for _ in range(2 * pairs)]
  batch = scoring.pack_pairs(prompts, actions, length_multiple=length)
  batch["rewards"] = rng.randint(0, 2, (pairs, 2)).astype(np.float32)
  return batch


def jax_step_time(path: str, batch: dict[str, np.ndarray], steps: int) -> float:
  """Seconds per jitted step (value_and_grad of `losses.dpa_loss` + optax AdamW), after compiling."""
  model = hf.load_hf(path, dtype="float32")
  ref = hf.load_hf(path, dtype="float32")
  graphdef, params = nnx.split(model)
  tx = optax.adamw(1e-5)
  cfg = losses.DPALossConfig(beta=BETA, kl="k1", weighting="pair")
  pairs = batch["rewards"].shape[0]
  inputs = {k: jnp.asarray(v) for k, v in batch.items()}
  inputs |= {
    "component": jnp.zeros((pairs,), jnp.int32),
    "share": jnp.ones((1,), jnp.float32),
    "row_penalty": jnp.zeros((pairs, 2)),
  }

  @jax.jit
  def step(params, opt_state, ref, inputs):
    loss_fn = lambda p: losses.dpa_loss(nnx.merge(graphdef, p), ref, inputs, cfg)[0]
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = tx.init(params)
  params, opt_state, loss = step(params, opt_state, ref, inputs)
  jax.block_until_ready(loss)
  start = time.perf_counter()
  for _ in range(steps):
    params, opt_state, loss = step(params, opt_state, ref, inputs)
  jax.block_until_ready(loss)
  return (time.perf_counter() - start) / steps


def torch_step_time(policy, batch: dict[str, np.ndarray], steps: int) -> float:
  """Seconds per step of the same loss written in PyTorch (transformers model, torch AdamW)."""
  reference = small_qwen3(policy.config.vocab_size)
  reference.load_state_dict(policy.state_dict())
  policy.train()
  optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5, weight_decay=0.0)
  tokens = torch.tensor(batch["tokens"], dtype=torch.long)
  attention = torch.tensor(batch["attention_mask"])
  completion = torch.tensor(batch["completion_mask"], dtype=torch.float32)[:, 1:]
  positions = torch.clamp(attention.cumsum(-1) - 1, min=0)
  rewards = torch.tensor(batch["rewards"])

  def pair_logp(model):
    logits = model(input_ids=tokens, attention_mask=attention, position_ids=positions).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, 1:, None])[..., 0]
    return ((logp * completion).sum(-1) / completion.sum(-1).clamp(min=1)).reshape(-1, 2)

  def one_step():
    with torch.no_grad():
      ref_logp = pair_logp(reference)
    logp = pair_logp(policy)
    adv = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, unbiased=False, keepdim=True) + 1e-6)
    loss = (0.5 * (-adv * logp) + BETA * 0.5 * (logp - ref_logp)).sum(-1).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

  one_step()
  start = time.perf_counter()
  for _ in range(steps):
    one_step()
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
  args = parser.parse_args()
  torch.set_num_threads(os.cpu_count() or 1)
  batch = make_batch(args.pairs, args.length, args.vocab)
  policy = small_qwen3(args.vocab)
  tokens = int(batch["attention_mask"].sum())
  with tempfile.TemporaryDirectory() as tmp:
    policy.save_pretrained(tmp)
    jax_s = jax_step_time(tmp, batch, args.steps)
  torch_s = torch_step_time(policy, batch, args.steps)
  print(f"train step, {2 * args.pairs} rows x {args.length} tokens, Qwen3 4x256, vocab {args.vocab}, CPU:")
  print(f"  JAX    {tokens / jax_s:10.0f} tokens/s  ({jax_s:.3f} s/step)")
  print(f"  PyTorch{tokens / torch_s:10.0f} tokens/s  ({torch_s:.3f} s/step)")
  print(f"  ratio JAX/PyTorch: {torch_s / jax_s:.2f}x")
  naive, chunked = logprob_memory(batch=4, length=1024, dim=2560, vocab=151_936, chunk=8192)
  print("log-prob value+grad peak memory, B=4 T=1024 D=2560 V=151,936 bf16 (compiled):")
  print(f"  naive full-vocabulary {naive / 2**30:7.2f} GiB")
  print(f"  chunked (8192)        {chunked / 2**30:7.2f} GiB   ratio {naive / chunked:.1f}x")


if __name__ == "__main__":
  main()
