"""The theory's ODE out of sample on the testbed: game from the step-0 gate rollout, time scale
fitted on seed 0, case-rate trajectories of the other seeds predicted.

The synthetic-forms overlay (`dpa_grpo.report.theory_overlay`) estimates its game from the first
training steps and fits its time scale on the same run it is drawn on: in sample. Here:

  game       one `theory.Game` per line, estimated from the gates' validation rollout (step 0,
             before any training; `gates/records.jsonl`), never from training steps. On a copy line
             the verifier's information state is what it can observe — does the draft equal the
             field? — which on this family is exactly S_x; on the control line it observes nothing
             about correctness (`Game.observes_correctness=False`: one verifier state, one
             generator state).
  clock      the generator's loss averaged over SAC'd units, as the trainer does
             (`averaging="sac_units"`); the run's β, KL estimator and weighting.
  time scale one κ (ODE time = κ · training step), fitted by least squares on seed 0's measured
             case rates only (training rollouts, windows of steps, the generator's sampled
             decisions), then held fixed to predict seeds 1 and 2.
  drafts     the ODE models the verifier and the KEEP / REVISE decision; the proposal's own learning
             is outside it. Held (`ode`): every line keeps its step-0 P(x right). Moving
             (`ode_drafts`): the case mix uses the fit seed's measured P(x right) of each line and
             window of steps (piecewise linear in the step; an exogenous input from the fit seed,
             never the predicted seed's), while θ follows the step-0 game's path. A case probability
             is linear in P(x right) given θ, so this is p·C(θ | x right) + (1 − p)·C(θ | x wrong).
  baselines  "the rates stay at step 0" (`step0`: the case rates of the step-0 game), and a
             one-parameter-per-rate trend (`trend`): each case rate moves linearly from its step-0
             value with the slope least squares fits on the fit seed's windows (8 slopes against the
             ODE's one κ), clipped to [0, 1].
  intervals  per predicted seed an RMS error of each predictor (over the 8 rates and every window);
             across predicted seeds the mean with its Student-t 95% interval, and the same for the
             paired differences ODE − trend and ODE − step0 (`lm.stats.t_interval`).

The predicted rates of a step are the mean over lines of each line's ODE case probabilities (every
line has one unit per case, so lines weigh equally).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpa_grpo import config as config_lib
from dpa_grpo import game, report, testbed_arms, theory
from dpa_grpo.envs import copycheck
from lm import rundir, stats
from lm.plotting import plt

WINDOWS = 5  # windows of training steps per seed
_T_STEPS = 4000  # RK4 steps of each line's ODE path
_KAPPAS = np.geomspace(1e-3, 50.0, 300)


def line_games(records: Sequence[dict[str, Any]], invalid_decision_action: str) -> dict[str, theory.Game]:
  """One game per line of the step-0 records; the control line's pooled over correctness."""
  games = {}
  for line in dict.fromkeys(r["line"] for r in records):
    rows = [r for r in records if r["line"] == line]
    g = report.estimate_game(rows, invalid_decision_action)
    if not copycheck.checkable(line):
      clip = lambda p: float(np.clip(p, report.PROB_CLIP, 1 - report.PROB_CLIP))
      pooled = clip(np.mean([r["verifier_action"] == "SAC" for r in rows]))
      g = theory.Game(
        p_x_right=g.p_x_right,
        p_z_right=g.p_z_right,
        verifier_ref=(pooled, pooled),
        generator_ref=g.generator_ref,
        observes_correctness=False,
      )
    games[line] = g
  return games


