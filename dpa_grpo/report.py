"""The report of an experiment's runs: tables, per-line curves and the theory overlay.

`write(workdir, config, methods)` reads each method's run directory (`<workdir>/<method>/`:
metrics.jsonl and records/train.jsonl, as `dpa_grpo.train` writes them) and writes

  report.md / report.json    accuracy before (step 0) and after (the last evaluation — not the best
                             one, which the test split would flatter) with Wilson 95% intervals, the
                             paper's numbers beside ours, and the 8-case tables of the game;
  figures/per_line_accuracy  test accuracy of every line over training, every method;
  figures/theory_overlay     case rates measured on the training rollouts, by training step, over
                             the ODE prediction of `dpa_grpo.theory` for the game the run played.

The overlay's game is estimated from the first training steps' rollouts: P(S_x = 1), P(S_z = 1 |
S_x) after a SAC, the verifier's SAC rate given S_x and the generator's REVISE rate — the LoRA
policies start at the backbone, so the initial policy *is* the KL reference. The loss settings (β,
KL estimator, weighting) are the run's. The measured decisions are the sampled replies, before
exploration forces any REVISE, since the theory's generator policy is the sampled one. ODE time
and training steps are related by one scale κ (t = κ · step), fitted by least squares over the
measured case rates and reported; everything else is predicted, not fitted. The theory holds the
proposal quality fixed while training moves it too, which is one reason the two can part.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpa_grpo import config as config_lib  # noqa: E402
from dpa_grpo import game, theory  # noqa: E402
from dpa_grpo.envs import taxcalc  # noqa: E402
from lm import rundir, stats  # noqa: E402
from lm.plotting import plt  # noqa: E402

# The DPA-GRPO paper's results table: post-revision accuracy (DPA-GRPO) or line accuracy (the rest)
# on TaxCalcBench TY24.
PAPER = {
  "Qwen3-4B": {"zero_shot": 0.414, "grpo": 0.520, "dapo": 0.467, "gspo": 0.461, "dpa_grpo": 0.533},
  "Qwen3-8B": {"zero_shot": 0.533, "grpo": 0.539, "dapo": 0.553, "gspo": 0.520, "dpa_grpo": 0.572},
}
LABELS = {"zero_shot": "zero-shot", "grpo": "GRPO", "dapo": "DAPO", "gspo": "GSPO", "dpa_grpo": "DPA-GRPO"}
ESTIMATE_FRACTION = 0.2  # the share of training steps (at least one) that estimates the game
PROB_CLIP = 0.02  # estimated probabilities are kept in [clip, 1 - clip] (the theory needs (0, 1))


def _evals(run_dir: str) -> dict[int, dict[str, Any]]:
  rows = rundir.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
  return {r["step"]: r["eval"] for r in rows if "eval" in r}


def _fmt(p: float, ci: Sequence[float]) -> str:
  return f"{p:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


# ---- measured cases of the training rollouts --------------------------------------------------


def _sampled_decision(record: dict[str, Any], fallback: int) -> int:
  """The generator's sampled KEEP/REVISE of a SAC'd unit's record (before any forced REVISE)."""
  return game.parse_decision((record.get("decision") or {}).get("text", ""), fallback).action


def sampled_cases(records: Sequence[dict[str, Any]], invalid_decision_action: str) -> list[tuple[int, str]]:
  """(step, case) of every training unit with the generator's *sampled* decision (no exploration)."""
  fallback = game.GENERATOR_ACTIONS.index(invalid_decision_action)
  out = []
  for r in records:
    sac = r["verifier_action"] == "SAC"
    action = _sampled_decision(r, fallback) if sac else None
    out.append((r["step"], game.classify_case(r["x_right"], int(sac), action, r["z_right"])))
  return out


