"""Batched sampling from a `lm.Qwen` model: one jitted prefill and one jitted decode loop.

Shapes stay static under jit: prompts are left-padded to a length bucket, the prompt batch to a
row bucket, the number of new tokens to a step bucket; per-row sampling parameters are arrays,
so changing temperature, top-p, top-k, the seed or `max_new_tokens` never recompiles. The n
samples of a prompt share one prefill (and on a mesh or an accelerator its KV cache, held once:
`SamplerConfig.share_prefix`; on one CPU device it is repeated n times) and each sample row
draws from its own key `fold_in(fold_in(key(seed), j), step)`: sample j of a prompt is the same
whether the prompt is sampled alone or inside any batch.

Log-probs are those of the model itself (no temperature or truncation applied), the quantity RL
losses and `lm.scoring` use. On a mesh the weights decode tensor parallel, never gathered whole
(`lm.sharding.DECODE_SHARDING`; docs/sampler.md).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from lm import cpu_gemm
from lm import model as model_lib
from lm import sharding as sharding_lib
from lm.model import Qwen, default_positions
from lm.shapes import pow2_bucket, round_up

Array = jax.Array
T = TypeVar("T")


class Detokenizer(Protocol):
  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...


@dataclasses.dataclass
class SamplerOutput:
  """Generated samples, nested [prompt][sample].

  Attributes:
    tokens: generated ids, EOS and stop sequences excluded.
    logprobs: the model's log-prob of each generated token.
    finish_reasons: "stop" (EOS or a stop sequence) or "length".
    prompt_lengths: tokens per prompt.
    texts: decoded samples when the sampler has a tokenizer (stop strings cut off), else None.
  """

  tokens: list[list[list[int]]]
  logprobs: list[list[list[float]]]
  finish_reasons: list[list[str]]
  prompt_lengths: list[int]
  texts: list[list[str]] | None = None

  @property
  def lengths(self) -> list[list[int]]:
    return [[len(t) for t in per_prompt] for per_prompt in self.tokens]


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """Bucketing and memory knobs.

  Attributes:
    min_prompt_bucket: smallest padded prompt length; buckets grow in powers of two.
    prompt_bucket_multiple: > 0 rounds prompt lengths up to a multiple of this instead (more
      compiled shapes, less padding: prefill attention is quadratic in the padded length, so
      long prompts of similar lengths — RL rollouts — run much faster with e.g. 64).
    step_bucket: `max_new_tokens` is rounded up to a multiple of this (the loop still stops at
      the requested count; only buffer shapes are rounded).
    min_rows: smallest prompt-row bucket (a server sees batches of every size: a floor of 8
      compiles one shape for all batches up to 8 prompts).
    max_rows: most decode rows (prompts × n) in one device call; larger requests are chunked.
    cache_dtype: KV-cache dtype (default: the model's compute dtype; float32 for a bfloat16 model
      on one CPU device without `lm.cpu_gemm`'s kernel, `cache_dtype()`).
    decode_phases: on CPU (no mesh), a decode loop in this many phases over ever larger caches
      (`_phase_ends`), so a step's attention reads about the filled part of the cache rather
      than every slot of the step bucket; 1 reads the whole cache from the first step (as
      accelerators always do). Each phase is its own loop body in the compiled decode program.
    decode_phase_min_steps: no phase is shorter than this many steps, so step buckets up to
      twice this decode in one phase: at 128 new tokens (shape (a) of
      `benchmarks/sampler_bench.py`) three phases measured 1.01 [0.91–1.18]× one and compiled
      1.6× longer; at 1024, 1.15 [0.97–1.59]×.
    cpu_gemm_threads: on CPU (no mesh, no LoRA adapter, float32 or bfloat16), the weights are
      packed for `lm.cpu_gemm`'s kernel (where it is built: `cpu_gemm.available()`), which then
      computes the products of the prefill and the decode steps with this many threads (bfloat16
      products of more than `cpu_gemm.KERNEL_MAX_ROWS_BF16` rows, a prefill's, run the library's
      VDPBF16PS kernel where the CPU has AVX512_BF16, else XLA's dot): -1 as many as
      XLA's intra-op pool has (every core), n at most n; 0 keeps XLA's dot on row-major weights.
      The attention runs the library's kernels with the same threads: the prefill's
      (`lm.model.sequence_attention`) and the decode steps' (`lm.model.decode_attention`, over
      a bf16 cache for a bf16 model: `cache_dtype`); 0 keeps XLA's ops there too.
    share_prefix: the n > 1 samples of a prompt share its prompt's KV cache (held once per prompt,
      each sample holding only its generated slots) instead of n copies of it: None (default)
      shares on a mesh and on accelerators, and keeps the copies on one CPU device, whose decode
      attention is tuned for one cache (`lm.model.attention`); see docs/sampler.md.
  """

  min_prompt_bucket: int = 16
  prompt_bucket_multiple: int = 0
  min_rows: int = 1
  step_bucket: int = 64
  max_rows: int = 256
  cache_dtype: Any = None
  decode_phases: int = 3
  decode_phase_min_steps: int = 128
  cpu_gemm_threads: int = -1
  share_prefix: bool | None = None

  def __post_init__(self):
    if self.cpu_gemm_threads < -1:
      raise ValueError(
        f"SamplerConfig.cpu_gemm_threads must be -1 (every core), 0 (off) or n > 0: {self.cpu_gemm_threads}"
      )


class Sampler:
  """Samples continuations of token-id prompts from a model (optionally sharded on a mesh).

  With a `mesh` (the sampling mesh: the training mesh or one of its own), `refresh` puts the
  weights into the `sharding` layout on that mesh, by default `lm.sharding.DECODE_SHARDING`:
  tensor parallel over the mesh's model axes (fsdp × tp), rows over data, as serving engines
  decode. Wherever the model's own arrays live (any mesh, any layout), that is a copy of the
  weights at 1 / (fsdp × tp) per device; decode then never gathers a weight (see docs/sampler.md).
  """

  def __init__(
    self,
    model: Qwen,
    *,
    tokenizer: Detokenizer | None = None,
    mesh: jax.sharding.Mesh | None = None,
    config: SamplerConfig = SamplerConfig(),
    sharding: sharding_lib.ShardingConfig | None = None,
  ):
    self.model = model
    self.tokenizer = tokenizer
    self.mesh = mesh
    self.config = config
    self.sharding = sharding or sharding_lib.DECODE_SHARDING
    self.pad_id = model.config.pad_token_id or 0
    self.refresh()

  def refresh(self) -> None:
    """Picks up new parameter values (e.g. after a training step) without recompiling."""
    model = self.model
    if self.mesh is None:
      self._graphdef, self._state = nnx.split(model)
    else:
      self._graphdef, self._state = sampling_split(model, self.mesh, self.sharding)
      model = nnx.merge(self._graphdef, self._state)
    # The output projection as a separate [D, V] buffer: XLA:CPU's Eigen dot runs the skinny
    # decode-step product ~4x faster in this layout than against the vocabulary-major [V, D]
    # matrix (7.0 vs 29.8 ms at [8, 512] x [512, 32000]; inside one jit a transpose would be
    # folded back into the dot). Costs one extra copy.
    self._head_dv = _transpose(model.output_weight_vd())
    # On CPU, each layer's weights as their own buffers with q/k/v and gate/up fused
    # (`lm.model.fuse_projections`): prepared here once per parameter update, so no call slices or
    # concatenates weights. Costs a copy of the layer weights; accelerators, sharded models and
    # LoRA adapters keep the stacked weights (split inside the program).
    self._layer_weights = None
    self._gemm_threads = 0
    if jax.default_backend() == "cpu" and self.mesh is None and self.model.lora is None:
      self._layer_weights = _fuse(self.model.layers.weights())
      # Then packed for `lm.cpu_gemm`'s kernel (float32 or bfloat16, where it is built): replacing
      # the fused copies and the [D, V] head, so the weights are held twice, as without it (a
      # bfloat16 layer weight keeps its fused copy too, for the prefill: the bytes of a float32 one).
      # Weights stored wider than the products' dtype (float32 master weights, bfloat16 compute:
      # `load_hf(compute_dtype=)`, a trainer's) are packed in the products' dtype: every product
      # casts them to it anyway, so the values are the same and a decode step reads half the bytes.
      dtype = self.model.dtype
      if self.config.cpu_gemm_threads != 0 and dtype in cpu_gemm.DTYPES and cpu_gemm.available():
        self._layer_weights = _pack_layers(_cast_products(self._layer_weights, dtype))
        self._head_dv = _pack(self._head_dv.astype(dtype))
        self._gemm_threads = self.config.cpu_gemm_threads

  def generate(
    self,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int | Sequence[int],
    n: int = 1,
    temperature: float | Sequence[float] = 1.0,
    top_p: float | Sequence[float] = 1.0,
    top_k: int | Sequence[int] = 0,
    eos_ids: Sequence[int] = (),
    stop: Sequence[str | Sequence[int]] = (),
    seed: int | Sequence[int] = 0,
    on_tokens: TokenListener | None = None,
    stream_every: int = 16,
  ) -> SamplerOutput:
    """Samples `n` continuations of every prompt.

    Args:
      prompts: token-id lists (at least one token each).
      max_new_tokens: most tokens generated per sample, for every prompt or one per prompt.
      n: samples per prompt (they share one prefill).
      temperature, top_p, top_k, seed: a scalar for every prompt or one value per prompt;
        temperature 0 is greedy, top_k 0 and top_p 1 disable truncation.
      eos_ids: tokens that end a sample (not included in the output).
      stop: stop sequences, as token-id lists or strings (strings need a tokenizer). Matching is
        on token ids on device (the string's own encoding) so rows stop early, then, for
        strings, on the decoded text, which also catches other tokenisations of the string.
      on_tokens: called as tokens are made (a streaming server's hook), after the first token and
        then every `stream_every` decode steps, with each sample's new tokens: one device program
        per chunk of steps instead of one for the whole decode (`_Programs.streamed`). The tokens
        are the device's, before the host cuts stop strings (and stop sequences' own tokens). The
        result is the same either way.
    """
    if stream_every < 1:
      raise ValueError(f"stream_every must be >= 1, got {stream_every}")
    if not prompts:
      return SamplerOutput([], [], [], [], [] if self.tokenizer else None)
    if any(len(p) == 0 for p in prompts):
      raise ValueError("every prompt needs at least one token")
    num = len(prompts)
    settings = {
      "max_new_tokens": [int(v) for v in per_prompt(max_new_tokens, num, "max_new_tokens")],
      "temperature": [float(v) for v in per_prompt(temperature, num, "temperature")],
      "top_p": [float(v) for v in per_prompt(top_p, num, "top_p")],
      "top_k": [int(v) for v in per_prompt(top_k, num, "top_k")],
      "seed": [int(v) for v in per_prompt(seed, num, "seed")],
    }
    if min(settings["max_new_tokens"]) < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {min(settings['max_new_tokens'])}")
    stop_strings = [s for s in stop if isinstance(s, str)]
    if stop_strings and self.tokenizer is None:
      raise ValueError("stop strings need a Sampler built with a tokenizer")
    stop_ids = [list(self.tokenizer.encode(s)) if isinstance(s, str) else list(s) for s in stop]
    stop_ids = [s for s in stop_ids if s]
    out = SamplerOutput([], [], [], [len(p) for p in prompts], [] if self.tokenizer else None)
    chunk = max(1, self.config.max_rows // n)
    for start in range(0, num, chunk):
      idx = slice(start, start + chunk)
      listener = None if on_tokens is None else functools.partial(_shifted, on_tokens, start)
      self._generate_chunk(
        prompts[idx],
        {k: v[idx] for k, v in settings.items()},
        n,
        tuple(eos_ids),
        stop_ids,
        stop_strings,
        out,
        listener,
        stream_every,
      )
    return out

  def lowered(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, n: int = 1) -> dict[str, Any]:
    """The compiled-to-be programs `generate` runs for these prompts (default sampling settings),
    lowered (`jax.stages.Lowered`: `.compile().as_text()`, `.compile().memory_analysis()`), by name:
    "decode", the program holding the decode loop, and on CPU "prefill", its own program. The
    prefill runs once here to give the decode program its cache."""
    num = len(prompts)
    settings = dict(max_new_tokens=[max_new_tokens] * num, temperature=[1.0] * num, top_p=[1.0] * num)
    settings |= dict(top_k=[0] * num, seed=[0] * num)
    fn, inputs, _ = self._prepare(prompts, settings, n, (), [])
    args = (self._state, self._head_dv, self._layer_weights)
    if fn.prefill is None:
      return {"decode": fn.decode.lower(*args, **inputs)}
    tokens, mask = inputs.pop("tokens"), inputs.pop("mask")
    cache, last_logits = fn.prefill(*args, tokens, mask)
    return {
      "prefill": fn.prefill.lower(*args, tokens, mask),
      "decode": fn.decode.lower(*args, cache, last_logits, tokens, mask, **inputs),
    }

  def _prepare(self, prompts, params, n, eos_ids, stop_ids):
    """The programs for this chunk's shapes, their padded inputs on the mesh, and the prompt count."""
    inputs = chunk_inputs(
      prompts, params, eos_ids, stop_ids, pad_id=self.pad_id, config=self.config,
      batch_multiple=_batch_multiple(self.mesh, self.sharding),
    )  # fmt: skip
    inputs = self._place(inputs)
    # One new token is a bucket of its own: `begin` gives it from the prefill's logits, with no
    # loop and no cache grown for steps that never run (a first token's time, as a stream has it).
    longest = max(params["max_new_tokens"])
    steps = 1 if longest == 1 else round_up(longest, self.config.step_bucket)
    one_cpu = jax.default_backend() == "cpu" and self.mesh is None
    fn = _generate_fn(
      self._graphdef,
      n,
      steps,
      self.mesh,
      self.sharding,
      cache_dtype(self.config, self.model.dtype, one_cpu, self._gemm_threads != 0),
      _phase_ends(steps, self.config.decode_phases, self.config.decode_phase_min_steps),
      self._gemm_threads,
      self.model.config.num_heads > self.model.config.num_kv_heads,
      n > 1 and self._share_prefix(),
    )
    return fn, inputs, len(prompts)

  def _share_prefix(self) -> bool:
    if self.config.share_prefix is not None:
      return self.config.share_prefix
    return self.mesh is not None or jax.default_backend() != "cpu"

  def _generate_chunk(
    self, prompts, params, n, eos_ids, stop_ids, stop_strings, out: SamplerOutput, on_tokens, every
  ) -> None:
    fn, inputs, num = self._prepare(prompts, params, n, eos_ids, stop_ids)
    args = (self._state, self._head_dv, self._layer_weights)
    if on_tokens is None:  # one program for the whole decode
      result = fn(*args, **inputs)
    else:
      report = functools.partial(_report, on_tokens, n, num * n, [0] * (num * n))
      result = fn.streamed(*args, every=every, report=report, **inputs)
    gen, logp, length, stopped = sharding_lib.to_host(result)  # every process gets every row
    for i in range(num):
      toks, lps, reasons, texts = [], [], [], []
      for j in range(n):
        r = i * n + j
        t = gen[r, : length[r]].tolist()
        lp = logp[r, : length[r]].tolist()
        reason = "stop" if stopped[r] else "length"
        text = None
        if self.tokenizer is not None:
          t, lp, text, hit = _cut_stop_strings(self.tokenizer, t, lp, stop_strings)
          reason = "stop" if hit else reason
        toks.append(t)
        lps.append(lp)
        reasons.append(reason)
        texts.append(text)
      out.tokens.append(toks)
      out.logprobs.append(lps)
      out.finish_reasons.append(reasons)
      if out.texts is not None:
        out.texts.append(texts)

  def _place(self, inputs: dict[str, np.ndarray]) -> dict[str, Array]:
    if self.mesh is None:
      return {k: jnp.asarray(v) for k, v in inputs.items()}
    return {
      k: jax.device_put(v, _input_sharding(self.mesh, self.sharding, k, v.shape)) for k, v in inputs.items()
    }


def _batch_multiple(mesh, shard: sharding_lib.ShardingConfig) -> int:
  """Prompt rows are a multiple of this: the devices of the layout's batch axes (1 without a mesh)."""
  if mesh is None:
    return 1
  axes = shard.tokens_bt[0]
  axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
  return math.prod(mesh.shape[a] for a in axes)


def _input_sharding(mesh, shard: sharding_lib.ShardingConfig, name: str, shape) -> jax.sharding.Sharding:
  """Where a chunk input lives on the mesh: rows split over the batch axes, the tables replicated."""
  if len(shape) and name not in ("eos", "stop"):
    return sharding_lib.batch_sharding(mesh, shape, shard)
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def chunk_inputs(
  prompts: Sequence[Sequence[int]],
  params: dict[str, Sequence],
  eos_ids: Sequence[int],
  stop_ids: Sequence[Sequence[int]],
  *,
  pad_id: int,
  config: SamplerConfig,
  batch_multiple: int = 1,
) -> dict[str, np.ndarray]:
  """The host arrays one device call of `generate` takes for a chunk of prompts: prompts left-padded
  to the length bucket, the rows to the row bucket (a multiple of `batch_multiple`), per-row
  settings (`params`: lists of max_new_tokens, temperature, top_p, top_k, seed), EOS and stop
  tables in bucketed shapes. `generate` and `shaped_programs` both build their inputs here, so a
  plan compiles the shapes a run compiles."""
  num = len(prompts)
  rows = round_up(pow2_bucket(num, config.min_rows), batch_multiple)
  longest = max(len(p) for p in prompts)
  if config.prompt_bucket_multiple > 0:
    prompt_len = max(round_up(longest, config.prompt_bucket_multiple), config.min_prompt_bucket)
  else:
    prompt_len = pow2_bucket(longest, config.min_prompt_bucket)
  tokens = np.full((rows, prompt_len), pad_id, np.int32)
  mask = np.zeros((rows, prompt_len), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, prompt_len - len(p) :] = p
    mask[i, prompt_len - len(p) :] = 1

  def padded(values, fill, dtype):
    return np.asarray(list(values) + [fill] * (rows - num), dtype)

  # Stop tables come in bucketed shapes so a new stop set rarely recompiles.
  stop_len = pow2_bucket(max([len(s) for s in stop_ids], default=1), 8)
  stop_table = np.full((pow2_bucket(len(stop_ids), 4), stop_len), -1, np.int32)
  for i, s in enumerate(stop_ids):
    stop_table[i, stop_len - len(s) :] = s
  return dict(
    tokens=tokens,
    mask=mask,
    temperature=padded(params["temperature"], 1.0, np.float32),
    top_p=padded(params["top_p"], 1.0, np.float32),
    top_k=padded(params["top_k"], 0, np.int32),
    seed=padded(params["seed"], 0, np.uint32),
    eos=np.asarray(list(eos_ids) or [-1], np.int32),
    stop=stop_table,
    max_new=padded(params["max_new_tokens"], 1, np.int32),
  )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShapedCall:
  """One jitted program of the sampler and abstract arguments for it: `fn.lower(*args, **kwargs)`
  compiles what `Sampler.generate` runs (`shaped_programs`)."""

  name: str
  fn: Any
  args: tuple
  kwargs: dict


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShapedSampler:
  """The sampler's programs for one chunk shape, on abstract weights (`shaped_programs`).

  programs: "sample" (prefill and decode, one program: accelerators and every mesh), or on CPU
    without a mesh "prefill" and "decode".
  prompts, prompt_len, steps: the compiled shapes — prompt rows after bucketing (each decoding
    `n` samples), the padded prompt length and the step bucket.
  weights: the weights as the program reads them (`sampling_split`'s layout on a mesh).
  head_bytes, copy_bytes: per device, what a `Sampler` keeps beside the model's own arrays between
    calls: the output head as its own [D, V] buffer (`Sampler.refresh`), and the weights again
    wherever the decode layout differs from the model's (the copy `sampling_split` makes).
  host_inputs: the host arrays the programs' abstract inputs were built from (prompts of token 1,
    temperature 1, seed 0), so that a device check can run the planned program itself.
  """

  programs: list[ShapedCall]
  prompts: int
  prompt_len: int
  steps: int
  weights: Any
  head_bytes: int
  copy_bytes: int
  host_inputs: dict[str, np.ndarray]

  @property
  def held_bytes(self) -> int:
    return self.head_bytes + self.copy_bytes


def shaped_programs(
  model: Qwen,
  mesh: jax.sharding.Mesh | None,
  *,
  rows: int,
  prompt_len: int,
  new_tokens: int,
  n: int = 1,
  config: SamplerConfig = SamplerConfig(),
  sharding: sharding_lib.ShardingConfig | None = None,
  platform: str = "",
) -> ShapedSampler:
  """The programs `Sampler(model, mesh=mesh, config=config).generate` compiles for a chunk of
  `rows` decode rows (`rows // n` prompts of `prompt_len` tokens, `n` samples each, `new_tokens`
  new tokens), with abstract inputs: the public compile entry a plan or a device check asks for
  instead of rebuilding the sampler's inputs (as maxtext's `train_compile.get_shaped_inputs`).

  `model`'s parameters may be `jax.ShapeDtypeStruct`s carrying shardings (`lm.plan.abstract_model`)
  or real arrays; nothing is computed. `platform` ("cuda", "tpu", "cpu"; "" this host's backend)
  picks the program's form, so a CPU host can plan an accelerator's program.
  """
  sharding = sharding or sharding_lib.DECODE_SHARDING
  platform = platform or jax.default_backend()
  cpu = platform == "cpu"
  graphdef, own = nnx.split(model)
  own = jax.tree.map(_shaped, own)  # real arrays become their shapes: nothing is copied
  model = nnx.merge(graphdef, own)
  graphdef, state = nnx.split(model) if mesh is None else sampling_split(model, mesh, sharding)
  weight_vd = (model.embed_vd if model.config.tie_word_embeddings else model.lm_head_vd).get_value()
  head_dv = _head_like(weight_vd, mesh)
  prompts = max(1, rows // n)
  settings = dict(max_new_tokens=[new_tokens] * prompts, temperature=[1.0] * prompts, top_p=[1.0] * prompts)
  settings |= dict(top_k=[0] * prompts, seed=[0] * prompts)
  eos = list(model.config.eos_token_ids or ())
  host = chunk_inputs(
    [[1] * prompt_len] * prompts, settings, eos, [], pad_id=model.config.pad_token_id or 0, config=config,
    batch_multiple=_batch_multiple(mesh, sharding),
  )  # fmt: skip
  inputs = {
    k: jax.ShapeDtypeStruct(
      v.shape, v.dtype, sharding=None if mesh is None else _input_sharding(mesh, sharding, k, v.shape)
    )
    for k, v in host.items()
  }
  steps = round_up(new_tokens, config.step_bucket)
  share = n > 1 and (
    config.share_prefix if config.share_prefix is not None else (mesh is not None or not cpu)
  )
  fn = _generate_fn(
    graphdef, n, steps, mesh, sharding, cache_dtype(config, model.dtype, cpu and mesh is None),
    _phase_ends(steps, config.decode_phases, config.decode_phase_min_steps), 0,
    model.config.num_heads > model.config.num_kv_heads, share, platform,
  )  # fmt: skip
  args = (state, head_dv, None)
  if fn.prefill is None:
    programs = [ShapedCall(name="sample", fn=fn.decode, args=args, kwargs=inputs)]
  else:
    tokens, mask = inputs.pop("tokens"), inputs.pop("mask")
    cache, last_logits = jax.eval_shape(fn.prefill, *args, tokens, mask)
    programs = [
      ShapedCall(name="prefill", fn=fn.prefill, args=(*args, tokens, mask), kwargs={}),
      ShapedCall(name="decode", fn=fn.decode, args=(*args, cache, last_logits, tokens, mask), kwargs=inputs),
    ]
  copied = 0
  if mesh is not None:  # the decode layout's copy, where it differs from the model's own
    for a, b in zip(jax.tree.leaves(own), jax.tree.leaves(state), strict=True):
      src = getattr(a, "sharding", None)
      if src is None or not src.is_equivalent_to(b.sharding, len(b.shape)):
        copied += _bytes(b)
  return ShapedSampler(
    programs=programs, prompts=host["tokens"].shape[0], prompt_len=host["tokens"].shape[1], steps=steps,
    weights=state, head_bytes=_bytes(head_dv), copy_bytes=copied, host_inputs=host,
  )  # fmt: skip


def _shaped(x) -> jax.ShapeDtypeStruct:
  """An array's (or an abstract array's) shape, dtype and sharding."""
  if isinstance(x, jax.ShapeDtypeStruct):
    return x
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))


