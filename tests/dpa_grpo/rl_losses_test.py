"""The model-level DPA-GRPO loss and the GRPO / DAPO / GSPO baselines against their formulas.

The paired core (`paired_loss`) has its own tests in losses_test.py; here every value is recomputed
in numpy from each method's published formula (GRPO: Shao et al. 2024; DAPO: Yu et al. 2025; GSPO:
Zheng et al. 2025), and gradients are checked by finite differences.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lm
from dpa_grpo import losses
from lm import scoring
from lm.config import ModelConfig

EPS = losses.ADVANTAGE_EPS


def _adv(r):
  return (r - r.mean(-1, keepdims=True)) / (r.std(-1, keepdims=True) + EPS)


def _k3(logp, ref):
  return np.exp(ref - logp) - (ref - logp) - 1


@pytest.fixture(scope="module")
def tokens():
  """Two groups of three completions of up to 4 tokens, with ratios away from 1 and one tie group."""
  rng = np.random.RandomState(0)
  logp = np.log(rng.uniform(0.05, 0.9, (2, 3, 4))).astype(np.float32)
  old = (logp + rng.uniform(-0.4, 0.4, logp.shape)).astype(np.float32)
  ref = (logp + rng.uniform(-0.3, 0.3, logp.shape)).astype(np.float32)
  mask = np.array(
    [[[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], [[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]], np.float32
  )
  rewards = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]], np.float32)
  return logp, old, ref, mask, rewards


def _clip_obj(ratio, adv, lo, hi):
  return -np.minimum(ratio * adv, np.clip(ratio, 1 - lo, 1 + hi) * adv)


def test_k3_is_nonnegative_and_zero_on_equal():
  x = jnp.linspace(-3, 0, 7)
  assert np.all(np.asarray(losses.k3(x, x[::-1])) >= 0)
  np.testing.assert_allclose(losses.k3(x, x), 0.0, atol=1e-7)
  np.testing.assert_allclose(losses.k3(jnp.log(0.5), jnp.log(0.25)), 0.5 - np.log(0.5) - 1, rtol=1e-6)


def test_grpo_against_formula(tokens):
  logp, old, ref, mask, rewards = tokens
  adv = _adv(rewards)[..., None]
  per_token = _clip_obj(np.exp(logp - old), adv, 0.2, 0.2) + 0.04 * _k3(logp, ref)
  expected = np.mean((per_token * mask).sum(-1) / mask.sum(-1))
  loss, metrics = losses.grpo_loss(logp, old, ref, mask, rewards, eps=0.2, beta=0.04)
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(
    metrics["kl"], np.mean((_k3(logp, ref) * mask).sum(-1) / mask.sum(-1)), rtol=1e-5
  )
  # Padding groups drop out of the mean.
  masked, _ = losses.grpo_loss(logp, old, ref, mask, rewards, jnp.array([1.0, 0.0]), eps=0.2, beta=0.04)
  np.testing.assert_allclose(masked, np.mean(((per_token * mask).sum(-1) / mask.sum(-1))[0]), rtol=1e-5)


def test_dapo_against_formula(tokens):
  logp, old, ref, mask, rewards = tokens
  max_len, cache_len = 4, 2  # lengths 3 and 4 fall in the soft-penalty zone
  lengths = mask.sum(-1)
  shaping = np.where(lengths <= 2, 0.0, np.where(lengths <= 4, (2 - lengths) / 2, -1.0))
  adv = _adv(rewards + shaping)[..., None]
  per_token = _clip_obj(np.exp(logp - old), adv, 0.2, 0.28)
  keep = np.array([1.0, 0.0])[:, None, None]  # group 2 has equal rewards: dropped
  expected = (per_token * mask * keep).sum() / (mask * keep).sum()
  loss, metrics = losses.dapo_loss(logp, old, mask, rewards, max_len=max_len, cache_len=cache_len)
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  assert float(metrics["kept_groups"]) == 0.5


def test_overlong_shaping_by_hand():
  got = losses.overlong_shaping(jnp.array([10, 12, 14, 16, 17]), max_len=16, cache_len=4)
  np.testing.assert_allclose(got, [0.0, 0.0, -0.5, -1.0, -1.0])


def test_gspo_against_formula(tokens):
  logp, old, ref, mask, rewards = tokens
  ratio = np.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
  expected = np.mean(_clip_obj(ratio, _adv(rewards), 3e-4, 4e-4))
  loss, metrics = losses.gspo_loss(logp, old, ref, mask, rewards)
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  assert float(metrics["clip_fraction"]) > 0  # these ratios are far outside 1 ± 4e-4


@pytest.mark.parametrize("method", ["grpo", "gspo"])
def test_on_policy_gradient_is_advantage_weighted_score(tokens, method):
  """With old = stop_gradient(logp) the ratio is 1 and dL/dlogp_it = −Â_i / |y_i| / N·G (+ KL)."""
  logp, _, _, mask, rewards = tokens
  fn = losses.grpo_loss if method == "grpo" else losses.gspo_loss
  grad = jax.grad(lambda x: fn(x, jax.lax.stop_gradient(x), x, mask, rewards)[0])(jnp.asarray(logp))
  expected = -_adv(rewards)[..., None] * mask / mask.sum(-1, keepdims=True) / rewards.size
  np.testing.assert_allclose(grad, expected, atol=1e-6)


def test_baseline_gradients_match_finite_differences(tokens):
  logp, old, ref, mask, rewards = tokens
  direction = np.random.RandomState(1).randn(*logp.shape).astype(np.float32)
  fns = {
    "grpo": lambda x: losses.grpo_loss(x, old, ref, mask, rewards)[0],
    "dapo": lambda x: losses.dapo_loss(x, old, mask, rewards, max_len=4, cache_len=2)[0],
    "gspo": lambda x: losses.gspo_loss(x, old, ref, mask, rewards, eps_low=0.5, eps_high=0.5, beta=0.1)[0],
  }
  h = 1e-3
  for name, fn in fns.items():
    analytic = float(jnp.vdot(jax.grad(fn)(jnp.asarray(logp)), direction))
    numeric = (float(fn(logp + h * direction)) - float(fn(logp - h * direction))) / (2 * h)
    np.testing.assert_allclose(analytic, numeric, rtol=2e-2, atol=1e-4, err_msg=name)


def test_paper_presets():
  assert (
    losses.BaselineConfig.paper("dapo").eps_high == 0.28 and losses.BaselineConfig.paper("dapo").beta == 0
  )
  assert losses.BaselineConfig.paper("gspo").eps_low == 3e-4
  with pytest.raises(ValueError, match="method must be one of"):
    losses.BaselineConfig.paper("ppo")


# ---- model level -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
  model = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(0))
  ref = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(1))
  prompts = [[3, 4, 5], [3, 4, 5], [7, 8], [7, 8], [9, 10, 11, 12], [9, 10, 11, 12]]
  actions = [[20, 21], [22, 23, 24], [30], [31, 32], [40, 41, 42], [43]]
  batch = {k: jnp.asarray(v) for k, v in scoring.pack_pairs(prompts, actions, length_multiple=8).items()}
  batch |= {
    "rewards": jnp.array([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0]]),
    "component": jnp.array([0, 1, -1]),
    "share": jnp.array([0.5, 1.0]),
    "row_penalty": jnp.array([[0.0, 0.0], [0.0, 0.0], [0.25, 0.0]]),
  }
  return model, ref, prompts, actions, batch


@jax.jit
def _pair_logp_by_hand(model, batch):
  """Mean completion log-prob per row from the full-vocabulary log-softmax.  # [P, 2]"""
  logp = jax.nn.log_softmax(model(batch["tokens"], attention_mask=batch["attention_mask"]))
  picked = jnp.take_along_axis(logp[:, :-1], batch["tokens"][:, 1:, None], -1)[..., 0]
  mask = batch["completion_mask"][:, 1:]
  return (jnp.sum(picked * mask, 1) / jnp.sum(mask, 1)).reshape(-1, 2)


