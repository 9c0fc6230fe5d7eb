"""The theory against closed forms, finite differences of the loss, SA runs and brute force."""

import dataclasses
import itertools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpa_grpo import losses, theory

GAME = theory.Game()
# A game where every state is reached often: its slowest ODE mode is fast enough for a short SA run.
FAST = theory.Game(p_x_right=0.5, verifier_ref=(0.5, 0.5), generator_sees_revision=False)
CLOSED = [
  ("policy", "exact", 0.5),
  ("policy", "k3", 0.5),
  ("pair", "k3", 0.5),
  ("pair", "k3", 0.04),
  ("policy", "exact", 2.0),
  ("pair", "k1", 2.0),
]


def _outcome_losses(theta, game, beta, kl, weighting):
  """[8] paired_loss of each one-unit outcome (S_x, S_z, SAC) and its probability under θ (numpy)."""
  theta_ref = theory.reference_logits(game)
  pair = lambda t: jax.nn.log_softmax(jnp.stack([jnp.zeros_like(t), t]))[None]
  out, probs = [], []
  for s_x, s_z, sac in itertools.product((0, 1), (0, 1), (0, 1)):
    g = 2 + game.generator_state(s_x, s_z)
    lv, _ = losses.paired_loss(
      pair(theta[s_x]),
      pair(jnp.asarray(theta_ref[s_x])),
      jnp.asarray(game.verifier_reward)[s_x][None],
      beta=beta,
      kl=kl,
      weighting=weighting,
    )
    lg, _ = losses.paired_loss(
      pair(theta[g]),
      pair(jnp.asarray(theta_ref[g])),
      jnp.asarray(game.generator_reward)[s_x][s_z][None],
      beta=beta,
      kl=kl,
      weighting=weighting,
      mask=jnp.array([float(sac)]),
    )
    p_x = game.p_x_right if s_x else 1 - game.p_x_right
    p_z = game.p_z_right[s_x] if s_z else 1 - game.p_z_right[s_x]
    p_v = 1 / (1 + np.exp(-float(theta[s_x])))
    probs.append(p_x * p_z * (p_v if sac else 1 - p_v))
    out.append(lv + lg)
  return jnp.stack(out), np.array(probs)


@pytest.mark.parametrize("kl", losses.KL_CHOICES)
def test_field_is_the_expected_finite_difference_of_the_loss(kl):
  """The paper's ("pair") loss. ("policy" weights are stop-gradients, so a difference of its values
  is not its gradient; those variants are checked against the derived equations below.)"""
  weighting = "pair"
  with jax.enable_x64(True):
    theta = jnp.asarray(np.random.default_rng(0).normal(size=GAME.dim))
    field = theory.vector_field(theta, GAME, 0.3, kl=kl, weighting=weighting)
    _, probs = _outcome_losses(theta, GAME, 0.3, kl, weighting)
    h, fd = 1e-5, []
    for i in range(GAME.dim):
      e = h * jnp.eye(GAME.dim)[i]
      plus, _ = _outcome_losses(theta + e, GAME, 0.3, kl, weighting)
      minus, _ = _outcome_losses(theta - e, GAME, 0.3, kl, weighting)
      fd.append(-np.sum(probs * (plus - minus)) / (2 * h))
  np.testing.assert_allclose(field, fd, atol=1e-8)


