"""paired_loss against hand-computed values and hand-derived gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpa_grpo import losses

EPS = losses.ADVANTAGE_EPS
A = 0.5 / (0.5 + EPS)  # |advantage| of a strict preference in a group of two


def test_group_advantages_are_plus_minus_one_and_zero_on_ties():
  adv = losses.group_advantages(jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [3.0, 1.0]]))
  np.testing.assert_allclose(adv, [[A, -A], [-A, A], [0, 0], [1 / (1 + EPS), -1 / (1 + EPS)]], rtol=1e-6)


@pytest.mark.parametrize("weighting", ["pair", "policy"])
@pytest.mark.parametrize("kl", ["k1", "k3", "exact"])
def test_loss_value_by_hand(kl, weighting):
  p, q = np.array([0.3, 0.7]), np.array([0.5, 0.5])
  beta = 0.1
  w = np.array([0.5, 0.5]) if weighting == "pair" else p
  adv = np.array([-A, A])
  pg = np.sum(w * -adv * np.log(p))
  divergence = {
    "k1": np.sum(w * np.log(p / q)),
    "k3": np.sum(w * (q / p - np.log(q / p) - 1)),
    "exact": np.sum(p * np.log(p / q)),
  }[kl]
  loss, metrics = losses.paired_loss(
    jnp.log(p)[None], jnp.log(q)[None], jnp.array([[0.0, 1.0]]), beta=beta, kl=kl, weighting=weighting
  )
  np.testing.assert_allclose(loss, pg + beta * divergence, rtol=1e-5)
  np.testing.assert_allclose(metrics["kl"], divergence, rtol=1e-5)
  np.testing.assert_allclose(metrics["prob_action1"], 0.7, rtol=1e-6)


@pytest.mark.parametrize("weighting", ["pair", "policy"])
@pytest.mark.parametrize("kl", ["k1", "k3", "exact"])
def test_gradient_of_a_logit_policy_by_hand(kl, weighting):
  """d loss / dθ for π = σ(θ): the per-unit equations of docs/theory.md (ā = A_1 of the pair)."""
  theta, theta_ref, beta = 0.4, -0.3, 0.2
  p, q = 1 / (1 + np.exp(-theta)), 1 / (1 + np.exp(-theta_ref))
  expected = {  # −dL/dθ
    ("pair", "k1"): 0.5 * A - 0.5 * beta * (1 - 2 * p),
    ("pair", "k3"): 0.5 * A - 0.5 * beta * (p - q) * ((1 - p) / p + p / (1 - p)),
    ("pair", "exact"): 0.5 * A - beta * p * (1 - p) * (theta - theta_ref),
    ("policy", "k1"): 2 * p * (1 - p) * A,
    ("policy", "k3"): 2 * p * (1 - p) * A - beta * (p - q),
    ("policy", "exact"): p * (1 - p) * (2 * A - beta * (theta - theta_ref)),
  }[(weighting, kl)]
  pair = lambda t: jax.nn.log_softmax(jnp.stack([0.0, t]))[None]
  grad = jax.grad(
    lambda t: losses.paired_loss(
      pair(t), pair(jnp.float32(theta_ref)), jnp.array([[0.0, 1.0]]), beta=beta, kl=kl, weighting=weighting
    )[0]
  )(jnp.float32(theta))
  np.testing.assert_allclose(-grad, expected, rtol=1e-5, atol=1e-7)


def test_gradient_wrt_unnormalised_logprobs():
  """In an LLM the two log-probs are free: pair/k1 gives −A/2 + β/2 per action."""
  logp = jnp.array([[-3.0, -5.0]])
  grad = jax.grad(
    lambda lp: losses.paired_loss(lp, logp - 1.0, jnp.array([[1.0, 0.0]]), beta=0.04, kl="k1")[0]
  )(logp)
  np.testing.assert_allclose(grad, [[-A / 2 + 0.02, A / 2 + 0.02]], rtol=1e-6)


def test_ties_give_only_the_kl_term_and_mask_drops_units():
  logp = jnp.log(jnp.array([[0.2, 0.8], [0.6, 0.4]]))
  ref = jnp.log(jnp.array([[0.5, 0.5], [0.5, 0.5]]))
  rewards = jnp.array([[1.0, 1.0], [0.0, 1.0]])
  loss, metrics = losses.paired_loss(logp, ref, rewards, beta=0.5, kl="exact", mask=jnp.array([1.0, 0.0]))
  kl = 0.2 * np.log(0.4) + 0.8 * np.log(1.6)
  np.testing.assert_allclose(loss, 0.5 * kl, rtol=1e-5)
  np.testing.assert_allclose(metrics["pg"], 0.0, atol=1e-7)
  assert metrics["units"] == 1 and metrics["tie_fraction"] == 1
  empty, _ = losses.paired_loss(logp, ref, rewards, beta=0.5, kl="exact", mask=jnp.zeros(2))
  assert empty == 0


def test_errors_name_the_problem():
  x = jnp.zeros((3, 2))
  with pytest.raises(ValueError, match="kl must be one of"):
    losses.paired_loss(x, x, x, beta=0.1, kl="k2")
  with pytest.raises(ValueError, match=r"must all be \[U, 2\]"):
    losses.paired_loss(x, x, jnp.zeros((3, 3)), beta=0.1, kl="k1")
