# Main benchmark: per-shape cold-weight chains, hot-weight chains, decoder-layer chain, mem BW.
import sys, math, numpy as np, jax, jax.numpy as jnp
from benchlib import *
from gemv import pack_bw
TRIALS = int(sys.argv[1]) if len(sys.argv) > 1 else 15
rng = np.random.default_rng(0)
import os
SHAPES = [(4,1024,4096),(4,2048,1024),(4,1024,6144),(4,3072,1024),(4,1024,151936),
          (8,512,32000),(8,512,1024),(8,512,3072),(8,1536,512)]
if os.environ.get("BENCH_SHAPES"): SHAPES = [tuple(map(int, t.split(","))) for t in os.environ["BENCH_SHAPES"].split(";")]
HOTS = (False, True) if not os.environ.get("BENCH_COLD_ONLY") else (False,)
OURS1 = dict(mode=0, skc=-1, pf=-16, cw=4096)
OURS2 = dict(mode=1, skc=-1, pf=-16, cw=4096)
PACK1 = dict(mode=0)
def p(*a): print(*a, flush=True)

bw = mem_bw(7)
for k, v in bw.items(): p(f"MEMBW {k:35s} median {np.median(v):.1f} GB/s [{v.min():.1f}-{v.max():.1f}]")

def run_shape(M, K, N, hot):
    wb = K*N*4
    if hot:
        nc, L = 1, 8
    else:
        nc = max(2, math.ceil((256 << 20) / wb)); L = nc
    base = rng.standard_normal((K, N), np.float32) / np.sqrt(K)
    ws = [jnp.asarray(base + np.float32(i * 1e-3)) for i in range(nc)]
    x = jnp.asarray(rng.standard_normal((M, K), np.float32))
    fns = {"xla": make_chain(jnp.dot, L),
           "ours1t": make_chain(lambda a, b: gemv(a, b, **OURS1), L),
           "ours2t": make_chain(lambda a, b: gemv(a, b, **OURS2), L)}
    args = {k: (x, *ws) for k in fns}
    if True:
        wps = [jnp.asarray(pack(np.asarray(w), pack_bw(M))) for w in ws]
        fns["packed1t"] = make_chain(lambda a, b: gemv_packed(a, b, n=N, **PACK1), L)
        args["packed1t"] = (x, *wps)
    r = bench_pair(fns, args, L, trials=TRIALS)
    tag = "HOT " if hot else "COLD"
    for n, a in r.items():
        ratio = r["xla"] / a
        p(f"{tag} M={M} K={K} N={N} W={wb/2**20:.1f}MiB L={L} {n:9s} {fmt(a)} us  {wb/np.median(a)/1e3:6.1f} GB/s  "
          f"xla/this {np.median(ratio):.2f} [{ratio.min():.2f}-{ratio.max():.2f}]")

for hot in HOTS:
    for (M, K, N) in SHAPES:
        run_shape(M, K, N, hot)

if os.environ.get('BENCH_SKIP_CHAIN'): sys.exit(0)
# decoder-layer chain (Qwen3-0.6B-ish dims, batch 4), NL distinct layers -> cold
M, NL = 4, 8
dims = [(1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024)]
layers = [[jnp.asarray(rng.standard_normal(d, np.float32) / np.sqrt(d[0])) for d in dims] for _ in range(NL)]
def layer_chain(op):
    def f(x, *ws):
        h = x
        for l in range(NL):
            qkv = op(h, ws[4*l]); o = op(qkv[:, :2048], ws[4*l+1])
            gu = op(o, ws[4*l+2]); h = op(gu[:, :3072], ws[4*l+3]) + h
        return h
    return jax.jit(f)
x = jnp.asarray(rng.standard_normal((M, 1024), np.float32))
flat = [w for l in layers for w in l]
fns = {"xla": layer_chain(jnp.dot), "ours1t": layer_chain(lambda a, b: gemv(a, b, **OURS1)),
       "ours2t": layer_chain(lambda a, b: gemv(a, b, **OURS2))}
args = {k: (x, *flat) for k in fns}
flatp = [jnp.asarray(pack(np.asarray(w), 64)) for w in flat]
fns["packed1t"] = layer_chain(lambda a, b: gemv_packed(a, b, **PACK1)); args["packed1t"] = (x, *flatp)
ref = np.asarray(fns["xla"](*args["xla"]))
for n in fns:
    out = np.asarray(fns[n](*args[n])); p(f"LAYERCHAIN check {n}: rel err vs xla {np.abs(out-ref).max()/np.abs(ref).max():.2e}")
r = bench_pair(fns, args, NL, trials=TRIALS)
lb = sum(a*b for a, b in dims) * 4
for n, a in r.items():
    ratio = r["xla"] / a
    p(f"LAYERCHAIN {n:9s} per layer (4 matmuls, {lb/2**20:.0f} MiB) {fmt(a)} us  {lb/np.median(a)/1e3:6.1f} GB/s  xla/this {np.median(ratio):.2f} [{ratio.min():.2f}-{ratio.max():.2f}]")
bw = mem_bw(7)
for k, v in bw.items(): p(f"MEMBW(end) {k:35s} median {np.median(v):.1f} GB/s [{v.min():.1f}-{v.max():.1f}]")