@pytest.mark.parametrize("weighting,kl", theory.LOSS_VARIANTS)
def test_field_matches_the_equations_in_the_docs(weighting, kl):
  """F_s = reach_s · h(θ_s; ā_s), h per variant as derived in docs/theory.md."""
  beta = 0.3
  with jax.enable_x64(True):
    theta = np.random.default_rng(1).normal(size=GAME.dim)
    field = np.asarray(theory.vector_field(jnp.asarray(theta), GAME, beta, kl=kl, weighting=weighting))
  p, q = 1 / (1 + np.exp(-theta)), 1 / (1 + np.exp(-theory.reference_logits(GAME)))
  a, d = theory.expected_advantages(GAME), theta - theory.reference_logits(GAME)
  h = {
    ("pair", "k1"): 0.5 * a - 0.5 * beta * (1 - 2 * p),
    ("pair", "k3"): 0.5 * a - 0.5 * beta * (p - q) * ((1 - p) / p + p / (1 - p)),
    ("pair", "exact"): 0.5 * a - beta * p * (1 - p) * d,
    ("policy", "k1"): 2 * p * (1 - p) * a,
    ("policy", "k3"): 2 * p * (1 - p) * a - beta * (p - q),
    ("policy", "exact"): p * (1 - p) * (2 * a - beta * d),
  }[(weighting, kl)]
  np.testing.assert_allclose(field, theory.reach_probabilities(GAME, p) * h, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("weighting,kl,beta", CLOSED)
def test_numeric_fixed_points_equal_closed_forms_and_stable_ones_have_negative_eigenvalues(
  weighting, kl, beta
):
  found = theory.fixed_points(GAME, beta, kl=kl, weighting=weighting)
  closed = theory.closed_form_fixed_points(GAME, beta, kl=kl, weighting=weighting)
  assert all(len(r) == 1 for r in closed)  # these variants have one root per state
  (fp,) = found
  np.testing.assert_allclose(fp.probs, [r[0] for r in closed], atol=1e-6)
  regularised = (weighting, kl) != ("pair", "k1")  # pair/k1 anti-regularises: its roots repel
  assert fp.stable == regularised
  assert np.all(fp.eigenvalues.real < 0) if regularised else np.all(fp.eigenvalues.real > 0)
  if (weighting, kl) == ("policy", "exact"):
    # ∂F/∂θ is triangular (only the generator's reach depends on the verifier): λ_s = reach_s·h'(θ_s).
    diag = -theory.reach_probabilities(GAME, fp.probs) * beta * fp.probs * (1 - fp.probs)
    np.testing.assert_allclose(np.sort(fp.eigenvalues.real), np.sort(diag), rtol=1e-6)


def test_no_interior_fixed_point_for_the_papers_k1_at_its_beta():
  assert theory.fixed_points(GAME, 0.04, kl="k1", weighting="pair") == []
  assert [len(r) for r in theory.closed_form_fixed_points(GAME, 0.04, kl="k1", weighting="pair")] == [
    0,
    0,
    1,
    0,
    0,
    1,
  ]


@pytest.mark.parametrize("weighting,kl", [("pair", "k3"), ("policy", "k3"), ("policy", "exact")])
def test_beta_to_zero_recovers_pure_best_responses(weighting, kl):
  best = theory.best_responses(GAME)
  strict = best >= 0
  closed = np.array([r[0] for r in theory.closed_form_fixed_points(GAME, 1e-3, kl=kl, weighting=weighting)])
  np.testing.assert_allclose(closed[strict], best[strict], atol=2e-3)
  if kl == "k3":  # policy/exact's point sits at logit ±2000: beyond any float, closed form only
    (fp,) = theory.fixed_points(GAME, 1e-3, kl=kl, weighting=weighting, min_eigenvalue=0.0)
    np.testing.assert_allclose(fp.probs[strict], best[strict], atol=2e-3)


def test_stochastic_approximation_mean_converges_to_the_ode_fixed_point():
  """128 seeds, 3000 steps of a_n = 1/(1 + n/100)^0.6 (ODE time 738, 22x the slowest mode's 1/|λ| = 33
  at this point): the mean over seeds ends within 0.01 of p* in every state (observed: 0.002)."""
  beta, kl, weighting = 1.0, "k3", "pair"
  p_star = np.array([r[0] for r in theory.closed_form_fixed_points(FAST, beta, kl=kl, weighting=weighting)])
  times, paths = theory.stochastic_approximation(
    jax.random.key(0),
    jnp.asarray(theory.reference_logits(FAST), jnp.float32),
    FAST,
    beta,
    kl=kl,
    weighting=weighting,
    steps=4000,
    seeds=256,
    save_every=100,
    a0=1.0,
    n0=100.0,
    kappa=0.6,
  )
  assert times[-1] > 700
  mean = np.asarray(jax.nn.sigmoid(paths[:, -1])).mean(0)
  np.testing.assert_allclose(mean, p_star, atol=0.01)
  start = np.asarray(jax.nn.sigmoid(paths[:, 0])).mean(0)
  assert np.max(np.abs(start - p_star)) > 0.2  # the runs did travel


def _payoff(game, probs, role):
  """A role's expected reward by brute force over the 16 outcomes (S_x, S_z, verifier, generator)."""
  total = 0.0
  for s_x, s_z, a_v, a_g in itertools.product((0, 1), repeat=4):
    p_x = game.p_x_right if s_x else 1 - game.p_x_right
    p_z = game.p_z_right[s_x] if s_z else 1 - game.p_z_right[s_x]
    p_v = probs[s_x] if a_v else 1 - probs[s_x]
    if role == "verifier":
      total += p_x * p_z * p_v * game.verifier_reward[s_x][a_v] * (a_g == 0)
    elif a_v == 1:
      g = probs[2 + game.generator_state(s_x, s_z)]
      total += p_x * p_z * p_v * (g if a_g else 1 - g) * game.generator_reward[s_x][s_z][a_g]
  return total


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(
  probs=st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6),
  state=st.sampled_from([0, 1, 3, 4]),  # the states of GAME with a strict best response
  mass=st.floats(1e-6, 1.0),
  sac=st.floats(1e-3, 1.0),
  sees_revision=st.booleans(),
)
def test_positive_mass_on_a_strictly_worse_action_is_a_profitable_deviation(
  probs, state, mass, sac, sees_revision
):
  game = dataclasses.replace(GAME, generator_sees_revision=sees_revision)
  probs = np.array(probs[: game.dim])
  state = min(state, game.dim - 1)
  best = theory.best_responses(game)[state]
  hypothesis.assume(best >= 0)
  probs[state] = 1 - mass if best == 1 else mass  # `mass` on the worse action
  if state >= 2:  # make the generator's state reachable: the verifier raises SAC there
    probs[[s for s in (0, 1) if any(game.generator_state(s, z) == state - 2 for z in (0, 1))]] = sac
  found = theory.deviations(game, probs)
  mine = [d for d in found if d.state == game.state_names()[state]]
  assert len(mine) == 1
  role = "verifier" if state < 2 else "generator"
  deviated = probs.copy()
  deviated[state] = best
  gain = _payoff(game, deviated, role) - _payoff(game, probs, role)
  assert gain > 0
  np.testing.assert_allclose(mine[0].gain, gain, rtol=1e-9, atol=1e-15)
  # All of a role's deviations at once (its own states only) gain the sum of their gains.
  own = np.arange(game.dim) < 2 if role == "verifier" else np.arange(game.dim) >= 2
  best_all = theory.best_responses(game)
  everything = np.where(own & (best_all >= 0), best_all, probs)
  np.testing.assert_allclose(
    sum(d.gain for d in found if d.role == role),
    _payoff(game, everything, role) - _payoff(game, probs, role),
    rtol=1e-9,
    atol=1e-15,
  )


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(ties=st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6), sees_revision=st.booleans())
def test_pure_best_response_profiles_have_no_deviation(ties, sees_revision):
  game = dataclasses.replace(GAME, generator_sees_revision=sees_revision, p_z_right=(0.3, 1.0))
  best = theory.best_responses(game)
  assert theory.deviations(game, np.where(best >= 0, best, ties[: game.dim])) == []


