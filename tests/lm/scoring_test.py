"""Chunked log-probs equal the full log-softmax, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lm
from lm import scoring
from lm.config import ModelConfig


def test_chunked_equals_full_log_softmax_with_ragged_last_chunk():
  rng = np.random.RandomState(0)
  hidden = jnp.asarray(rng.randn(2, 5, 8), jnp.float32)
  weight = jnp.asarray(rng.randn(37, 8), jnp.float32)
  targets = jnp.asarray(rng.randint(0, 37, (2, 5)))
  full = jnp.take_along_axis(jax.nn.log_softmax(hidden @ weight.T), targets[..., None], -1)[..., 0]
  for chunk in (5, 16, 37, 64):
    np.testing.assert_allclose(
      scoring.chunked_token_logprobs(hidden, weight, targets, chunk), full, atol=1e-5
    )
  grad_full = jax.grad(
    lambda w: jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(hidden @ w.T), targets[..., None], -1))
  )(weight)
  grad_chunked = jax.grad(lambda w: jnp.sum(scoring.chunked_token_logprobs(hidden, w, targets, 8)))(weight)
  np.testing.assert_allclose(grad_chunked, grad_full, atol=1e-5)


@pytest.mark.slow
def test_sequence_logprobs_match_model_logits():
  model = lm.Qwen(ModelConfig.tiny_qwen2(vocab_size=100), rngs=nnx.Rngs(0))
  prompts = [[5, 6, 7], [9]]
  completions = [[10, 11], [12, 13, 14, 15]]
  batch = scoring.pack_pairs(prompts, completions, length_multiple=8)
  per_token, total = scoring.sequence_logprobs(model, {k: jnp.asarray(v) for k, v in batch.items()}, chunk=32)
  for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
    logits = model(jnp.asarray([p + c]))[0]
    logp = jax.nn.log_softmax(logits)
    expected = [float(logp[len(p) - 1 + t, tok]) for t, tok in enumerate(c)]
    np.testing.assert_allclose(
      np.asarray(per_token[i])[batch["completion_mask"][i] == 1], expected, atol=1e-5
    )
    np.testing.assert_allclose(float(total[i]), sum(expected), atol=1e-5)
  _, mean = scoring.sequence_logprobs(
    model, {k: jnp.asarray(v) for k, v in batch.items()}, normalize=True, chunk=32
  )
  np.testing.assert_allclose(np.asarray(mean), np.asarray(total) / np.array([2, 4]), rtol=1e-6)


@pytest.mark.slow
def test_scoring_only_the_completion_window_changes_nothing_but_the_work():
  """`pack_pairs`'s `completion_positions` (the last K positions) give the same per-token
  log-probs and the same gradient as scoring every position."""
  model = lm.Qwen(ModelConfig.tiny_qwen2(vocab_size=64), rngs=nnx.Rngs(0))
  prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [9, 3]]
  completions = [[10, 11], [12, 13, 14, 15, 16]]
  batch = {k: jnp.asarray(v) for k, v in scoring.pack_pairs(prompts, completions, length_multiple=8).items()}
  assert batch["completion_positions"].shape == (2, 16)  # K: 5 rounded up to 16, below T - 1 = 23
  full = {k: v for k, v in batch.items() if k != "completion_positions"}
  graphdef, params = nnx.split(model)

  def mean_logp(p, b):
    return jnp.sum(scoring.sequence_logprobs(nnx.merge(graphdef, p), b, normalize=True, chunk=24)[1])

  np.testing.assert_allclose(
    scoring.sequence_logprobs(model, batch)[0], scoring.sequence_logprobs(model, full)[0], atol=1e-6
  )
  windowed, everywhere = jax.grad(mean_logp)(params, batch), jax.grad(mean_logp)(params, full)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), windowed, everywhere)
  assert float(jnp.abs(windowed["embed_vd"][...]).sum()) > 0