def estimate_game(records: Sequence[dict[str, Any]], invalid_decision_action: str) -> theory.Game:
  """The `theory.Game` of the units in `records` (see the module docstring)."""
  clip = lambda p: float(np.clip(p, PROB_CLIP, 1 - PROB_CLIP))
  mean = lambda xs, default: float(np.mean(xs)) if len(xs) else default
  fallback = game.GENERATOR_ACTIONS.index(invalid_decision_action)
  x = np.array([r["x_right"] for r in records], bool)
  sac = np.array([r["verifier_action"] == "SAC" for r in records], bool)
  challenged = [r for r, s in zip(records, sac, strict=True) if s]
  z_given = [[r["z_right"] for r in challenged if r["x_right"] == s] for s in (False, True)]
  revise = [_sampled_decision(r, fallback) for r in challenged]
  return theory.Game(
    p_x_right=clip(x.mean()),
    p_z_right=(clip(mean(z_given[0], 0.5)), clip(mean(z_given[1], 0.5))),
    verifier_ref=(clip(mean(sac[~x], 0.5)), clip(mean(sac[x], 0.5))),
    generator_ref=clip(mean(revise, 0.5)),
  )


def _windows(steps: np.ndarray, count: int) -> list[np.ndarray]:
  edges = np.linspace(steps.min(), steps.max() + 1, count + 1)
  return [(steps >= lo) & (steps < hi) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


def theory_overlay(records, config, figure_dir: str, windows: int = 6) -> dict[str, Any]:
  """Measured case rates (per window of steps) against the ODE from the estimated game."""
  fallback = config.rollout.invalid_decision_action
  steps = np.array(sorted({r["step"] for r in records}))
  first = steps[: max(1, int(round(ESTIMATE_FRACTION * len(steps))))]
  estimated = estimate_game([r for r in records if r["step"] in set(first.tolist())], fallback)
  played = sampled_cases(records, fallback)
  unit_steps = np.array([s for s, _ in played])
  unit_cases = np.array([game.CASES.index(c) for _, c in played])
  masks = [m for m in _windows(unit_steps, min(windows, len(steps))) if m.any()]
  centre = np.array([unit_steps[m].mean() for m in masks])
  counts = np.array([np.bincount(unit_cases[m], minlength=len(game.CASES)) for m in masks])  # [W, 8]
  measured = counts / counts.sum(1, keepdims=True)
  intervals = np.array(
    [[stats.wilson_interval(int(k), int(c.sum())) for k in c] for c in counts]
  )  # [W, 8, 2]

  beta, kl, weighting = config.loss.beta, config.loss.kl, config.loss.weighting
  t_max, n = 20.0 * max(steps.max(), 1), 4000
  theta0 = theory.reference_logits(estimated)[None]
  times, path = theory.ode_paths(
    theta0, estimated, beta, kl=kl, weighting=weighting, t_end=t_max, steps=n, save_every=4
  )
  times = np.asarray(times)
  probs = np.asarray(theory.case_probabilities(estimated, path[0]))  # [S, 8]
  predict = lambda t: np.stack([np.interp(t, times, probs[:, c]) for c in range(len(game.CASES))], -1)
  kappas = np.geomspace(1e-3, 20.0, 200)
  errors = [np.mean((predict(k * centre) - measured) ** 2) for k in kappas]
  kappa = float(kappas[int(np.argmin(errors))])

  os.makedirs(figure_dir, exist_ok=True)
  fig, axes = plt.subplots(2, 4, figsize=(14, 6), sharex=True)
  grid = np.linspace(0, steps.max(), 200)
  curve = predict(kappa * grid)
  for c, (name, ax) in enumerate(zip(game.CASES, axes.flat, strict=True)):
    low, high = intervals[:, c, 0], intervals[:, c, 1]
    ax.errorbar(
      centre, measured[:, c], yerr=[measured[:, c] - low, high - measured[:, c]], fmt="o", label="measured"
    )
    ax.plot(grid, curve[:, c], "-", label=f"ODE (t = {kappa:.3g}·step)")
    ax.set_title(f"case {name}")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("training step")
  axes.flat[0].legend(fontsize=8)
  fig.suptitle(
    f"Case rates of training rollouts vs the theory's ODE (β={beta}, KL {kl}, {weighting} weighting)"
  )
  fig.tight_layout()
  path_png = os.path.join(figure_dir, "theory_overlay.png")
  fig.savefig(path_png, dpi=110)
  plt.close(fig)
  return {
    "game": {
      "p_x_right": estimated.p_x_right,
      "p_z_right": list(estimated.p_z_right),
      "verifier_ref": list(estimated.verifier_ref),
      "generator_ref": estimated.generator_ref,
      "estimated_from_steps": first.tolist(),
    },
    "kappa": kappa,
    "rmse": float(np.sqrt(min(errors))),
    "window_steps": centre.tolist(),
    "measured": measured.tolist(),
    "predicted": predict(kappa * centre).tolist(),
    "figure": path_png,
  }


# ---- per-line curves ------------------------------------------------------------------------------


def per_line_figure(evals: dict[str, dict[int, dict]], figure_dir: str) -> str:
  """Test accuracy of every line over training: post- and pre-revision for the game, drafts else."""
  series = {}
  for method, by_step in evals.items():
    keys = ("per_line_post", "per_line_pre") if method == "dpa_grpo" else ("per_line",)
    for key in keys:
      label = LABELS.get(method, method) + {"per_line_pre": " (draft)"}.get(key, "")
      series[label] = {s: e[key] for s, e in sorted(by_step.items()) if key in e}
  lines = [i for i in taxcalc.LINE_IDS if any(i in v for s in series.values() for v in s.values())]
  cols = min(4, len(lines))
  rows = -(-len(lines) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(3.5 * cols, 2.6 * rows), sharex=True, squeeze=False)
  for ax, line_id in zip(axes.flat, lines, strict=False):
    for label, by_step in series.items():
      pts = [(s, v[line_id]) for s, v in by_step.items() if line_id in v]
      xs = [s for s, _ in pts]
      ys = np.array([p["accuracy"] for _, p in pts])
      ax.plot(xs, ys, "o-" if "(draft)" not in label else "x--", label=label, ms=3)
      if label == LABELS["dpa_grpo"]:
        ax.fill_between(xs, [p["ci_low"] for _, p in pts], [p["ci_high"] for _, p in pts], alpha=0.15)
    ax.set_title(f"line {line_id}")
    ax.set_ylim(-0.02, 1.02)
  for ax in list(axes.flat)[len(lines) :]:
    ax.axis("off")
  axes.flat[0].legend(fontsize=7)
  fig.supxlabel("training step")
  fig.supylabel("test accuracy (greedy)")
  fig.tight_layout()
  os.makedirs(figure_dir, exist_ok=True)
  path = os.path.join(figure_dir, "per_line_accuracy.png")
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


# Panels of the training curves: title, y label, and which series of a metrics.jsonl row each draws
# ({label suffix: (row section, key)}; section "" is the row itself, "rollout" the training play).
CURVE_PANELS = (
  (
    "loss",
    "loss",
    lambda row: {k.split("/")[0]: row[k] for k in row if k.count("/") == 1 and k.endswith("/loss")},
  ),
  (
    "reward",
    "accuracy (outcome reward)",
    lambda row: {
      **({"training play": row["rollout"]["accuracy"]} if "accuracy" in row.get("rollout", {}) else {}),
      **({"test (greedy)": row["eval"]["accuracy"]} if "accuracy" in row.get("eval", {}) else {}),
    },
  ),
  (
    "KL to the reference",
    "KL estimate",
    lambda row: {k.rsplit("/", 1)[0]: row[k] for k in row if k.endswith("/kl")},
  ),
  (
    "decision rates (training play)",
    "rate",
    lambda row: {k: row["rollout"][k] for k in ("sac_rate", "revise_rate") if k in row.get("rollout", {})},
  ),
)


def training_curves(workdir: str, methods: Sequence[str], figure_dir: str) -> str | None:
  """figures/training_curves.png: loss, reward (training-play and test accuracy), KL and the
  verifier's / generator's decision rates per step, one line per method and series, read from each
  method's metrics.jsonl; None when no method logged a training step."""
  series: list[dict[str, list[tuple[int, float]]]] = [{} for _ in CURVE_PANELS]
  for method in methods:
    for row in rundir.read_jsonl(os.path.join(workdir, method, "metrics.jsonl")):
      for panel, (_, _, pick) in zip(series, CURVE_PANELS, strict=True):
        for name, value in pick(row).items():
          if isinstance(value, (int, float)):
            panel.setdefault(f"{LABELS.get(method, method)}: {name}", []).append((row["step"], float(value)))
  if not any(len(pts) > 1 for panel in series for pts in panel.values()):
    return None
  fig, axes = plt.subplots(1, len(CURVE_PANELS), figsize=(4.2 * len(CURVE_PANELS), 3.2), squeeze=False)
  for ax, panel, (title, ylabel, _) in zip(axes.flat, series, CURVE_PANELS, strict=True):
    for label, pts in sorted(panel.items()):
      ax.plot([s for s, _ in pts], [v for _, v in pts], "o-", ms=2, label=label)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("training step")
    if panel:
      ax.legend(fontsize=6)
  fig.tight_layout()
  os.makedirs(figure_dir, exist_ok=True)
  path = os.path.join(figure_dir, "training_curves.png")
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


# ---- tables -----------------------------------------------------------------------------------------


def _case_rows(before: dict, after: dict) -> list[str]:
  rows = ["| case | before | after |", "|---|---|---|"]
  for name in game.CASES:
    cells = [
      _fmt(t["rate"], (t["ci_low"], t["ci_high"])) for t in (before["cases"][name], after["cases"][name])
    ]
    rows.append(f"| {name} | {cells[0]} | {cells[1]} |")
  return rows


def anchoring_note(loss: config_lib.LossConfig) -> str:
  """Whether this run's DPA-GRPO loss is anchored at π_ref, in one plain sentence (docs/theory.md)."""
  if (loss.weighting, loss.kl) == ("pair", "k1"):
    head = "This run's DPA-GRPO loss (pair weighting, k1: the reference code's) is not anchored at π_ref"
  else:
    head = (
      f"This run's DPA-GRPO loss is {loss.weighting} weighting with {loss.kl}; the reference code's "
      "(pair, k1) is not anchored at π_ref"
    )
  return (
    f"{head}: its two-action field is ½ā − ½β(1 − 2p), so its stable points are pure best responses. "
    "The theorem's anchored stable points (σ(logit p_ref + E[Δr]/β)) need the exact two-action KL "
    "with on-policy weighting (loss.weighting=policy, loss.kl=exact); see docs/theory.md."
  )


def _scoring_lines(evals: dict[str, dict[int, dict]], config: config_lib.ExperimentConfig) -> list[str]:
  """The last evaluation's accuracy under both readings of a missing amount, and the all-cases
  figure when selection used the first `train.eval_cases` test cases (runs that logged them)."""
  lines = []
  for m, by_step in evals.items():
    last = by_step[max(by_step)]
    if "accuracy_missing_wrong" in last:
      lines.append(
        f"- {LABELS.get(m, m)}: a missing amount read as wrong {last['accuracy_missing_wrong']:.3f}, "
        f"as 0.0 (the reference evaluator) {last['accuracy_missing_as_zero']:.3f}"
        + (f"; all test cases {last['all_cases']['accuracy']:.3f}" if "all_cases" in last else "")
        + "."
      )
  if not lines:
    return []
  used = "0.0" if config.rollout.missing_as_zero else "wrong"
  scope = f"the first {config.train.eval_cases} test cases" if config.train.eval_cases else "every test case"
  return ["", f"Scoring (this run reads a missing amount as {used}; accuracy over {scope}):", "", *lines]


def write(workdir: str, config: config_lib.ExperimentConfig, methods: Sequence[str]) -> dict[str, Any]:
  """Writes report.md, report.json and figures/ for the runs of `methods` under `workdir`; on a
  process other than the writer (several hosts: `lm.rundir.is_writer`) writes nothing, returns {}."""
  if not rundir.is_writer():
    return {}
  figure_dir = os.path.join(workdir, "figures")
  lines = "all 19" if config.rollout.lines == taxcalc.LINE_IDS else ", ".join(config.rollout.lines)
  evals = {m: _evals(os.path.join(workdir, m)) for m in methods}
  summary: dict[str, Any] = {"methods": {}}
  md = [
    "# DPA-GRPO experiment report",
    "",
    f"Model: `{config.model.preset}` {dict(sorted(config.model.overrides.items()))}; data: "
    + (
      config.data.root or f"synthetic forms {dict(sorted(dataclasses.asdict(config.data.synthetic).items()))}"
    )
    + f"; lines: {lines}.",
    "Accuracy is the per-line strict accuracy of the greedy test-split play (post-revision for "
    "DPA-GRPO, the draft for generator-only methods), with Wilson 95% intervals; *after* is the "
    "last evaluation.",
    "",
    "| method | step | before | after |",
    "|---|---|---|---|",
  ]
  for m in methods:
    by_step = evals[m]
    first, last = by_step[min(by_step)], by_step[max(by_step)]
    summary["methods"][m] = {
      "before": first["accuracy"],
      "before_ci": first["accuracy_ci"],
      "after": last["accuracy"],
      "after_ci": last["accuracy_ci"],
      "last_step": max(by_step),
      "units": last["units"],
    }
    md.append(
      f"| {LABELS.get(m, m)} | {max(by_step)} | {_fmt(first['accuracy'], first['accuracy_ci'])} | "
      f"{_fmt(last['accuracy'], last['accuracy_ci'])} |"
    )
  md += _scoring_lines(evals, config)
  md += ["", "Paper (TaxCalcBench TY24, arXiv 2605.08327) beside this run:", ""]
  md += ["| method | " + " | ".join(PAPER) + " | this run |", "|---|" + "---|" * (len(PAPER) + 1)]
  for m in LABELS:
    ours = summary["methods"].get(m, {}).get("after")
    md.append(
      f"| {LABELS[m]} | "
      + " | ".join(f"{PAPER[k][m]:.3f}" for k in PAPER)
      + f" | {'—' if ours is None else f'{ours:.3f}'} |"
    )
  if "dpa_grpo" in evals:
    by_step = evals["dpa_grpo"]
    before, after = by_step[min(by_step)], by_step[max(by_step)]
    md += ["", f"8-case table of the test play, DPA-GRPO (step 0 → step {max(by_step)}):", ""]
    md += _case_rows(before, after) + [""]
    for key in ("pre_revision_accuracy", "sac_rate", "revise_rate", "invalid_verdicts", "invalid_decisions"):
      md.append(
        f"- {key}: {before[key]:.3g} → {after[key]:.3g}"
        if isinstance(before[key], float)
        else f"- {key}: {before[key]} → {after[key]}"
      )
    summary["cases"] = {"before": before["cases"], "after": after["cases"]}
    records = list(rundir.read_jsonl(os.path.join(workdir, "dpa_grpo", "records", "train.jsonl")))
    if records:
      overlay = theory_overlay(records, config, figure_dir)
      summary["theory_overlay"] = overlay
      g = overlay["game"]
      md += [
        "",
        "Theory overlay (figures/theory_overlay.png): game estimated from training steps "
        f"{g['estimated_from_steps']}: P(x right) = {g['p_x_right']:.3f}, P(z right | x wrong, x right) = "
        f"{g['p_z_right'][0]:.3f}, {g['p_z_right'][1]:.3f}; reference SAC | x wrong, x right = "
        f"{g['verifier_ref'][0]:.3f}, {g['verifier_ref'][1]:.3f}; "
        f"reference REVISE = {g['generator_ref']:.3f}. "
        f"Fitted time scale κ = {overlay['kappa']:.3g} (ODE time per step); RMS gap over the 8 case "
        f"rates = {overlay['rmse']:.3f}.",
      ]
  md += ["", anchoring_note(config.loss)]
  summary["per_line_figure"] = per_line_figure(evals, figure_dir)
  summary["training_curves"] = training_curves(workdir, methods, figure_dir)
  md += [
    "",
    *(
      ["![training curves: loss, reward, KL, decision rates](figures/training_curves.png)"]
      if summary["training_curves"]
      else []
    ),
    "![per-line accuracy](figures/per_line_accuracy.png)",
    "![theory overlay](figures/theory_overlay.png)",
  ]
  rundir.atomic_write_text(os.path.join(workdir, "report.md"), "\n".join(md) + "\n")
  rundir.write_json(os.path.join(workdir, "report.json"), summary)
  return summary
