"""Flax NNX decoder for the Qwen2 / Qwen2.5 / Qwen3 family, exact against `transformers`.

Layers are stored stacked (every layer weight has a leading [L] axis) and run with `lax.scan` (unrolled
for a shallow model: `ModelConfig.unroll_layers`), so compile time does not grow with depth and one
`PartitionSpec` per weight name shards every layer.
Weight names carry their axes (D model, F MLP, N query heads, K kv heads, H head dim, V vocab).

Dtype policy: weights are stored in `param_dtype` and matmuls run in `dtype` (both float32 or
bfloat16); RMSNorm statistics, RoPE angles, attention softmax and the output logits are always
float32, as the reference implementation does for the parts where precision matters.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from lm import cpu_gemm
from lm.config import ModelConfig

Array = jax.Array
# One {"k", "v"} pair per layer, each [B, K, S, H]: per-layer buffers are updated in place inside
# decode loops, and the K-major layout is the one the attention contractions read without copies.
Cache = list[dict[str, Array]]
LayerWeights = list[dict[str, Array]]
# x [..., K] @ w [K, N] -> [..., N]: the fused weights' products (`fuse_projections`); jnp.matmul,
# or on CPU `lm.cpu_gemm.matmul` for a decode step's few rows (the sampler's choice).
Matmul = Callable[[Array, Array], Array]

_NEG_INF = cpu_gemm.NEG_INF  # a masked score (the CPU kernels use the same value)


_PLATFORM = contextvars.ContextVar("lm_model_platform", default="")


@contextlib.contextmanager
def lowering_for(platform: str):
  """Traces inside this block are for `platform` ("cpu", "tpu", "cuda", ...), whatever this
  process's backend is. A plan compiles accelerators' programs ahead of time on a CPU host
  (`lm.plan.compile_program`); there `contract` must give the accelerator's program, not the
  CPU's form. JAX reuses a function's trace for the same arguments whatever this block says; a
  plan's arguments carry the target's shardings, so its traces are its own."""
  token = _PLATFORM.set(platform)
  try:
    yield
  finally:
    _PLATFORM.reset(token)


# Threads of `lm.cpu_gemm`'s attention kernels (a decode step's, and whole sequences' with their
# gradient) for the traces inside `cpu_attention`; None (the default): `_cpu_attention_threads`'s
# choice.
_CPU_ATTENTION_THREADS = contextvars.ContextVar("lm_model_cpu_attention_threads", default=None)


@contextlib.contextmanager
def cpu_attention(threads: int | None):
  """Attention traced inside this block for XLA:CPU runs `lm.cpu_gemm`'s kernels with `threads`
  (as `cpu_gemm.matmul`'s: -1 every core of XLA's pool, 0 off: XLA's own ops), where its library
  is loaded; None: the default (`_cpu_attention_threads`). The sampler traces its programs inside
  it with its `cpu_gemm_threads`."""
  token = _CPU_ATTENTION_THREADS.set(threads)
  try:
    yield
  finally:
    _CPU_ATTENTION_THREADS.reset(token)


def _cpu_attention_threads() -> int:
  """The kernels' threads for this trace: 0 (XLA's ops) unless it is for XLA:CPU with the library
  loaded; then `cpu_attention`'s, or by default every core where this process has one device. With
  several (a CPU mesh) the programs may be sharded, and a custom call's operands would be gathered
  onto every device, so there the default is XLA's ops."""
  if not _for_cpu() or not cpu_gemm.available():
    return 0
  threads = _CPU_ATTENTION_THREADS.get()
  if threads is None:
    return -1 if jax.device_count() == 1 else 0
  return threads


def _for_cpu() -> bool:
  """Whether the trace is for XLA:CPU: this process's backend, or the platform a plan lowers for."""
  return (_PLATFORM.get() or jax.default_backend()) == "cpu"


def _cpu_bf16(a: Array, b: Array) -> bool:
  """Whether a product of a and b is a bfloat16 one traced for XLA:CPU (`contract`)."""
  return _for_cpu() and a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16


def embed(table_vd: Array, tokens: Array, dtype: Any) -> Array:
  """Rows `tokens` [...] of the embedding table [V, D], in `dtype` -> [..., D].

  XLA:CPU gathers from a bfloat16 table through a float32 convert of the table. Fused into the
  gather, that converts only the rows read; but in a decode loop the convert's operand is
  loop-invariant, so XLA hoists it out of the body: a float32 copy of the whole table every call.
  For Qwen3-0.6B ([151936, 1024]) that was 0.6 GB written on one thread, 381 ms of a 793 ms
  bfloat16 first token (sampler_bench shape (b), `jax.profiler`, 2026-12-05). A bfloat16 table
  traced for XLA:CPU therefore passes through an optimization barrier with the tokens, which
  makes it loop-variant: the convert stays fused into the gather (1.8 ms against 159 ms for ten
  4-row gathers from that table in a loop). The values and the gradient are `jnp.take`'s; other
  platforms' programs are unchanged.
  """
  if _for_cpu() and table_vd.dtype == jnp.bfloat16:
    table_vd, tokens = jax.lax.optimization_barrier((table_vd, tokens))
  return jnp.take(table_vd, tokens, axis=0).astype(dtype)


def contract(spec: str, a: Array, b: Array, out_dtype: Any = None) -> Array:
  """`jnp.einsum(spec, a, b, preferred_element_type=out_dtype)`; a bfloat16 product traced for
  XLA:CPU is asked for in float32 and rounded once after to `out_dtype` (default bfloat16),
  5-6x faster.

  Why: XLA:CPU widens both operands of a bf16 x bf16 -> bf16 dot to float32 (the whole weight,
  every call) and runs a float32 dot (95-137 GFLOP/s at [256, 1024] x [1024, 3072] on a 2-core
  AVX-512/AMX Xeon, 16-22 at 8 rows), but hands a bf16 x bf16 -> f32 dot to its library as it is,
  which uses the CPU's bf16 instructions (563-910 and 70 GFLOP/s; docs/results/2026-12-04-bf16-cpu.md).
  Not bit-identical: at [64, 1024] x [1024, 3072] 0.017% of outputs differ by one bf16 step (other
  summation orders), and this form equals the correctly rounded product more often (99.992%
  against 99.982% of outputs). Other platforms' programs are the plain einsum, unchanged: the
  platform is this process's backend, or the one a plan lowers for (`lowering_for`).
  """
  return _contract(spec, a, b, out_dtype, _cpu_bf16(a, b))


def _contract(spec: str, a: Array, b: Array, out_dtype: Any, cpu_bf16: bool) -> Array:
  a_axes, b_axes, out = _einsum_axes(spec)
  batched = bool(set(a_axes) & set(b_axes) & set(out))
  # A batched bf16 x bf16 -> f32 dot that XLA:CPU's library declines falls to its own dot, which
  # refuses it at run time ("Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32";
  # an attention product of a prefill, jax 0.10.2): batched products keep the plain form.
  if not cpu_bf16 or batched:
    return jnp.einsum(spec, a, b, preferred_element_type=out_dtype)
  wide = jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
  return wide.astype(out_dtype or jnp.bfloat16)


def matmul(x: Array, w: Array, preferred_element_type: Any = None) -> Array:
  """x [..., K] @ w [K, N]: `jnp.matmul`, a bf16 product on XLA:CPU as in `contract`. The default
  `Matmul` of the fused weights' products."""
  if preferred_element_type is not None or x.dtype != jnp.bfloat16 or w.dtype != jnp.bfloat16:
    return jnp.matmul(x, w, preferred_element_type=preferred_element_type)
  return contract("...k,kn->...n", x, w)