def _head_like(weight_vd, mesh) -> jax.ShapeDtypeStruct:
  """The [D, V] head buffer `Sampler.refresh` makes (`_transpose` of the [V, D] weight), abstract:
  on a mesh the weight's spec transposed, fitted to the mesh."""
  shape = tuple(weight_vd.shape[::-1])
  if mesh is None:
    return jax.ShapeDtypeStruct(shape, weight_vd.dtype)
  spec = tuple(weight_vd.sharding.spec) if getattr(weight_vd, "sharding", None) is not None else ()
  vocab_axis, model_axis = (spec + (None, None))[:2]
  head_spec = sharding_lib.fit_spec(jax.sharding.PartitionSpec(model_axis, vocab_axis), shape, mesh)
  return jax.ShapeDtypeStruct(shape, weight_vd.dtype, sharding=jax.sharding.NamedSharding(mesh, head_spec))


def _bytes(x) -> int:
  """Bytes per device of one (abstract or real) array: its shard."""
  shape = x.shape
  if getattr(x, "sharding", None) is not None:
    shape = x.sharding.shard_shape(shape)
  return math.prod(shape) * jnp.dtype(x.dtype).itemsize


def sampling_split(
  model: Qwen, mesh: jax.sharding.Mesh, config: sharding_lib.ShardingConfig = sharding_lib.DECODE_SHARDING
) -> tuple[nnx.GraphDef, nnx.State]:
  """`nnx.split` of `model` as the sampler runs it on `mesh` in `config`'s layout: the residual
  stream pinned to `config.act_btd` there, and every array put onto its sharding (`jax.device_put`:
  a no-op for arrays already there, a copy for the rest; abstract `jax.ShapeDtypeStruct`s, as
  `lm.plan` compiles, get the sharding). Parameters get their named axes' specs; anything else (a
  LoRA adapter's factors, rank-sized) is replicated."""
  view = copy.copy(model)
  view.activation_sharding = model_lib.ActivationSharding(jax.sharding.NamedSharding(mesh, config.act_btd))
  graphdef, state = nnx.split(view)
  shardings = sharding_lib.param_shardings(model, mesh, config)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def put(path, x):
    name = ".".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))
    target = shardings.get(name, replicated)
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=target)
    return jax.device_put(x, target)

  return graphdef, jax.tree_util.tree_map_with_path(put, state)


