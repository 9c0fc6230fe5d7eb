"""A matrix product for XLA:CPU against weights packed in column blocks (`lm/cpu_gemm.cc`, through
`jax.ffi`): what the sampler's CPU programs multiply by. Weights float32 or bfloat16 (half the
bytes a decode step streams; widened to float32 in registers, sums in float32), rows float32.

Why: a decode step reads every weight once for a few rows of activations, so its speed is the rate
at which its products stream weights. XLA:CPU's dot reads a row-major [K, N] weight at 7-16 GB/s
for 2..16 rows; the kernel reads a packed one (`pack`: blocks [ceil(N / B), K, B], each one
contiguous stream, B = 64 columns with AVX-512 and 16 with AVX2, `block()`) at the core's read
bandwidth, on every core (docs in `lm/cpu_gemm.cc`). At
prefill's hundreds of rows the same kernel is a blocked GEMM level with XLA's, so the sampler keeps
one copy of its weights, packed, for both programs (`SamplerConfig.cpu_gemm_threads`). A bfloat16
prefill's products run a second kernel on the same packed blocks where the CPU has AVX512_BF16
(`bf16_dot()`): its VDPBF16PS instruction multiplies bf16 pairs at twice float32's rate.

The library is compiled for the machine it runs on (`-march=native`) at install time
(`scripts/setup_env.sh` runs `python -m lm.cpu_gemm`) into `~/.cache/lm/` (or `$LM_KERNEL_DIR`),
under a name that hashes the source, the compiler command and the CPU's flags, so a changed
source or another CPU never loads a stale build. Where it is not built (no compiler, another CPU),
`available()` is False and the sampler keeps XLA's dot; a log line says how to build it.

The library also holds the CPU attention kernels `lm.model.attention` runs on XLA:CPU: a decode
step's (`decode_attention`) and whole sequences' with its gradient (`sequence_attention`, a prefill's
and a train step's), chosen by `lm.model.cpu_attention`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import logging
import os
import pathlib
import platform
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

Array = jax.Array

_log = logging.getLogger(__name__)
SOURCE = pathlib.Path(__file__).with_name("cpu_gemm.cc")
TARGET = "lm_cpu_gemm_packed_f32"
TARGET_BF16 = "lm_cpu_gemm_packed_bf16"  # the same product against bfloat16 weights
TARGET_BF16_DOT = "lm_cpu_gemm_packed_bf16_dot"  # bf16 rows by VDPBF16PS (AVX512_BF16): a prefill's
TARGET_SWIGLU_BF16 = "lm_cpu_swiglu_bf16"  # the same for a gate/up weight, SiLU and the gating after it
TARGET_ATTENTION = "lm_cpu_decode_attention"  # a decode step's attention over a float32 cache
TARGET_ATTENTION_BF16 = "lm_cpu_decode_attention_bf16"  # the same over a bfloat16 cache
TARGET_CACHE_WRITE = "lm_cpu_cache_write"  # a KV cache's write in place
TARGET_ATTENTION_BLOCK = "lm_cpu_attention_block"  # a layer's norms, rope, cache writes and attention
TARGET_SEQUENCE_ATTENTION = "lm_cpu_attention"  # whole sequences' attention (a prefill's, a train step's)
TARGET_SEQUENCE_ATTENTION_BWD = "lm_cpu_attention_bwd"  # its gradient
_SYMBOLS = {
  TARGET: "LmCpuGemmPackedF32",
  TARGET_BF16: "LmCpuGemmPackedBF16",
  TARGET_BF16_DOT: "LmCpuGemmPackedBF16Dot",
  TARGET_SWIGLU_BF16: "LmCpuSwiGLUBF16",
  TARGET_ATTENTION: "LmCpuDecodeAttention",
  TARGET_ATTENTION_BF16: "LmCpuDecodeAttentionBF16",
  TARGET_CACHE_WRITE: "LmCpuCacheWrite",
  TARGET_ATTENTION_BLOCK: "LmCpuAttentionBlock",
  TARGET_SEQUENCE_ATTENTION: "LmCpuAttention",
  TARGET_SEQUENCE_ATTENTION_BWD: "LmCpuAttentionBackward",
}
DTYPES = (jnp.float32, jnp.bfloat16)  # the weight dtypes the kernel packs
# Above this many rows a bfloat16 product of bfloat16 rows runs the library's VDPBF16PS kernel
# where the build has it (`bf16_dot()`), else XLA's dot on the packed blocks: bf16 instructions
# (AVX512_BF16, AMX) outrun the kernel's widened float32 products there ([M, 1024] x [1024, 3072],
# 2-core AVX-512/AMX Xeon, GFLOP/s kernel vs XLA on the blocks: M 8: 76 vs 33, 16: 107 vs 71, 24:
# 132 vs 87, 32: 121 vs 132, 64: 122 vs 206, 128: 118 vs 296; docs/results/2026-12-04-bf16-cpu.md).
KERNEL_MAX_ROWS_BF16 = 24
DEFAULT_BLOCK = 64  # columns per block where no library is loaded (a packed weight is then unpacked)
NEG_INF = -0.7 * float(np.finfo(np.float32).max)  # a masked score (lm.model's; finite: no NaN when all are)
_FLAGS = (
  "-O3",
  "-march=native",
  "-std=c++17",
  "-shared",
  "-fPIC",
  "-fopenmp-simd",
)


def _cpu_flags() -> str:
  """The CPU's feature flags (part of the build's name: `-march=native` code is for this CPU)."""
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("flags"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _command(out: pathlib.Path, extra_flags: tuple[str, ...] = ()) -> list[str]:
  cxx = os.environ.get("CXX", "g++")
  return [cxx, *_FLAGS, *extra_flags, f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", str(out)]


def library_path(
  directory: str | os.PathLike | None = None, extra_flags: tuple[str, ...] = ()
) -> pathlib.Path:
  """Where this source's build for this CPU lives (it may not exist yet)."""
  directory = directory or os.environ.get("LM_KERNEL_DIR") or pathlib.Path.home() / ".cache" / "lm"
  key = hashlib.sha256()
  # The command without the source's path: a copy of this source elsewhere (a benchmark's
  # `ours@REF`) shares the build.
  command = " ".join(part for part in _command(pathlib.Path("OUT"), extra_flags) if part != str(SOURCE))
  for part in (SOURCE.read_bytes(), command.encode(), _cpu_flags().encode()):
    key.update(part)
  return pathlib.Path(directory) / f"libcpu_gemm-{key.hexdigest()[:16]}.so"