@dataclasses.dataclass(frozen=True)
class LayerWeightSpec:
  """Shape of one stacked layer weight, in named axes; the single source for init and loading."""

  axes: tuple[str, ...]
  init: str  # "normal" or "ones" or "zeros"


def layer_weight_specs(config: ModelConfig) -> dict[str, LayerWeightSpec]:
  """Per-layer weights (without the leading L axis) that this architecture has."""
  specs = {
    "input_norm_d": LayerWeightSpec(("D",), "ones"),
    "q_dnh": LayerWeightSpec(("D", "N", "H"), "normal"),
    "k_dkh": LayerWeightSpec(("D", "K", "H"), "normal"),
    "v_dkh": LayerWeightSpec(("D", "K", "H"), "normal"),
    "o_nhd": LayerWeightSpec(("N", "H", "D"), "normal"),
    "post_norm_d": LayerWeightSpec(("D",), "ones"),
    "gate_df": LayerWeightSpec(("D", "F"), "normal"),
    "up_df": LayerWeightSpec(("D", "F"), "normal"),
    "down_fd": LayerWeightSpec(("F", "D"), "normal"),
  }
  if config.qkv_bias:
    specs["q_bias_nh"] = LayerWeightSpec(("N", "H"), "zeros")
    specs["k_bias_kh"] = LayerWeightSpec(("K", "H"), "zeros")
    specs["v_bias_kh"] = LayerWeightSpec(("K", "H"), "zeros")
  if config.qk_norm:
    specs["q_norm_h"] = LayerWeightSpec(("H",), "ones")
    specs["k_norm_h"] = LayerWeightSpec(("H",), "ones")
  return specs


def axis_sizes(config: ModelConfig) -> dict[str, int]:
  return {
    "L": config.num_layers,
    "D": config.hidden_size,
    "F": config.intermediate_size,
    "N": config.num_heads,
    "K": config.num_kv_heads,
    "H": config.head_dim,
    "V": config.vocab_size,
  }