_transpose = jax.jit(lambda w: w.T)
_fuse = jax.jit(model_lib.fuse_projections)
_pack = jax.jit(cpu_gemm.pack)
_cast_products = jax.jit(
  lambda layers, dtype: [
    {k: v.astype(dtype) if k in model_lib.FUSED_PRODUCTS else v for k, v in w.items()} for w in layers
  ],
  static_argnums=1,
)
# bfloat16 layer weights also keep their row-major copy, which a prefill's products read
# (`cpu_gemm.pack(rows=True)`), unless the library multiplies those on the packed blocks itself
# (`cpu_gemm.bf16_dot()`: AVX512_BF16); a head product has a few rows only, the kernel's.
_pack_layers = jax.jit(
  lambda layers: [
    {
      k: cpu_gemm.pack(v, rows=not cpu_gemm.bf16_dot()) if k in model_lib.FUSED_PRODUCTS else v
      for k, v in w.items()
    }
    for w in layers
  ]
)
# XLA:CPU hands every dot to YNNPACK by default, which runs a decode step's skinny products
# ([B, D] x [D, F], B a few rows) slowly: a profile of shape (a) of benchmarks/sampler_bench.py
# shows 1.1 ms for each [8, 512] x [512, 1536] product, ~3 GB/s of weights. These options keep
# YNNPACK for reductions and convolutions (the other defaults) and give dots back to Eigen, for
# the sampler's program only: that step goes from 25.8 to 21.2 ms (17.5 together with the
# multiply-reduce decode attention of `lm.model.attention`).
_CPU_DECODE_OPTIONS = {
  "xla_cpu_experimental_ynn_fusion_type": ",".join(
    ["LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION", "LIBRARY_FUSION_TYPE_REDUCE"]
  )
}
# The same without YNNPACK's reductions, for models without grouped queries (as many kv heads as
# query heads). The decode attention's multiply-reduces then carry a size-1 group axis, and
# YNNPACK reduces them 10-30x slower than XLA's own loops (one reduction, best of 20, the
# development machine's 2 cores, 2026-12-01): scores of [160 rows, 4 heads, 1, 264 slots, 16]
# 15.2 ms against 0.61, the weighted sum 26.8 against 1.4; [8, 8, 1, 200, 64] 1.8 / 6.6 ms
# against 0.40 / 0.30. With groups (G = 2) YNNPACK's are the faster: [8, 4, 2, 192, 64] 0.23 /
# 0.10 ms against 0.43 / 0.26, [4, 8, 2, 192, 128] (Qwen3-0.6B) 0.38 / 0.17 against 0.67 / 0.38.
# The testbed's tiny solver (4 heads, 4 kv heads) sampled 27 prompts x 5 in 689 ms a call with
# YNNPACK's reductions and 248 without.
_CPU_DECODE_OPTIONS_NO_GROUPS = {
  "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"
}


