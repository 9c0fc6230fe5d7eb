"""Blockwise attention: equal to the plain computation, and prefill memory linear in the length."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lm import model as model_lib
from lm.config import ModelConfig
from lm.model import Qwen

TINY = ModelConfig.tiny_qwen3()


def _qkv(t, s, *, b=2, n=4, k=2, h=16, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return (
    jax.random.normal(keys[0], (b, t, n, h)),
    jax.random.normal(keys[1], (b, k, s, h)),
    jax.random.normal(keys[2], (b, k, s, h)),
  )


@pytest.mark.parametrize("t, s, offset, block", [(300, 300, 0, 64), (100, 100, 0, 32), (40, 230, 190, 16)])
def test_blockwise_equals_plain_attention_with_padding_and_an_offset(t, s, offset, block):
  q, k, v = _qkv(t, s)
  key_mask = jnp.ones((2, s), bool).at[1, :37].set(False)  # row 1 left-padded: some rows fully masked
  plain = model_lib.attention(q, k, v, model_lib._attention_mask(key_mask, t, offset))
  blockwise = model_lib.blockwise_attention(q, k, v, key_mask, offset, block=block)
  np.testing.assert_allclose(blockwise, plain, atol=2e-6)


def test_blockwise_gradients_equal_the_plain_ones():
  q, k, v = _qkv(90, 90)
  key_mask = jnp.ones((2, 90), bool).at[0, :5].set(False)
  full = model_lib._attention_mask(key_mask, 90, 0)
  weights = jax.random.normal(jax.random.key(1), q.shape)
  plain = jax.grad(lambda *x: jnp.sum(model_lib.attention(*x, full) * weights), argnums=(0, 1, 2))(q, k, v)
  blockwise = jax.grad(
    lambda *x: jnp.sum(model_lib.blockwise_attention(*x, key_mask, block=32) * weights), argnums=(0, 1, 2)
  )(q, k, v)
  for got, want in zip(blockwise, plain, strict=True):
    np.testing.assert_allclose(got, want, atol=2e-5)


def _models(block):
  plain = Qwen(TINY, rngs=nnx.Rngs(0))
  blocked = Qwen(dataclasses.replace(TINY, attention_block=block), rngs=nnx.Rngs(0))
  return plain, blocked


def test_the_model_over_a_sequence_longer_than_a_block_equals_the_plain_model():
  """Training / scoring (no cache) and the sampler's prefill (cache, index 0) share the switch."""
  plain, blocked = _models(block=16)
  tokens = jax.random.randint(jax.random.key(2), (2, 53), 2, TINY.vocab_size)
  mask = jnp.ones((2, 53), jnp.int32).at[1, :11].set(0)
  np.testing.assert_allclose(
    blocked(tokens, attention_mask=mask), plain(tokens, attention_mask=mask), atol=1e-4
  )
  cache_mask = jnp.concatenate([mask, jnp.ones((2, 8), jnp.int32)], axis=1)
  got, got_cache = blocked(tokens, attention_mask=cache_mask, cache=blocked.init_cache(2, 61))
  want, want_cache = plain(tokens, attention_mask=cache_mask, cache=plain.init_cache(2, 61))
  np.testing.assert_allclose(got, want, atol=1e-4)
  np.testing.assert_allclose(got_cache[-1]["k"], want_cache[-1]["k"], atol=1e-5)


def test_sequences_within_a_block_run_the_plain_computation_unchanged():
  """Within one block nothing changes, to the bit (results already reported stay identical)."""
  assert isinstance(model_lib._attention_mask(jnp.ones((1, 16), bool), 16, 0, 16), jax.Array)
  assert isinstance(model_lib._attention_mask(jnp.ones((1, 17), bool), 17, 0, 16), model_lib.CausalMask)
  plain, blocked = _models(block=32)
  tokens = jax.random.randint(jax.random.key(3), (2, 32), 2, TINY.vocab_size)
  np.testing.assert_array_equal(blocked(tokens), plain(tokens))


