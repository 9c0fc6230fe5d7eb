"""Greedy decoding: lm.Sampler vs transformers `generate`, same weights, same prompts, one run.

  python -m benchmarks.sampler_bench            # both shapes
  python -m benchmarks.sampler_bench --shapes=a # the small Qwen3 only

For each shape it prints decode tokens/s of both implementations and their ratio, our compile
time, the machine's measured memory bandwidth and the fraction of the bandwidth roofline our
decode steps reach (bytes a decode step must read — every weight once plus the KV cache in use —
divided by bandwidth, over the measured step time).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time

from absl import app, flags

_SHAPES = flags.DEFINE_list("shapes", ["a", "b"], "Which shapes to run: a (small Qwen3), b (Qwen3-0.6B).")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed repetitions per measurement (best is kept).")


@dataclasses.dataclass(frozen=True)
class Shape:
  name: str
  layers: int
  hidden: int
  intermediate: int
  heads: int
  kv_heads: int
  head_dim: int
  vocab: int
  batch: int
  prompt_len: int
  new_tokens: int
  tied: bool = True


SHAPES = {
  "a": Shape("(a) small Qwen3", 4, 512, 1536, 8, 4, 64, 32_000, 8, 64, 128),
  "b": Shape("(b) Qwen3-0.6B shape", 28, 1024, 3072, 16, 8, 128, 151_936, 4, 64, 128),
}


def _best(fn, repeats):
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return min(times)


def measure_bandwidth(num_bytes: int = 1 << 30) -> float:
  """Read bandwidth in bytes/s: a jitted sum over a buffer far larger than the caches."""
  import jax
  import jax.numpy as jnp

  x = jnp.ones((num_bytes // 4,), jnp.float32)
  total = jax.jit(jnp.sum)
  total(x).block_until_ready()
  seconds = _best(lambda: total(x).block_until_ready(), 5)
  return num_bytes / seconds


def run_shape(shape: Shape, repeats: int, bandwidth: float) -> dict:
  import numpy as np
  import torch
  import transformers

  import lm
  from lm.sampler import Sampler

  torch.manual_seed(0)
  hf_config = transformers.Qwen3Config(
    vocab_size=shape.vocab,
    hidden_size=shape.hidden,
    intermediate_size=shape.intermediate,
    num_hidden_layers=shape.layers,
    num_attention_heads=shape.heads,
    num_key_value_heads=shape.kv_heads,
    head_dim=shape.head_dim,
    tie_word_embeddings=shape.tied,
    max_position_embeddings=4096,
  )
  hf_model = transformers.Qwen3ForCausalLM(hf_config).eval()
  prompts = np.random.RandomState(0).randint(10, shape.vocab, (shape.batch, shape.prompt_len))
  with tempfile.TemporaryDirectory() as tmp:
    hf_model.save_pretrained(tmp)
    model = lm.load_hf(tmp, dtype="float32")
  sampler = Sampler(model)
  prompt_lists = prompts.tolist()

  def ours(new_tokens):
    out = sampler.generate(prompt_lists, max_new_tokens=new_tokens, temperature=0.0)
    assert all(len(t[0]) == new_tokens for t in out.tokens)
    return out

  start = time.perf_counter()
  ours(shape.new_tokens)
  first_call = time.perf_counter() - start
  ours(1)
  ours_full = _best(lambda: ours(shape.new_tokens), repeats)
  ours_prefill = _best(lambda: ours(1), repeats)
  compile_s = first_call - ours_full

  input_ids = torch.tensor(prompts)

  def theirs(new_tokens):
    with torch.no_grad():
      return hf_model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=0,
      )

  theirs(2)
  hf_full = _best(lambda: theirs(shape.new_tokens), repeats)
  hf_prefill = _best(lambda: theirs(1), repeats)

  # Same greedy continuation (checked on the first 16 tokens: fp32 reductions differ in order, so
  # near-ties may diverge later on random weights).
  ours_tokens = np.asarray([t[0] for t in ours(16).tokens])
  hf_tokens = theirs(16)[:, shape.prompt_len :].numpy()
  agreement = float(np.mean(ours_tokens == hf_tokens))

  steps = shape.new_tokens - 1
  ours_step = (ours_full - ours_prefill) / steps
  hf_step = (hf_full - hf_prefill) / steps
  weight_bytes = sum(p.numel() * 4 for p in hf_model.parameters())
  mean_kv_len = shape.prompt_len + shape.new_tokens / 2
  kv_bytes = 2 * shape.layers * shape.batch * mean_kv_len * shape.kv_heads * shape.head_dim * 4
  ideal_step = (weight_bytes + kv_bytes) / bandwidth
  return {
    "shape": shape.name,
    "ours_tok_s": shape.batch / ours_step,
    "hf_tok_s": shape.batch / hf_step,
    "ratio": hf_step / ours_step,
    "compile_s": compile_s,
    "ours_step_ms": ours_step * 1e3,
    "hf_step_ms": hf_step * 1e3,
    "roofline_step_ms": ideal_step * 1e3,
    "roofline_fraction": ideal_step / ours_step,
    "hf_roofline_fraction": ideal_step / hf_step,
    "greedy_agreement_16": agreement,
  }


def main(argv):
  del argv
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax

  jax.config.update("jax_default_matmul_precision", "highest")
  import torch

  bandwidth = measure_bandwidth()
  print(
    f"machine: {os.cpu_count()} CPUs, jax {jax.__version__} on {jax.devices()[0].platform}, "
    f"torch {torch.__version__} with {torch.get_num_threads()} threads; "
    f"measured read bandwidth {bandwidth / 1e9:.1f} GB/s"
  )
  header = (
    f"{'shape':24} {'ours tok/s':>10} {'HF tok/s':>9} {'ratio':>6} {'compile s':>9} "
    f"{'ours ms/step':>12} {'HF ms/step':>10} {'roofline ms':>11} {'ours %roof':>10} "
    f"{'HF %roof':>8} {'agree':>5}"
  )
  print(header)
  for key in _SHAPES.value:
    r = run_shape(SHAPES[key], _REPEATS.value, bandwidth)
    print(
      f"{r['shape']:24} {r['ours_tok_s']:10.1f} {r['hf_tok_s']:9.1f} {r['ratio']:6.2f} "
      f"{r['compile_s']:9.1f} {r['ours_step_ms']:12.2f} {r['hf_step_ms']:10.2f} "
      f"{r['roofline_step_ms']:11.2f} {100 * r['roofline_fraction']:9.0f}% "
      f"{100 * r['hf_roofline_fraction']:7.0f}% {r['greedy_agreement_16']:5.2f}",
      flush=True,
    )


if __name__ == "__main__":
  app.run(main)
