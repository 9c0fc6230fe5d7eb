"""The CPU kernel (`lm.cpu_gemm`): built at install time, exact to float32 round-off against a
float64 product on every row count (decode's few, prefill's hundreds) and ragged shape, XLA's dot
wherever it does not apply, and the sampler's tokens and log-probs unchanged by it."""

import ctypes
import dataclasses
import platform
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lm import cpu_gemm
from lm import sampler as sampler_lib
from lm.config import ModelConfig
from lm.model import Qwen

x86_linux = platform.machine() == "x86_64" and sys.platform == "linux"
pytestmark = pytest.mark.skipif(not x86_linux, reason="the kernel is built and tested on x86-64 Linux")

# (K, N): decode-like shapes, N below / not a multiple of a block (64 or 16 columns), N above one
# work chunk (4096 columns), K above and not a multiple of a k-chunk (3072 or 512 rows), K = 1.
SHAPES = [(64, 1024), (100, 7), (1000, 4149), (3, 130), (1, 33), (300, 9000), (37, 64), (600, 40), (3100, 70)]
ROWS = [*range(1, 17), 64, 129]  # a decode step's rows, and a prefill's (several tiles, a ragged one)


def _relative_error(
  rows: int, k: int, n: int, product, seed: int = 0, block_width=None, dtype=jnp.float32
) -> float:
  """max |product(x, pack(w, block_width)) - x @ w (float64)| / max |x @ w|, w in `dtype` (the
  float64 product of the same bfloat16 values for a bfloat16 w)."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((rows, k), np.float32)
  w = jnp.asarray((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)).astype(dtype)
  want = x.astype(np.float64) @ np.asarray(w.astype(jnp.float32)).astype(np.float64)
  got = np.asarray(jax.jit(product)(x, cpu_gemm.pack(w, block_width)))
  assert got.shape == want.shape and got.dtype == np.float32
  return float(np.abs(got - want).max() / np.abs(want).max())


def test_the_kernel_is_built_at_install_time():
  # scripts/setup_env.sh runs `python -m lm.cpu_gemm`; without it the sampler silently keeps XLA's dot.
  assert cpu_gemm.library_path().exists() and cpu_gemm.available()


def test_packing_round_trips():
  w = jax.random.normal(jax.random.key(0), (37, 130))
  packed = cpu_gemm.pack(w, 64)
  assert packed.blocks.shape == (3, 37, 64) and packed.shape == (37, 130)
  assert np.array_equal(packed.unpack(), w) and not np.any(packed.blocks[2, :, 2:])
  packed = cpu_gemm.pack(w, 16)
  assert packed.blocks.shape == (9, 37, 16) and np.array_equal(packed.unpack(), w)
  assert cpu_gemm.pack(w).blocks.shape[2] == cpu_gemm.block() in (16, 64)  # what the kernel reads
  half = cpu_gemm.pack(w.astype(jnp.bfloat16), 64)  # bfloat16 packs as it is: half the bytes
  assert half.dtype == jnp.bfloat16 and np.array_equal(half.unpack(), w.astype(jnp.bfloat16))
  with pytest.raises(ValueError, match="float32 or bfloat16"):
    cpu_gemm.pack(w.astype(jnp.float16))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("threads", [1, 2, 3, -1])
def test_every_row_count_and_ragged_shape_matches_float64(threads, dtype):
  # bfloat16 weights: widened exactly and summed in float32, so as close to the float64 product of
  # the same bf16 values as float32 weights are to theirs. Rows up to KERNEL_MAX_ROWS_BF16 run
  # the kernel, more (64, 129) XLA's dot on the blocks (`test_bf16_products_...` below).
  worst = 0.0
  for rows in ROWS:
    for k, n in SHAPES:
      product = lambda x, w: cpu_gemm.matmul(x, w, threads=threads)
      worst = max(worst, _relative_error(rows, k, n, product, seed=rows, dtype=dtype))
  # float32 round-off over K <= 1000 terms (XLA's own dot is ~1e-6 on these; a wrong column,
  # row or k-chunk would be O(1)).
  assert worst < 1e-5, worst


def _has_avx2() -> bool:
  return {"avx2", "fma"} <= set(cpu_gemm._cpu_flags().split())


@pytest.mark.parametrize(
  "name, flags, width",
  [
    pytest.param(
      "avx2", ("-mno-avx512f",), 16, marks=pytest.mark.skipif(not _has_avx2(), reason="this CPU has no AVX2")
    ),
    ("portable", ("-mno-avx512f", "-mno-avx2", "-mno-fma"), 64),
  ],
)
def test_the_paths_without_avx512_match_float64(tmp_path, name, flags, width):
  """The AVX2 micro-kernel and the plain C++ one (machines without AVX-512), each built and
  registered on its own, with its own block width."""
  target = f"lm_cpu_gemm_packed_f32_{name}"
  library = cpu_gemm.build(tmp_path, extra_flags=flags)
  assert cpu_gemm.register(target, library) == width
  assert cpu_gemm.register(f"{target}_bf16", library, "bfloat16") == width
  no_dot = ctypes.cdll.LoadLibrary(str(library)).LmCpuGemmBF16Dot
  no_dot.restype = ctypes.c_int64
  assert no_dot() == 0  # no AVX-512 build has the VDPBF16PS products (they refuse the call)
  for rows in (1, 4, 5, 8, 13, 16, 129):
    for k, n in SHAPES:
      for threads in (1, 2):
        for dtype, name in ((jnp.float32, target), (jnp.bfloat16, f"{target}_bf16")):
          product = lambda x, w, t=threads, name=name: cpu_gemm.call(name, x, w.blocks, t, w.n)
          assert _relative_error(rows, k, n, product, seed=rows, block_width=width, dtype=dtype) < 1e-5
  # the decode attention's plain loops (no AVX-512: every head dim), over a float32 and a bf16 cache
  handle = ctypes.cdll.LoadLibrary(str(library))
  rng = np.random.default_rng(1)
  for symbol, cache in (("LmCpuDecodeAttention", jnp.float32), ("LmCpuDecodeAttentionBF16", jnp.bfloat16)):
    attention = f"{symbol}_{name}"
    jax.ffi.register_ffi_target(attention, jax.ffi.pycapsule(getattr(handle, symbol)), platform="cpu")
    for b, heads, g, s, h in [(2, 2, 2, 9, 128), (1, 3, 3, 5, 8)]:
      q = jnp.asarray(rng.standard_normal((b, heads, g, h)), jnp.float32)
      k, v = (jnp.asarray(rng.standard_normal((b, heads, s, h)), cache) for _ in range(2))
      mask = jnp.asarray(rng.random((b, s)) < 0.6).at[:, -1].set(True)
      call = jax.ffi.ffi_call(attention, jax.ShapeDtypeStruct(q.shape, jnp.float32))
      got = call(q, k, v, mask, scale=np.float32(h**-0.5), threads=np.int64(2))
      wide = (k.astype(jnp.float32), v.astype(jnp.float32))
      want = cpu_gemm.reference_decode_attention(q, *wide, mask, h**-0.5)
      np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6)
  # a weight packed for the other width is refused, naming the block width, not multiplied wrongly
  wrong = cpu_gemm.pack(jnp.ones((8, 40)), 64 if width == 16 else 16)
  with pytest.raises(jax.errors.JaxRuntimeError, match="block width"):
    jax.block_until_ready(cpu_gemm.call(target, jnp.ones((2, 8)), wrong.blocks, 1, wrong.n))


def test_batched_rows_keep_their_shape_and_plain_weights_use_xla():
  x = jax.random.normal(jax.random.key(0), (2, 3, 40))  # [B, T, K]: 6 rows
  w = jax.random.normal(jax.random.key(1), (40, 70))
  want = jnp.einsum("btk,kn->btn", x, w)
  np.testing.assert_allclose(jax.jit(cpu_gemm.matmul)(x, cpu_gemm.pack(w)), want, rtol=1e-5, atol=1e-5)
  assert cpu_gemm.TARGET in jax.jit(cpu_gemm.matmul).lower(x, cpu_gemm.pack(w)).as_text()
  # a plain [K, N] weight is jnp.matmul, dtype rules included
  assert cpu_gemm.TARGET not in jax.jit(cpu_gemm.matmul).lower(x, w).as_text()
  bf16 = x.astype(jnp.bfloat16)
  assert cpu_gemm.matmul(bf16, w.astype(jnp.bfloat16)).dtype == jnp.bfloat16
  as_f32 = cpu_gemm.matmul(bf16, w.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
  assert as_f32.dtype == jnp.float32
  with pytest.raises(ValueError, match="float32 rows"):
    cpu_gemm.matmul(bf16, cpu_gemm.pack(w))


def _calls(lowered: str, target: str) -> bool:
  """Whether a lowered program calls the FFI target by that exact name (one name prefixes another)."""
  return f"@{target}(" in lowered


def test_bf16_products_keep_jnp_dtypes_and_choose_the_kernel_by_rows():
  # A bf16 x packed-bf16 product is bf16 (float32 when asked), like jnp.matmul; up to
  # KERNEL_MAX_ROWS_BF16 rows it is the kernel, above them the VDPBF16PS kernel where the build has
  # it (else XLA's dot on the blocks), and each equals the float32-summed product rounded once (the
  # model's own `lm.model.matmul`) to a bf16 step.
  w = jax.random.normal(jax.random.key(1), (96, 200)).astype(jnp.bfloat16)
  packed = cpu_gemm.pack(w)
  above = cpu_gemm.TARGET_BF16_DOT if cpu_gemm.bf16_dot() else None
  for rows, target in (
    (cpu_gemm.KERNEL_MAX_ROWS_BF16, cpu_gemm.TARGET_BF16),
    (cpu_gemm.KERNEL_MAX_ROWS_BF16 + 1, above),
  ):
    x = jax.random.normal(jax.random.key(rows), (rows, 96)).astype(jnp.bfloat16)
    lowered = jax.jit(cpu_gemm.matmul).lower(x, packed).as_text()
    for name in (cpu_gemm.TARGET_BF16, cpu_gemm.TARGET_BF16_DOT):
      assert _calls(lowered, name) == (name == target), (rows, name)
    # float32 rows against a bf16 weight never go to the VDPBF16PS kernel (it would round them)
    wide_rows = jax.jit(cpu_gemm.matmul).lower(x.astype(jnp.float32), packed).as_text()
    assert not _calls(wide_rows, cpu_gemm.TARGET_BF16_DOT)
    got = jax.jit(cpu_gemm.matmul)(x, packed)
    assert got.dtype == jnp.bfloat16
    want = jnp.matmul(x, w, preferred_element_type=jnp.float32)
    np.testing.assert_allclose(got.astype(jnp.float32), want, rtol=2**-7, atol=1e-6)
    wide = cpu_gemm.matmul(x, packed, preferred_element_type=jnp.float32)
    assert wide.dtype == jnp.float32
    np.testing.assert_allclose(wide, want, rtol=1e-5, atol=1e-5)


_BF16_DOT = pytest.mark.skipif(not cpu_gemm.bf16_dot(), reason="this CPU (or build) has no AVX512_BF16")


@_BF16_DOT
@pytest.mark.parametrize("threads", [1, 2, -1])
def test_the_bf16_dot_kernel_matches_float64_and_rounds_as_a_cast(threads):
  # bf16 rows x packed bf16 weight by VDPBF16PS: float32 sums of exact bf16 products, so within
  # float32 round-off of the float64 product of the same values. Rows not a multiple of the 6-row
  # tile, columns not of the 64-column block, odd K (the last k paired with zeros), K = 1.
  rng = np.random.default_rng(threads + 10)
  worst = 0.0
  for rows in (25, 31, 64, 129, 256):
    for k, n in ((64, 1024), (1000, 4149), (3, 130), (1, 33), (37, 64), (600, 40), (255, 200)):
      x = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
      w = jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), jnp.bfloat16)
      want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
      blocks = cpu_gemm.pack(w).blocks
      got = np.asarray(cpu_gemm.call(cpu_gemm.TARGET_BF16_DOT, x, blocks, threads, n))
      assert got.shape == want.shape and got.dtype == np.float32
      worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
      # its bfloat16 output is its float32 output rounded as a cast rounds (to nearest even)
      short = cpu_gemm.call(cpu_gemm.TARGET_BF16_DOT, x, blocks, threads, n, jnp.bfloat16)
      assert short.dtype == jnp.bfloat16
      np.testing.assert_array_equal(np.asarray(short), np.asarray(jnp.asarray(got).astype(jnp.bfloat16)))
  # float32 round-off over K <= 1000 terms; a wrong pairing, column order or row would be O(1)
  assert worst < 1e-5, worst
  # control: the same check sees a product with one k-pair's halves swapped (w's rows 0 and 1)
  x = jnp.asarray(rng.standard_normal((30, 64)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((64, 70)), jnp.bfloat16)
  swapped = np.asarray(
    cpu_gemm.call(
      cpu_gemm.TARGET_BF16_DOT, x, cpu_gemm.pack(w[jnp.array([1, 0, *range(2, 64)])]).blocks, 1, 70
    )
  )
  want = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  assert np.abs(swapped - want).max() / np.abs(want).max() > 1e-2


@_BF16_DOT
@pytest.mark.parametrize("threads", [1, 2, -1])
def test_the_swiglu_kernel_matches_the_gated_products(threads):
  # silu(x @ gate) * (x @ up) summed and gated in float32, rounded once to bf16, as the model's MLP
  # does on XLA:CPU: equal to that to the bit but for a rare one-step rounding (another sum order,
  # another exp); rows not a multiple of the 6-row tile, odd K.
  rng = np.random.default_rng(threads + 20)
  for rows, k, f in ((25, 64, 64), (31, 33, 128), (129, 255, 192), (256, 1024, 3072)):
    x = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
    w = jnp.asarray(3 * rng.standard_normal((k, 2 * f)) / np.sqrt(k), jnp.bfloat16)  # gates of both signs
    packed = cpu_gemm.pack(w)
    assert cpu_gemm.swiglu_applies(x, packed)
    got = np.asarray(jax.jit(cpu_gemm.swiglu, static_argnums=2)(x, packed, threads), np.float32)
    gate, up = jnp.split(jnp.matmul(x, w, preferred_element_type=jnp.float32), 2, axis=-1)
    want = np.asarray((jax.nn.silu(gate) * up).astype(jnp.bfloat16), np.float32)
    assert got.shape == (rows, f) and np.mean(got == want) > 0.999, np.mean(got == want)
    np.testing.assert_allclose(got, want, rtol=2**-7, atol=1e-6 * np.abs(want).max())
  # control: gate and up swapped (the halves of the weight) fail the same check
  swapped = cpu_gemm.pack(jnp.concatenate(jnp.split(w, 2, axis=1)[::-1], axis=1))
  assert np.mean(np.asarray(cpu_gemm.swiglu(x, swapped, threads), np.float32) == want) < 0.5
  # where the kernel does not apply: few rows, float32 rows, a row-major weight, F not of 64 columns
  narrow = cpu_gemm.pack(jnp.ones((64, 2 * 96), jnp.bfloat16))
  assert not cpu_gemm.swiglu_applies(x[: cpu_gemm.KERNEL_MAX_ROWS_BF16], packed)
  assert not cpu_gemm.swiglu_applies(x.astype(jnp.float32), packed)
  assert not cpu_gemm.swiglu_applies(x, w)
  assert not cpu_gemm.swiglu_applies(jnp.ones((30, 64), jnp.bfloat16), narrow)
  with pytest.raises(ValueError, match="does not apply"):
    cpu_gemm.swiglu(jnp.ones((30, 64), jnp.bfloat16), narrow)


@_BF16_DOT
def test_a_bf16_prefill_layer_runs_the_bf16_kernels_and_matches_xla():
  # A bf16 prefill's layer on packed weights (the sampler's): the QKV, output and down products by
  # the VDPBF16PS kernel, the gate/up product and its gating by the SwiGLU kernel; against the same
  # layer in XLA's ops (the weights row-major, the kernels off).
  from lm import model as model_lib

  config = ModelConfig.tiny_qwen3()
  w, _, _, _, _, _ = _decode_block_case(config, "bfloat16", "bfloat16")
  packed = {k: cpu_gemm.pack(v) if k in model_lib.FUSED_PRODUCTS else v for k, v in w.items()}
  rng = np.random.default_rng(2)
  b, t, h = 3, 16, config.head_dim
  x = jnp.asarray(rng.standard_normal((b, t, config.hidden_size)), jnp.bfloat16)
  kv = {name: jnp.zeros((b, config.num_kv_heads, t + 3, h), jnp.bfloat16) for name in ("k", "v")}
  key_mask = jnp.asarray(np.arange(t + 3)[None] < t).repeat(b, 0)
  positions = model_lib.default_positions(key_mask)[:, :t]

  def layer(x, kv, on):
    weights, matmul = (packed, cpu_gemm.matmul) if on else (w, model_lib.matmul)
    with model_lib.cpu_attention(-1 if on else 0):
      rotary = model_lib.rope_table(positions, h, config.rope_theta, jnp.bfloat16)
      mask = model_lib._attention_mask(key_mask[:, :t], t, 0)
      return model_lib.decoder_layer(config, weights, x, rotary, mask, kv, 0, jnp.bfloat16, matmul=matmul)

  text = jax.jit(layer, static_argnums=2).lower(x, kv, True).as_text()
  assert _calls(text, cpu_gemm.TARGET_SWIGLU_BF16) and _calls(text, cpu_gemm.TARGET_BF16_DOT)
  assert _calls(text, cpu_gemm.TARGET_ATTENTION_BLOCK)
  (got, got_kv), (want, want_kv) = (jax.jit(layer, static_argnums=2)(x, kv, on) for on in (True, False))
  f32 = lambda a: np.asarray(a, np.float32)
  assert got.dtype == want.dtype == jnp.bfloat16
  assert np.abs(f32(got) - f32(want)).max() <= 2e-2 * np.abs(f32(want)).max()
  np.testing.assert_allclose(f32(got_kv["k"]), f32(want_kv["k"]), rtol=1e-2, atol=1e-2)


@_BF16_DOT
def test_a_bf16_sampler_needs_no_row_major_copy_with_the_bf16_dot_kernel():
  # The prefill's products read the packed blocks themselves: no second bf16 copy of each weight.
  model = Qwen(ModelConfig.tiny_qwen3(), rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16)
  sampler = sampler_lib.Sampler(model)
  packed = [
    w for layer in sampler._layer_weights for w in layer.values() if isinstance(w, cpu_gemm.PackedWeight)
  ]
  assert packed and all(w.matrix is None and w.dtype == jnp.bfloat16 for w in packed)


def test_a_failed_build_names_the_source_and_the_compiler_output(tmp_path, monkeypatch):
  monkeypatch.setenv("CXX", "g++")
  path = cpu_gemm.build(tmp_path)
  assert path.parent == tmp_path and path.name.startswith("libcpu_gemm-")
  assert cpu_gemm.build(tmp_path) == path  # built once: the same name, nothing recompiled
  with pytest.raises(RuntimeError, match="cpu_gemm.cc failed"):
    cpu_gemm.build(tmp_path, extra_flags=("-DLM_NOT_A_FLAG", "-fno-such-option"))
  monkeypatch.setenv("CXX", str(tmp_path / "no-compiler-here"))
  with pytest.raises(RuntimeError, match="no-compiler-here"):
    cpu_gemm.build(tmp_path / "other")
  assert not list((tmp_path / "other").glob("*")), "a failed build leaves nothing behind"


@pytest.mark.parametrize(
  "param_dtype, dtype, atol",
  [(jnp.float32, jnp.float32, 1e-4), (jnp.bfloat16, jnp.bfloat16, 0.05), (jnp.float32, jnp.bfloat16, 0.05)],
)
def test_sampler_tokens_and_logprobs_do_not_depend_on_the_kernel(param_dtype, dtype, atol):
  # bfloat16: the kernel and XLA's dot both sum in float32 and round once, in other orders, so a
  # product may differ by one bf16 step: log-probs agree to a few hundredths, tokens exactly here.
  # float32 weights with bfloat16 products (a trainer's master weights) are packed in bfloat16.
  model = Qwen(ModelConfig.tiny_qwen3(), rngs=nnx.Rngs(0), param_dtype=param_dtype, dtype=dtype)
  prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [3]]
  outputs = {}
  for threads in (0, 1, 2):
    sampler = sampler_lib.Sampler(model, config=sampler_lib.SamplerConfig(cpu_gemm_threads=threads))
    assert isinstance(sampler._head_dv, cpu_gemm.PackedWeight) == (threads != 0)
    assert sampler._head_dv.dtype == (dtype if threads else param_dtype)
    outputs[threads] = sampler.generate(prompts, max_new_tokens=12, n=2, temperature=0.0)
  for threads in (1, 2):
    assert outputs[threads].tokens == outputs[0].tokens
    np.testing.assert_allclose(
      np.concatenate([np.ravel(lp) for p in outputs[threads].logprobs for lp in p]),
      np.concatenate([np.ravel(lp) for p in outputs[0].logprobs for lp in p]),
      atol=atol,
    )
  with pytest.raises(ValueError, match="cpu_gemm_threads"):
    sampler_lib.SamplerConfig(cpu_gemm_threads=-2)


@pytest.mark.parametrize("cache", ["float32", "bfloat16"])
@pytest.mark.parametrize("threads", [1, -1])
@pytest.mark.parametrize(
  "b, heads, g, s, h",
  [
    (4, 8, 2, 128, 128),
    (3, 2, 1, 7, 16),
    (2, 1, 4, 33, 64),
    (1, 3, 3, 1, 8),
    (2, 2, 5, 9, 32),
    (1, 2, 3, 6, 256),
  ],
)
def test_the_decode_attention_kernel_matches_the_reference(cache, threads, b, heads, g, s, h):
  # lm.model.decode_attention: the kernel for the sampler's decode steps (a float32 or bf16 cache),
  # XLA's multiply-reduce elsewhere; one query per kv head or several (odd counts: the register
  # tiles' last partial group), odd key counts, masked keys, head dims that are a multiple of 16
  # (the tiled path: 128, 64, 16 and 32, 256) or not (8: the plain loops).
  from lm import model as model_lib

  assert cpu_gemm.available()
  rng = np.random.default_rng(s)
  q = jnp.asarray(rng.standard_normal((b, heads, g, h)), jnp.float32)
  k, v = (jnp.asarray(rng.standard_normal((b, heads, s, h)), cache) for _ in range(2))
  mask = jnp.asarray(rng.random((b, s)) < 0.6).at[:, -1].set(True)
  scale = h**-0.5
  # a bf16 key or value is exact in float32: the kernel widens it, so its values are the
  # reference's over the float32 copy (the reference over bf16 itself rounds the probabilities)
  want = cpu_gemm.reference_decode_attention(q, k.astype(jnp.float32), v.astype(jnp.float32), mask, scale)
  got = jax.jit(lambda *a: cpu_gemm.decode_attention(*a, scale, threads))(q, k, v, mask)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6)
  # a masked key's value changes nothing: the kernel reads the mask
  v_masked = v.at[:, :, 0].set(jnp.where(mask[:, None, 0, None], v[:, :, 0], 1e6))
  again = cpu_gemm.decode_attention(q, k, v_masked, mask, scale, threads)
  np.testing.assert_allclose(np.asarray(again), np.asarray(got), atol=2e-6)
  # no key at all: every key weighs alike, as the model's softmax does
  none = jnp.zeros_like(mask)
  uniform = cpu_gemm.decode_attention(q, k, v, none, scale, threads)
  want_uniform = jnp.broadcast_to(jnp.mean(v.astype(jnp.float32), axis=2, keepdims=True), (b, heads, g, h))
  np.testing.assert_allclose(np.asarray(uniform), np.asarray(want_uniform), atol=2e-6)

  def loss(q, k, v, kernel):
    with model_lib.cpu_attention(threads if kernel else 0):
      return jnp.sum(model_lib.decode_attention(q, k, v, mask, scale) ** 2)

  target = cpu_gemm.TARGET_ATTENTION_BF16 if cache == "bfloat16" else cpu_gemm.TARGET_ATTENTION
  assert target in jax.jit(lambda *a: loss(*a, True)).lower(q, k, v).as_text()
  assert "lm_cpu_decode_attention" not in jax.jit(lambda *a: loss(*a, False)).lower(q, k, v).as_text()
  grads = [jax.grad(loss, argnums=(0, 1, 2))(q, k, v, kernel) for kernel in (True, False)]
  # (bf16: the reference's own probabilities are rounded to bf16, so the two differ at its precision)
  tol = dict(atol=1e-5) if cache == "float32" else dict(rtol=0.03, atol=0.03)
  for a, c in zip(*grads, strict=True):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(c, np.float32), **tol)
  with pytest.raises(ValueError, match="both be float32 or bfloat16"):
    cpu_gemm.decode_attention(q, k, v.astype(jnp.float16), mask, scale, threads)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_cache_write_kernel_equals_a_dynamic_update_slice_in_place(dtype):
  # lm.model.cache_write: a bf16 KV cache's write in place by the kernel (XLA:CPU would run the
  # dynamic-update-slice in float32 over the whole cache), one slot or several, the start clamped
  # as XLA's (an index past S - T writes the last T slots); an operand that is not donated keeps
  # its values (XLA gives the result a buffer of its own, and the kernel copies the cache there).
  from lm import model as model_lib

  assert cpu_gemm.available()
  rng = np.random.default_rng(0)
  cache = jnp.asarray(rng.standard_normal((2, 3, 10, 16)), dtype)
  before = np.asarray(cache, np.float32)
  for t, index in [(1, 0), (1, 7), (4, 3), (4, 9), (10, 0)]:
    update = jnp.asarray(rng.standard_normal((2, 3, t, 16)), dtype)
    want = jax.lax.dynamic_update_slice_in_dim(cache, update, index, axis=2)
    got = jax.jit(cpu_gemm.cache_write)(cache, update, index)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
  np.testing.assert_array_equal(np.asarray(cache, np.float32), before)

  # in a loop, as the decode steps write: slot i gets i + 1, every slot once
  def steps(cache, kernel):
    def body(i, c):
      row = jnp.full((2, 3, 1, 16), i + 1, jnp.float32).astype(c.dtype)
      with model_lib.cpu_attention(-1 if kernel else 0):
        return model_lib.cache_write(c, row, i)

    return jax.lax.fori_loop(0, 10, body, cache)

  looped = {kernel: jax.jit(steps, static_argnums=1)(cache, kernel) for kernel in (True, False)}
  np.testing.assert_array_equal(np.asarray(looped[True], np.float32), np.asarray(looped[False], np.float32))
  np.testing.assert_array_equal(np.asarray(looped[True], np.float32)[0, 0, :, 0], np.arange(1, 11))
  text = jax.jit(steps, static_argnums=1).lower(cache, True).as_text()
  assert (cpu_gemm.TARGET_CACHE_WRITE in text) == (dtype == "bfloat16")  # float32's write stays XLA's
  with pytest.raises(ValueError, match="not the cache's"):
    cpu_gemm.cache_write(cache, jnp.zeros((2, 3, 1, 16), jnp.float16), 0)


def _decode_block_case(config, dtype, cache, seed=0):
  """A decode step of `config`'s first layer (fused weights, every weight random: norms and biases
  too) at slot 5 of a cache of 9 with keys 0..5 readable (row 1: slot 2 padding), and its inputs."""
  from lm import model as model_lib

  rng = np.random.default_rng(seed)
  model = Qwen(config, rngs=nnx.Rngs(seed), param_dtype=jnp.float32, dtype=dtype)
  stacked = {}
  for name, w in model.stacked_layer_weights().items():
    noise = rng.standard_normal(w.shape).astype(np.float32)
    stacked[name] = (
      (1 + 0.2 * noise) if "norm" in name else noise * (0.3 if "bias" in name else w.shape[1] ** -0.5)
    )
  w = {name: jnp.asarray(a, dtype) for name, a in model_lib.fuse_projections(stacked)[0].items()}
  b, s, k, h = 3, 9, config.num_kv_heads, config.head_dim
  x = jnp.asarray(rng.standard_normal((b, 1, config.hidden_size)), dtype)
  kv = {name: jnp.asarray(rng.standard_normal((b, k, s, h)), cache) for name in ("k", "v")}
  key_mask = jnp.asarray(np.arange(s)[None] <= 5).repeat(b, 0).at[1, 2].set(False)
  index = jnp.int32(5)
  positions = model_lib.default_positions(key_mask)[:, 5:6] + jnp.arange(b)[:, None] * 40  # [B, 1]
  return w, x, kv, key_mask, index, positions


@pytest.mark.parametrize("cache", ["float32", "bfloat16"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
  "family, heads, kv_heads, h",
  [("qwen3", 16, 8, 128), ("qwen3", 6, 2, 16), ("qwen2", 4, 4, 8), ("qwen3", 9, 3, 64)],
)
@pytest.mark.parametrize("threads", [1, -1])
def test_the_decode_block_kernel_matches_the_layer_it_replaces(
  threads, family, heads, kv_heads, h, dtype, cache
):
  # lm.model._attention_block: a decode step's QKV output through the norms (Qwen3) or biases (Qwen2),
  # rope, the cache writes and the attention in one kernel, against the same layer with the kernels
  # off (XLA's ops). Every op rounds to the compute dtype as XLA's do; the norm's sum and rsqrt
  # differ in order and round-off, so in bf16 a value may land one bf16 step away (~0.4%).
  from lm import model as model_lib

  base = ModelConfig.tiny_qwen3() if family == "qwen3" else ModelConfig.tiny_qwen2()
  config = dataclasses.replace(base, num_heads=heads, num_kv_heads=kv_heads, head_dim=h)
  w, x, kv, key_mask, index, positions = _decode_block_case(config, dtype, cache)

  def layer(x, kv, on):
    with model_lib.cpu_attention(threads if on else 0):
      rotary = model_lib.rope_table(positions, h, config.rope_theta, dtype)
      mask = model_lib._attention_mask(key_mask, 1, index)
      return model_lib.decoder_layer(config, w, x, rotary, mask, kv, index, dtype)

  (got, got_kv), (want, want_kv) = (jax.jit(layer, static_argnums=2)(x, kv, on) for on in (True, False))
  text = jax.jit(layer, static_argnums=2).lower(x, kv, True).as_text()
  assert cpu_gemm.TARGET_ATTENTION_BLOCK in text and "lm_cpu_decode_attention" not in text
  assert cpu_gemm.TARGET_ATTENTION_BLOCK not in jax.jit(layer, static_argnums=2).lower(x, kv, False).as_text()
  assert got.dtype == want.dtype and got_kv["k"].dtype == jnp.dtype(cache)
  f32 = lambda a: np.asarray(a, np.float32)
  for name in ("k", "v"):  # every other slot as it was; the step's slot the layer's key and value
    np.testing.assert_array_equal(
      np.delete(f32(got_kv[name]), 5, axis=2), np.delete(f32(kv[name]), 5, axis=2)
    )
    tol = (
      dict(rtol=1e-5, atol=1e-5) if dtype == "float32" and cache == "float32" else dict(rtol=1e-2, atol=1e-2)
    )
    np.testing.assert_allclose(f32(got_kv[name])[:, :, 5], f32(want_kv[name])[:, :, 5], **tol)
  if dtype == "bfloat16" or cache == "bfloat16":  # most values exact, the others one rounding away
    assert np.mean(f32(got_kv["k"])[:, :, 5] == f32(want_kv["k"])[:, :, 5]) > 0.9
  scale = np.abs(f32(want)).max()
  assert np.abs(f32(got) - f32(want)).max() <= (1e-5 if dtype == "float32" else 2e-2) * scale


@pytest.mark.parametrize("cache", ["float32", "bfloat16"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
  "family, heads, kv_heads, h, t",
  [("qwen3", 16, 8, 128, 7), ("qwen3", 6, 2, 16, 70), ("qwen2", 4, 4, 8, 9)],
)
def test_the_attention_block_kernel_matches_the_prefill_it_replaces(
  family, heads, kv_heads, h, t, dtype, cache
):
  # lm.model._attention_block at a prefill: T prompt tokens a row (row 1 left-padded by 2: its first
  # queries attend no key) from slot 0 of a cache with 3 slots more, against the same layer with the
  # kernels off (XLA's ops). T 70: the keys in two blocks of 64, the second ragged.
  from lm import model as model_lib

  base = ModelConfig.tiny_qwen3() if family == "qwen3" else ModelConfig.tiny_qwen2()
  config = dataclasses.replace(base, num_heads=heads, num_kv_heads=kv_heads, head_dim=h)
  w, _, kv, _, _, _ = _decode_block_case(config, dtype, cache)
  rng = np.random.default_rng(1)
  b, s = 3, t + 3
  x = jnp.asarray(rng.standard_normal((b, t, config.hidden_size)), dtype)
  kv = {name: jnp.asarray(rng.standard_normal((b, kv_heads, s, h)), cache) for name in ("k", "v")}
  key_mask = jnp.asarray(np.arange(s)[None] < t).repeat(b, 0).at[1, :2].set(False)
  positions = model_lib.default_positions(key_mask)[:, :t]

  def layer(x, kv, on):
    with model_lib.cpu_attention(-1 if on else 0):
      rotary = model_lib.rope_table(positions, h, config.rope_theta, dtype)
      mask = model_lib._attention_mask(key_mask[:, :t], t, 0)
      return model_lib.decoder_layer(config, w, x, rotary, mask, kv, 0, dtype)

  (got, got_kv), (want, want_kv) = (jax.jit(layer, static_argnums=2)(x, kv, on) for on in (True, False))
  text = jax.jit(layer, static_argnums=2).lower(x, kv, True).as_text()
  assert (
    f"@{cpu_gemm.TARGET_ATTENTION_BLOCK}(" in text and f"@{cpu_gemm.TARGET_SEQUENCE_ATTENTION}(" not in text
  )
  assert got.dtype == want.dtype and got_kv["k"].dtype == jnp.dtype(cache)
  f32 = lambda a: np.asarray(a, np.float32)
  exact = dtype == "float32" and cache == "float32"
  for name in ("k", "v"):  # the slots after the prompt as they were; the prompt's the layer's
    np.testing.assert_array_equal(f32(got_kv[name])[:, :, t:], f32(kv[name])[:, :, t:])
    tol = dict(rtol=1e-5, atol=1e-5) if exact else dict(rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(f32(got_kv[name])[:, :, :t], f32(want_kv[name])[:, :, :t], **tol)
  if not exact:  # most values exact, the others one rounding away
    assert np.mean(f32(got_kv["k"])[:, :, :t] == f32(want_kv["k"])[:, :, :t]) > 0.9
  scale = np.abs(f32(want)).max()
  assert np.abs(f32(got) - f32(want)).max() <= (1e-5 if dtype == "float32" else 2e-2) * scale


@pytest.mark.parametrize("t", [1, 5])
def test_the_attention_block_reads_and_writes_bf16_as_it_rounds(t):
  # A bf16 prefill hands the block a bf16 qkv (the product rounded) and takes a bf16 output: the
  # same values, to the bit, as a float32 qkv holding them and a float32 output cast (a decode step
  # too, t = 1); and the cache the same.
  rng = np.random.default_rng(3)
  b, kv_heads, g, h, s = 2, 2, 2, 16, 8
  n = kv_heads * g
  qkv = jnp.asarray(rng.standard_normal((b, t, (n + 2 * kv_heads) * h)), jnp.bfloat16)
  k, v = (jnp.asarray(rng.standard_normal((b, kv_heads, s, h)), jnp.bfloat16) for _ in range(2))
  mask = jnp.tril(jnp.ones((t, t), bool))[None].repeat(b, 0) if t > 1 else jnp.ones((b, 1, s), bool)
  angles = rng.standard_normal((b, t, h))
  cos, sin = jnp.asarray(np.cos(angles), jnp.bfloat16), jnp.asarray(np.sin(angles), jnp.bfloat16)
  norm = jnp.asarray(1 + 0.1 * rng.standard_normal(h), jnp.bfloat16)
  index = 0 if t > 1 else 3

  def block(qkv, out_dtype):
    return cpu_gemm.attention_block(
      qkv,
      k,
      v,
      index,
      mask,
      cos,
      sin,
      q_norm=norm,
      k_norm=norm,
      bias=None,
      eps=1e-6,
      dtype=jnp.bfloat16,
      out_dtype=out_dtype,
    )

  short = jax.jit(block, static_argnums=1)(qkv, jnp.bfloat16)
  wide = jax.jit(block, static_argnums=1)(qkv.astype(jnp.float32), jnp.float32)
  assert short[0].dtype == jnp.bfloat16 and wide[0].dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(short[0]), np.asarray(wide[0].astype(jnp.bfloat16)))
  assert np.array_equal(np.asarray(wide[0]), np.asarray(wide[0].astype(jnp.bfloat16).astype(jnp.float32)))
  for a, c in zip(short[1:], wide[1:], strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
  with pytest.raises(ValueError, match="out_dtype"):
    block(qkv, jnp.float16)


def test_the_attention_block_kernel_rejects_what_it_cannot_run():
  assert cpu_gemm.available()
  rng = np.random.default_rng(0)
  qkv = jnp.asarray(rng.standard_normal((2, 1, 4 * 16)), jnp.float32)  # N 2, K 1, H 16
  k = v = jnp.zeros((2, 1, 4, 16), jnp.float32)
  mask, cos, sin = jnp.ones((2, 1, 4), bool), jnp.ones((2, 1, 16)), jnp.zeros((2, 1, 16))
  common = dict(q_norm=None, k_norm=None, bias=None, eps=1e-6)
  with pytest.raises(ValueError, match="float32 or bfloat16"):
    cpu_gemm.attention_block(qkv, k, v.astype(jnp.bfloat16), 0, mask, cos, sin, dtype=jnp.float32, **common)
  with pytest.raises(ValueError, match="both given or neither"):
    cpu_gemm.attention_block(
      qkv, k, v, 0, mask, cos, sin, dtype=jnp.float32, **{**common, "q_norm": jnp.ones(16)}
    )
  with pytest.raises(Exception, match="lm_cpu_attention_block: shapes disagree"):
    jax.block_until_ready(
      cpu_gemm.attention_block(qkv, k, v, 0, mask, cos[..., :8], sin, dtype=jnp.float32, **common)
    )
  two = jnp.concatenate([qkv, qkv], axis=1)  # two tokens a row: only as a prefill from slot 0
  cos2, sin2 = jnp.ones((2, 2, 16)), jnp.zeros((2, 2, 16))
  with pytest.raises(Exception, match="only as a prefill"):
    jax.block_until_ready(
      cpu_gemm.attention_block(
        two, k, v, 1, jnp.ones((2, 2, 2), bool), cos2, sin2, dtype=jnp.float32, **common
      )
    )
  with pytest.raises(Exception, match="only as a prefill"):
    jax.block_until_ready(
      cpu_gemm.attention_block(
        two, k, v, 0, jnp.ones((2, 2, 4), bool), cos2, sin2, dtype=jnp.float32, **common
      )
    )
  # with nothing to normalise or add, rope of angle 0 (cos 1, sin 0) is the identity: out is v's head
  out, k2, v2 = cpu_gemm.attention_block(
    qkv, k, v, 3, jnp.zeros((2, 1, 4), bool).at[:, :, 3].set(True), cos, sin, dtype=jnp.float32, **common
  )
  np.testing.assert_array_equal(np.asarray(k2)[:, 0, 3], np.asarray(qkv)[:, 0, 32:48])
  np.testing.assert_array_equal(np.asarray(v2)[:, 0, 3], np.asarray(qkv)[:, 0, 48:])
  np.testing.assert_allclose(np.asarray(out)[:, 0], np.tile(np.asarray(qkv)[:, 0, 48:], 2), rtol=1e-6)
  # and a prefill of two tokens, the second masked from the first: each attends its own value
  mask2 = jnp.asarray([[[True, False], [False, True]]] * 2)
  out, k2, v2 = cpu_gemm.attention_block(
    two * jnp.asarray([1.0, 2.0])[:, None], k, v, 0, mask2, cos2, sin2, dtype=jnp.float32, **common
  )
  np.testing.assert_array_equal(np.asarray(v2)[:, 0, 1], 2 * np.asarray(qkv)[:, 0, 48:])
  np.testing.assert_array_equal(np.asarray(k2)[:, 0, 2:], 0)  # slots after the prompt untouched
  np.testing.assert_allclose(np.asarray(out)[:, 1], np.tile(2 * np.asarray(qkv)[:, 0, 48:], 2), rtol=1e-6)


@pytest.mark.parametrize("threads", [-1])  # (one thread or all: the decode kernel's test runs both)
@pytest.mark.parametrize(
  "b, t, s, kv, g, h",
  [
    (2, 37, 37, 2, 3, 16),  # a train step's rows: causal, left padding, an empty query row
    (3, 130, 130, 1, 2, 64),  # keys in three blocks of 64, the last ragged
    (2, 5, 70, 2, 2, 32),  # a prefill of 5 tokens after 65 cached ones
    (1, 20, 20, 2, 1, 40),  # a head dim that is not a multiple of 16 (the column remainder)
  ],
)
def test_the_sequence_attention_kernel_matches_the_model_and_its_gradient(threads, b, t, s, kv, g, h):
  # lm.model.attention of whole sequences: the kernel inside `cpu_attention(threads)`, XLA's ops
  # with 0. Values and the gradient of every input agree to float32 round-off, including a query
  # row with no key at all (its softmax reads every key uniformly; its scores pass no gradient).
  from lm import model as model_lib

  rng = np.random.default_rng(t)
  q = jnp.asarray(rng.standard_normal((b, t, kv * g, h)), jnp.float32)
  k, v = (jnp.asarray(rng.standard_normal((b, kv, s, h)), jnp.float32) for _ in range(2))
  keys = np.ones((b, s), bool)
  keys[0, : s - t + 3] = False  # row 0's first three queries see no key
  mask = jnp.asarray(np.tril(np.ones((t, s), bool), k=s - t)[None] & keys[:, None, :])
  weight = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

  def loss(q, k, v, kernel):
    with model_lib.cpu_attention(threads if kernel else 0):
      return jnp.sum(model_lib.attention(q, k, v, mask) * weight)

  assert "lm_cpu_attention" in jax.jit(lambda *a: loss(*a, True)).lower(q, k, v).as_text()
  assert "lm_cpu_attention" not in jax.jit(lambda *a: loss(*a, False)).lower(q, k, v).as_text()
  (value, grads), (want_value, want_grads) = (
    jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v, kernel) for kernel in (True, False)
  )
  np.testing.assert_allclose(float(value), float(want_value), rtol=1e-5)
  for got, want in zip(grads, want_grads, strict=True):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5 * float(np.abs(want).max()))
  # a masked key's value is never read by a query with a key: only the empty rows' outputs move
  out = lambda v: cpu_gemm.sequence_attention(q.reshape(b, t, kv, g, h), k, v, mask, h**-0.5, threads)[0]
  moved = np.abs(np.asarray(out(v.at[0, :, 0].set(1e6)) - out(v))).max(axis=(2, 3, 4)) > 0  # [B, T]
  np.testing.assert_array_equal(moved, ~np.asarray(mask).any(axis=-1))


def test_sequence_attention_keeps_the_dtype_and_is_off_by_default_on_a_cpu_mesh():
  # bfloat16 operands are attended in float32 and rounded once; their gradients come back in
  # bfloat16. With this test process's 8 CPU devices the default is XLA's ops (a sharded program
  # would gather the kernel's operands onto every device), with one device it is the kernel.
  from lm import model as model_lib

  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((2, 9, 4, 16)), jnp.bfloat16)
  k, v = (jnp.asarray(rng.standard_normal((2, 2, 9, 16)), jnp.bfloat16) for _ in range(2))
  mask = jnp.asarray(np.tril(np.ones((9, 9), bool)))[None].repeat(2, 0)

  def loss(q, k, v):
    return jnp.sum(model_lib.attention(q, k, v, mask).astype(jnp.float32) ** 2)

  assert jax.device_count() == 8
  assert "lm_cpu_attention" not in jax.jit(loss).lower(q, k, v).as_text()
  with model_lib.cpu_attention(-1):
    assert model_lib.attention(q, k, v, mask).dtype == jnp.bfloat16
    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
  assert [g.dtype for g in grads] == [jnp.bfloat16] * 3
  exact = jax.grad(loss, argnums=(0, 1, 2))(*(x.astype(jnp.float32) for x in (q, k, v)))
  for got, want in zip(grads, exact, strict=True):  # the float32 gradient, rounded to bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=2e-2, atol=2e-2)