def cache_dtype(config: SamplerConfig, model_dtype: Any, cpu: bool, kernel: bool = False) -> Any:
  """The KV cache's dtype: `config.cache_dtype`, else the model's compute dtype, except a bfloat16
  model's on one CPU device (`cpu`) without `lm.cpu_gemm`'s decode attention (`kernel`), whose
  cache is float32. The kernel reads a bf16 cache itself, widening in registers: half the bytes a
  step streams from the cache. XLA's own decode attention computes in float32, and XLA:CPU's
  bf16 -> f32 converts made it 2.2x slower than over a float32 cache (one layer at Qwen3-0.6B's
  shape, 4 rows x 192 slots: 1.36 against 0.61 ms); a float32 cache holds the same values (a bf16
  key or value is exact in float32)."""
  if config.cache_dtype is not None:
    return config.cache_dtype
  return jnp.float32 if cpu and not kernel and jnp.dtype(model_dtype) == jnp.bfloat16 else model_dtype


def _decode_options(grouped: bool) -> dict[str, str]:
  """XLA:CPU options of the sampler's decode program, for a model with grouped queries or not."""
  return _CPU_DECODE_OPTIONS if grouped else _CPU_DECODE_OPTIONS_NO_GROUPS


def per_prompt(value: T | Sequence[T], num: int, name: str) -> list[T]:
  """`value` repeated for `num` prompts, or the per-prompt list itself after a length check.

  The one rule for "one value for every prompt or one per prompt", here and in `lm.generators`.
  """
  if isinstance(value, (list, tuple, np.ndarray)):
    if len(value) != num:
      raise ValueError(f"{name} has {len(value)} values for {num} prompts")
    return list(value)
  return [value] * num