def predictor(games: dict[str, theory.Game], loss: config_lib.LossConfig, t_end: float):
  """(κ, steps [W], draft_right=None) -> predicted rates of the 8 cases [W, 8] (mean over lines), by
  interpolating each line's ODE path (integrated once here) at t = κ · step. `draft_right` {line:
  (steps [K], P(x right) [K])}: the case mix follows it (the module docstring's "moving" drafts);
  None: each line's step-0 P(x right)."""
  lines = []
  for line, g in games.items():
    times, path = theory.ode_paths(
      theory.reference_logits(g)[None],
      g,
      loss.beta,
      kl=loss.kl,
      weighting=loss.weighting,
      t_end=t_end,
      steps=_T_STEPS,
      save_every=4,
      averaging="sac_units",
    )
    given = [
      np.asarray(theory.case_probabilities(dataclasses.replace(g, p_x_right=p), path[0])) for p in (0.0, 1.0)
    ]
    lines.append((line, g.p_x_right, given))  # given: [x wrong, x right], each [S, 8]
  times = np.asarray(times)

  def predict(kappa: float, steps: np.ndarray, draft_right: dict | None = None) -> np.ndarray:
    steps = np.asarray(steps, np.float64)
    out = []
    for line, p0, (wrong, right) in lines:
      at = lambda curve: np.stack(
        [np.interp(kappa * steps, times, curve[:, c]) for c in range(len(game.CASES))], -1
      )
      p = np.full_like(steps, p0) if draft_right is None else np.interp(steps, *draft_right[line])
      out.append(p[:, None] * at(right) + (1 - p)[:, None] * at(wrong))
    return np.mean(out, axis=0)

  return predict


