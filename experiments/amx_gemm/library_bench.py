"""bf16 products through lm.cpu_gemm's handler with library_path.patch applied (the AMX path) against
XLA's bf16 dot, interleaved; `python library_bench.py TRIALS` from the repository root."""
import time, sys, numpy as np, jax, jax.numpy as jnp
from lm import cpu_gemm
rng = np.random.default_rng(0)
shapes = [(256, 1024, 6144), (256, 3072, 1024), (256, 2048, 1024), (512, 1024, 6144)]
fns = {}
for (m, k, n) in shapes:
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((k, n)) / 8, jnp.bfloat16)
  pw = cpu_gemm.pack(w)
  f = jax.jit(lambda x, b, n=n: cpu_gemm.call(cpu_gemm.TARGET_BF16, x.astype(jnp.float32), b, 2, n))
  g = jax.jit(lambda x, w: jnp.matmul(x, w, preferred_element_type=jnp.float32))
  fns[(m, k, n)] = {"amx": (f, (x, pw.blocks)), "xla": (g, (x, w))}
  for fn, args in fns[(m, k, n)].values(): fn(*args).block_until_ready()
times = {(s, e): [] for s in shapes for e in ("amx", "xla")}
for trial in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
  for s in shapes:
    for e, (fn, args) in fns[s].items():
      ts = []
      for _ in range(7):
        t = time.perf_counter(); fn(*args).block_until_ready(); ts.append(time.perf_counter() - t)
      times[(s, e)].append(np.median(ts))
for s in shapes:
  a, x = np.array(times[(s, "amx")]), np.array(times[(s, "xla")])
  r = x / a
  fl = 2 * np.prod(s)
  print(s, f"amx {fl/np.median(a)/1e9:.0f} xla {fl/np.median(x)/1e9:.0f} GFLOP/s; amx speedup {np.median(r):.2f} [{r.min():.2f}-{r.max():.2f}]")
