"""Pure, jitted policy-gradient losses.

Every loss here is a function of arrays (log-probabilities under the policy and the frozen
reference, rewards) and static settings, and returns `(loss, metrics)`: no parameters, no model, no
I/O, no Python branches on traced values. The model-level train step scores sequences and calls
these; the theory (`dpa_grpo/theory.py`) calls the very same functions on the two-action game, so
the ODE it studies is the expected update that training performs.

Log-probabilities are *length-normalised* sequence log-probabilities (the mean over an action's
tokens): the DPA-GRPO reference code needed this because the longer SAC text otherwise drove the SAC
rate to 1. In the two-action game they are the exact log-probabilities of a logit policy.

## Paired-action loss (DPA-GRPO)

Each of U decision units has a group of the role's two counterfactual actions a ∈ {0, 1} (verifier:
NS, SAC; generator: KEEP, REVISE). Both actions are scored, whichever was sampled. With
ℓ_a = log π(a), ℓ^ref_a = log π_ref(a) and rewards r_a:

  Group-normalised advantages (population std over the group of two, explicit ε):
    A_a = (r_a − mean(r)) / (std(r) + ε),  so A = ±1·(1 − O(ε)) on a strict preference, 0 on a tie.

  The renormalised two-action distribution (exact policy in the game; a conditional in an LLM):
    p̂_a = exp(ℓ_a) / (exp(ℓ_0) + exp(ℓ_1)),   p̂^ref likewise from ℓ^ref.

  Per-action weights w_a:
    "pair"   (paper):  w_a = 1/2 — the mean over the pair's two per-action losses.
    "policy":          w_a = stop_gradient(p̂_a) — the expectation of the loss of one action sampled
                       from π, i.e. the on-policy ("expected-advantage") update.

  Per-unit loss:  L_u = Σ_a w_a·(−A_a·ℓ_a) + β·D_u, with the KL choice D_u:
    "k1"    (paper's reference code):  Σ_a w_a·(ℓ_a − ℓ^ref_a)
    "k3":                              Σ_a w_a·(exp(ℓ^ref_a − ℓ_a) − (ℓ^ref_a − ℓ_a) − 1)
    "exact":                           Σ_a p̂_a·(log p̂_a − log p̂^ref_a)   (= KL(p̂ ‖ p̂^ref), unweighted)

  Batch loss: Σ_u m_u·L_u / max(Σ_u m_u, 1), m the optional mask of units that have a pair (the
  generator's pair exists only after SAC).

With "pair" weights, k1 summed over both actions is not a KL: on the two-action simplex it equals
(β/2)·log(p(1−p)) + const, which pushes a policy *away* from uniform (see docs/theory.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

KL_CHOICES = ("k1", "k3", "exact")
WEIGHTINGS = ("pair", "policy")
ADVANTAGE_EPS = 1e-6


def group_advantages(rewards: jax.Array, eps: float = ADVANTAGE_EPS) -> jax.Array:
  """(r − mean) / (std + ε) over the last axis (the group), population std as in GRPO."""
  mean = rewards.mean(axis=-1, keepdims=True)
  std = rewards.std(axis=-1, keepdims=True)
  return (rewards - mean) / (std + eps)


def _kl_terms(logp: jax.Array, ref_logp: jax.Array, weights: jax.Array, kl: str) -> jax.Array:
  """Per-unit divergence D_u of the module docstring.  # [U, 2] -> [U]"""
  if kl == "k1":
    return jnp.sum(weights * (logp - ref_logp), axis=-1)
  if kl == "k3":
    log_ratio = ref_logp - logp
    return jnp.sum(weights * (jnp.exp(log_ratio) - log_ratio - 1.0), axis=-1)
  log_p = jax.nn.log_softmax(logp, axis=-1)
  log_p_ref = jax.nn.log_softmax(ref_logp, axis=-1)
  return jnp.sum(jnp.exp(log_p) * (log_p - log_p_ref), axis=-1)


@functools.partial(jax.jit, static_argnames=("kl", "weighting"))
def paired_loss(
    logp: jax.Array,
    ref_logp: jax.Array,
    rewards: jax.Array,
    *,
    beta: float | jax.Array,
    kl: str,
    weighting: str = "pair",
    mask: jax.Array | None = None,
    eps: float = ADVANTAGE_EPS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Loss of one role over U decision units, each with its two counterfactual actions.

  Args:
    logp: [U, 2] length-normalised log-probs of actions (0, 1) under the policy.
    ref_logp: [U, 2] the same under the frozen reference policy.
    rewards: [U, 2] the reward of each action of the pair.
    beta: KL coefficient.
    kl: "k1", "k3" or "exact" (see the module docstring).
    weighting: "pair" (the paper's mean over both actions) or "policy" (on-policy expectation).
    mask: optional [U]; 1 where the unit has a pair, 0 where it has none (contributes nothing).
    eps: the ε of the group-normalised advantage.

  Returns:
    (loss, metrics): the scalar loss and its parts, averaged over the masked units.
  """
  if kl not in KL_CHOICES:
    raise ValueError(f"kl must be one of {KL_CHOICES}, got {kl!r}")
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
  if logp.shape != ref_logp.shape or logp.shape != rewards.shape or logp.shape[-1:] != (2,):
    raise ValueError(
        f"logp {logp.shape}, ref_logp {ref_logp.shape} and rewards {rewards.shape} must all be [U, 2]"
    )
  advantages = group_advantages(rewards, eps)  # [U, 2]
  probs = jax.nn.softmax(logp, axis=-1)  # [U, 2] renormalised two-action policy
  if weighting == "pair":
    weights = jnp.full_like(logp, 0.5)
  else:
    weights = jax.lax.stop_gradient(probs)
  pg = jnp.sum(weights * (-advantages * logp), axis=-1)  # [U]
  divergence = _kl_terms(logp, ref_logp, weights, kl)  # [U]
  per_unit = pg + beta * divergence  # [U]
  m = jnp.ones(logp.shape[:1], logp.dtype) if mask is None else mask.astype(logp.dtype)  # [U]
  denom = jnp.maximum(m.sum(), 1.0)
  mean = lambda x: jnp.sum(m * x) / denom
  loss = mean(per_unit)
  metrics = {
      "loss": loss,
      "pg": mean(pg),
      "kl": mean(divergence),
      "prob_action1": mean(probs[:, 1]),
      "tie_fraction": mean((rewards[:, 0] == rewards[:, 1]).astype(logp.dtype)),
      "units": m.sum(),
  }
  return loss, metrics