def build(directory: str | os.PathLike | None = None, extra_flags: tuple[str, ...] = ()) -> pathlib.Path:
  """Compiles the library (if this build is not there yet) and returns its path.

  `extra_flags` go after the defaults (a test builds the portable path with `-mno-avx512f`).
  Raises RuntimeError with the compiler's command and output when it fails. The file appears
  atomically, so concurrent builds never load a half-written library.
  """
  out = library_path(directory, extra_flags)
  if out.exists():
    return out
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_suffix(f".{os.getpid()}.tmp")
  command = _command(tmp, extra_flags)
  try:
    done = subprocess.run(command, capture_output=True, text=True)
  except OSError as e:  # no compiler at all
    raise RuntimeError(f"building {SOURCE} failed ({' '.join(command)}): {e}") from e
  if done.returncode != 0:
    tmp.unlink(missing_ok=True)
    raise RuntimeError(f"building {SOURCE} failed ({' '.join(command)}):\n{done.stderr[-4000:]}")
  os.replace(tmp, out)
  return out


def available() -> bool:
  """Whether the kernel is registered with XLA:CPU (loaded once per process)."""
  return _loaded_block() is not None


@functools.cache
def bf16_dot() -> bool:
  """Whether the loaded library multiplies bfloat16 rows by AVX512_BF16's VDPBF16PS (built so where
  the CPU has it): then `matmul` runs a bfloat16 product of more than KERNEL_MAX_ROWS_BF16 rows (a
  prefill's) there, on the packed blocks, rather than XLA's dot, and a packed bf16 weight needs no
  row-major copy (`pack(rows=...)`)."""
  if not available():
    return False
  library = ctypes.cdll.LoadLibrary(str(library_path()))
  library.LmCpuGemmBF16Dot.restype = ctypes.c_int64
  return bool(library.LmCpuGemmBF16Dot())