def _windows(steps: np.ndarray, windows: int) -> list[np.ndarray]:
  """Masks of `windows` equal spans of training steps, the empty ones left out."""
  edges = np.linspace(steps.min(), steps.max() + 1, windows + 1)
  masks = [(steps >= lo) & (steps < hi) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
  return [m for m in masks if m.any()]


def draft_trajectory(records: Sequence[dict[str, Any]], windows: int = WINDOWS):
  """{line: (window centre steps [W], P(x right) [W])} of training records (the fit seed's)."""
  out = {}
  for line in dict.fromkeys(r["line"] for r in records):
    rows = [r for r in records if r["line"] == line]
    steps = np.array([r["step"] for r in rows])
    right = np.array([bool(r["x_right"]) for r in rows])
    masks = _windows(steps, windows)
    out[line] = (np.array([steps[m].mean() for m in masks]), np.array([right[m].mean() for m in masks]))
  return out


def trend_slopes(step0: np.ndarray, centre: np.ndarray, rates: np.ndarray) -> np.ndarray:
  """Least-squares slope of each case rate from its step-0 value: argmin_b Σ_w (r0 + b·s_w − r_w)².  # [8]"""
  return ((rates - step0[None]) * centre[:, None]).sum(0) / np.sum(centre**2)


def trend(step0: np.ndarray, slopes: np.ndarray, steps: np.ndarray) -> np.ndarray:
  """The trend baseline's rates at `steps`.  # [W, 8]"""
  return np.clip(step0[None] + np.asarray(steps)[:, None] * slopes[None], 0.0, 1.0)


def measured_rates(records: Sequence[dict[str, Any]], invalid_decision_action: str, windows: int = WINDOWS):
  """(window centre steps [W], rates [W, 8], Wilson intervals [W, 8, 2]) of training records."""
  played = report.sampled_cases(records, invalid_decision_action)
  steps = np.array([s for s, _ in played])
  cases = np.array([game.CASES.index(c) for _, c in played])
  masks = _windows(steps, windows)
  counts = np.array([np.bincount(cases[m], minlength=len(game.CASES)) for m in masks])
  ci = np.array([[stats.wilson_interval(int(k), int(c.sum())) for k in c] for c in counts])
  return np.array([steps[m].mean() for m in masks]), counts / counts.sum(1, keepdims=True), ci


def out_of_sample(
  gate_records: Sequence[dict[str, Any]],
  train_records: dict[int, Sequence[dict[str, Any]]],
  config: config_lib.ExperimentConfig,
  figure_dir: str,
  fit_seed: int = 0,
) -> dict[str, Any]:
  """Fits κ (and the trend's slopes) on `fit_seed`'s training records and predicts every other
  seed's; RMS errors of the ODE (drafts held and moving), the trend and the step-0 predictor over
  the 8 case rates and all windows of each predicted seed, with their across-seed intervals."""
  fallback = config.rollout.invalid_decision_action
  games = line_games(gate_records, fallback)
  last = max(max(r["step"] for r in rs) for rs in train_records.values())
  t_end = _KAPPAS[-1] * (last + 1)
  ode, drafts = predictor(games, config.loss, t_end), draft_trajectory(train_records[fit_seed])
  predictors = {"ode": ode, "ode_drafts": lambda k, steps: ode(k, steps, drafts)}
  step0 = ode(0.0, np.zeros(1))[0]
  measured = {s: measured_rates(rs, fallback) for s, rs in train_records.items()}
  centre, rates, _ = measured[fit_seed]
  rms = lambda pred, r: float(np.sqrt(np.mean((pred - r) ** 2)))
  kappas, fits = {}, {}
  for name, predict in predictors.items():
    errors = [rms(predict(k, centre), rates) for k in _KAPPAS]
    kappas[name] = float(_KAPPAS[int(np.argmin(errors))])
    fits[name] = float(min(errors))
  slopes = trend_slopes(step0, centre, rates)
  fits["trend"] = rms(trend(step0, slopes, centre), rates)
  result: dict[str, Any] = {
    "kappa": kappas["ode"],
    "kappa_drafts": kappas["ode_drafts"],
    "fit_seed": fit_seed,
    "fit_rmse": fits["ode"],
    "fit_rmse_drafts": fits["ode_drafts"],
    "fit_rmse_trend": fits["trend"],
    "trend_slopes": dict(zip(game.CASES, slopes.tolist(), strict=True)),
    "games": {line: _game_dict(g) for line, g in games.items()},
    "seeds": {},
  }
  for seed, (c, r, _) in measured.items():
    if seed == fit_seed:
      continue
    result["seeds"][seed] = {
      "ode_rmse": rms(predictors["ode"](kappas["ode"], c), r),
      "ode_drafts_rmse": rms(predictors["ode_drafts"](kappas["ode_drafts"], c), r),
      "trend_rmse": rms(trend(step0, slopes, c), r),
      "step0_rmse": rms(step0[None], r),
    }
  result["across_seeds"] = across_seeds(result["seeds"])
  best = lambda k: predictors["ode"](kappas["ode"], k)
  result["figure"] = _figure(measured, best, kappas["ode"], step0, fit_seed, figure_dir)
  return result


def other_warm_start(
  fit: dict[str, Any],
  gate_records: Sequence[dict[str, Any]],
  train_records: dict[int, Sequence[dict[str, Any]]],
  config: config_lib.ExperimentConfig,
) -> dict[str, Any]:
  """`fit` (an `out_of_sample` result: κ and the trend's slopes from one seed of one warm start)
  predicting the training case rates of every run of *another* warm start. Only what a warm start
  fixes is re-read: its own step-0 game (its gates' rollout) is the ODE's start and the step-0 and
  trend predictors' intercept; κ and the slopes carry over unchanged. Drafts held only: the moving
  drafts' input is the fit seed's own P(x right) trajectory, which belongs to the other warm start."""
  fallback = config.rollout.invalid_decision_action
  games = line_games(gate_records, fallback)
  last = max(max(r["step"] for r in rs) for rs in train_records.values())
  ode = predictor(games, config.loss, _KAPPAS[-1] * (last + 1))
  step0 = ode(0.0, np.zeros(1))[0]
  slopes = np.array([fit["trend_slopes"][c] for c in game.CASES])
  rms = lambda pred, r: float(np.sqrt(np.mean((pred - r) ** 2)))
  seeds = {}
  for seed, rs in train_records.items():
    c, r, _ = measured_rates(rs, fallback)
    seeds[seed] = {
      "ode_rmse": rms(ode(fit["kappa"], c), r),
      "trend_rmse": rms(trend(step0, slopes, c), r),
      "step0_rmse": rms(step0[None], r),
    }
  games_out = {line: _game_dict(g) for line, g in games.items()}
  return {"kappa": fit["kappa"], "games": games_out, "seeds": seeds, "across_seeds": across_seeds(seeds)}


def across_seeds(per_seed: dict[int, dict[str, float]]) -> dict[str, dict[str, Any]]:
  """Mean over the predicted seeds of each RMS error and of the paired differences ODE − trend and
  ODE − step0 (negative: the ODE predicts better), each with its Student-t 95% interval (None
  with fewer than two seeds)."""
  if not per_seed:
    return {}
  rows = list(per_seed.values())
  series = {name: [r[name] for r in rows] for name in rows[0]}
  for ode in ("ode_rmse", "ode_drafts_rmse"):
    for other in ("trend_rmse", "step0_rmse"):
      if ode in series:
        series[f"{ode} - {other}"] = [r[ode] - r[other] for r in rows]
  return {
    name: {
      "mean": float(np.mean(v)),
      "interval": list(stats.t_interval(v)) if len(v) > 1 else None,
      "n": len(v),
    }
    for name, v in series.items()
  }


def _game_dict(g: theory.Game) -> dict[str, Any]:
  return {
    "p_x_right": g.p_x_right,
    "p_z_right": list(g.p_z_right),
    "verifier_ref": list(g.verifier_ref),
    "generator_ref": g.generator_ref,
    "observes_correctness": g.observes_correctness,
  }


def _figure(measured, predict, kappa, step0, fit_seed, figure_dir) -> str:
  os.makedirs(figure_dir, exist_ok=True)
  fig, axes = plt.subplots(2, 4, figsize=(14, 6), sharex=True)
  last = max(c.max() for c, _, _ in measured.values())
  grid = np.linspace(0, last, 200)
  curve = predict(grid)
  for i, (name, ax) in enumerate(zip(game.CASES, axes.flat, strict=True)):
    for seed, (c, r, ci) in measured.items():
      style = "s" if seed == fit_seed else "o"
      label = f"seed {seed}" + (" (fit)" if seed == fit_seed else " (predicted)")
      ax.errorbar(c, r[:, i], yerr=[r[:, i] - ci[:, i, 0], ci[:, i, 1] - r[:, i]], fmt=style, ms=4,
                  label=label, alpha=0.8)  # fmt: skip
    ax.plot(grid, curve[:, i], "k-", label=f"ODE (t = {kappa:.3g}·step)")
    ax.axhline(step0[i], color="grey", ls=":", label="step-0 rates")
    ax.set_title(f"case {name}")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("training step")
  axes.flat[0].legend(fontsize=7)
  fig.suptitle(f"ODE out of sample: game from the step-0 gate rollout, κ fitted on seed {fit_seed} only")
  fig.tight_layout()
  path = os.path.join(figure_dir, "ode_out_of_sample.png")
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def _finished(workdir: str, arm: str, seeds: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
  """{seed: training records} of the arm's finished runs in a testbed workdir."""
  train = {}
  for seed in seeds:
    path = os.path.join(testbed_arms.run_dir(workdir, arm, seed), "records", "train.jsonl")
    if os.path.exists(os.path.join(testbed_arms.run_dir(workdir, arm, seed), "summary.json")):
      train[seed] = list(rundir.read_jsonl(path))
  return train


def for_workdir(
  workdir: str,
  config: config_lib.ExperimentConfig,
  arm: str,
  seeds: Sequence[int],
  other_workdir: str = "",
):
  """`out_of_sample` for one DPA-GRPO arm of a testbed workdir; None until seed 0 and another
  seed have run. `other_workdir`: a testbed workdir of the same arm from another warm start (e.g.
  `--config.warm_start.seed=1`), whose finished runs the fit also predicts (`other_warm_start`,
  under "other_warm_start")."""
  gate_path = os.path.join(workdir, "gates", "records.jsonl")
  train = _finished(workdir, arm, seeds)
  if not os.path.exists(gate_path) or 0 not in train or len(train) < 2:
    return None
  arm_cfg = testbed_arms.arm_config(config, testbed_arms.ALL_ARMS[arm], 0, "")
  out = out_of_sample(list(rundir.read_jsonl(gate_path)), train, arm_cfg, os.path.join(workdir, "figures"))
  other_gates = os.path.join(other_workdir, "gates", "records.jsonl")
  other = _finished(other_workdir, arm, seeds) if other_workdir else {}
  if other and os.path.exists(other_gates):
    out["other_warm_start"] = other_warm_start(out, list(rundir.read_jsonl(other_gates)), other, arm_cfg)
    out["other_warm_start"]["workdir"] = other_workdir
  return out
