"""The decode step's logits product alone, under each XLA:CPU option that could take it over.

  python -m benchmarks.head_bench            # [8, 512] x [512, 32,000] float32, 7 repeats
  python -m benchmarks.head_bench --quick    # a tiny product, 2 repeats (a test runs it)

A decode step at `benchmarks.sampler_bench`'s shape (a) spends ~6.8 of ~18 ms (idle machine) in
the [B, D] x [D, V] product of the output head, which the sampler's decode program gives to Eigen
(`lm.sampler._CPU_DECODE_OPTIONS`). Each variant here compiles `--chain` dependent products into
one call (each reads the previous one's logits, so none is elided or overlapped) under one set of
compiler options; the repeats run every variant once, in an order rotating from repeat to repeat
(`benchmarks.harness.interleave`). Reported: ms a product, median [min–max], and the ratio to the
sampler's choice (Eigen, [D, V] layout) within each repeat; every variant's product is first
checked against NumPy's.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness
from lm import sampler as sampler_lib

EIGEN = sampler_lib._CPU_DECODE_OPTIONS
# Each variant: (weight layout, compiler options). None: XLA:CPU's defaults (YNNPACK for dots).
VARIANTS = {
  "eigen [D,V] (sampler)": ("dv", EIGEN),
  "ynnpack [D,V]": ("dv", None),
  "eigen [V,D]": ("vd", EIGEN),
  "ynnpack [V,D]": ("vd", None),
  "xnnpack dot [D,V]": (
    "dv",
    {**EIGEN, "xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
  ),
  "onednn [D,V]": ("dv", {**EIGEN, "xla_cpu_use_onednn": True}),
  "onednn dot [D,V]": (
    "dv",
    {**EIGEN, "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
  ),
  "eigen 512-bit [D,V]": ("dv", {**EIGEN, "xla_cpu_prefer_vector_width": 512}),
}
REFERENCE = "eigen [D,V] (sampler)"


def product(layout: str):
  spec = "bd,dv->bv" if layout == "dv" else "bd,vd->bv"
  return lambda h, w: jnp.einsum(spec, h, w, preferred_element_type=jnp.float32)


def chained(layout: str, chain: int):
  """`chain` products, each input nudged by the previous logits' row maxima (a data dependence)."""
  one = product(layout)

  def run(h, w):
    total = jnp.zeros(h.shape[:1], jnp.float32)
    for _ in range(chain):
      total = total + jnp.max(one(h + 1e-6 * total[:, None], w), axis=-1)
    return total

  return run


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="a tiny product, 2 repeats")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--dim", type=int, default=512)
  parser.add_argument("--vocab", type=int, default=32_000)
  parser.add_argument("--chain", type=int, default=20, help="products in one call")
  parser.add_argument("--repeats", type=int, default=7)
  args = parser.parse_args()
  if args.quick:
    args.batch, args.dim, args.vocab, args.chain, args.repeats = 2, 32, 256, 2, 2
  harness.describe_machine(os.cpu_count(), quick=True)
  rng = np.random.RandomState(0)
  h = rng.randn(args.batch, args.dim).astype(np.float32)
  w_dv = (rng.randn(args.dim, args.vocab) * 0.05).astype(np.float32)
  weights = {"dv": jnp.asarray(w_dv), "vd": jnp.asarray(np.ascontiguousarray(w_dv.T))}
  expected = h.astype(np.float64) @ w_dv.astype(np.float64)
  calls = {}
  for name, (layout, options) in VARIANTS.items():
    once = jax.jit(product(layout), compiler_options=options)(h, weights[layout])
    np.testing.assert_allclose(np.asarray(once), expected, rtol=1e-4, atol=1e-4, err_msg=name)
    call = jax.jit(chained(layout, args.chain), compiler_options=options)
    call(h, weights[layout]).block_until_ready()
    calls[name] = (call, weights[layout])

  def measure(name, entry):
    call, w = entry
    start = time.perf_counter()
    call(h, w).block_until_ready()
    return 1e3 * (time.perf_counter() - start) / args.chain

  ms = harness.interleave(calls, args.repeats, measure)
  print(
    f"[{args.batch}, {args.dim}] x [{args.dim}, {args.vocab}] float32; ms a product, median [min–max] over "
    f"{args.repeats} interleaved repeats of {args.chain} chained products; ratio = variant ÷ {REFERENCE} "
    "within each repeat (below 1: faster); every product checked against NumPy"
  )
  print(f"{'variant':24} {'ms':>22} {'ratio':>19}")
  for name, values in ms.items():
    print(
      f"{name:24} {harness.fmt(values, 2):>22} {harness.fmt(harness.ratios(values, ms[REFERENCE]), 2):>19}"
    )
  harness.end_load()


if __name__ == "__main__":
  main()