def _init_array(kind: str, key: Array, shape: tuple[int, ...], dtype: Any) -> Array:
  if kind == "ones":
    return jnp.ones(shape, dtype)
  if kind == "zeros":
    return jnp.zeros(shape, dtype)
  return (0.02 * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


class Layers(nnx.Module):
  """All decoder layers' weights, each stacked along a leading [L] axis."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype: Any):
    sizes = axis_sizes(config)
    for name, spec in layer_weight_specs(config).items():
      shape = (config.num_layers, *(sizes[a] for a in spec.axes))
      setattr(self, name, nnx.Param(_init_array(spec.init, rngs.params(), shape, param_dtype)))

  def weights(self) -> dict[str, Array]:
    return {name: var[...] for name, var in vars(self).items() if isinstance(var, nnx.Param)}


class Qwen(nnx.Module):
  """Qwen2/Qwen3 causal LM.

  `model(tokens)` returns float32 logits [B, T, V]. For left-padded batches pass
  `attention_mask` [B, T] (1 = real token); positions then default to the count of real tokens
  before each one, so every row equals the same row run alone. For incremental decoding pass a
  `cache` from `init_cache` with `cache_index` (the slot where these tokens go) and a
  `attention_mask` covering all cache slots [B, S]; the call then returns `(logits, cache)`.
  """

  def __init__(
    self,
    config: ModelConfig,
    *,
    rngs: nnx.Rngs,
    param_dtype: Any = jnp.float32,
    dtype: Any | None = None,
  ):
    self.config = config
    self.dtype = jnp.dtype(dtype or param_dtype)
    v, d = config.vocab_size, config.hidden_size
    self.embed_vd = nnx.Param(_init_array("normal", rngs.params(), (v, d), param_dtype))
    self.layers = Layers(config, rngs=rngs, param_dtype=param_dtype)
    self.final_norm_d = nnx.Param(jnp.ones((d,), param_dtype))
    if not config.tie_word_embeddings:
      self.lm_head_vd = nnx.Param(_init_array("normal", rngs.params(), (v, d), param_dtype))
    self.activation_sharding: ActivationSharding | None = None
    # An `lm.lora.Adapter` (stacked `<weight>_lora_a/_lora_b` entries) or None: see `layer_weights`.
    self.lora = nnx.data(None)

  def __call__(
    self,
    tokens: Array,
    *,
    positions: Array | None = None,
    attention_mask: Array | None = None,
    cache: Cache | None = None,
    cache_index: Array | int = 0,
    remat: bool | str = False,
    layer_weights: LayerWeights | None = None,
  ) -> Array | tuple[Array, Cache]:
    hidden, new_cache = self.hidden_states(
      tokens,
      positions=positions,
      attention_mask=attention_mask,
      cache=cache,
      cache_index=cache_index,
      remat=remat,
      layer_weights=layer_weights,
    )
    logits = self.logits(hidden)
    return logits if cache is None else (logits, new_cache)

  def hidden_states(
    self,
    tokens: Array,
    *,
    positions: Array | None = None,
    attention_mask: Array | None = None,
    cache: Cache | None = None,
    cache_index: Array | int = 0,
    remat: bool | str = False,
    layer_weights: LayerWeights | None = None,
    matmul: Matmul = matmul,
    prefix_mask: Array | None = None,
    branch: Array | None = None,
    last_only: bool = False,
  ) -> tuple[Array, Cache | None]:
    """Final-norm hidden states [B, T, D] (and the updated cache): what `logits` and scoring read.

    `layer_weights` (from `unstacked_layer_weights`) lets a decode loop split the stacked weights
    once, outside the loop, instead of slicing every layer's weights at every step; with fused
    ones (`fuse_projections`), `matmul` computes their products (`decoder_layer`). `prefix_mask`
    [P, Lp]: the rows share their prompts' cached keys (`cached_decoder_stack`). `branch` [B, T]
    int (no cache; pass `positions` too): each row is a tree, a shared stem (0) and branches
    (1, 2, ...) that each continue it — a token attends the stem and its own branch only
    (`branch_mask`; `lm.scoring.pack_shared_pairs` builds such rows). `last_only` (with a cache):
    hidden states [B, 1, D] of the last position only, every position's keys and values cached —
    a prefill that wants the next token's logits skips the last layer's output projection and MLP
    at the other positions.
    """
    length = tokens.shape[1]
    if branch is not None and (cache is not None or positions is None):
      raise ValueError("branch rows need their positions and run without a cache")
    if last_only and cache is None:
      raise ValueError("last_only is a cached (prefill) call's option")
    if cache is None:
      key_mask = jnp.ones(tokens.shape, jnp.bool_) if attention_mask is None else attention_mask.astype(bool)
      if positions is None:
        positions = default_positions(key_mask)  # [B, T]
    else:
      if attention_mask is None:
        raise ValueError("decoding with a cache needs attention_mask over all cache slots [B, S]")
      key_mask = attention_mask.astype(jnp.bool_)  # [B, S]
      if positions is None:
        positions = jax.lax.dynamic_slice_in_dim(default_positions(key_mask), cache_index, length, axis=1)
    x = embed(self.embed_vd[...], tokens, self.dtype)  # [B, T, D]
    x = self._constrain(x)
    if cache is None:
      hidden = decoder_stack(
        self.config,
        self.stacked_layer_weights(),
        x,
        positions,
        key_mask,
        dtype=self.dtype,
        remat=remat,
        constrain=self._constrain,
        branch=branch,
      )
      new_cache = None
    else:
      hidden, new_cache = cached_decoder_stack(
        self.config,
        layer_weights or self.unstacked_layer_weights(),
        x,
        positions,
        key_mask,
        cache,
        cache_index,
        dtype=self.dtype,
        constrain=self._constrain,
        matmul=matmul,
        prefix_mask=prefix_mask,
        last_only=last_only,
      )
    return rms_norm(hidden, self.final_norm_d[...], self.config.rms_norm_eps), new_cache

  def stacked_layer_weights(self) -> dict[str, Array]:
    """Every layer weight stacked on [L], plus the LoRA adapter's entries when one is attached."""
    if self.lora is None:
      return self.layers.weights()
    return {**self.layers.weights(), **self.lora.weights()}

  def unstacked_layer_weights(self) -> LayerWeights:
    """Per-layer weight dicts [L] × {name: array without the L axis}."""
    stacked = self.stacked_layer_weights()
    return [{name: w[i] for name, w in stacked.items()} for i in range(self.config.num_layers)]

  def logits(self, hidden: Array) -> Array:
    """float32 logits [..., V] of final-norm hidden states [..., D]."""
    return jnp.einsum(
      "...d,vd->...v",
      hidden,
      self.output_weight_vd().astype(hidden.dtype),
      preferred_element_type=jnp.float32,
    )

  def output_weight_vd(self) -> Array:
    """The output projection [V, D]: the embedding itself when tied, else `lm_head`.

    Both are kept vocabulary-major (as HF stores them) so the tied and untied heads run the same
    contraction and no transpose of a [V, D] matrix is ever materialised in a decode step.
    """
    if self.config.tie_word_embeddings:
      return self.embed_vd[...]
    return self.lm_head_vd[...]

  def init_cache(self, batch: int, max_len: int, dtype: Any | None = None) -> Cache:
    return init_cache(self.config, batch, max_len, dtype or self.dtype)

  def _constrain(self, x: Array) -> Array:
    if self.activation_sharding is None:
      return x
    return jax.lax.with_sharding_constraint(x, self.activation_sharding.btd)


@dataclasses.dataclass(frozen=True)
class ActivationSharding:
  """Where the residual stream [B, T, D] lives on the mesh (set by `lm.sharding.shard_model`)."""

  btd: jax.sharding.NamedSharding


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype: Any = jnp.float32) -> Cache:
  shape = (batch, config.num_kv_heads, max_len, config.head_dim)  # [B, K, S, H]
  return [{"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)} for _ in range(config.num_layers)]


def default_positions(mask: Array) -> Array:
  """RoPE positions of a left-padded batch: the number of real tokens before each slot."""
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def rms_norm(x: Array, weight: Array, eps: float) -> Array:
  """RMSNorm as Qwen computes it: statistics in float32, cast back, then a plain weight multiply."""
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return weight.astype(x.dtype) * normed.astype(x.dtype)


class Rotary(NamedTuple):
  """RoPE's cos and sin at every position, [B, T, 1, H] each in the compute dtype (`rope_table`)."""

  cos: Array
  sin: Array


def rope_table(positions: Array, head_dim: int, theta: float, dtype: Any) -> Rotary:
  """The rotary table of positions [B, T]: made once for every layer, queries and keys (a decode
  step computed it twice in each of its layers). Angles in float32, as the reference's."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))  # [H/2]
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, H/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, H]
  return Rotary(cos=jnp.cos(angles).astype(dtype), sin=jnp.sin(angles).astype(dtype))


def rope(x: Array, table: Rotary) -> Array:
  """Rotate-half rotary embedding of x [B, T, heads, H] by `rope_table`'s table of its positions."""
  first, second = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([-second, first], axis=-1)
  return x * table.cos + rotated * table.sin


def attention(q: Array, k: Array, v: Array, mask: Array) -> Array:
  """Grouped-query attention.

  Args:
    q: [B, T, N, H] queries.
    k, v: [B, K, S, H] keys and values (N is a multiple of K).
    mask: [B, T, S] True where query t may attend key s.

  Returns:
    [B, T, N, H] in q's dtype; scores and softmax in float32.
  """
  b, t, n, h = q.shape
  kv_heads = k.shape[1]
  q = q.reshape(b, t, kv_heads, n // kv_heads, h)  # [B, T, K, G, H]
  if t == 1:  # a decode step
    return (
      decode_attention(q[:, 0], k, v, jnp.broadcast_to(mask, (b, 1, k.shape[2]))[:, 0], h**-0.5)
      .astype(q.dtype)
      .reshape(b, t, n, h)
    )
  threads = _cpu_attention_threads()
  if threads != 0:  # XLA:CPU: the kernel, forward and backward (`sequence_attention`)
    mask = jnp.broadcast_to(mask, (b, t, k.shape[2]))
    return sequence_attention(q, k, v, mask, h**-0.5, threads).reshape(b, t, n, h)
  # bf16 on XLA:CPU: the products and their gradients as `einsum`'s (bf16 gradient products);
  # elsewhere plain einsums and their autodiff, the programs as they were.
  product = einsum if _cpu_bf16(q, k) else contract
  scores = product("btkgh,bksh->bkgts", q, k, out_dtype=jnp.float32)
  scores = scores * (h**-0.5)
  scores = jnp.where(mask[:, None, None, :, :], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = product("bkgts,bksh->btkgh", probs, v)
  return out.reshape(b, t, n, h)


def decode_attention(q: Array, k: Array, v: Array, mask: Array, scale: float) -> Array:
  """A decode step's attention: q [B, K, G, H] against the cache k, v [B, K, S, H], mask [B, S]
  -> [B, K, G, H] float32 (scores and softmax in float32).

  Traced for XLA:CPU over a float32 or bfloat16 cache (`lm.sampler.cache_dtype`) inside
  `cpu_attention` (the sampler's decode loop), with `lm.cpu_gemm`'s library loaded: its kernel,
  which reads each key and value once for the G queries of its kv head (a bf16 one widened in
  registers). XLA:CPU's own form, the multiply-reduces of
  `cpu_gemm.reference_decode_attention` (a batched [G, H] x [H, S] product would be a generic
  dot, slower still), ran at ~5x the cache's bytes' time in bf16, recomputing the rotated queries
  for every key: 18 ms of a 76 ms step at Qwen3-0.6B's shape (B 4, S 128). Elsewhere, and for the
  gradient, that reference.
  """
  threads = _cpu_attention_threads()
  if threads != 0 and k.dtype == v.dtype and k.dtype in (jnp.float32, jnp.bfloat16):
    return _decode_attention_kernel(q, k, v, mask, scale, threads)
  return cpu_gemm.reference_decode_attention(q, k, v, mask, scale)


def cache_write(cache: Array, update: Array, index: Array | int) -> Array:
  """The cache [B, K, S, H] with `update` [B, K, T, H] at slots from `index`: a dynamic-update-slice,
  except a bfloat16 cache traced for XLA:CPU with `lm.cpu_gemm`'s kernels on (`cpu_attention`),
  written in place by its kernel. XLA:CPU runs a bf16 dynamic-update-slice in float32, converting
  the whole cache there and back: a pass over both caches of every layer at every decode step
  (2.9 ms of a ~41 ms bf16 step at Qwen3-0.6B's shape, 192 slots; the kernel's write 1.6 us
  against 24 us for one such cache)."""
  if cache.dtype == jnp.bfloat16 and _cpu_attention_threads() != 0:
    return cpu_gemm.cache_write(cache, update, index)
  return jax.lax.dynamic_update_slice_in_dim(cache, update, index, axis=2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _decode_attention_kernel(q: Array, k: Array, v: Array, mask: Array, scale: float, threads: int) -> Array:
  return cpu_gemm.decode_attention(q, k, v, mask, scale, threads)


def _decode_attention_fwd(q, k, v, mask, scale, threads):
  return _decode_attention_kernel(q, k, v, mask, scale, threads), (q, k, v, mask)


def _decode_attention_bwd(scale, threads, saved, cotangent):
  """The reference's gradient (the kernel's values are the reference's to float32 round-off)."""
  q, k, v, mask = saved
  _, pullback = jax.vjp(lambda q, k, v: cpu_gemm.reference_decode_attention(q, k, v, mask, scale), q, k, v)
  return (*pullback(cotangent), None)


_decode_attention_kernel.defvjp(_decode_attention_fwd, _decode_attention_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def sequence_attention(q: Array, k: Array, v: Array, mask: Array, scale: float, threads: int) -> Array:
  """`attention` of whole sequences by `lm.cpu_gemm`'s kernel (XLA:CPU, its library loaded): q
  [B, T, K, G, H], k and v [B, K, S, H] of any float dtype (computed in float32), mask [B, T, S] ->
  [B, T, K, G, H] in q's dtype, equal to `attention`'s to float32 round-off, and its gradient by
  the kernel's backward.

  Why: XLA:CPU runs the scores, mask, softmax and their gradients as batched products and passes
  over [B, K, G, T, S] with layout copies between them: about 37% of a float32 train step for 4%
  of its FLOPs at rl_bench's shape (docs/results/2026-12-04-bf16-cpu.md). The kernel keeps a tile
  of scores in cache and saves only the output and each query's log-sum-exp for the backward."""
  return _sequence_attention_fwd(q, k, v, mask, scale, threads)[0]


def _f32(x: Array) -> Array:
  return x.astype(jnp.float32)


def _sequence_attention_fwd(q, k, v, mask, scale, threads):
  out, lse = cpu_gemm.sequence_attention(_f32(q), _f32(k), _f32(v), mask, scale, threads)
  return out.astype(q.dtype), (q, k, v, mask, out, lse)


def _sequence_attention_bwd(scale, threads, saved, cotangent):
  q, k, v, mask, out, lse = saved
  dq, dk, dv = cpu_gemm.sequence_attention_bwd(
    _f32(q), _f32(k), _f32(v), mask, out, lse, _f32(cotangent), scale, threads
  )
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


sequence_attention.defvjp(_sequence_attention_fwd, _sequence_attention_bwd)


@dataclasses.dataclass(frozen=True)
class CausalMask:
  """The mask of a long sequence, kept as its parts so that no [T, S] array is ever built.

  Query t sits at slot `offset + t` and may attend key slot s when s <= offset + t and
  `key_mask[b, s]`; `blockwise_attention` builds each block's mask from these.
  """

  key_mask: Array  # [B, S] bool
  offset: Array | int = 0


@dataclasses.dataclass(frozen=True)
class SharedPrefixMask:
  """The mask of rows that share their prompt's keys: the n samples of each of P prompts, B = P·n
  rows, prompt-major. `own` [B, T, S] masks each row's own (generated) keys; `prefix` [P, Lp] the
  prompt keys every sample of that prompt reads (True = a real token), kept once per prompt in
  the layer cache's "prefix_k" / "prefix_v" [P, K, Lp, H] (`shared_prefix_attention`)."""

  own: Array
  prefix: Array


def attend(
  q: Array,
  k: Array,
  v: Array,
  mask: Array | CausalMask | SharedPrefixMask,
  block: int,
  prefix: tuple[Array, Array] | None = None,
  impl: str = "blockwise",
) -> Array:
  """The attention of every caller (sampler prefill and decode, scoring, training).

  A full mask [B, T, S] runs the plain `attention`; a `CausalMask` (what the stacks pass for
  sequences longer than `block`) runs `blockwise_attention`, or with `impl` "xla" / "cudnn"
  (`ModelConfig.attention_impl`) and queries from slot 0 `fused_causal_attention`; a
  `SharedPrefixMask` (the sampler's decode with `prefix`, the prompt keys and values) runs
  `shared_prefix_attention`.
  """
  if isinstance(mask, SharedPrefixMask):
    return shared_prefix_attention(q, k, v, mask.own, *prefix, mask.prefix)
  if isinstance(mask, CausalMask):
    from_start = isinstance(mask.offset, int) and mask.offset == 0 and k.shape[2] == q.shape[1]
    if impl != "blockwise" and from_start:
      return fused_causal_attention(q, k, v, mask.key_mask, impl=impl, block=block)
    return blockwise_attention(q, k, v, mask.key_mask, mask.offset, block=block)
  return attention(q, k, v, mask)


def fused_causal_attention(q: Array, k: Array, v: Array, key_mask: Array, *, impl: str, block: int) -> Array:
  """Causal attention from slot 0 through `jax.nn.dot_product_attention` (`impl` "xla" or "cudnn").

  The fused kernels take a row's padding as its length from the left (right padding). Rows here
  are left-padded (the sampler's prompts, `lm.scoring`'s batches), so each row is rotated so that
  its real tokens start at slot 0, attended with `key_value_seq_lengths`, and rotated back: for a
  real query the keys it may attend are the same (real, not after it), so its output is the same
  function as `blockwise_attention`'s. A padding query's output differs (neither is used: its
  position is masked out of every loss and never attended). A row whose real tokens are not one
  contiguous run would be wrong rotated, so the program checks and then runs `blockwise_attention`
  for the whole batch instead (`lax.cond`: one branch runs).

  Args:
    q: [B, T, N, H]; k, v: [B, K, T, H]; key_mask: [B, S >= T], True at real tokens.

  Returns:
    [B, T, N, H] in q's dtype.
  """
  t = q.shape[1]
  real = key_mask[:, :t].astype(bool)  # a prefill's mask may run on over the cache's empty slots
  length = real.sum(axis=-1).astype(jnp.int32)  # [B] (an empty row is given one key: no NaN)
  start = jnp.argmax(real, axis=-1).astype(jnp.int32)  # [B] first real token (0 for an empty row)
  slot = jnp.arange(t, dtype=jnp.int32)[None, :]  # [1, T]
  run = (slot >= start[:, None]) & (slot < (start + length)[:, None])
  contiguous = jnp.all(run == real)

  def fused(q, k, v):
    take = (slot + start[:, None]) % t  # [B, T]: rotated slot i reads slot start + i
    back = (slot - start[:, None]) % t

    def rotate(x, index):  # x [B, T, ...]
      return jnp.take_along_axis(x, index.reshape(*index.shape, *([1] * (x.ndim - 2))), axis=1)

    out = jax.nn.dot_product_attention(
      rotate(q, take), rotate(k.swapaxes(1, 2), take), rotate(v.swapaxes(1, 2), take),
      is_causal=True, key_value_seq_lengths=jnp.maximum(length, 1), implementation=impl,
    )  # fmt: skip
    return rotate(out.astype(q.dtype), back)

  def blockwise(q, k, v):
    return blockwise_attention(q, k, v, real, 0, block=block)

  return jax.lax.cond(contiguous, fused, blockwise, q, k, v)


def shared_prefix_attention(
  q: Array, k: Array, v: Array, mask: Array, prefix_k: Array, prefix_v: Array, prefix_mask: Array
) -> Array:
  """Grouped-query attention of B = P·n rows (n per prompt, prompt-major) over two parts: their
  prompt's keys, held once per prompt, and their own.

  One softmax over both parts' scores (equal to merging two partial softmaxes by their
  log-sum-exps), so the result is `attention` over the concatenated keys, without repeating the
  prompt's keys and values n times.

  Args:
    q: [B, T, N, H] queries.
    k, v: [B, K, S, H] each row's own keys and values; mask: [B, T, S].
    prefix_k, prefix_v: [P, K, Lp, H] the prompts' keys and values; prefix_mask: [P, Lp] (True = a
      real token: every query may attend every real prompt key).

  Returns:
    [B, T, N, H] in q's dtype; scores and softmax in float32.
  """
  b, t, n_heads, h = q.shape
  prompts, kv_heads, prompt_len = prefix_k.shape[:3]
  n, g = b // prompts, n_heads // kv_heads
  q = q.reshape(prompts, n, t, kv_heads, g, h)
  k, v = (x.reshape(prompts, n, *x.shape[1:]) for x in (k, v))  # [P, n, K, S, H]
  f32 = jnp.float32
  shared = jnp.einsum("pntkgh,pksh->pnkgts", q, prefix_k, preferred_element_type=f32) * (h**-0.5)
  shared = jnp.where(prefix_mask[:, None, None, None, None, :], shared, _NEG_INF)  # [P, n, K, G, T, Lp]
  own = jnp.einsum("pntkgh,pnksh->pnkgts", q, k, preferred_element_type=f32) * (h**-0.5)
  own = jnp.where(mask.reshape(prompts, n, 1, 1, t, -1), own, _NEG_INF)  # [P, n, K, G, T, S]
  probs = jax.nn.softmax(jnp.concatenate([shared, own], axis=-1), axis=-1).astype(v.dtype)
  out = jnp.einsum("pnkgts,pksh->pntkgh", probs[..., :prompt_len], prefix_v, preferred_element_type=f32)
  out = out + jnp.einsum("pnkgts,pnksh->pntkgh", probs[..., prompt_len:], v, preferred_element_type=f32)
  return out.astype(v.dtype).reshape(b, t, n_heads, h)


def blockwise_attention(
  q: Array, k: Array, v: Array, key_mask: Array, offset: Array | int = 0, *, block: int
) -> Array:
  """`attention` in memory linear in the sequence length (the FlashAttention recurrence).

  Queries are taken `block` at a time (`lax.map`), and for each chunk keys `block` at a time
  with an online softmax (`lax.scan`): a running max, normaliser and weighted sum in float32.
  Each query chunk is rematerialised in the backward pass, so training keeps only its inputs.
  Masked keys get the plain path's score (`_NEG_INF`), so fully masked (padding) rows average
  the values exactly as `attention` does; keys past S (block padding) get -inf and count for
  nothing.

  Args:
    q: [B, T, N, H]; k, v: [B, K, S, H]; key_mask: [B, S] (True = a real key); offset: the slot
      of query 0 (0 for a prefill or a whole sequence; a traced index is fine).

  Returns:
    [B, T, N, H] in q's dtype.
  """
  b, t, n, h = q.shape
  kv_heads, s = k.shape[1], k.shape[2]
  g = n // kv_heads
  tq, sk = -(-t // block), -(-s // block)
  q = jnp.pad(q.reshape(b, t, kv_heads, g, h), ((0, 0), (0, tq * block - t), (0, 0), (0, 0), (0, 0)))
  q_chunks = q.reshape(b, tq, block, kv_heads, g, h).swapaxes(0, 1)  # [Tq, B, block, K, G, H]
  pad_keys = ((0, 0), (0, 0), (0, sk * block - s), (0, 0))
  k_blocks = jnp.pad(k, pad_keys).reshape(b, kv_heads, sk, block, h).transpose(2, 0, 1, 3, 4)
  v_blocks = jnp.pad(v, pad_keys).reshape(b, kv_heads, sk, block, h).transpose(2, 0, 1, 3, 4)
  mask_blocks = jnp.pad(key_mask.astype(bool), ((0, 0), (0, sk * block - s))).reshape(b, sk, block)
  mask_blocks = mask_blocks.swapaxes(0, 1)  # [Sk, B, block]
  scale = h**-0.5

  @jax.checkpoint
  def query_chunk(chunk, q_c):  # q_c [B, block, K, G, H]
    query_slot = offset + chunk * block + jnp.arange(block)  # [block]

    def key_block(carry, xs):
      m, norm, acc = carry  # [B, K, G, block], same, [B, K, G, block, H] (float32)
      j, k_j, v_j, km_j = xs
      key_slot = j * block + jnp.arange(block)
      scores = jnp.einsum("btkgh,bksh->bkgts", q_c, k_j, preferred_element_type=jnp.float32) * scale
      allowed = (query_slot[:, None] >= key_slot[None, :])[None] & km_j[:, None, :]  # [B, block, block]
      scores = jnp.where(allowed[:, None, None], scores, _NEG_INF)
      scores = jnp.where((key_slot < s)[None, None, None, None, :], scores, -jnp.inf)
      m_new = jnp.maximum(m, scores.max(axis=-1))
      correction = jnp.exp(m - m_new)
      p = jnp.exp(scores - m_new[..., None])
      norm = norm * correction + p.sum(axis=-1)
      pv = jnp.einsum("bkgts,bksh->bkgth", p.astype(v_j.dtype), v_j, preferred_element_type=jnp.float32)
      return (m_new, norm, acc * correction[..., None] + pv), None

    init = (
      jnp.full((b, kv_heads, g, block), _NEG_INF, jnp.float32),
      jnp.zeros((b, kv_heads, g, block), jnp.float32),
      jnp.zeros((b, kv_heads, g, block, h), jnp.float32),
    )
    (_, norm, acc), _ = jax.lax.scan(key_block, init, (jnp.arange(sk), k_blocks, v_blocks, mask_blocks))
    return (acc / norm[..., None]).astype(v.dtype)  # [B, K, G, block, H]

  out = jax.lax.map(lambda xs: query_chunk(*xs), (jnp.arange(tq), q_chunks))  # [Tq, B, K, G, block, H]
  out = out.transpose(1, 0, 4, 2, 3, 5).reshape(b, tq * block, n, h)
  return out[:, :t]


def einsum(spec: str, a: Array, b: Array, *, out_dtype: Any = None) -> Array:
  """`jnp.einsum(spec, a, b, preferred_element_type=out_dtype)` whose gradients are einsums
  written straight in each operand's axes.

  Why not plain `jnp.einsum`: JAX differentiates a weight's product by contracting in the
  product's own order and transposing after, and XLA:CPU folds that transpose into the
  elementwise fusion that makes the cotangent (the MLP's SiLU backward), which then writes a
  [F, B·T] array column by column. In a profile of the rl_bench train step (4 layers × 256,
  8 rows × 256 tokens a chunk) two such fusions took 9% of the step
  (docs/results/2026-12-03-rl-bench.md). Asking for each gradient as its own einsum,
  `ct, b -> a` and `a, ct -> b`, lets XLA contract into the layout it wants (the step ran
  1.15× faster, the same loss and gradient); on TPU and GPU both forms are the same
  contractions. Needs every axis of each operand in the output or in the other operand (a
  projection's, an attention product's); any other spec is a plain product (`contract`).

  bfloat16 operands traced for XLA:CPU (`contract`): every product, forward and backward, sums in
  float32 and rounds once, and the backward's cotangent is cast to bfloat16 first (a float32
  `out_dtype`'s too: the attention scores'), so a bf16 step's gradient products are bf16
  products, as under PyTorch's CPU autocast (the rl_bench train step 1.83x [1.60-2.88] faster in
  bf16). Everywhere else (float32, GPU, TPU) the programs are as they were: a float32
  `out_dtype` is plain `jnp.einsum` and its autodiff.
  """
  a_axes, b_axes, out = _einsum_axes(spec)
  straight = not (set(a_axes) - set(out + b_axes) or set(b_axes) - set(out + a_axes))
  if not straight or (out_dtype is not None and not _cpu_bf16(a, b)):
    return contract(spec, a, b, out_dtype)
  # Whether this is XLA:CPU's bf16 form is a static argument: JAX caches a custom VJP's traces by
  # their arguments, and a plan traces one function for this CPU and for an accelerator.
  return _einsum_vjp(spec, out_dtype, _cpu_bf16(a, b), a, b)


def _einsum_axes(spec: str) -> tuple[str, str, str]:
  """A two-operand spec's axes: ("btd", "dnh", "btnh") for "btd,dnh->btnh"."""
  operands, out = spec.split("->")
  a_axes, b_axes = operands.split(",")
  return a_axes, b_axes, out


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _einsum_vjp(spec: str, out_dtype: Any, cpu_bf16: bool, a: Array, b: Array) -> Array:
  return _contract(spec, a, b, out_dtype, cpu_bf16)


def _einsum_fwd(
  spec: str, out_dtype: Any, cpu_bf16: bool, a: Array, b: Array
) -> tuple[Array, tuple[Array, Array]]:
  return _contract(spec, a, b, out_dtype, cpu_bf16), (a, b)


def _einsum_bwd(
  spec: str, out_dtype: Any, cpu_bf16: bool, residuals: tuple[Array, Array], ct: Array
) -> tuple[Array, Array]:
  del out_dtype
  a, b = residuals
  a_axes, b_axes, out = _einsum_axes(spec)
  if cpu_bf16:  # bf16 gradient products, as autocast's (see `einsum`)
    ct = ct.astype(jnp.bfloat16)
    da = _contract(f"{out},{b_axes}->{a_axes}", ct, b, None, True)
    return da, _contract(f"{a_axes},{out}->{b_axes}", a, ct, None, True)
  da = jnp.einsum(f"{out},{b_axes}->{a_axes}", ct, b)
  db = jnp.einsum(f"{a_axes},{out}->{b_axes}", a, ct)
  return da.astype(a.dtype), db.astype(b.dtype)


_einsum_vjp.defvjp(_einsum_fwd, _einsum_bwd)


def project(spec: str, x: Array, w: dict[str, Array], name: str, dtype: Any, out_dtype: Any = None) -> Array:
  """`einsum(spec, x, w[name], out_dtype=)`, plus the low-rank LoRA update when `w` holds
  `<name>_lora_a/_b`.

  The adapter factors split the weight's axes: A [in axes..., R] and B [R, out axes...] (B already
  scaled by alpha / rank), so x·W + (x·A)·B needs no reshape of any weight (see `lm.lora`). When
  `w` also holds `<name>_lora_keep` and `<name>_lora_key` (`lm.lora.with_dropout`, training losses
  only), the adapter reads inverted dropout of x: x·W + (mask·x/keep·A)·B, mask ~ Bernoulli(keep).
  """
  out = einsum(spec, x, w[name].astype(dtype), out_dtype=out_dtype)
  if name + "_lora_a" not in w:
    return out
  x_axes, w_axes, out_axes = _einsum_axes(spec)
  kept = "".join(a for a in x_axes if a not in w_axes)  # the batch / sequence axes ("bt")
  contracted = "".join(a for a in w_axes if a in x_axes)
  produced = "".join(a for a in w_axes if a not in x_axes)
  if name + "_lora_keep" in w:
    keep = w[name + "_lora_keep"]
    mask = jax.random.bernoulli(jax.random.wrap_key_data(w[name + "_lora_key"]), keep, x.shape)
    x = jnp.where(mask, x.astype(jnp.float32) / keep, 0.0).astype(x.dtype)  # scale in f32, like torch
  low = einsum(f"{x_axes},{contracted}r->{kept}r", x, w[name + "_lora_a"].astype(dtype))
  return out + einsum(f"{kept}r,r{produced}->{out_axes}", low, w[name + "_lora_b"].astype(dtype))


def decoder_layer(
  config: ModelConfig,
  w: dict[str, Array],
  x: Array,
  rotary: Rotary,
  mask: Array | CausalMask,
  kv: dict[str, Array] | None,
  cache_index: Array | int,
  dtype: Any,
  matmul: Matmul = matmul,
  last_only: bool = False,
) -> tuple[Array, dict[str, Array] | None]:
  """One pre-norm decoder layer on x [B, T, D]; `w` holds this layer's weights (no L axis);
  `rotary` is the rope table of x's positions (`rope_table`, made once for every layer).
  `last_only`: the output at the last position only, [B, 1, D] (the keys and values of every
  position are still written): the output projection and the MLP skip the other T − 1.

  With `kv` (this layer's cache, [B, K, S, H] each), the new keys/values are written at slot
  `cache_index` and attention reads the whole cache (`mask` [B, T, S]), except for a prefill
  (`cache_index` the static 0), which attends over its own keys only (`mask` [B, T, T]): the
  slots after them are still empty, and scores over them would be computed only to be masked.
  Without `kv` attention is over x itself. With fused weights (`fuse_projections`) every product
  is `matmul` against a [K, N] matrix.
  """
  eps = config.rms_norm_eps
  cast = lambda name: w[name].astype(dtype)
  h = rms_norm(x, w["input_norm_d"], eps)
  if _attention_block_applies(w, x, mask, kv, cache_index, dtype):
    attn, kv = _attention_block(config, w, h, rotary, mask, kv, cache_index, dtype, matmul)
    return _layer_output(config, w, x, attn, dtype, matmul, last_only), kv
  if "qkv_dx" in w:  # fused weights (`fuse_projections`): one product instead of three
    b, t = h.shape[:2]
    n, kv_heads, hd = config.num_heads, config.num_kv_heads, config.head_dim
    qkv = matmul(h, w["qkv_dx"].astype(dtype))  # [B, T, (N + 2K)·H]
    q = qkv[..., : n * hd].reshape(b, t, n, hd)
    k = qkv[..., n * hd : (n + kv_heads) * hd].reshape(b, t, kv_heads, hd)
    v = qkv[..., (n + kv_heads) * hd :].reshape(b, t, kv_heads, hd)
  else:
    q = project("btd,dnh->btnh", h, w, "q_dnh", dtype)
    k = project("btd,dkh->btkh", h, w, "k_dkh", dtype)
    v = project("btd,dkh->btkh", h, w, "v_dkh", dtype)
  if config.qkv_bias:
    q, k, v = q + cast("q_bias_nh"), k + cast("k_bias_kh"), v + cast("v_bias_kh")
  if config.qk_norm:
    q = rms_norm(q, w["q_norm_h"], eps)
    k = rms_norm(k, w["k_norm_h"], eps)
  q = rope(q, rotary)
  k = rope(k, rotary).swapaxes(1, 2)  # [B, K, T, H]
  v = v.swapaxes(1, 2)
  prefix = None
  if kv is not None:
    kv = {
      **kv,  # a shared prompt's "prefix_k" / "prefix_v" (`SharedPrefixMask`) pass through unchanged
      "k": cache_write(kv["k"], k.astype(kv["k"].dtype), cache_index),
      "v": cache_write(kv["v"], v.astype(kv["v"].dtype), cache_index),
    }
    if not _is_prefill(cache_index):
      k, v = kv["k"].astype(dtype), kv["v"].astype(dtype)
      if x.shape[1] == 1 and kv["k"].dtype == jnp.float32:  # a decode step computes in float32:
        k, v = kv["k"], kv["v"]  # a wider cache (`lm.sampler.cache_dtype`) is read as it is
    if "prefix_k" in kv:
      prefix = (kv["prefix_k"].astype(dtype), kv["prefix_v"].astype(dtype))
  attn = attend(q, k, v, mask, config.attention_block, prefix, config.attention_impl)  # [B, T, N, H]
  attn = attn.astype(dtype)  # (a float32 cache's decode attention is float32)
  return _layer_output(config, w, x, attn.reshape(*attn.shape[:2], -1), dtype, matmul, last_only), kv


def _layer_output(
  config: ModelConfig,
  w: dict[str, Array],
  x: Array,
  attn: Array,
  dtype: Any,
  matmul: Matmul,
  last_only: bool = False,
) -> Array:
  """The rest of `decoder_layer` after attention: x [B, T, D] plus the output projection of attn
  [B, T, N·H] (values of `dtype`; a decode step's held as float32 by `_attention_block`), then
  the MLP block; `last_only`: at the last position only ([B, 1, D])."""
  eps = config.rms_norm_eps
  if last_only:
    x, attn = x[:, -1:], attn[:, -1:]
  if "o_xd" in w:
    x = x + matmul(attn, w["o_xd"].astype(dtype), preferred_element_type=dtype)
  else:
    attn = attn.astype(dtype).reshape(*attn.shape[:2], config.num_heads, config.head_dim)
    x = x + project("btnh,nhd->btd", attn, w, "o_nhd", dtype)
  h = rms_norm(x, w["post_norm_d"], eps)
  # bf16 on XLA:CPU: SiLU and the gating on the products' float32 results, rounded once for the
  # down product. XLA:CPU's bf16 elementwise ops run ~3x slower than float32 ones (SiLU of a
  # [512, 3072]: 2.8 against 0.9 ms), and rounding the [B, T, 2F] result is a pass of its own.
  # Elsewhere (None) the products' results are bf16, as before.
  wide = jnp.float32 if _cpu_bf16(h, h) else None
  if "gate_up_dx" in w:
    gate_up_w = w["gate_up_dx"].astype(dtype)
    if _cpu_attention_threads() != 0 and cpu_gemm.swiglu_applies(h, gate_up_w):
      # A bf16 prefill with the library's kernels: the products and the gating in one call.
      hidden = cpu_gemm.swiglu(h, gate_up_w, threads=_cpu_attention_threads())  # [B, T, F]
    else:
      gate_up = matmul(h, gate_up_w, preferred_element_type=wide)
      gate, up = jnp.split(gate_up, 2, axis=-1)  # [B, T, F] each
      hidden = (jax.nn.silu(gate) * up).astype(dtype)
    x = x + matmul(hidden, w["down_fd"].astype(dtype))
  else:
    gate = project("btd,df->btf", h, w, "gate_df", dtype, wide)
    up = project("btd,df->btf", h, w, "up_df", dtype, wide)
    x = x + project("btf,fd->btd", (jax.nn.silu(gate) * up).astype(dtype), w, "down_fd", dtype)
  return x


def _attention_block_applies(
  w: dict[str, Array],
  x: Array,
  mask: Array | CausalMask,
  kv: dict[str, Array] | None,
  cache_index: Array | int,
  dtype: Any,
) -> bool:
  """Whether `decoder_layer` runs its attention block as `lm.cpu_gemm.attention_block`: a decode
  step (one token per row) or a prefill (the static slot 0, its [B, T, T] mask as one array: at most
  `attention_block` tokens), a cache of its own (no shared prefix), fused weights, traced for
  XLA:CPU with the kernels on (`cpu_attention`), in float32 or bfloat16 over a float32 or bfloat16
  cache."""
  floats = (jnp.float32, jnp.bfloat16)
  return (
    "qkv_dx" in w
    and kv is not None
    and "prefix_k" not in kv
    and (x.shape[1] == 1 or _is_prefill(cache_index))
    and not isinstance(mask, (CausalMask, SharedPrefixMask))
    and jnp.dtype(dtype) in floats
    and kv["k"].dtype == kv["v"].dtype
    and kv["k"].dtype in floats
    and _cpu_attention_threads() != 0
  )


def _attention_block(
  config: ModelConfig,
  w: dict[str, Array],
  h: Array,
  rotary: Rotary,
  mask: Array,
  kv: dict[str, Array],
  cache_index: Array | int,
  dtype: Any,
  matmul: Matmul,
) -> tuple[Array, dict[str, Array]]:
  """`decoder_layer`'s attention block by `lm.cpu_gemm.attention_block`: the fused QKV product,
  then the norms, rope, cache writes and attention in one call. Returns the attention output
  [B, T, N·H] (a decode step's float32 holding values of `dtype`, a prefill's in `dtype`: the
  product after it takes it as its rows) and the layer's updated cache.

  Why: XLA:CPU ran this block as ~20 small ops a layer around the kernels: 3.5 ms of a 38.5 ms bf16
  decode step at Qwen3-0.6B's shape, where the weights' stream is the step's bound
  (docs/results/2026-12-05-decode-block.md), and ~125 ms of a 1.24 s float32 prefill of 4 × 64
  tokens, where it computed the keys' transposes twice (docs/results/2026-12-05-prefill-block.md)."""
  b, t = h.shape[:2]
  # A bf16 prefill's product writes bf16 (the values the kernel rounds it to: half the bytes it
  # reads) and takes the attention's output as bf16 rows; a decode step's stay float32 (the decode
  # kernel's products read and write float32).
  inner = jnp.float32 if t == 1 or jnp.dtype(dtype) == jnp.float32 else dtype
  qkv = matmul(h, w["qkv_dx"].astype(dtype), preferred_element_type=inner)  # [B, T, (N + 2K)·H]
  bias = None
  if config.qkv_bias:
    bias = jnp.concatenate([w["q_bias_nh"], w["k_bias_kh"], w["v_bias_kh"]], axis=0)  # [N + 2K, H]
  attn, k, v = cpu_gemm.attention_block(
    qkv,
    kv["k"],
    kv["v"],
    cache_index,
    jnp.broadcast_to(mask, (b, t, mask.shape[-1])),
    rotary.cos.reshape(b, t, -1),
    rotary.sin.reshape(b, t, -1),
    q_norm=w["q_norm_h"] if config.qk_norm else None,
    k_norm=w["k_norm_h"] if config.qk_norm else None,
    bias=bias,
    eps=config.rms_norm_eps,
    dtype=dtype,
    threads=_cpu_attention_threads(),
    out_dtype=inner,
  )
  return (attn if t == 1 else attn.astype(dtype)), {**kv, "k": k, "v": v}


_FUSED = {"qkv_dx": ("q_dnh", "k_dkh", "v_dkh"), "gate_up_dx": ("gate_df", "up_df")}
# A fused layer's weights that `decoder_layer` multiplies by with `matmul`, each [K, N].
FUSED_PRODUCTS = ("qkv_dx", "o_xd", "gate_up_dx", "down_fd")


def fuse_projections(stacked: dict[str, Array]) -> LayerWeights:
  """Per-layer weights with q/k/v as one [D, (N + 2K)·H] matrix and gate/up as one [D, 2F], and
  the output projection as one [N·H, D] matrix, so every product of a layer is `matmul` of a row
  block and a [K, N] matrix (`decoder_layer`).

  For decoding on CPU, where a step's products have a few rows each and XLA:CPU spends as much on
  each product's launch and packing as on its arithmetic: one wide product does the work of three
  (or two) skinny ones. `decoder_layer` takes this path when it finds the fused entries. The
  concatenation copies those weights, so callers make it once (per parameter update), outside
  any jitted step, and only without a LoRA adapter (whose updates `project` applies per weight).
  """
  if any(name.endswith(("_lora_a", "_lora_b")) for name in stacked):
    raise ValueError("fuse_projections: weights with a LoRA adapter are projected one by one")
  fused = {k: v for k, v in stacked.items() if not any(k in parts for parts in _FUSED.values())}
  for name, parts in _FUSED.items():
    fused[name] = jnp.concatenate([stacked[p].reshape(*stacked[p].shape[:2], -1) for p in parts], axis=-1)
  o = fused.pop("o_nhd")  # [L, N, H, D]
  fused["o_xd"] = o.reshape(o.shape[0], -1, o.shape[-1])
  layers = next(iter(stacked.values())).shape[0]
  return [{name: w[i] for name, w in fused.items()} for i in range(layers)]


def _is_prefill(cache_index: Array | int) -> bool:
  """Whether a cached call writes the first slots of an empty cache (known at trace time)."""
  return isinstance(cache_index, int) and cache_index == 0


def _attention_mask(
  key_mask: Array, length: int, cache_index: Array | int, block: int | None = None
) -> Array | CausalMask:
  """[B, T, S]: causal over slots (query t sits at slot cache_index + t) and no padding keys.

  With more than `block` queries, the same mask as a `CausalMask` (blockwise attention, no
  [T, S] array); a decode step or a sequence within one block gets the plain [B, T, S] mask.
  """
  if block is not None and length > block:
    return CausalMask(key_mask.astype(bool), cache_index)
  query_slot = jnp.arange(length) + cache_index  # [T]
  causal = query_slot[:, None] >= jnp.arange(key_mask.shape[1])[None, :]  # [T, S]
  return causal[None] & key_mask[:, None, :]


def branch_mask(key_mask: Array, branch: Array) -> Array:
  """[B, T, T] mask of tree rows: query t sees real key s ≤ t of the stem (branch 0) or of its own
  branch. A row [stem, branch 1, branch 2] then computes, in one pass, what the two rows
  [stem, branch 1] and [stem, branch 2] compute (the branches' positions continue the stem's, as
  `lm.scoring.pack_shared_pairs` sets them), with the stem's work done once.

  Always a whole [T, S] array, even past `attention_block`: on XLA:CPU the attention kernel reads
  such a mask in its blocks; elsewhere the plain attention's scores are [T, S] anyway.
  """
  t = key_mask.shape[1]
  causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]  # [T, S]
  own = (branch[:, None, :] == 0) | (branch[:, None, :] == branch[:, :, None])  # [B, T, S]
  return causal[None] & own & key_mask.astype(bool)[:, None, :]


# Per-layer rematerialisation in the backward pass, by name (`decoder_stack`'s `remat`):
#   "none"           every activation of the forward pass is kept (fastest, most memory);
#   "dots_saveable"  matmul results without batch dimensions are kept, the rest recomputed
#                    (`jax.checkpoint_policies.dots_with_no_batch_dims_saveable`);
#   "full"           only each layer's input is kept, the whole layer recomputed (`nothing_saveable`).
REMAT_POLICIES = ("none", "dots_saveable", "full")


def remat_policy(remat: bool | str) -> Callable | None:
  """The `jax.checkpoint` policy of a remat name (True = "full", False = "none"); None: no remat."""
  name = ("full" if remat else "none") if isinstance(remat, bool) else remat
  if name not in REMAT_POLICIES:
    raise ValueError(f"remat must be one of {REMAT_POLICIES} (or a bool), got {remat!r}")
  return {
    "none": None,
    "dots_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
  }[name]


def decoder_stack(
  config: ModelConfig,
  weights: dict[str, Array],
  x: Array,
  positions: Array,
  key_mask: Array,
  *,
  dtype: Any,
  remat: bool | str = False,
  constrain=lambda x: x,
  branch: Array | None = None,
) -> Array:
  """All layers over a whole sequence with `lax.scan` over the stacked weights (training, scoring),
  unrolled when the model has at most `config.unroll_layers` layers; `remat` names each layer's
  rematerialisation policy (`REMAT_POLICIES`); `branch` [B, T]: tree rows (`branch_mask`)."""
  if branch is None:
    mask = _attention_mask(key_mask, x.shape[1], 0, config.attention_block)
  else:
    mask = branch_mask(key_mask, branch)
  rotary = rope_table(positions, config.head_dim, config.rope_theta, dtype)

  def body(carry, w):
    out, _ = decoder_layer(config, w, carry, rotary, mask, None, 0, dtype)
    return constrain(out), None

  policy = remat_policy(remat)
  if policy is not None:
    body = jax.checkpoint(body, policy=policy)
  x, _ = jax.lax.scan(body, x, weights, unroll=config.num_layers <= config.unroll_layers)
  return x


def cached_decoder_stack(
  config: ModelConfig,
  layer_weights: LayerWeights,
  x: Array,
  positions: Array,
  key_mask: Array,
  cache: Cache,
  cache_index: Array | int,
  *,
  dtype: Any,
  constrain=lambda x: x,
  matmul: Matmul = matmul,
  prefix_mask: Array | None = None,
  last_only: bool = False,
) -> tuple[Array, Cache]:
  """All layers with a KV cache, unrolled: each layer reads its own weight and cache buffers.
  `last_only`: the last layer's output at the last position only, [B, 1, D] (`decoder_layer`).

  Unrolling (instead of scanning) is what keeps a decode step at one read of every weight: a scan
  over stacked weights copies each layer's slice, and a scanned cache is rewritten every step.
  With `prefix_mask` [P, Lp] the rows share their prompts' keys (`SharedPrefixMask`): each layer's
  cache also holds "prefix_k" / "prefix_v", and `key_mask` and `cache_index` count own slots only.
  """
  length = x.shape[1]
  keys = key_mask[:, :length] if _is_prefill(cache_index) else key_mask  # see `decoder_layer`
  mask = _attention_mask(keys, length, cache_index, config.attention_block)
  if prefix_mask is not None:
    mask = SharedPrefixMask(mask, prefix_mask.astype(bool))
  rotary = rope_table(positions, config.head_dim, config.rope_theta, dtype)
  new_cache = []
  for i, (w, kv) in enumerate(zip(layer_weights, cache, strict=True)):
    last = last_only and i == len(cache) - 1
    x, kv = decoder_layer(config, w, x, rotary, mask, kv, cache_index, dtype, matmul, last_only=last)
    x = constrain(x)
    new_cache.append(kv)
  return x, new_cache


def param_axes(config: ModelConfig, paths: tuple[str, ...] | None = None) -> dict[str, tuple[str, ...]]:
  """Named axes of every parameter, keyed by its dotted path in the module ("layers.q_dnh")."""
  axes = {"embed_vd": ("V", "D"), "final_norm_d": ("D",), "lm_head_vd": ("V", "D")}
  for name, spec in layer_weight_specs(config).items():
    axes[f"layers.{name}"] = ("L", *spec.axes)
  if paths is None:
    return axes
  unknown = [p for p in paths if p not in axes]
  if unknown:
    raise KeyError(f"parameters with no known axes: {unknown}")
  return {p: axes[p] for p in paths}