def _cut_stop_strings(tokenizer, tokens, logprobs, stop_strings):
  """Cuts a sample at the first stop string in its text; returns (tokens, logprobs, text, hit)."""
  text = tokenizer.decode(tokens)
  cuts = [text.find(s) for s in stop_strings if s in text]
  if not cuts:
    return tokens, logprobs, text, False
  cut = min(cuts)
  # Keep the longest token prefix whose text ends before the stop string begins.
  keep = 0
  while keep < len(tokens) and len(tokenizer.decode(tokens[: keep + 1])) <= cut:
    keep += 1
  return tokens[:keep], logprobs[:keep], text[:cut], True


class TokenListener(Protocol):
  """`Sampler.generate`'s `on_tokens`: sample `sample` of prompt `prompt` has made `token_ids` (with
  their log-probs), its tokens `start`, `start + 1`, ... (`start` counts the tokens reported before)."""

  def __call__(
    self, prompt: int, sample: int, start: int, token_ids: list[int], logprobs: list[float]
  ) -> None: ...


def _shifted(on_tokens: TokenListener, first: int, prompt: int, *rest) -> None:
  """`on_tokens` for a device call whose prompt 0 is the generate call's prompt `first`."""
  on_tokens(first + prompt, *rest)


def _report(
  on_tokens: TokenListener, n: int, used: int, sent: list[int], loop: _SamplingState
) -> tuple[int, bool]:
  """Hands each of the first `used` rows' new tokens to `on_tokens` (`sent[r]`: row r's tokens so
  far, updated); returns (steps taken, every row done) for `_Programs.streamed`."""
  tokens, logprobs, step, done = sharding_lib.to_host((loop.tokens, loop.logprobs, loop.step, loop.done))
  for r in range(used):
    made = tokens[r, :step]
    ended = np.flatnonzero(made < 0)  # -1 from EOS on
    length = int(ended[0]) if ended.size else int(step)
    if length > sent[r]:
      on_tokens(
        r // n, r % n, sent[r], made[sent[r] : length].tolist(), logprobs[r, sent[r] : length].tolist()
      )
      sent[r] = length
  return int(step), bool(done.all())


@struct.dataclass
class _SamplingState:
  """The decode loop's carry, named (as tunix's and flax `examples/gemma`'s `_SamplingState`).

  B is decode rows (prompts × n), W the stop-sequence window, V the vocabulary.
  """

  step: Array  # [] int32: tokens chosen so far
  token: Array  # [B] int32: the last chosen token, whose forward pass the next step runs
  cache: Any  # the model's KV cache (`Qwen.init_cache`), filled up to the prompt plus `step` − 1
  done: Array  # [B] bool: the row has ended (EOS, a stop sequence or its max_new)
  tokens: Array  # [B, steps] int32: generated ids, -1 at EOS and after a row ends
  logprobs: Array  # [B, steps] float32: the model's log-prob of each token, 0 after a row ends
  recent: Array  # [B, W] int32: the last W tokens, for stop sequences (-2 before any)
  stopped: Array  # [B] bool: the row ended on EOS or a stop sequence (not on length)


def _phase_ends(steps: int, phases: int, min_steps: int = 1) -> tuple[int, ...]:
  """Decode steps after which each phase's loop ends: steps / 2^(phases − 1), ..., steps / 2, steps,
  leaving out ends below `min_steps` (so a short bucket stays one phase).

  Phase i runs with a cache of prompt + ends[i] slots, so a step reads at most twice the slots
  filled so far (after the first phase's), whatever the step bucket; halving keeps the number of
  compiled loop bodies at most `phases` for every bucket.
  """
  ends = {steps >> k for k in range(max(phases, 1)) if (steps >> k) >= max(min_steps, 1)}
  return tuple(sorted(ends | {steps}))


def _grow_cache(cache, slots: int):
  """The cache with empty slots appended up to `slots` ([B, K, S, H] "k" and "v" of each layer; one
  copy per phase, the first fused with the prompt cache's repeat over samples). A shared prompt's
  "prefix_k" / "prefix_v" stay as they are."""
  pad = lambda c: jnp.pad(c, ((0, 0), (0, 0), (0, slots - c.shape[2]), (0, 0)))
  return [{**kv, "k": pad(kv["k"]), "v": pad(kv["v"])} for kv in cache]


def _weights_of(graphdef, state, layer_weights):
  """The model, and its per-layer weights split once outside the decode loop unless given."""
  model = nnx.merge(graphdef, state)
  if layer_weights is None:
    layer_weights = model.unstacked_layer_weights()
  return model, layer_weights


def _matmul(gemm_threads: int):
  return functools.partial(cpu_gemm.matmul, threads=gemm_threads) if gemm_threads else model_lib.matmul


def _head(h: Array, head_dv: Array, matmul) -> Array:  # [B, D] -> float32 logits [B, V]
  return matmul(h, head_dv.astype(h.dtype), preferred_element_type=jnp.float32)


@functools.lru_cache(maxsize=64)
def _prefill_fn(graphdef, cache_dtype, gemm_threads: int, jit: bool):
  """The prompt's forward pass for one graph: (cache [P, K, prompt, H] per layer, last-position
  logits [P, V]). Its shapes are the prompts' only, so one program serves every `n` and step bucket
  (`_generate_fn` appends the slots it decodes into); `jit`: its own executable (CPU), else the
  plain function for `_generate_fn`'s single program."""
  matmul = _matmul(gemm_threads)

  def prefill(state, head_dv, layer_weights, tokens, mask):
    model, layer_weights = _weights_of(graphdef, state, layer_weights)
    rows, prompt_len = tokens.shape
    with model_lib.cpu_attention(gemm_threads):  # its kernels where the products have theirs
      hidden, cache = model.hidden_states(
        tokens,
        positions=default_positions(mask),
        attention_mask=mask,
        cache=model.init_cache(rows, prompt_len, cache_dtype),
        cache_index=0,
        layer_weights=layer_weights,
        matmul=matmul,
        last_only=True,  # only the last prompt position's logits are read
      )
    return cache, _head(hidden[:, -1], head_dv, matmul)

  return jax.jit(prefill) if jit else prefill


@struct.dataclass
class _Rows:
  """The per-row constants of one decode (B rows = prompts × n), beside its `_SamplingState`: built
  once with the first token and passed unchanged to every chunk of a streamed decode."""

  keys: Array  # [B] PRNG keys, `fold_in(key(seed), sample index)`
  temperature: Array  # [B] float32
  top_p: Array  # [B] float32
  top_k: Array  # [B] int32
  max_new: Array  # [B] int32
  next_pos: Array  # [B] int32: the position of the first new token
  key_mask: Array  # [B, S]: the prompt's padding (unless shared), then every generated slot
  mask: Array  # [P, prompt]: the prompts' mask (a shared prefix's keys)
  eos: Array  # [E] int32
  stop: Array  # [Ns, W] int32 stop sequences, right-aligned, -1 padded


