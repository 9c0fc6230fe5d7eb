"""The Game variant that cannot observe correctness, and the out-of-sample ODE on hand-built records."""

import os
import random

import jax.numpy as jnp
import numpy as np
import pytest

from configs import dpa_grpo as dpa_config
from dpa_grpo import game, testbed_report, testbed_theory, theory
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
  for r in out["seeds"].values():
    assert 0 <= r["ode_drafts_rmse"] < 1 and 0 <= r["trend_rmse"] < 1
  assert out["seeds"][3]["trend_rmse"] == pytest.approx(out["fit_rmse_trend"])
  across = out["across_seeds"]
  assert across["ode_rmse"]["n"] == 3
  lo, hi = across["ode_rmse - trend_rmse"]["interval"]
  assert lo <= across["ode_rmse - trend_rmse"]["mean"] <= hi
  # The report's section renders every predictor and the paired differences.
  md = "\n".join(testbed_report.ode_markdown(out, "DPA-GRPO"))
  assert "trend (8 slopes)" in md and "ode − trend" in md and "| 3 |" in md
  # Another warm start: κ and the slopes carry over, the step-0 game is its own. Given the fit's
  # own gates and seed, the fit's numbers come back; given another game, step-0's error is that game's.
  same = testbed_theory.other_warm_start(out, gate, {0: train[0]}, config)
  assert same["seeds"][0]["ode_rmse"] == pytest.approx(out["fit_rmse"])
  assert same["seeds"][0]["trend_rmse"] == pytest.approx(out["fit_rmse_trend"])
  gate2 = [_record(rng, line, 0, 0.8, 0.3, 0.1) for line in ("1a", "25d", "12") for _ in range(200)]
  other = testbed_theory.other_warm_start(out, gate2, {0: train[0], 1: train[1]}, config)
  assert other["games"]["1a"]["p_x_right"] != out["games"]["1a"]["p_x_right"]
  assert other["kappa"] == out["kappa"]
  assert other["seeds"][0]["step0_rmse"] > same["seeds"][0]["step0_rmse"]  # the wrong game for these runs
  assert "ode_rmse - trend_rmse" in other["across_seeds"] and "ode_drafts_rmse" not in other["across_seeds"]
  md = "\n".join(testbed_report.ode_markdown(dict(out, other_warm_start=dict(other, workdir="/ws2")), "D"))
  assert "Another warm start (`/ws2`)" in md and "ode − trend" in md


def test_the_trend_baseline_recovers_a_linear_drift_and_moving_drafts_shift_the_case_mix():
  step0 = np.full(len(game.CASES), 1 / len(game.CASES))
  slopes = np.linspace(-0.004, 0.004, len(game.CASES))
  centre = np.array([2.0, 5.0, 8.0, 11.0, 14.0])
  rates = step0[None] + centre[:, None] * slopes[None]
  np.testing.assert_allclose(testbed_theory.trend_slopes(step0, centre, rates), slopes, atol=1e-12)
  np.testing.assert_allclose(testbed_theory.trend(step0, slopes, centre), rates, atol=1e-12)
  # Drafts held vs moving: with P(x right) fixed at the game's own value both predictors agree; when
  # the drafts improve, right-draft cases (1, 3) gain mass.
  config = ExperimentConfig.from_dict(dpa_config.get_config("testbed").to_dict())
  g = {"1a": theory.Game(p_x_right=0.5, verifier_ref=(0.6, 0.4))}
  predict = testbed_theory.predictor(g, config.loss, t_end=10.0)
  steps, at = np.array([0.0, 10.0, 20.0]), np.array([0.0, 20.0])
  held, same = predict(0.3, steps), predict(0.3, steps, {"1a": (at, np.array([0.5, 0.5]))})
  up = predict(0.3, steps, {"1a": (at, np.array([0.5, 0.9]))})
  np.testing.assert_allclose(held, same, atol=1e-6)
  right = [game.CASES.index(c) for c in ("1", "3")]
  assert up[-1, right].sum() > held[-1, right].sum() + 0.2
  np.testing.assert_allclose(up.sum(-1), 1.0, atol=1e-5)


def test_training_health_reads_format_collapse_from_training_records_only():
  """Verdicts parse in the first half and not in the second; the KL estimate falls: the windows say so."""
  train = [
    {"step": step, "verifier_valid": step <= 5, "decision": {"text": "x"}, "decision_valid": True}
    for step in range(1, 11)
    for _ in range(4)
  ]
  logs = [{"step": step, "verifier/verdict/kl": -0.1 * step} for step in range(1, 11)]
  rows = testbed_report.training_health(train, logs, windows=2)
  assert [r["steps"] for r in rows] == [[1, 5], [6, 10]]
  assert [r["valid_verdict"] for r in rows] == [1.0, 0.0]
  assert [r["valid_decision"] for r in rows] == [1.0, 1.0]
  assert rows[0]["verifier_kl"] == pytest.approx(-0.3) and rows[1]["verifier_kl"] == pytest.approx(-0.8)


def test_for_workdir_reads_a_v2_arm(tmp_path):
  """The v2 report asks for the `dpa_paper` arm (it once looked it up among v1's arms only)."""
  from dpa_grpo import testbed_arms
  from lm import rundir

  config = ExperimentConfig.from_dict(dpa_config.get_config("testbed_v2").to_dict())
  rng = random.Random(1)
  (tmp_path / "gates").mkdir()
  rundir.append_jsonl(
    str(tmp_path / "gates" / "records.jsonl"),
    [_record(rng, line, 0, 0.5, 0.6, 0.4) for line in ("1a", "12") for _ in range(50)],
  )
  for seed in (0, 1):
    run = testbed_arms.run_dir(str(tmp_path), "dpa_paper", seed)
    os.makedirs(os.path.join(run, "records"))
    rows = [
      _record(rng, line, step, 0.5, 0.6, 0.4)
      for step in range(1, 6)
      for line in ("1a", "12")
      for _ in range(8)
    ]
    rundir.append_jsonl(os.path.join(run, "records", "train.jsonl"), rows)
    rundir.write_json(os.path.join(run, "summary.json"), {})
  out = testbed_theory.for_workdir(str(tmp_path), config, "dpa_paper", [0, 1])
  assert set(out["seeds"]) == {1} and out["across_seeds"]["trend_rmse"]["n"] == 1
