"""Causal attention of a training row, forward and backward: ours against the fused kernels a user
could pick instead.

  python -m benchmarks.attention_bench                     # Qwen3-4B heads, 8 rows x 4,096 (a GPU)
  python -m benchmarks.attention_bench --cpu               # tiny shapes (what the test runs)

Why: the device check (docs/results/2026-12-04-device-check-h200.md) measured the 4B DPA-GRPO
`accumulate` on an H200 at 10.9x its roofline, and its profile put about 60% of the device's time
in the transposes, reductions and copies of `lm.model.blockwise_attention`'s float32 score blocks,
21% in matrix products. This measures the attention alone at the step's shape, so the share a fused
kernel could win back is a number.

Engines (each in this process, jitted, trials interleaved, the median of `--trials` after a
warm-up): `ours` (`lm.model.attend` with a `CausalMask`: blockwise, `--block` keys at a time), and
`jax.nn.dot_product_attention` with implementation "xla" and, on a GPU, "cudnn" (the flash kernel),
both told each row's length (`key_value_seq_lengths`: rows are right-padded). Each computes the
output and the gradients of sum(out * g) for q, k, v; the largest difference from ours over the
real (unpadded) query positions is reported beside the time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lm import model as model_lib


def _inputs(b: int, t: int, n: int, k: int, h: int, dtype, seed: int = 0):
  keys = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(keys[0], (b, t, n, h), jnp.float32).astype(dtype)
  kk = jax.random.normal(keys[1], (b, t, k, h), jnp.float32).astype(dtype)
  v = jax.random.normal(keys[2], (b, t, k, h), jnp.float32).astype(dtype)
  g = jax.random.normal(keys[3], (b, t, n, h), jnp.float32).astype(dtype)
  lengths = jnp.asarray(np.linspace(t // 2, t, b).astype(np.int32))  # right padding, rows differ
  return q, kk, v, g, lengths


def engines(block: int, gpu: bool) -> dict[str, Any]:
  """name -> f(q [B,T,N,H], k, v [B,T,K,H], lengths [B]) -> [B,T,N,H]."""

  def ours(q, k, v, lengths):
    key_mask = jnp.arange(q.shape[1])[None, :] < lengths[:, None]
    mask = model_lib.CausalMask(key_mask=key_mask)
    return model_lib.attend(q, k.swapaxes(1, 2), v.swapaxes(1, 2), mask, block)

  def sdpa(implementation):
    def f(q, k, v, lengths):
      return jax.nn.dot_product_attention(
        q, k, v, is_causal=True, key_value_seq_lengths=lengths, implementation=implementation
      )

    return f

  out = {"ours": ours, "xla_sdpa": sdpa("xla")}
  if gpu:
    out["cudnn"] = sdpa("cudnn")
  return out


def _program(f):
  def loss(q, k, v, g, lengths):
    return jnp.sum(f(q, k, v, lengths).astype(jnp.float32) * g.astype(jnp.float32))

  def both(q, k, v, g, lengths):
    out = f(q, k, v, lengths)
    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, g, lengths)
    return out, grads

  return jax.jit(both)


def run(*, b: int, t: int, n: int, k: int, h: int, block: int, dtype: str, trials: int) -> dict[str, Any]:
  gpu = jax.default_backend() == "gpu"
  q, kk, v, g, lengths = _inputs(b, t, n, k, h, jnp.dtype(dtype))
  real = (jnp.arange(t)[None, :] < lengths[:, None])[:, :, None, None]  # [B, T, 1, 1]
  programs, record, reference = {}, {}, None
  for name, f in engines(block, gpu).items():
    try:
      programs[name] = _program(f).lower(q, kk, v, g, lengths).compile()
      out, grads = jax.block_until_ready(programs[name](q, kk, v, g, lengths))
    except Exception as e:  # noqa: BLE001 -- an engine this device cannot run is reported, not fatal
      record[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
      continue
    out = jnp.where(real, out, 0).astype(jnp.float32)
    dq = jnp.where(real, grads[0], 0).astype(jnp.float32)  # padded queries' gradients are not used
    if reference is None:
      reference = (out, dq, grads[1].astype(jnp.float32), grads[2].astype(jnp.float32))
    record[name] = {
      "seconds": [],
      "max_abs_diff_from_ours": {
        "out": float(jnp.abs(out - reference[0]).max()),
        "dq": float(jnp.abs(dq - reference[1]).max()),
        "dk": float(jnp.abs(grads[1].astype(jnp.float32) - reference[2]).max()),
        "dv": float(jnp.abs(grads[2].astype(jnp.float32) - reference[3]).max()),
      },
    }
  for _ in range(trials):  # interleaved: a slow moment of the machine touches every engine
    for name, program in programs.items():
      start = time.perf_counter()
      jax.block_until_ready(program(q, kk, v, g, lengths))
      record[name]["seconds"].append(time.perf_counter() - start)
  for name in programs:
    s = record[name]["seconds"]
    record[name]["median_s"] = statistics.median(s)
    record[name]["ours_over_this"] = [a / b for a, b in zip(record["ours"]["seconds"], s, strict=True)]
  return {
    "shape": dict(rows=b, tokens=t, heads=n, kv_heads=k, head_dim=h, block=block, dtype=dtype),
    "backend": jax.default_backend(),
    "device": jax.devices()[0].device_kind,
    "jax": jax.__version__,
    "engines": record,
    "source": "measured (forward + backward, median of the trials after a warm-up; ratios within a trial)",
  }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--cpu", action="store_true", help="tiny shapes (tests)")
  parser.add_argument("--rows", type=int, default=8)
  parser.add_argument("--tokens", type=int, default=4096)
  parser.add_argument("--block", type=int, default=1024, help="ours: keys a block (attention_block)")
  parser.add_argument("--trials", type=int, default=5)
  parser.add_argument("--out", default="", help="write the record (JSON) here")
  args = parser.parse_args(argv)
  if args.cpu:
    shape = dict(b=2, t=64, n=4, k=2, h=16, block=16, dtype="float32", trials=2)
  else:
    shape = dict(b=args.rows, t=args.tokens, n=32, k=8, h=128, block=args.block, dtype="bfloat16")
    shape["trials"] = args.trials
  record = run(**shape)
  text = json.dumps(record, indent=1)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