def _prefill_temp_bytes(length: int, block: int) -> int:
  """Scratch memory XLA allocates for a sampler-style prefill of `length` tokens (compiled, not run)."""
  config = dataclasses.replace(TINY, attention_block=block)
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen(config, rngs=nnx.Rngs(0))))

  def prefill(state, tokens):
    model = nnx.merge(graphdef, state)
    cache = model.init_cache(1, length + 16)
    hidden, cache = model.hidden_states(
      tokens, attention_mask=jnp.ones((1, length + 16), jnp.int32), cache=cache, cache_index=0
    )
    return hidden[:, -1], cache

  tokens = jax.ShapeDtypeStruct((1, length), jnp.int32)
  return jax.jit(prefill).lower(state, tokens).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_prefill_memory_at_8k_tokens_is_at_most_twice_that_at_1k():
  at_1k, at_8k = _prefill_temp_bytes(1024, 1024), _prefill_temp_bytes(8192, 1024)
  assert at_8k <= 2 * at_1k, (at_1k, at_8k)
  assert at_8k < 64 * 2**20  # the quadratic path needed ~3 GiB here: [1, 2, 2, 8192, 8192] float32 scores


def _real_rows():
  """Left padding, right padding, a row with a hole (not one run), a row with no real token."""
  mask = jnp.ones((4, 96), bool)
  mask = mask.at[0, :29].set(False).at[1, 70:].set(False).at[2, 40:45].set(False).at[3].set(False)
  return mask


@pytest.mark.parametrize("rows", [(0, 1), (0, 1, 2, 3)])
def test_fused_causal_attention_equals_blockwise_at_every_real_query(rows):
  """Rows (0, 1) are contiguous runs (the fused kernel runs, rotated); with rows 2 and 3 the program
  falls back to blockwise for the batch. Either way: the same outputs and gradients wherever a
  real query's output is used, and nothing that is not finite."""
  key_mask = _real_rows()[jnp.asarray(rows)]
  q, k, v = _qkv(96, 96, b=len(rows), seed=4)
  weights = jax.random.normal(jax.random.key(5), q.shape) * key_mask[:, :, None, None]  # real queries

  def loss(fn):
    return lambda *x: jnp.sum(fn(*x) * weights)

  blockwise = lambda q, k, v: model_lib.blockwise_attention(q, k, v, key_mask, block=32)  # noqa: E731
  fused = lambda q, k, v: model_lib.fused_causal_attention(q, k, v, key_mask, impl="xla", block=32)  # noqa: E731
  real = key_mask[:, :, None, None]
  out = fused(q, k, v)
  assert bool(jnp.all(jnp.isfinite(out)))
  np.testing.assert_allclose(jnp.where(real, out, 0), jnp.where(real, blockwise(q, k, v), 0), atol=2e-5)
  got = jax.grad(loss(fused), argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(loss(blockwise), argnums=(0, 1, 2))(q, k, v)
  for g, w in zip(got, want, strict=True):
    assert bool(jnp.all(jnp.isfinite(g)))
    np.testing.assert_allclose(g, w, atol=5e-5)


def test_the_model_with_the_fused_attention_equals_the_blockwise_model():
  """Training / scoring and a prefill into a longer cache: `attention_impl="xla"` against blockwise,
  at every real token (the padding's outputs are nobody's)."""
  blocked = Qwen(dataclasses.replace(TINY, attention_block=16), rngs=nnx.Rngs(0))
  fused = Qwen(dataclasses.replace(TINY, attention_block=16, attention_impl="xla"), rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(6), (2, 53), 2, TINY.vocab_size)
  mask = jnp.ones((2, 53), jnp.int32).at[1, :11].set(0)
  real = mask.astype(bool)[:, :, None]
  got, want = fused(tokens, attention_mask=mask), blocked(tokens, attention_mask=mask)
  np.testing.assert_allclose(jnp.where(real, got, 0), jnp.where(real, want, 0), atol=1e-4)
  cache_mask = jnp.concatenate([mask, jnp.ones((2, 8), jnp.int32)], axis=1)
  got, _ = fused(tokens, attention_mask=cache_mask, cache=fused.init_cache(2, 61))
  want, _ = blocked(tokens, attention_mask=cache_mask, cache=blocked.init_cache(2, 61))
  np.testing.assert_allclose(jnp.where(real, got, 0), jnp.where(real, want, 0), atol=1e-4)
  with pytest.raises(ValueError, match="attention_impl"):
    dataclasses.replace(TINY, attention_impl="flash")