def block() -> int:
  """Columns per block of this process's packed layout: the loaded library's, else DEFAULT_BLOCK."""
  return _loaded_block() or DEFAULT_BLOCK


@functools.cache
def _loaded_block() -> int | None:
  """Registers this CPU's build as TARGET and TARGET_BF16 (once per process) and returns its block
  width; None where there is none."""
  if platform.machine() not in ("x86_64", "AMD64") or sys.platform != "linux":
    return None  # built and tested on x86-64 Linux only
  path = library_path()
  if not path.exists():
    _log.info("lm.cpu_gemm: %s is not built (python -m lm.cpu_gemm); decode uses XLA's dot", path)
    return None
  register(TARGET_BF16, path, "bfloat16")
  library = ctypes.cdll.LoadLibrary(str(path))
  for target in (
    TARGET_BF16_DOT,
    TARGET_SWIGLU_BF16,
    TARGET_ATTENTION,
    TARGET_ATTENTION_BF16,
    TARGET_CACHE_WRITE,
    TARGET_ATTENTION_BLOCK,
    TARGET_SEQUENCE_ATTENTION,
    TARGET_SEQUENCE_ATTENTION_BWD,
  ):
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, _SYMBOLS[target])), platform="cpu")
  return register(TARGET, path)


def register(target: str, path: str | os.PathLike, dtype: str = "float32") -> int:
  """Loads the library at `path`, registers its handler for weights of `dtype` ("float32" or
  "bfloat16") with XLA:CPU as `target`, and returns the block width its packed weights must have
  (`LmCpuGemmBlock`: 64 with AVX-512, 16 with AVX2)."""
  library = ctypes.cdll.LoadLibrary(str(path))
  symbol = _SYMBOLS[TARGET_BF16 if dtype == "bfloat16" else TARGET]
  jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
  library.LmCpuGemmBlock.restype = ctypes.c_int64
  return int(library.LmCpuGemmBlock())


@struct.dataclass
class PackedWeight:
  """A [K, N] float32 or bfloat16 weight stored as column blocks [ceil(N / B), K, B] (`pack`), columns past N
  zero: each block is one contiguous stream, which the kernel reads at the core's full read
  bandwidth (a row-major [K, N] is read as many strided streams instead). A pytree (`n` static),
  so it passes through `jax.jit` like the array it replaces."""

  blocks: Array  # [ceil(N / B), K, B], B = `block()` when packed
  n: int = struct.field(pytree_node=False)
  # [K, N] row-major, or None: kept beside the blocks for bfloat16 (`pack(rows=True)`), which
  # products of more than KERNEL_MAX_ROWS_BF16 rows (a prefill's) hand to XLA's dot as it is; the
  # blocks would be unpacked every call (a copy of the weight) for that dot.
  matrix: Array | None = None

  @property
  def shape(self) -> tuple[int, int]:
    return (self.blocks.shape[1], self.n)

  @property
  def dtype(self):
    return self.blocks.dtype

  def astype(self, dtype) -> PackedWeight:
    """Itself: a packed weight keeps its dtype (the kernel widens bf16 to float32 in registers, and
    `matmul` gives the dtype `jnp.matmul` would); a cast to another dtype is refused, not copied."""
    if jnp.dtype(dtype) not in (self.blocks.dtype, jnp.dtype(jnp.float32)):
      raise ValueError(f"a {self.blocks.dtype} PackedWeight cannot be cast to {dtype}")
    return self

  def unpack(self) -> Array:
    """The [K, N] matrix (a copy: what a platform without the kernel multiplies by)."""
    k = self.blocks.shape[1]
    return self.blocks.transpose(1, 0, 2).reshape(k, -1)[:, : self.n]


