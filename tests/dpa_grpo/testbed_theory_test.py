"""The Game variant that cannot observe correctness, and the out-of-sample ODE on hand-built records."""

import random

import jax.numpy as jnp
import numpy as np
import pytest

from configs import dpa_grpo as dpa_config
from dpa_grpo import game, testbed_theory, theory
from dpa_grpo.config import ExperimentConfig


def test_a_game_without_correctness_acts_on_one_state_per_role():
  g = theory.Game(p_x_right=0.3, verifier_ref=(0.4, 0.4), observes_correctness=False)
  theta = jnp.asarray(theory.reference_logits(g), jnp.float32)
  field = np.asarray(theory.vector_field(theta, g, 0.04, kl="k1", weighting="pair"))
  assert field[1] == 0.0 and np.all(field[3:] == 0.0)  # idle coordinates never move
  assert field[0] != 0.0
  probs = np.asarray(theory.case_probabilities(g, theta))
  assert probs.sum() == pytest.approx(1.0)
  i = {c: game.CASES.index(c) for c in game.CASES}
  # The verifier cannot tell: NS is as likely on wrong drafts as on right ones.
  assert probs[i["4"]] / probs[i["1"]] == pytest.approx(0.7 / 0.3)
  seeing = theory.Game(p_x_right=0.3, verifier_ref=(0.4, 0.4))
  assert (
    np.asarray(theory.vector_field(jnp.asarray(theory.reference_logits(seeing)), seeing, 0.04, kl="k1"))[1]
    != 0.0
  )


def _record(rng, line, step, p_right, p_sac_wrong, p_sac_right):
  x_right = rng.random() < p_right
  sac = rng.random() < (p_sac_right if x_right else p_sac_wrong)
  return {
    "step": step,
    "line": line,
    "x_right": x_right,
    "verifier_action": "SAC" if sac else "NS",
    "decision": {"text": game.render_decision(game.KEEP)} if sac else None,
    "z_right": (rng.random() < 0.4) if sac else None,
  }


def test_out_of_sample_fits_on_one_seed_and_scores_the_others(tmp_path):
  config = ExperimentConfig.from_dict(dpa_config.get_config("testbed").to_dict())
  rng = random.Random(0)
  gate = [_record(rng, line, 0, 0.5, 0.6, 0.4) for line in ("1a", "25d", "12") for _ in range(200)]
  # Training: the verifier's SAC on wrong drafts rises over 15 steps (what the ODE predicts too).
  train = {
    seed: [
      _record(rng, line, step, 0.5, 0.6 + 0.02 * step, 0.4 - 0.01 * step)
      for step in range(1, 16)
      for line in ("1a", "25d", "12")
      for _ in range(24)
    ]
    for seed in (0, 1, 2)
  }
  train[3] = train[0]  # a copy of the fitted seed is predicted exactly as well as it was fitted
  out = testbed_theory.out_of_sample(gate, train, config, str(tmp_path))
  assert set(out["seeds"]) == {1, 2, 3}
  assert out["seeds"][3]["ode_rmse"] == pytest.approx(out["fit_rmse"])
  assert not out["games"]["12"]["observes_correctness"] and out["games"]["1a"]["observes_correctness"]
  assert all(0 <= r["ode_rmse"] < 1 and 0 <= r["step0_rmse"] < 1 for r in out["seeds"].values())
  assert (tmp_path / "ode_out_of_sample.png").stat().st_size > 1000
