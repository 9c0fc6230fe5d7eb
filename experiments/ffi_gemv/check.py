import numpy as np, jax, jax.numpy as jnp, sys
from gemv import gemv, gemv_packed, pack, pack_bw
SHAPES = [(4,1024,4096),(4,2048,1024),(4,1024,6144),(4,3072,1024),(4,1024,151936),
          (8,512,32000),(8,512,1024),(8,512,3072),(8,1536,512)]
rng = np.random.default_rng(0)
def err(a, ref):
    a = np.asarray(a, np.float64); ref = np.asarray(ref, np.float64)
    return np.abs(a-ref).max() / np.abs(ref).max()
cases = [(s, {}) for s in SHAPES]
cases += [((m,1024,4096), {}) for m in (1,2,3,4,5,6,7,8,9,12,15,16)]
cases += [((m,1024,4096), dict(kern=1)) for m in (1,3,4,8,16)]
cases += [((m,1024,4096), dict(mode=m2)) for m in (3,16) for m2 in (1,2,3)]
cases += [((m,1024,4096), dict(skc=0)) for m in (1,3,4,8,16)]
cases += [((m,1024,4096), dict(mode=1, skc=16, cw=1024)) for m in (1,3,4,8,16)]
cases += [((16,1024,4096), dict(mt=16, nv=1)), ((4,1000,4096+48+5), {}), ((3,100,7), {})]
rows = []
for (M,K,N), kw in cases:
    x = rng.standard_normal((M,K), np.float32); w = rng.standard_normal((K,N), np.float32) / np.sqrt(K)
    xj, wj = jnp.asarray(x), jnp.asarray(w)
    ref64 = x.astype(np.float64) @ w.astype(np.float64)
    ours = jax.jit(lambda a,b: gemv(a,b,**kw))(xj, wj)
    xla = jax.jit(jnp.dot)(xj, wj)
    line = f"M={M:2d} K={K:5d} N={N:6d} {str(kw):22s} ours-vs-jnp.dot {err(ours, xla):.2e}  ours-vs-f64 {err(ours, ref64):.2e}  jnp.dot-vs-f64 {err(xla, ref64):.2e}"
    if not kw:
        op = jax.jit(lambda a,b: gemv_packed(a,b,n=N))(xj, jnp.asarray(pack(w, pack_bw(M))))
        line += f"  packed-vs-jnp.dot {err(op, xla):.2e}"
    print(line, flush=True)
