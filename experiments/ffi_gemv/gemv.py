"""Load libgemv.so, register FFI targets, provide jax wrappers."""
import ctypes, os
import numpy as np
import jax, jax.numpy as jnp

_HERE = os.path.dirname(os.path.abspath(__file__))
lib = ctypes.cdll.LoadLibrary(os.path.join(_HERE, os.environ.get("GEMV_LIB", "libgemv.so")))
jax.ffi.register_ffi_target("gemv_f32", jax.ffi.pycapsule(lib.GemvF32), platform="cpu")
jax.ffi.register_ffi_target("gemv_packed_f32", jax.ffi.pycapsule(lib.GemvPackedF32), platform="cpu")
lib.read_bw_sum.restype = ctypes.c_double
lib.read_bw_sum.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]

DEFAULTS = dict(mode=0, kern=0, nv=0, mt=0, pf=-16, nthr=2, skc=-1, cw=4096)

def _attrs(kw):
    a = dict(DEFAULTS); a.update(kw)
    return {k: np.int64(v) for k, v in a.items()}

def gemv(x, w, **kw):
    M, K = x.shape; K2, N = w.shape
    assert K == K2
    return jax.ffi.ffi_call("gemv_f32", jax.ShapeDtypeStruct((M, N), jnp.float32))(x, w, **_attrs(kw))

def pack(w_np, bw=64):
    """[K,N] -> [ceil(N/bw), K, bw] (zero-padded columns)."""
    K, N = w_np.shape
    Np = -(-N // bw) * bw
    if Np != N:
        w_np = np.concatenate([w_np, np.zeros((K, Np - N), w_np.dtype)], axis=1)
    return np.ascontiguousarray(w_np.reshape(K, Np // bw, bw).transpose(1, 0, 2))

def pack_bw(M):
    return 64 if M <= 4 else 48

def gemv_packed(x, wp, n=None, **kw):
    kw.setdefault("pf", 0)
    M, K = x.shape; nb, K2, bw = wp.shape
    assert K == K2
    y = jax.ffi.ffi_call("gemv_packed_f32", jax.ShapeDtypeStruct((M, nb * bw), jnp.float32))(x, wp, **_attrs(kw))
    return y if n is None or n == nb * bw else y[:, :n]