_dpa_loss = jax.jit(losses.dpa_loss, static_argnames="cfg")


@pytest.mark.parametrize("kl", ["k3", "exact"])
def test_dpa_loss_equals_core_on_hand_scored_pairs(tiny, kl):
  model, ref, _, _, batch = tiny
  cfg = losses.DPALossConfig(
    beta=0.1, kl=kl, components=("decision", "proposal"), component_weights=(1.0, 0.5)
  )
  loss, metrics = _dpa_loss(model, ref, batch, cfg)
  logp, ref_logp = np.asarray(_pair_logp_by_hand(model, batch)), np.asarray(_pair_logp_by_hand(ref, batch))
  core = lambda u: losses.paired_loss(
    jnp.asarray(logp[u : u + 1]),
    jnp.asarray(ref_logp[u : u + 1]),
    batch["rewards"][u : u + 1],
    beta=0.1,
    kl=kl,
  )
  expected = 1.0 * 0.5 * core(0)[0] + 0.5 * 1.0 * core(1)[0] + 0.25 * logp[2, 0]
  np.testing.assert_allclose(loss, expected, rtol=1e-4)
  np.testing.assert_allclose(metrics["decision/kl"], 0.5 * core(0)[1]["kl"], rtol=1e-4)
  np.testing.assert_allclose(metrics["proposal/tie_fraction"], 1.0)


