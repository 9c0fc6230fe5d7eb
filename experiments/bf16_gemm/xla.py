"""XLA:CPU's bf16 dot (bf16 x bf16 -> float32) at the (b) prefill's four products, 2 threads: GFLOP/s."""

import time

import jax
import jax.numpy as jnp
import numpy as np

SHAPES = [(256, 1024, 4096), (256, 1024, 6144), (256, 3072, 1024), (256, 2048, 1024)]


def main() -> None:
  rng = np.random.default_rng(0)
  product = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
  for m, k, n in SHAPES:
    a = jnp.asarray(rng.random((m, k)) - 0.5, jnp.bfloat16)
    b = jnp.asarray((rng.random((k, n)) - 0.5) / 32, jnp.bfloat16)
    product(a, b).block_until_ready()
    times = []
    for _ in range(25):
      start = time.perf_counter()
      product(a, b).block_until_ready()
      times.append(time.perf_counter() - start)
    times.sort()
    median, best = (2 * m * n * k / t / 1e9 for t in (times[12], times[0]))
    print(f"XLA [{m} x {k}] @ [{k} x {n}]: median {median:.0f} GFLOP/s (best {best:.0f})")


if __name__ == "__main__":
  main()
