"""bfloat16 products on XLA:CPU (`lm.model.contract`, `einsum`): summed in float32 and rounded once
there, 5-6x XLA:CPU's own bf16 dot; every other platform's program the plain einsum, including a
plan's accelerator program lowered on this CPU host (`lowering_for`)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lm import model as model_lib
from lm import plan as plan_lib
from lm import sampler as sampler_lib
from lm.config import ModelConfig
from lm.model import Qwen


def _dots(fn, *args) -> list:
  """The preferred element types of every dot_general in fn's jaxpr (custom VJPs' bodies too)."""
  found = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "dot_general":
        found.append(eqn.params["preferred_element_type"])
      for param in eqn.params.values():
        for sub in param if isinstance(param, (list, tuple)) else [param]:
          if hasattr(sub, "jaxpr"):
            walk(sub.jaxpr if hasattr(sub.jaxpr, "eqns") else sub.jaxpr.jaxpr)
          elif hasattr(sub, "eqns"):
            walk(sub)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


def _operands():
  x = jax.random.normal(jax.random.key(0), (64, 256)).astype(jnp.bfloat16)
  w = (jax.random.normal(jax.random.key(1), (256, 96)) / 16).astype(jnp.bfloat16)
  return x, w


def test_a_bf16_product_on_cpu_sums_in_float32_and_rounds_once():
  x, w = _operands()
  got = model_lib.contract("mk,kn->mn", x, w)
  assert got.dtype == jnp.bfloat16
  exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  # rounded once from a float32 sum: within half a bf16 step (2^-9 relative) of the exact product,
  # plus float32 summation error
  np.testing.assert_allclose(np.asarray(got, np.float64), exact, rtol=2**-8, atol=1e-5)
  assert _dots(lambda x, w: model_lib.contract("mk,kn->mn", x, w), x, w) == [jnp.float32]
  assert _dots(model_lib.matmul, x, w) == [jnp.float32]
  # bf16 traced for another platform: the plain product (its result type, bf16)
  with model_lib.lowering_for("tpu"):
    assert _dots(lambda x, w: model_lib.contract("mk,kn->mn", x, w), x, w) == [jnp.bfloat16]


def test_gradients_on_cpu_are_bf16_products_and_other_platforms_keep_the_plain_einsum():
  x, w = _operands()

  def gradient():  # a new function each time: JAX caches a function's trace by its arguments
    loss = lambda x, w: model_lib.einsum("mk,kn->mn", x, w).astype(jnp.float32).sum()
    return jax.grad(loss, argnums=(0, 1))

  grad = gradient()
  # forward and both gradient products summed in float32, the cotangent cast to bf16 first
  assert _dots(grad, x, w) == [jnp.float32] * 3
  gx, gw = grad(x, w)
  assert gx.dtype == gw.dtype == jnp.bfloat16
  np.testing.assert_allclose(
    np.asarray(gw, np.float32), np.asarray(x, np.float32).T @ np.ones((64, 96)), rtol=2**-7
  )
  for platform in ("tpu", "cuda"):
    with model_lib.lowering_for(platform):
      assert _dots(gradient(), x, w) == [jnp.bfloat16] * 3, platform  # plain bf16 products, as before
      assert _dots(lambda x, w: model_lib.matmul(x, w), x, w) == [jnp.bfloat16], platform
      scores = lambda q, k: model_lib.einsum("mk,nk->mn", q, k, out_dtype=jnp.float32)
      assert _dots(scores, x, x) == [jnp.float32], platform  # plain jnp.einsum(preferred f32)


def test_a_plan_compiles_for_its_target_platform(monkeypatch):
  seen = []

  class Fn:
    def lower(self, *args, **kwargs):
      seen.append(model_lib._PLATFORM.get())
      raise RuntimeError("stop")  # the platform seen while lowering is all this test needs

  target = plan_lib.TARGETS["v5p-8"]
  try:
    plan_lib.compile_program("p", Fn(), (), {}, target, model=(0.0, 0.0))
  except RuntimeError:
    pass
  assert seen == ["tpu"] and model_lib._PLATFORM.get() == ""


def test_the_cache_dtype_rule_and_a_bf16_cache_read_by_the_kernel_at_a_real_shape():
  # The cache rule (`lm.sampler.cache_dtype`): float32 for a bf16 model on one CPU device without
  # `lm.cpu_gemm`'s decode attention only (the kernel reads a bf16 cache itself).
  config = sampler_lib.SamplerConfig()
  assert sampler_lib.cache_dtype(config, jnp.bfloat16, cpu=True) == jnp.float32
  assert sampler_lib.cache_dtype(config, jnp.bfloat16, cpu=True, kernel=True) == jnp.bfloat16
  assert sampler_lib.cache_dtype(config, jnp.bfloat16, cpu=False) == jnp.bfloat16
  assert sampler_lib.cache_dtype(config, jnp.float32, cpu=True) == jnp.float32
  explicit = sampler_lib.SamplerConfig(cache_dtype=jnp.bfloat16)
  assert sampler_lib.cache_dtype(explicit, jnp.bfloat16, cpu=True) == jnp.bfloat16
  wide = sampler_lib.SamplerConfig(cache_dtype=jnp.float32)
  assert sampler_lib.cache_dtype(wide, jnp.bfloat16, cpu=True, kernel=True) == jnp.float32
  # Shape (a) of benchmarks/sampler_bench.py, bf16: its prefill's batched attention products once
  # compiled to a dot XLA:CPU refuses at run time (BF16 x BF16 = F32); a tiny model's are inlined
  # and never reach it.
  dims = dict(num_layers=4, hidden_size=512, intermediate_size=1536, num_heads=8, num_kv_heads=4, head_dim=64)
  model_config = dataclasses.replace(ModelConfig.tiny_qwen3(vocab_size=4096), **dims)
  model = Qwen(model_config, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16)
  prompts = np.random.RandomState(0).randint(10, 4096, (8, 64)).tolist()
  outputs = {}
  for name, fields in {
    "float32 cache": dict(cache_dtype=jnp.float32),
    "default": {},  # a bf16 cache read by the kernel where it is built, else float32
    "XLA's attention, bf16 cache": dict(cache_dtype=jnp.bfloat16, cpu_gemm_threads=0),
  }.items():
    sampler = sampler_lib.Sampler(model, config=sampler_lib.SamplerConfig(**fields))
    outputs[name] = sampler.generate(prompts, max_new_tokens=8, temperature=0.0)
  logprobs = {name: np.ravel([lp for p in out.logprobs for lp in p]) for name, out in outputs.items()}
  # The kernel widens a bf16 key or value exactly and computes as over the float32 copy: the same
  # tokens and log-probs to the bit as the float32 cache
  assert outputs["default"].tokens == outputs["float32 cache"].tokens
  np.testing.assert_array_equal(logprobs["default"], logprobs["float32 cache"])
  # XLA's decode attention over the bf16 cache rounds its probabilities to bf16 before the weighted
  # sum: log-probs agree to bf16 precision
  first = {name: [lp[0][0] for lp in out.logprobs] for name, out in outputs.items()}
  np.testing.assert_allclose(first["default"], first["XLA's attention, bf16 cache"], atol=0.05)
  assert all(len(t[0]) == 8 for t in outputs["default"].tokens)


def _whole_table_fusions(text: str, shape: str) -> int:
  """Top-level instructions of a compiled program producing a float32 table of `shape`: a convert
  of the whole table (inside a fused gather the convert is a `convert(`, not a `fusion(`)."""
  return sum(f"= f32[{shape}]" in line and " fusion(" in line for line in text.splitlines())


def test_a_bf16_decode_loop_on_cpu_never_converts_the_whole_embedding_table(monkeypatch):
  # `lm.model.embed`: without its barrier XLA:CPU hoists convert(bf16 table -> f32) out of the
  # decode loop, a float32 copy of the whole table every call (381 ms of a bf16 first token at
  # Qwen3-0.6B's vocabulary). The control (the plain gather) shows the check can see the hoist.
  model_config = ModelConfig.tiny_qwen3(vocab_size=8192)
  model = Qwen(model_config, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16)
  prompts = np.random.RandomState(0).randint(10, 8192, (2, 8)).tolist()
  shape = f"8192,{model_config.hidden_size}"

  def decode_text(sampler) -> str:
    return sampler.lowered(prompts, max_new_tokens=4)["decode"].compile().as_text()

  sampler = sampler_lib.Sampler(model, config=sampler_lib.SamplerConfig(cpu_gemm_threads=0))
  assert _whole_table_fusions(decode_text(sampler), shape) == 0
  got = sampler.generate(prompts, max_new_tokens=4, temperature=0.0)

  def fresh_programs():  # the sampler's programs are cached per graph: trace them again
    sampler_lib._generate_fn.cache_clear()
    sampler_lib._prefill_fn.cache_clear()
    jax.clear_caches()

  plain = lambda table, tokens, dtype: jnp.take(table, tokens, axis=0).astype(dtype)
  monkeypatch.setattr(model_lib, "embed", plain)
  fresh_programs()
  try:
    control = sampler_lib.Sampler(model, config=sampler_lib.SamplerConfig(cpu_gemm_threads=0))
    assert _whole_table_fusions(decode_text(control), shape) >= 1
    assert control.generate(prompts, max_new_tokens=4, temperature=0.0).tokens == got.tokens
  finally:
    fresh_programs()