@pytest.mark.slow
def test_dpa_loss_gradient_matches_finite_differences(tiny):
  model, ref, _, _, batch = tiny
  cfg = losses.DPALossConfig(
    beta=0.1, kl="k3", components=("decision", "proposal"), component_weights=(1.0, 1.0)
  )
  graphdef, params = nnx.split(model)
  fn = jax.jit(lambda p: losses.dpa_loss(nnx.merge(graphdef, p), ref, batch, cfg)[0])
  grads = jax.jit(jax.grad(fn))(params)
  rng = np.random.RandomState(2)
  direction = jax.tree.map(lambda x: jnp.asarray(rng.randn(*x.shape), x.dtype), params)
  norm = np.sqrt(sum(float(jnp.vdot(d, d)) for d in jax.tree.leaves(direction)))
  direction = jax.tree.map(lambda d: d / norm, direction)  # a unit step in parameter space
  analytic = sum(
    float(jnp.vdot(g, d)) for g, d in zip(jax.tree.leaves(grads), jax.tree.leaves(direction), strict=True)
  )
  h = 1e-2
  shift = lambda s: jax.tree.map(lambda p, d: p + s * h * d, params, direction)
  numeric = (float(fn(shift(1.0))) - float(fn(shift(-1.0)))) / (2 * h)
  np.testing.assert_allclose(analytic, numeric, rtol=2e-2)


@pytest.mark.parametrize("method", ["grpo", "dapo"])
def test_baseline_loss_scores_the_model(tiny, method):
  model, ref, prompts, actions, _ = tiny
  batch = {k: jnp.asarray(v) for k, v in scoring.pack_pairs(prompts, actions, length_multiple=8).items()}
  batch |= {"rewards": jnp.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]), "group_mask": jnp.ones(2), "share": 0.5}
  cfg = losses.BaselineConfig.paper(method, max_len=8, cache_len=2)
  loss, _ = jax.jit(losses.baseline_loss, static_argnames="cfg")(model, ref, batch, cfg)
  per_token, _ = scoring.sequence_logprobs(model, batch)
  ref_token, _ = scoring.sequence_logprobs(ref, batch)
  shape = (2, 3, per_token.shape[-1])
  logp, ref_logp = per_token.reshape(shape), ref_token.reshape(shape)
  mask = batch["completion_mask"].reshape(shape).astype(jnp.float32)
  if method == "grpo":
    expected, _ = losses.grpo_loss(logp, logp, ref_logp, mask, batch["rewards"])
  elif method == "dapo":
    expected, _ = losses.dapo_loss(logp, logp, mask, batch["rewards"], max_len=8, cache_len=2)
  else:
    expected, _ = losses.gspo_loss(logp, logp, ref_logp, mask, batch["rewards"])
  np.testing.assert_allclose(loss, 0.5 * expected, rtol=1e-5)