def pack(w: Array, block_width: int | None = None, rows: bool = False) -> PackedWeight:
  """[K, N] float32 or bfloat16 -> `PackedWeight` in blocks of `block_width` columns (default
  `block()`, what this process's kernel reads), in w's dtype; a copy, made once per parameter
  update, outside any step. `rows`: a bfloat16 w is also kept as it is (`PackedWeight.matrix`),
  for products of many rows (two bf16 copies: the bytes of one float32 copy)."""
  if w.ndim != 2 or w.dtype not in DTYPES:
    raise ValueError(f"pack: expected a float32 or bfloat16 [K, N] weight, got {w.dtype} {w.shape}")
  width = block_width or block()
  k, n = w.shape
  padded = jnp.pad(w, ((0, 0), (0, -n % width)))
  blocks = padded.reshape(k, -1, width).transpose(1, 0, 2)
  return PackedWeight(blocks=blocks, n=n, matrix=w if rows and w.dtype == jnp.bfloat16 else None)


def matmul(x: Array, w: Array | PackedWeight, threads: int = -1, preferred_element_type: Any = None) -> Array:
  """x [..., K] @ w [K, N] -> [..., N]: the kernel when w is a `PackedWeight`, else `jnp.matmul`.

  A drop-in for `jnp.matmul` (`lm.model.decoder_layer`'s `matmul`), dtype rules included: a
  bfloat16 product (rows and weight) is bfloat16 unless `preferred_element_type` says float32, a
  float32 weight needs float32 rows. The kernel itself reads float32 rows (bfloat16 rows are
  widened first: exact) and sums in float32, like XLA's dot. `threads`: 1 computes on the calling
  thread only; n > 1 also runs column chunks on XLA's intra-op pool, up to n threads in all; < 0 as
  many as that pool has (`lm/cpu_gemm.cc`). Under `jax.jit` for another platform, or in a process
  without the library, a packed weight is unpacked and multiplied by XLA's dot.
  """
  if not isinstance(w, PackedWeight):
    return jnp.matmul(x, w, preferred_element_type=preferred_element_type)
  if w.dtype == jnp.float32 and x.dtype != jnp.float32:
    raise ValueError(f"a float32 PackedWeight multiplies float32 rows, got {x.dtype}")
  out_dtype = jnp.dtype(preferred_element_type or jnp.result_type(x.dtype, w.dtype))
  lead, k = x.shape[:-1], x.shape[-1]
  rows = x.reshape(-1, k)  # [M, K]

  def dot(rows, blocks):
    weight = dataclasses.replace(w, blocks=blocks).unpack()
    return jnp.matmul(rows, weight, preferred_element_type=jnp.float32)

  if not available():
    return dot(rows, w.blocks).astype(out_dtype).reshape(*lead, w.n)
  if (
    w.dtype == jnp.bfloat16
    and rows.shape[0] > KERNEL_MAX_ROWS_BF16
    and rows.dtype == jnp.bfloat16
    and bf16_dot()
  ):
    # The kernel writes bfloat16 itself (rounded as the cast rounds) where that is the product's dtype.
    y_dtype = out_dtype if out_dtype in DTYPES else jnp.dtype(jnp.float32)
    kernel = lambda rows, blocks: call(TARGET_BF16_DOT, rows, blocks, threads, w.n, y_dtype)
    default = lambda rows, blocks: dot(rows, blocks).astype(y_dtype)
    out = jax.lax.platform_dependent(rows, w.blocks, cpu=kernel, default=default)  # [M, N]
    return out.astype(out_dtype).reshape(*lead, w.n)
  if w.dtype == jnp.bfloat16 and rows.shape[0] > KERNEL_MAX_ROWS_BF16:
    # XLA's dot, summed in float32: on the row-major copy where kept, else on the blocks as they
    # are ([M, K] x [NB, K, B] -> [M, NB, B]; XLA unpacks them first).
    if w.matrix is not None:
      out = jnp.matmul(rows, w.matrix, preferred_element_type=jnp.float32)
    else:
      out = jnp.einsum("mk,nkb->mnb", rows, w.blocks, preferred_element_type=jnp.float32)
    return out.reshape(rows.shape[0], -1)[:, : w.n].astype(out_dtype).reshape(*lead, w.n)
  target = TARGET_BF16 if w.dtype == jnp.bfloat16 else TARGET
  kernel = lambda rows, blocks: call(target, rows.astype(jnp.float32), blocks, threads, w.n)
  out = jax.lax.platform_dependent(rows, w.blocks, cpu=kernel, default=dot)  # [M, N] float32
  return out.astype(out_dtype).reshape(*lead, w.n)


