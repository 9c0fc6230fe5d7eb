"""LoRA dropout (`lm.lora.with_dropout`, `lm.model.project`): on the adapter's input only, unbiased,
and exactly today's program without a key or at rate 0."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lm
from lm import lora
from lm.config import ModelConfig
from lm.model import project

TOKENS = jnp.array([[5, 9, 2, 7, 30, 11], [3, 3, 8, 1, 0, 4]])
SPEC = "btd,df->btf"


def _weights(seed=0, b=2, t=4, d=16, f=12, r=4):
  rng = np.random.RandomState(seed)
  x = jnp.asarray(rng.randn(b, t, d), jnp.float32)
  w = {
    "up_df": jnp.asarray(rng.randn(d, f) / 4, jnp.float32),
    "up_df_lora_a": jnp.asarray(rng.randn(d, r) / 4, jnp.float32),
    "up_df_lora_b": jnp.asarray(rng.randn(r, f) / 4, jnp.float32),
  }
  return x, w


def _dropped(w, keep, key):
  return {**w, "up_df_lora_keep": jnp.float32(keep), "up_df_lora_key": jax.random.key_data(key)}


def test_keep_one_is_bit_identical_to_no_dropout():
  """The dropout branch at keep probability 1 (every mask entry true, x / 1) computes exactly the
  numbers of the branch without dropout entries: the no-dropout path is today's."""
  x, w = _weights()
  base = project(SPEC, x, w, "up_df", jnp.float32)
  np.testing.assert_array_equal(
    project(SPEC, x, _dropped(w, 1.0, jax.random.key(3)), "up_df", jnp.float32), base
  )


def test_dropout_acts_on_the_adapter_input_only():
  """x·W + ((m ⊙ x)/keep · A)·B with m the Bernoulli(keep) mask of the entries' key."""
  x, w = _weights()
  key, keep = jax.random.key(7), 0.8
  got = project(SPEC, x, _dropped(w, keep, key), "up_df", jnp.float32)
  mask = jax.random.bernoulli(key, keep, x.shape)
  expected = x @ w["up_df"] + ((mask * x / keep) @ w["up_df_lora_a"]) @ w["up_df_lora_b"]
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  assert 0.7 < float(mask.mean()) < 0.9  # 128 draws at keep 0.8
  no_adapter = {"up_df": w["up_df"]}  # no adapter: nothing to drop, whatever the entries
  np.testing.assert_array_equal(project(SPEC, x, no_adapter, "up_df", jnp.float32), x @ w["up_df"])


def test_bf16_scales_in_float32():
  """In bf16 the kept inputs are x/keep computed in float32 and rounded once (bf16 holds 0.95 as
  0.9492: dividing by the rounded keep would bias every kept input by 0.08%)."""
  x, w = _weights(seed=2)
  x16 = x.astype(jnp.bfloat16)
  w16 = {k: v.astype(jnp.bfloat16) for k, v in w.items()}
  key = jax.random.key(4)
  got = project(SPEC, x16, _dropped(w16, 0.95, key), "up_df", jnp.bfloat16)
  mask = jax.random.bernoulli(key, jnp.float32(0.95), x.shape)
  dropped = jnp.where(mask, x16.astype(jnp.float32) / 0.95, 0.0).astype(jnp.bfloat16)
  low = jnp.einsum("btd,dr->btr", dropped, w16["up_df_lora_a"])
  expected = jnp.einsum("btd,df->btf", x16, w16["up_df"]) + jnp.einsum(
    "btr,rf->btf", low, w16["up_df_lora_b"]
  )
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32))


def test_dropout_is_unbiased():
  """Inverted dropout keeps the expectation: E[m/keep] = 1, so the mean output over N keys is the
  no-dropout output up to sampling noise. Tolerance: 5 standard errors per element (the empirical
  std over the N draws / √N; the mean of N = 4,000 independent draws is within 5 SE with
  probability 1 − 6e-7 per element by the CLT), plus float32 rounding."""
  x, w = _weights(seed=1)
  base = np.asarray(project(SPEC, x, w, "up_df", jnp.float32))
  keys = jax.random.split(jax.random.key(0), 4000)
  outs = np.asarray(jax.vmap(lambda k: project(SPEC, x, _dropped(w, 0.95, k), "up_df", jnp.float32))(keys))
  se = outs.std(axis=0) / np.sqrt(len(keys))
  assert (se > 0).all()  # the draws differ: dropout is on
  assert np.all(np.abs(outs.mean(axis=0) - base) <= 5 * se + 1e-5)


@pytest.fixture(scope="module")
def adapted():
  model = lm.Qwen(ModelConfig.tiny_qwen3(64), rngs=nnx.Rngs(0))
  (adapter,) = lora.init_adapters(model, lora.LoRAConfig(rank=4, alpha=8.0), ("generator",), seed=1).values()
  rng = np.random.RandomState(0)
  for name, var in vars(adapter).items():
    if isinstance(var, lora.LoRAParam) and name.endswith("_lora_b"):
      var[...] = jnp.asarray(0.05 * rng.randn(*var.shape), var.dtype)
  return model, lora.with_adapter(model, adapter)


def test_no_key_or_rate_zero_is_the_same_view(adapted):
  _, view = adapted
  assert lora.with_dropout(view, 0.0, jax.random.key(0)) is view
  assert lora.with_dropout(view, 0.05, None) is view
  base_model, _ = adapted
  assert lora.with_dropout(base_model, 0.05, jax.random.key(0)) is base_model  # the reference: no adapter


def test_model_logits_depend_on_the_key_and_only_through_the_adapter(adapted):
  model, view = adapted
  graph, state = nnx.split(view)

  @jax.jit
  def logits(state, key):
    return lora.with_dropout(nnx.merge(graph, state), 0.05, key)(TOKENS)

  a, b = jax.random.key(1), jax.random.key(2)
  plain = np.asarray(view(TOKENS))
  first, again, other = (np.asarray(logits(state, k)) for k in (a, a, b))
  np.testing.assert_array_equal(first, again)  # one key, one mask
  assert np.abs(first - other).max() > 1e-6 and np.abs(first - plain).max() > 1e-6
  # A fresh adapter (B = 0) adds nothing, dropped out or not: the backbone path is untouched.
  (fresh,) = lora.init_adapters(model, lora.LoRAConfig(rank=4, alpha=8.0), ("g",), seed=1).values()
  fresh_graph, fresh_state = nnx.split(lora.with_adapter(model, fresh))
  dropped = jax.jit(lambda s, k: lora.with_dropout(nnx.merge(fresh_graph, s), 0.5, k)(TOKENS))(fresh_state, a)
  np.testing.assert_allclose(dropped, model(TOKENS), atol=1e-6)  # jit vs eager rounding only


def test_rate_is_checked():
  with pytest.raises(ValueError, match="dropout rate"):
    lora.DropoutAdapter(None, 1.0, jax.random.key(0))