@functools.lru_cache(maxsize=64)
def _generate_fn(
  graphdef,
  n: int,
  steps: int,
  mesh,
  shard_config,
  cache_dtype,
  phase_ends: tuple[int, ...],
  gemm_threads: int,
  grouped: bool,
  share_prefix: bool = False,
  platform: str = "",
):
  """The jitted prefill and decode loop for one (graph, n, step bucket) — shapes set the rest.

  On CPU these are two executables, so that each gets its own XLA:CPU options: the prefill's
  products have prompt × rows rows, where XLA:CPU's default library (YNNPACK) is the faster one,
  and a decode step's have a few rows, where Eigen is (`_decode_options`); the cache passes
  from one to the other, and the prefill's (`_prefill_fn`) serves every n and step bucket.
  Elsewhere they are one program, as one library serves every product there.
  On CPU without a mesh the decode loop also runs in phases, ending after `phase_ends` steps,
  over growing caches (`_phase_ends`): XLA reads every slot of a cache buffer in a step's
  attention (a slice of a larger buffer costs a copy each step, more than it saves), so the buffer
  itself is kept near the filled length and grown between phases. With `gemm_threads` other than 0 (CPU,
  fused weights packed by `Sampler.refresh`) every product, the output head's included, runs
  `lm.cpu_gemm`'s kernel with that many threads. `grouped`: the model has fewer kv heads than
  query heads (its decode program's options, `_decode_options`). `share_prefix`: the n samples of a
  prompt read its prompt's KV cache, held once ([P, K, prompt, H] per layer), and hold only their own
  generated slots ([P·n, K, steps, H]; `lm.model.shared_prefix_attention`), instead of n copies of
  the whole cache ([P·n, K, prompt + steps, H]).

  The decode is three pure parts, `begin` (the first token, from the prefill's logits), `advance`
  (loop steps of one phase) and `finish` (lengths, stop sequences cut): `decode` runs them as one
  program; a streamed call runs them as programs of their own (`_Programs.streamed`), `advance`
  a chunk of steps at a time with the loop state carried, donated, between calls. `platform` (""
  this host's backend): whose form to build (`shaped_programs` plans an accelerator's program on a
  CPU host).
  """
  cpu = (platform or jax.default_backend()) == "cpu"
  ends = phase_ends if cpu and mesh is None else (steps,)
  matmul = _matmul(gemm_threads)
  weights_of = functools.partial(_weights_of, graphdef)
  head = functools.partial(_head, matmul=matmul)

  def own_slots(prompt_len: int) -> int:  # a row's own cache slots before its first new token
    return 0 if share_prefix else prompt_len

  def key_mask_of(mask):  # [P, S]: the prompt's padding (unless shared), then every generated slot
    generated = jnp.ones((mask.shape[0], steps), mask.dtype)
    return generated if share_prefix else jnp.concatenate([mask, generated], axis=1)

  def choose(rows: _Rows, state: _SamplingState, logits: Array) -> _SamplingState:
    """Token `state.step` of every row from its logits [B, V], and the bookkeeping after it."""
    step = state.step
    keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(rows.keys, step)
    token = sample_token(logits, keys, rows.temperature, rows.top_p, rows.top_k)  # [B]
    # The token's log-prob without the [B, V] log-softmax: its logit less the row's log-sum-exp.
    chosen = jnp.take_along_axis(logits, token[:, None], axis=1)[:, 0]
    logprob = chosen - jax.nn.logsumexp(logits, axis=-1)
    is_eos = jnp.any(token[:, None] == rows.eos[None, :], axis=1)
    recent = jnp.concatenate([state.recent[:, 1:], token[:, None]], axis=1)  # [B, W]
    stop = rows.stop
    hit_stop = jnp.any(
      jnp.all((recent[:, None, :] == stop[None]) | (stop[None] < 0), axis=2)
      & jnp.any(stop >= 0, axis=1)[None],
      axis=1,
    )
    live = ~state.done
    return state.replace(
      step=step + 1,
      token=token,
      done=state.done | is_eos | hit_stop | (step + 1 >= rows.max_new),
      tokens=state.tokens.at[:, step].set(jnp.where(live & ~is_eos, token, -1)),
      logprobs=state.logprobs.at[:, step].set(jnp.where(live, logprob, 0.0)),
      recent=recent,
      stopped=state.stopped | (live & (is_eos | hit_stop)),
    )

  def begin(
    state, head_dv, layer_weights, cache, last_logits, tokens, mask, *,
    temperature, top_p, top_k, seed, eos, stop, max_new,
  ) -> tuple[_SamplingState, _Rows]:  # fmt: skip
    """The loop state after the first token (from the prefill's cache and logits), and the rows' constants."""
    del state, head_dv, layer_weights  # the same signature as the other parts
    rows, prompt_len = tokens.shape
    # n samples per prompt share the prefill: rows become prompt-major [P * n].
    rep = lambda x: jnp.repeat(x, n, axis=0)
    own = own_slots(prompt_len)
    if share_prefix:  # the prompt's keys once per prompt; each row's own slots start empty
      empty = lambda c: jnp.zeros((rows * n, c.shape[1], 0, c.shape[3]), c.dtype)
      cache = [
        {"k": empty(kv["k"]), "v": empty(kv["v"]), "prefix_k": kv["k"], "prefix_v": kv["v"]} for kv in cache
      ]
    else:
      cache = jax.tree.map(rep, cache)
    cache = _grow_cache(cache, own + ends[0])  # "k", "v" [B, K, own + first phase, H]
    if mesh is not None:
      place = lambda v: sharding_lib.named(mesh, shard_config.cache_bksh, v.shape)
      cache = jax.tree.map(lambda v: jax.lax.with_sharding_constraint(v, place(v)), cache)
    sample_index = jnp.tile(jnp.arange(n, dtype=jnp.uint32), rows)
    constants = _Rows(
      keys=jax.vmap(lambda s, j: jax.random.fold_in(jax.random.key(s), j))(rep(seed), sample_index),
      temperature=rep(temperature),
      top_p=rep(top_p),
      top_k=rep(top_k),
      max_new=rep(max_new),
      next_pos=rep(jnp.sum(mask, axis=1)),
      key_mask=rep(key_mask_of(mask)),
      mask=mask,
      eos=eos,
      stop=stop,
    )
    batch = rows * n
    # The first token comes from the prefill's logits; each loop step then runs the forward pass of
    # the token chosen before it, so no step computes logits nobody reads (a whole decode step
    # after the last token: 9 % of the first token's time at sampler_bench's shape (a)).
    initial = _SamplingState(
      step=jnp.int32(0),
      token=jnp.zeros((batch,), jnp.int32),
      cache=cache,
      done=jnp.zeros((batch,), bool),
      tokens=jnp.full((batch, steps), -1, jnp.int32),
      logprobs=jnp.zeros((batch, steps), jnp.float32),
      recent=jnp.full((batch, stop.shape[1]), -2, jnp.int32),
      stopped=jnp.zeros((batch,), bool),
    )
    return choose(constants, initial, rep(last_logits)), constants

  def advance(model, layer_weights, head_dv, rows: _Rows, loop: _SamplingState, phase: int, stop_at=None):
    """Loop steps of phase `phase` (its cache grown first) until every row is done, the phase ends
    or, given `stop_at`, `loop.step` reaches it."""
    own = own_slots(rows.mask.shape[1])
    slots = own + ends[phase]
    if loop.cache[0]["k"].shape[2] < slots:
      loop = loop.replace(cache=_grow_cache(loop.cache, slots))
    key_mask = rows.key_mask[:, :slots]

    def keep_going(state: _SamplingState) -> Array:
      going = ~jnp.all(state.done)
      if phase + 1 < len(ends):  # one phase, the whole cache, except on CPU (`_phase_ends`)
        going = going & (state.step <= ends[phase])  # slot step − 1
      if stop_at is not None:
        going = going & (state.step < stop_at)
      return going

    def step_fn(state: _SamplingState) -> _SamplingState:
      """The last chosen token's forward pass (its slot is `state.step` − 1), then the next token."""
      slot = state.step - 1
      with model_lib.cpu_attention(gemm_threads):  # its kernels where the products have theirs
        hidden, cache = model.hidden_states(
          state.token[:, None],
          positions=(rows.next_pos + slot)[:, None],
          attention_mask=key_mask,
          cache=state.cache,
          cache_index=own + slot,
          layer_weights=layer_weights,
          matmul=matmul,
          prefix_mask=rows.mask if share_prefix else None,
        )
      return choose(rows, state.replace(cache=cache), head(hidden[:, 0], head_dv))

    return jax.lax.while_loop(keep_going, step_fn, loop)

  def finish(loop: _SamplingState, rows: _Rows):
    """(tokens, log-probs, lengths without a final stop sequence, stopped) of every row."""
    out, out_lp, stopped = loop.tokens, loop.logprobs, loop.stopped
    # A row's tokens end at EOS (excluded); a stop sequence's tokens are cut on the host side.
    valid = out >= 0
    length = jnp.where(jnp.all(valid, axis=1), steps, jnp.argmin(valid, axis=1))
    stop_trim = _stop_match_length(out, length, rows.stop)
    return out, out_lp, length - stop_trim, stopped

  def generate(state, head_dv, layer_weights, cache, last_logits, tokens, mask, **settings):
    model, layer_weights = weights_of(state, layer_weights)
    loop, rows = begin(state, head_dv, layer_weights, cache, last_logits, tokens, mask, **settings)
    for phase in range(len(ends) if steps > 1 else 0):  # steps 1: `begin` chose the only token
      loop = advance(model, layer_weights, head_dv, rows, loop, phase)
    return finish(loop, rows)

  def grow(rows: _Rows, loop: _SamplingState, *, phase: int) -> _SamplingState:
    """The loop state with its cache grown to phase `phase`'s slots (a program of its own, so that
    `advance` gets the state in the shapes it returns and can reuse its donated buffers)."""
    return loop.replace(cache=_grow_cache(loop.cache, own_slots(rows.mask.shape[1]) + ends[phase]))

  def advance_chunk(state, head_dv, layer_weights, rows, loop, stop_at, *, phase):
    model, layer_weights = weights_of(state, layer_weights)
    return advance(model, layer_weights, head_dv, rows, loop, phase, stop_at)

  options = _decode_options(grouped) if cpu else None
  chunk = dict(
    advance=jax.jit(
      advance_chunk, static_argnames=("phase",), donate_argnames=("loop",), compiler_options=options
    ),
    finish=jax.jit(finish),
    grow=jax.jit(grow, static_argnames=("phase",)),
    phase_ends=ends,
  )
  if not cpu:
    prefill = _prefill_fn(graphdef, cache_dtype, gemm_threads, jit=False)

    def prefill_and(part):
      def run(state, head_dv, layer_weights, tokens, mask, **settings):
        cache, last_logits = prefill(state, head_dv, layer_weights, tokens, mask)
        return part(state, head_dv, layer_weights, cache, last_logits, tokens, mask, **settings)

      return run

    # accelerators: one program, one library for every product
    return _Programs(
      prefill=None, decode=jax.jit(prefill_and(generate)), begin=jax.jit(prefill_and(begin)), **chunk
    )
  return _Programs(
    prefill=_prefill_fn(graphdef, cache_dtype, gemm_threads, jit=True),
    decode=jax.jit(generate, compiler_options=options),
    begin=jax.jit(begin),
    **chunk,
  )