def swiglu_applies(x: Array, w: Array | PackedWeight) -> bool:
  """Whether `swiglu` runs the library's kernel for rows x [..., K] and a gate/up weight w [K, 2F]:
  a packed bf16 w with F a multiple of its block, bf16 rows, more than KERNEL_MAX_ROWS_BF16 of them
  (a prefill's; a decode step's few rows stream the weight with the kernel's widened products), and
  a build with the VDPBF16PS products (`bf16_dot()`)."""
  rows = int(np.prod(x.shape[:-1]))
  return (
    isinstance(w, PackedWeight)
    and w.dtype == jnp.bfloat16
    and x.dtype == jnp.bfloat16
    and rows > KERNEL_MAX_ROWS_BF16
    and w.n % (2 * w.blocks.shape[2]) == 0
    and bf16_dot()
  )


def swiglu(x: Array, w: PackedWeight, threads: int = -1) -> Array:
  """silu(x @ w[:, :F]) * (x @ w[:, F:]) in float32, rounded once to bfloat16 -> [..., F]: a SwiGLU
  MLP's hidden state from its fused gate/up weight (`lm.model.fuse_projections`' "gate_up_dx"), by
  the library's kernel where `swiglu_applies` (call only there): the float32 [..., 2F] product is
  never written (`lm/cpu_gemm.cc` PackedSwiGLUBF16Impl). Traced for another platform, the products
  and the gating in XLA's ops."""
  if not swiglu_applies(x, w):
    raise ValueError(f"swiglu: the kernel does not apply to rows {x.dtype} {x.shape} and this weight")
  lead, k, f = x.shape[:-1], x.shape[-1], w.n // 2
  rows = x.reshape(-1, k)

  def kernel(rows, blocks):
    out = jax.ShapeDtypeStruct((rows.shape[0], f), jnp.bfloat16)
    return jax.ffi.ffi_call(TARGET_SWIGLU_BF16, out)(rows, blocks, threads=np.int64(threads))

  def default(rows, blocks):
    gate_up = jnp.matmul(
      rows, dataclasses.replace(w, blocks=blocks).unpack(), preferred_element_type=jnp.float32
    )
    gate, up = jnp.split(gate_up, 2, axis=-1)
    return (jax.nn.silu(gate) * up).astype(jnp.bfloat16)

  return jax.lax.platform_dependent(rows, w.blocks, cpu=kernel, default=default).reshape(*lead, f)


def call(target: str, rows: Array, blocks: Array, threads: int, n: int, dtype: Any = jnp.float32) -> Array:
  """The FFI call itself: rows [M, K] @ packed blocks [ceil(n / B), K, B] -> [M, n] of `dtype`, by
  the handler registered as `target` (B its library's block width), with the dtypes it takes:
  float32 rows and float32 or bfloat16 blocks to float32 (TARGET, TARGET_BF16), or bfloat16 rows
  and blocks to float32 or bfloat16 (TARGET_BF16_DOT)."""
  out = jax.ShapeDtypeStruct((rows.shape[0], n), dtype)
  return jax.ffi.ffi_call(target, out)(rows, blocks, threads=np.int64(threads))


def decode_attention(q: Array, k: Array, v: Array, mask: Array, scale: float, threads: int = -1) -> Array:
  """One decode step's grouped-query attention over the cache, by the library's kernel: q
  [B, K, G, H], k and v [B, K, S, H] both float32 or both bfloat16 (widened in registers: a bf16
  cache streams half the bytes), mask [B, S] (True where a key may be read) -> [B, K, G, H]
  float32; scores (times `scale`) and softmax in float32, each key and value read once for the G
  queries of its kv head (`lm/cpu_gemm.cc` DecodeAttentionImpl). Call only where `available()`;
  `lm.model.attention` does, for a decode step traced for XLA:CPU. Traced for another platform, it
  is the model's own multiply-reduce (`reference_decode_attention`)."""
  if k.dtype != v.dtype or k.dtype not in (jnp.float32, jnp.bfloat16):
    raise ValueError(f"decode_attention: k and v must both be float32 or bfloat16: {k.dtype}, {v.dtype}")
  target = TARGET_ATTENTION_BF16 if k.dtype == jnp.bfloat16 else TARGET_ATTENTION
  out = jax.ShapeDtypeStruct(q.shape, jnp.float32)

  def kernel(q, k, v, mask):
    call = jax.ffi.ffi_call(target, out)
    return call(q, k, v, mask, scale=np.float32(scale), threads=np.int64(threads))

  def default(q, k, v, mask):
    return reference_decode_attention(q, k, v, mask, scale)

  args = (q.astype(jnp.float32), k, v, mask.astype(bool))
  return jax.lax.platform_dependent(*args, cpu=kernel, default=default)


