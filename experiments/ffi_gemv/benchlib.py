import time, math, numpy as np, jax, jax.numpy as jnp
from gemv import gemv, gemv_packed, pack, lib

def make_chain(op, L):
    """jit fn(x, *ws): L dependent calls op(x_i, ws[i % len(ws)])."""
    def f(x, *ws):
        acc = x
        for i in range(L):
            y = op(acc, ws[i % len(ws)])
            acc = x + 1e-30 * y[:, :1]
        return acc
    return jax.jit(f)

def run_once(fn, args):
    t = time.perf_counter(); fn(*args).block_until_ready(); return time.perf_counter() - t

def bench_pair(fns, args_list, L, trials=15, min_time=0.03):
    """fns: dict name->jitted fn. Interleaved trials; returns name->array of us/call."""
    names = list(fns)
    reps = {}
    for n in names:  # warmup + calibrate
        for _ in range(2): run_once(fns[n], args_list[n])
        t = run_once(fns[n], args_list[n])
        reps[n] = max(1, math.ceil(min_time / max(t, 1e-6)))
    res = {n: [] for n in names}
    for tr in range(trials):
        order = names if tr % 2 == 0 else names[::-1]
        for n in order:
            f, a = fns[n], args_list[n]
            t0 = time.perf_counter()
            for _ in range(reps[n]): out = f(*a)
            out.block_until_ready()
            res[n].append((time.perf_counter() - t0) / reps[n] / L * 1e6)
    return {n: np.array(v) for n, v in res.items()}

def fmt(a):
    return f"{np.median(a):9.1f} [{a.min():.1f}-{a.max():.1f}]"

def mem_bw(trials=5):
    a = np.ones(256 * 1024 * 1024, np.float32)  # 1 GiB
    out = {}
    t = []
    for _ in range(trials):
        t0 = time.perf_counter(); a.sum(); t.append(time.perf_counter() - t0)
    out["numpy sum 1GiB (1 thread)"] = a.nbytes / np.array(t) / 1e9
    for nt in (1, 2):
        t = []
        for _ in range(trials):
            t0 = time.perf_counter(); lib.read_bw_sum(a.ctypes.data, a.size, nt); t.append(time.perf_counter() - t0)
        out[f"AVX-512 read 1GiB ({nt} thread{'s' if nt>1 else ''})"] = a.nbytes / np.array(t) / 1e9
    del a
    return out
