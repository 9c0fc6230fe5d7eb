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


def _pair_rows(model, prompts, pairs, branch_override=None):
  """Both ways of scoring pairs: per-completion log-probs [P, 2] and their gradient, two rows a pair
  (`pack_pairs`) and one shared row (`pack_shared_pairs`, its `branch` optionally replaced)."""
  graphdef, params = nnx.split(model)
  rows = scoring.pack_pairs([p for p in prompts for _ in range(2)], [c for pair in pairs for c in pair])
  shared = scoring.pack_shared_pairs(prompts, pairs)
  if branch_override is not None:
    shared["branch"] = branch_override(shared["branch"])
  rows, shared = ({k: jnp.asarray(v) for k, v in b.items()} for b in (rows, shared))

  def two_rows(p):
    return scoring.sequence_logprobs(nnx.merge(graphdef, p), rows, normalize=True, chunk=24)[1].reshape(-1, 2)

  def one_row(p):
    return scoring.sequence_logprobs(nnx.merge(graphdef, p), shared, normalize=True, chunk=24)[1]

  weights = jnp.asarray([[1.0, -2.0], [0.5, 3.0], [-1.0, 0.25]][: len(prompts)])
  return [
    (fn(params), jax.grad(lambda p, fn=fn: jnp.sum(weights * fn(p)))(params)) for fn in (two_rows, one_row)
  ]


@pytest.mark.parametrize("config", ["qwen3", "qwen2"])
@pytest.mark.parametrize("kernel", [True, False], ids=["cpu_kernel", "xla_attention"])
def test_a_shared_prompt_row_scores_each_pair_as_its_two_rows(config, kernel):
  """One row [prompt, a, b] (b attends the prompt, not a; its positions restart after the prompt)
  gives the log-probs and the gradient of the two rows [prompt, a], [prompt, b]: left padding, a
  completion longer than the other's window, an empty one (an invalid reply's pair)."""
  from lm import model as model_lib

  cfg = ModelConfig.tiny_qwen3(vocab_size=64) if config == "qwen3" else ModelConfig.tiny_qwen2(vocab_size=64)
  model = lm.Qwen(cfg, rngs=nnx.Rngs(1))
  rng = np.random.RandomState(0)
  prompts = [list(rng.randint(3, 64, n)) for n in (9, 3, 20)]
  draw = lambda n: list(rng.randint(3, 64, n))
  pairs = [(draw(5), draw(2)), ([7], draw(17)), ([8, 9], [])]
  with model_lib.cpu_attention(None if kernel else 0):
    (rows, rows_grad), (shared, shared_grad) = _pair_rows(model, prompts, pairs)
    np.testing.assert_allclose(shared, rows, atol=2e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), shared_grad, rows_grad)
    assert float(rows[2, 1]) == 0.0 and float(jnp.abs(shared_grad["embed_vd"][...]).sum()) > 0
    # The control: a shared row whose second completion also attends the first scores it otherwise.
    (_, _), (leaky, _) = _pair_rows(model, prompts, pairs, branch_override=lambda b: np.minimum(b, 1))
    np.testing.assert_allclose(leaky[:, 0], rows[:, 0], atol=2e-5)
    assert np.abs(np.asarray(leaky[:2, 1] - rows[:2, 1])).max() > 50 * 2e-5


def test_shared_pairs_layout():
  batch = scoring.pack_shared_pairs([[5, 6, 7]], [([10, 11], [12])], length_multiple=8)
  np.testing.assert_array_equal(batch["tokens"], [[0, 0, 5, 6, 7, 10, 11, 12]])
  np.testing.assert_array_equal(batch["positions"], [[0, 0, 0, 1, 2, 3, 4, 3]])
  np.testing.assert_array_equal(batch["branch"], [[0, 0, 0, 0, 0, 1, 1, 2]])
  np.testing.assert_array_equal(batch["score_sources"][0, :, :2], [[4, 5], [4, 0]])
  np.testing.assert_array_equal(batch["score_targets"][0, :, :2], [[10, 11], [12, 0]])
  assert batch["score_mask"].shape == (1, 2, 16) and batch["score_mask"].sum() == 3
  with pytest.raises(ValueError, match="2 prompts but 1 completion pairs"):
    scoring.pack_shared_pairs([[1], [2]], [([3], [4])])