def cache_write(cache: Array, update: Array, index: Array | int) -> Array:
  """`jax.lax.dynamic_update_slice_in_dim(cache, update, index, axis=2)` for a KV cache [B, K, S, H]
  and an update [B, K, T, H] of its dtype, by the library's kernel in place (the call aliases the
  cache's buffer): XLA:CPU runs a bfloat16 dynamic-update-slice in float32, a pass over the whole
  cache (`lm/cpu_gemm.cc` CacheWriteImpl). Call only where `available()`; traced for another
  platform, it is the dynamic-update-slice itself."""
  if update.dtype != cache.dtype:
    raise ValueError(f"cache_write: the update's dtype {update.dtype} is not the cache's {cache.dtype}")
  out = jax.ShapeDtypeStruct(cache.shape, cache.dtype)

  def kernel(cache, update, index):
    return jax.ffi.ffi_call(TARGET_CACHE_WRITE, out, input_output_aliases={0: 0})(cache, update, index)

  def default(cache, update, index):
    return jax.lax.dynamic_update_slice_in_dim(cache, update, index, axis=2)

  index = jnp.asarray(index, jnp.int32)
  return jax.lax.platform_dependent(cache, update, index, cpu=kernel, default=default)


def attention_block(
  qkv: Array,
  k: Array,
  v: Array,
  index: Array | int,
  mask: Array,
  cos: Array,
  sin: Array,
  *,
  q_norm: Array | None,
  k_norm: Array | None,
  bias: Array | None,
  eps: float,
  dtype: Any,
  threads: int = -1,
  out_dtype: Any = jnp.float32,
) -> tuple[Array, Array, Array]:
  """A layer's attention block by the library's kernel (`lm/cpu_gemm.cc` AttentionBlockImpl): from
  the fused QKV product's output qkv [B, T, (N + 2K)·H] (float32, or bfloat16 where `dtype` is: the
  values the kernel would round it to) to the attention's output [B, T, N·H] of `out_dtype` (float32
  or bfloat16; values of `dtype`), and the caches k, v [B, K, S, H] (float32 or bfloat16)
  with the T new keys and values from slot `index` (written in place: the call aliases them).

  What `lm.model.decoder_layer` computes there in `dtype` (float32 or bfloat16), each op's result
  rounded as its ops round: the product's output (plus `bias` [N + 2K, H]), queries and keys
  through their RMSNorm (`q_norm`, `k_norm` [H], with `eps`; None: no norm) and rope (cos and sin
  [B, T, H], rotate-half's sign not folded in), the keys and values into the cache, the attention
  where mask [B, T, M] (scores scaled by H^-0.5, softmax in float32). T = 1 (a decode step): over
  the cache's first M slots as it holds them. T > 1 (a prefill: `index` 0, M = T): over the T new
  keys and values as `dtype` has them. Call only for a trace for XLA:CPU where `available()`
  (`lm.model` does, inside `cpu_attention`)."""
  b, t, width = qkv.shape
  kv_heads, h = k.shape[1], k.shape[3]
  n = width // h - 2 * kv_heads
  if (
    k.dtype != v.dtype
    or k.dtype not in DTYPES
    or jnp.dtype(dtype) not in DTYPES
    or (q_norm is None) != (k_norm is None)
  ):
    raise ValueError(
      f"attention_block: caches {k.dtype}/{v.dtype} and dtype {dtype} must be float32 or bfloat16,"
      " and q_norm and k_norm both given or neither"
    )
  empty = jnp.zeros((0,), dtype)
  if jnp.dtype(out_dtype) not in DTYPES or qkv.dtype not in DTYPES:
    raise ValueError(
      f"attention_block: qkv {qkv.dtype} and out_dtype {out_dtype} must be float32 or bfloat16"
    )
  shapes = (
    jax.ShapeDtypeStruct((b, t, n * h), out_dtype),
    jax.ShapeDtypeStruct(k.shape, k.dtype),
    jax.ShapeDtypeStruct(v.shape, v.dtype),
  )
  call = jax.ffi.ffi_call(TARGET_ATTENTION_BLOCK, shapes, input_output_aliases={6: 1, 7: 2})
  return call(
    qkv,
    empty if bias is None else bias.astype(dtype),
    empty if q_norm is None else q_norm.astype(dtype),
    empty if k_norm is None else k_norm.astype(dtype),
    cos.astype(dtype),
    sin.astype(dtype),
    k,
    v,
    jnp.asarray(index, jnp.int32),
    mask.astype(bool),
    scale=np.float32(h**-0.5),
    eps=np.float32(eps),
    bf16=bool(jnp.dtype(dtype) == jnp.bfloat16),
    norm=q_norm is not None,
    bias=bias is not None,
    threads=np.int64(threads),
  )


