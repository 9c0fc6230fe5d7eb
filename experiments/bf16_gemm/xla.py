import time, jax, jax.numpy as jnp, numpy as np
for M, K, N in [(256, 1024, 4096), (256, 1024, 6144), (256, 3072, 1024), (256, 2048, 1024)]:
  a = jnp.asarray(np.random.rand(M, K) - 0.5, jnp.bfloat16); b = jnp.asarray((np.random.rand(K, N) - 0.5) / 32, jnp.bfloat16)
  f = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
  f(a, b).block_until_ready(); ts = []
  for _ in range(25):
    t = time.perf_counter(); f(a, b).block_until_ready(); ts.append(time.perf_counter() - t)
  ts.sort(); print(f"XLA [{M} x {K}] @ [{K} x {N}]: median {2*M*N*K/ts[12]/1e9:.0f} GFLOP/s (best {2*M*N*K/ts[0]/1e9:.0f})")