@dataclasses.dataclass(frozen=True)
class _Programs:
  """`_generate_fn`'s jitted programs: on CPU a prefill and a decode program (the cache passes from
  one to the other), elsewhere one program (`prefill` None) that does both. A streamed call runs
  `begin` (with the prefill inside where `prefill` is None), then `advance` a chunk of steps at a
  time, then `finish`, instead of `decode`."""

  prefill: Any
  decode: Any
  begin: Any
  advance: Any
  finish: Any
  grow: Any
  phase_ends: tuple[int, ...]

  def __call__(self, state, head_dv, layer_weights, tokens, mask, **settings):
    if self.prefill is None:
      return self.decode(state, head_dv, layer_weights, tokens, mask, **settings)
    cache, last_logits = self.prefill(state, head_dv, layer_weights, tokens, mask)
    return self.decode(state, head_dv, layer_weights, cache, last_logits, tokens, mask, **settings)

  def streamed(self, state, head_dv, layer_weights, tokens, mask, *, every: int, report, **settings):
    """What `__call__` returns, decoded `every` steps at a time: after the first token and after
    each chunk, `report(loop_state)` sees the tokens so far and answers (steps taken, every row done).

    Each chunk is one device call returning to the host, so a reader gets tokens after the
    prefill plus at most `every` steps; the chunks together run the same steps as `decode`."""
    args = (state, head_dv, layer_weights)
    if self.prefill is None:
      loop, rows = self.begin(*args, tokens, mask, **settings)
    else:
      cache, last_logits = self.prefill(*args, tokens, mask)
      loop, rows = self.begin(*args, cache, last_logits, tokens, mask, **settings)
    step, done = report(loop)
    for phase, end in enumerate(self.phase_ends):
      last = phase + 1 == len(self.phase_ends)
      if phase and not done:
        loop = self.grow(rows, loop, phase=phase)
      while not done and (last or step <= end):  # a phase may end inside a chunk
        loop = self.advance(*args, rows, loop, jnp.int32(step + every), phase=phase)
        step, done = report(loop)
    return self.finish(loop, rows)


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4}
_DTYPE_BYTES |= {"u32": 4, "f64": 8, "s64": 8, "u64": 8}


def gathered_bytes(hlo_text: str) -> dict[str, int]:
  """Bytes that a compiled program's all-gathers produce (per device), by where they run: "outside"
  loops (once per call, held through the loops that read them: a weight gathered there is a whole
  copy on every device for the program's length) and "inside" a while loop (each iteration).

  `hlo_text` is `jax.jit(f).lower(...).compile().as_text()`; see docs/sampler.md for the decode
  program's figures."""
  comps: dict[str, list[str]] = {}
  entry, name = None, None
  for line in hlo_text.splitlines():
    header = re.match(r"^(ENTRY )?%([^\s(]+) ", line)
    if header and line.rstrip().endswith("{"):
      name = header.group(2)
      comps[name] = []
      entry = name if header.group(1) else entry
    elif name is not None:
      comps[name].append(line)
  refs = re.compile(r"(body|condition|calls|to_apply|branch_computations|\w+_computation)=")

  def reachable(roots: list[str], through_loops: bool) -> set[str]:
    seen, todo = set(), list(roots)
    while todo:
      c = todo.pop()
      if c in seen or c not in comps:
        continue
      seen.add(c)
      for line in comps[c]:
        for m in refs.finditer(line):
          if m.group(1) in ("body", "condition") and not through_loops:
            continue
          todo += re.findall(r"%([^\s,}]+)", line[m.end() :].split("metadata=")[0])[:8]
    return seen

  bodies = [b for lines in comps.values() for line in lines for b in re.findall(r"body=%([^\s,]+)", line)]
  inside = reachable(bodies, True)
  outside = reachable([entry], False) - inside
  out = {"outside": 0, "inside": 0}
  for where, names in (("outside", outside), ("inside", inside)):
    for c in names:
      for line in comps[c]:
        m = re.search(r" = (.*?) all-gather(-start)?\(", line)
        if m:  # an async start's result is (operand, result): the last shape is the gathered one
          dtype, dims = re.findall(r"([a-z]+[0-9]*)\[([0-9,]*)\]", m.group(1))[-1]
          out[where] += math.prod(int(d) for d in dims.split(",") if d) * _DTYPE_BYTES.get(dtype, 4)
  return out