def reference_decode_attention(q: Array, k: Array, v: Array, mask: Array, scale: float) -> Array:
  """`decode_attention` in XLA's ops: q [B, K, G, H] against k, v [B, K, S, H], mask [B, S] ->
  [B, K, G, H] float32, scores and products as multiply-reduces in float32 (XLA:CPU runs a batched
  [G, H] x [H, S] product as a slow generic dot; see `lm.model.attention`)."""
  products = q[:, :, :, None, :].astype(jnp.float32) * k[:, :, None].astype(jnp.float32)  # [B, K, G, S, H]
  scores = jnp.sum(products, axis=-1) * scale  # [B, K, G, S]
  scores = jnp.where(mask[:, None, None, :], scores, NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  weighted = probs[..., None].astype(jnp.float32) * v[:, :, None].astype(jnp.float32)  # [B, K, G, S, H]
  return jnp.sum(weighted, axis=3)


def sequence_attention(
  q: Array, k: Array, v: Array, mask: Array, scale: float, threads: int = -1
) -> tuple[Array, Array]:
  """Whole sequences' grouped-query attention by the library's kernel (`lm/cpu_gemm.cc`
  AttentionImpl): q [B, T, K, G, H], k and v [B, K, S, H] float32, mask [B, T, S] (True where query
  t may read key s) -> (out [B, T, K, G, H] float32, lse [B, T, K, G]: each query's log-sum-exp of
  its scores, which `sequence_attention_bwd` recomputes the probabilities from). Scores (times
  `scale`) and softmax in float32; a query with no key attends every key uniformly, as the model's
  softmax over kNegInf scores does. Call only where `available()`, in a program for XLA:CPU."""
  b, t, kv, g, _ = q.shape
  shapes = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct((b, t, kv, g), jnp.float32))
  call = jax.ffi.ffi_call(TARGET_SEQUENCE_ATTENTION, shapes)
  return call(q, k, v, mask.astype(bool), scale=np.float32(scale), threads=np.int64(threads))


def sequence_attention_bwd(
  q: Array,
  k: Array,
  v: Array,
  mask: Array,
  out: Array,
  lse: Array,
  cotangent: Array,
  scale: float,
  threads: int = -1,
) -> tuple[Array, Array, Array]:
  """The gradient of `sequence_attention`'s out with respect to q, k and v (float32, their shapes),
  given its inputs, its out and lse, and out's cotangent. Masked scores pass no gradient (the
  model's `where`). Call only where `available()`."""
  shapes = tuple(jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in (q, k, v))
  call = jax.ffi.ffi_call(TARGET_SEQUENCE_ATTENTION_BWD, shapes)
  return call(
    q, k, v, mask.astype(bool), out, lse, cotangent, scale=np.float32(scale), threads=np.int64(threads)
  )


def main() -> None:
  """`python -m lm.cpu_gemm [DIR]`: builds the library (scripts/setup_env.sh runs this)."""
  print(build(sys.argv[1] if len(sys.argv) > 1 else None))


if __name__ == "__main__":
  main()