def test_each_case_signals_the_deviation_of_the_table():
  signals = {c: [(d.role, d.action, d.better) for d in ds] for c, ds in theory.case_deviations(GAME).items()}
  assert signals == {
    "1": [],
    "2": [("verifier", "SAC", "NS"), ("generator", "REVISE", "KEEP")],
    "3": [("verifier", "SAC", "NS")],
    "4": [("verifier", "NS", "SAC")],
    "5a": [],
    "5b": [],
    "6a": [],
    "6b": [("generator", "KEEP", "REVISE")],
  }
  assert theory.case_deviations(GAME)["2"][1].gap == pytest.approx(1 - GAME.p_z_right[1])


def test_case_probabilities_at_the_reference_reproduce_the_papers_pre_training_rates():
  cases = np.asarray(theory.case_probabilities(GAME, jnp.asarray(theory.reference_logits(GAME), jnp.float32)))
  np.testing.assert_allclose(cases.sum(), 1.0, rtol=1e-6)
  np.testing.assert_allclose(cases[[0, 3]], [0.274, 0.553], atol=3e-3)  # cases 1 and 4 (refs rounded)


def test_sac_units_averaging_is_the_expected_update_of_the_trainers_batch_mean():
  """The trainer averages the generator's loss over the SAC'd units of a batch only. Its expected
  gradient, over many large batches drawn from P_θ (each loss aggregated exactly as training does:
  verifier a mean over all units, generator `paired_loss` with the SAC mask), is the "sac_units"
  field — the "expected" field with the generator's rows divided by P_θ(SAC)."""
  game = theory.Game(generator_sees_revision=False)
  beta, kl, weighting = 0.04, "k3", "pair"
  with jax.enable_x64(True):
    theta = jnp.asarray([-1.0, 0.5, 0.3, -0.2], jnp.float64)
    s_x_of, s_z_of = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])
    _, _, prior, v_rewards, g_rewards = theory._unit_types(game)
    ref = jnp.asarray(theory.reference_logits(game))
    rng = np.random.default_rng(0)
    n, batches = 4000, 50

    def batch_loss(t, types, sac):
      sx = s_x_of[types]
      g = 2 + np.array([game.generator_state(a, b) for a, b in zip(sx, s_z_of[types], strict=True)])
      v, _ = losses.paired_loss(
        theory._pair_logp(t[sx]),
        theory._pair_logp(ref[sx]),
        v_rewards[types],
        beta=beta,
        kl=kl,
        weighting=weighting,
      )
      gen, _ = losses.paired_loss(
        theory._pair_logp(t[g]),
        theory._pair_logp(ref[g]),
        g_rewards[types],
        beta=beta,
        kl=kl,
        weighting=weighting,
        mask=jnp.asarray(sac),
      )
      return v + gen

    grads = []
    for _ in range(batches):
      types = rng.choice(4, size=n, p=prior)
      sac = rng.random(n) < np.asarray(jax.nn.sigmoid(theta[s_x_of[types]]))
      grads.append(-np.asarray(jax.grad(batch_loss)(theta, types, sac.astype(np.float64))))
    mc = np.mean(grads, axis=0)
    expected = np.asarray(theory.vector_field(theta, game, beta, kl=kl, weighting=weighting))
    trained = np.asarray(
      theory.vector_field(theta, game, beta, kl=kl, weighting=weighting, averaging="sac_units")
    )
    rate = float(theory.sac_rate(theta, game))
  np.testing.assert_allclose(trained[:2], expected[:2])  # the verifier: a mean over every unit
  np.testing.assert_allclose(trained[2:], expected[2:] / rate, rtol=1e-12)
  np.testing.assert_allclose(mc, trained, rtol=0.05, atol=2e-3)
  assert np.max(np.abs(mc[2:] - expected[2:])) > 10 * np.max(np.abs(mc[2:] - trained[2:]))