def _stop_match_length(out: Array, length: Array, stop: Array) -> Array:
  """Length of the stop sequence a row's tokens end with (0 if none), so it can be cut off."""
  window = stop.shape[1]
  idx = length[:, None] - window + jnp.arange(window)[None, :]  # [B, W]
  tail = jnp.where(idx >= 0, jnp.take_along_axis(out, jnp.maximum(idx, 0), axis=1), -2)
  used = stop >= 0  # [Ns, W]
  match = jnp.all((tail[:, None, :] == stop[None]) | ~used[None], axis=2) & jnp.any(used, 1)[None]
  lengths = jnp.where(match, jnp.sum(used, axis=1)[None], 0)  # [B, Ns]
  return jnp.max(lengths, axis=1)


def first_argmax(logits: Array) -> Array:
  """`jnp.argmax(logits, axis=-1)` [B] int32 (the first index of each row's largest entry) as two
  plain reductions, a max and a min of indices where the row equals it.

  Why: XLA:CPU lowers argmax to one reduction over (value, index) pairs, which it does not
  vectorise: 0.83 ms a decode step over [8, 32,000] logits at benchmarks/sampler_bench.py's shape
  (a), 7% of the step (docs/results/2026-12-03-sampler-bench.md). A row of NaNs (where argmax gives
  the first NaN) gives the last index instead.
  """
  vocab = logits.shape[-1]
  best = jnp.max(logits, axis=-1, keepdims=True)  # [B, 1]
  index = jnp.where(logits == best, jnp.arange(vocab, dtype=jnp.int32), vocab)  # [B, V]
  return jnp.minimum(jnp.min(index, axis=-1), vocab - 1)


def sample_token(logits: Array, keys: Array, temperature: Array, top_p: Array, top_k: Array) -> Array:
  """Draws one token per row [B] from logits [B, V] with per-row parameters.

  Rows with temperature 0 take the argmax, and a batch of only greedy rows skips sampling. Draws
  use the inverse CDF with one uniform per row: exact, and far cheaper on CPU than Gumbel-max,
  which needs a random number per vocabulary entry. Top-k / top-p masks are computed only when
  some row asks for them (a full-vocabulary sort is otherwise the costliest op of a step).
  """
  greedy = first_argmax(logits)

  def draw(_):
    scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
    needs_truncation = jnp.any((top_k > 0) | (top_p < 1.0))
    scaled = jax.lax.cond(needs_truncation, _truncate, lambda x, *_: x, scaled, top_p, top_k)
    probs = jax.nn.softmax(scaled, axis=-1)
    cdf = jnp.cumsum(probs, axis=-1)  # [B, V]
    u = jax.vmap(lambda k: jax.random.uniform(k, ()))(keys) * cdf[:, -1]  # [B]
    token = jnp.sum(cdf <= u[:, None], axis=-1)
    # Never land on a zero-probability entry (u can equal a plateau of the CDF).
    token = jnp.minimum(token, logits.shape[-1] - 1)
    first_allowed = first_argmax(probs > 0)
    return jnp.where(jnp.take_along_axis(probs, token[:, None], 1)[:, 0] > 0, token, first_allowed)

  drawn = jax.lax.cond(jnp.all(temperature <= 0.0), lambda _: greedy, draw, None).astype(jnp.int32)
  return jnp.where(temperature <= 0.0, greedy, drawn)


# Entries a nucleus is first looked for among (`_truncate`): a partial sort of this many per row.
NUCLEUS_CANDIDATES = 64


def _truncate(scaled: Array, top_p: Array, top_k: Array) -> Array:
  """Masks tokens outside each row's top-k and top-p (nucleus) sets with -inf.

  The sets are found among each row's NUCLEUS_CANDIDATES largest entries (`lax.top_k`, a partial
  sort) and, only when some row's set does not end there (top-k above it, or a flat row whose
  nucleus needs more), by sorting the whole vocabulary (`_truncate_sorted`). Same sets by the same
  definition either way; the fast path exists because XLA:CPU's full sort of [16, 8192] took about
  30 ms a step, more than a small policy's whole decode step (a DPA-GRPO rollout at temperature
  0.2, top-p 0.9), where the partial sort takes under 1 ms.
  """
  if NUCLEUS_CANDIDATES >= scaled.shape[-1]:
    return _truncate_sorted(scaled, top_p, top_k)
  masked, found = _truncate_candidates(scaled, top_p, top_k)
  return jax.lax.cond(jnp.all(found), lambda: masked, lambda: _truncate_sorted(scaled, top_p, top_k))


def _truncate_candidates(scaled: Array, top_p: Array, top_k: Array) -> tuple[Array, Array]:
  """`_truncate` from each row's NUCLEUS_CANDIDATES largest entries: the masked logits [B, V] and
  whether each row's set was found there [B] (a row not found is masked wrongly)."""
  vocab = scaled.shape[-1]
  c = NUCLEUS_CANDIDATES
  k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)  # [B]
  top = jax.lax.top_k(scaled, c)[0]  # [B, C], descending
  within_k = jnp.arange(c)[None] < k[:, None]  # [B, C]
  # Normalised over the row's top-k set: inside the candidates when k <= C, else the whole row.
  lse = jnp.where(
    (k <= c)[:, None],
    jax.nn.logsumexp(jnp.where(within_k, top, -jnp.inf), axis=-1, keepdims=True),
    jax.nn.logsumexp(scaled, axis=-1, keepdims=True),
  )  # [B, 1]
  probs = jnp.where(within_k, jnp.exp(top - lse), 0.0)  # [B, C]
  kth = jnp.where(
    (k <= c)[:, None], jnp.take_along_axis(top, jnp.minimum(k, c)[:, None] - 1, axis=-1), -jnp.inf
  )
  threshold = _threshold(top, probs, top_p, kth)  # [B, 1]
  # A row's set ends among the candidates when its top-k does, or, without top-k and with top-p
  # below 1, when their mass reaches top-p (then the entry after them is not kept). A top-k above C,
  # or neither (top-p 1 keeps every entry), is sorted.
  found = (k <= c) | ((k == vocab) & (top_p < 1.0) & (jnp.sum(probs, axis=-1) >= top_p))  # [B]
  return jnp.where(scaled >= threshold, scaled, -jnp.inf), found


def _truncate_sorted(scaled: Array, top_p: Array, top_k: Array) -> Array:
  """`_truncate` by a full sort of each row: any vocabulary, any top-k."""
  vocab = scaled.shape[-1]
  sorted_desc = -jnp.sort(-scaled, axis=-1)  # [B, V]
  k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
  kth = jnp.take_along_axis(sorted_desc, (k - 1)[:, None], axis=-1)  # [B, 1]
  probs = jax.nn.softmax(jnp.where(jnp.arange(vocab)[None] < k[:, None], sorted_desc, -jnp.inf), -1)
  return jnp.where(scaled >= _threshold(sorted_desc, probs, top_p, kth), scaled, -jnp.inf)


def _threshold(desc: Array, probs: Array, top_p: Array, kth: Array) -> Array:
  """The smallest logit a row keeps [B, 1], from its logits in descending order `desc` [B, C], their
  probabilities within the top-k set `probs` [B, C] (0 past it) and its k-th largest logit `kth`
  [B, 1]. A token stays if the probability mass strictly before it is below top_p (the first always
  does); top-p 1 keeps the whole top-k set (a float32 cumulative sum can reach 1 before its end)."""
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  keep = (mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0)
  cutoff = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)
  return jnp.maximum(kth, cutoff)
