"""The testbed's report: accuracy per arm and seed, the case rates of the game, the pre-registered
predictions judged by the rule fixed before the first comparison (docs/dpa_grpo.md, testbed).

`write(workdir, config, arms, seeds)` reads `<workdir>/<arm>/seed<k>/metrics.jsonl` (whatever
runs exist so far: the report is rewritten after every run) and `gates.json`, and writes
report.md, report.json and figures/{accuracy,cases}.png.

The judging rule. Every comparison is per seed, on the greedy play of the same held-out test units,
with Wilson 95% intervals: a quantity *separates upward* when the later (or first-named) interval's
lower bound exceeds the other's upper bound, *downward* in the mirror case, else it does not
separate. A prediction is **held** when at least two of the three seeds separate in the predicted
direction and none against it; **not held** when at least two separate against it and none for
it; **inconclusive** otherwise (including fewer than three seeds run).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpa_grpo import config as config_lib
from dpa_grpo import testbed, testbed_theory
from lm import rundir, stats
from lm.plotting import plt

# (id, statement, kind, arm(s), quantity): kind "change" compares an arm's final evaluation with
# its step 0; kind "versus" compares two arms' final evaluations.
PREDICTIONS = (
  ("P1", "case 4 (wrong draft, NS) falls", "change", ("dpa_k1",), ("case", "4"), "down"),
  ("P2", "case 1 (right draft, NS) rises", "change", ("dpa_k1",), ("case", "1"), "up"),
  ("P3", "case 6a (wrong draft, SAC, KEEP, revision wrong) rises", "change", ("dpa_k1",),
   ("case", "6a"), "up"),
  ("P4", "DPA-GRPO's final accuracy exceeds GRPO's (reference baseline mode)", "versus",
   ("dpa_k1", "grpo_reference"), ("accuracy",), "up"),
  ("P5", "DPA-GRPO's final accuracy exceeds GRPO's (library-standard)", "versus", ("dpa_k1", "grpo"),
   ("accuracy",), "up"),
  # The same four claims for the anchored loss, reported beside (secondary).
  ("P1k3", "case 4 falls (anchored loss)", "change", ("dpa_k3",), ("case", "4"), "down"),
  ("P2k3", "case 1 rises (anchored loss)", "change", ("dpa_k3",), ("case", "1"), "up"),
  ("P3k3", "case 6a rises (anchored loss)", "change", ("dpa_k3",), ("case", "6a"), "up"),
  ("P4k3", "anchored DPA-GRPO's final accuracy exceeds GRPO's (reference mode)", "versus",
   ("dpa_k3", "grpo_reference"), ("accuracy",), "up"),
  ("P5k3", "anchored DPA-GRPO's final accuracy exceeds GRPO's (library)", "versus", ("dpa_k3", "grpo"),
   ("accuracy",), "up"),
)  # fmt: skip
SEEDS_NEEDED = 3


def _evals(path: str) -> dict[int, dict[str, Any]]:
  metrics = os.path.join(path, "metrics.jsonl")
  if not os.path.exists(metrics):
    return {}
  return {r["step"]: r["eval"] for r in rundir.read_jsonl(metrics) if "eval" in r}


def _proportion(e: dict[str, Any], quantity: tuple[str, ...]) -> tuple[int, int]:
  """(successes, n) of a quantity of one evaluation: its accuracy or one case's count."""
  n = e["units"]
  if quantity[0] == "accuracy":
    return round(e["accuracy"] * n), n
  return e["cases"][quantity[1]]["count"], n


def separation(a: tuple[int, int], b: tuple[int, int]) -> int:
  """+1 when a's Wilson 95% interval lies wholly above b's, -1 wholly below, 0 when they overlap."""
  (alo, ahi), (blo, bhi) = stats.wilson_interval(*a), stats.wilson_interval(*b)
  return 1 if alo > bhi else -1 if ahi < blo else 0


def judge(separations: Sequence[int], direction: str, seeds_needed: int = SEEDS_NEEDED) -> str:
  """held / not held / inconclusive from the per-seed separations (the module docstring's rule)."""
  sign = 1 if direction == "up" else -1
  hits = sum(s == sign for s in separations)
  against = sum(s == -sign for s in separations)
  if len(separations) < seeds_needed:
    return "inconclusive"
  if hits >= 2 and against == 0:
    return "held"
  if against >= 2 and hits == 0:
    return "not held"
  return "inconclusive"


def _fmt(k: int, n: int) -> str:
  lo, hi = stats.wilson_interval(k, n)
  return f"{k / n:.3f} [{lo:.3f}, {hi:.3f}]"


def _spread(values: Sequence[float]) -> str:
  if not values:
    return "—"
  v = np.asarray(values)
  sd = float(v.std(ddof=1)) if len(v) > 1 else 0.0
  return f"{v.mean():.3f} ± {sd:.3f} (min {v.min():.3f}, max {v.max():.3f}, {len(v)} seeds)"


def _figures(runs: dict[str, dict[int, dict[int, dict]]], figure_dir: str) -> list[str]:
  os.makedirs(figure_dir, exist_ok=True)
  fig, ax = plt.subplots(figsize=(6, 3.6))
  for i, (arm, by_seed) in enumerate(runs.items()):
    for j, evals in enumerate(by_seed.values()):
      steps = sorted(evals)
      ax.plot(steps, [evals[s]["accuracy"] for s in steps], "o-", color=f"C{i}", ms=3, alpha=0.8,
              label=testbed.ARMS[arm].label if j == 0 else None)  # fmt: skip
  ax.set_xlabel("training step")
  ax.set_ylabel("test accuracy (greedy; post-revision for DPA-GRPO)")
  ax.set_ylim(-0.02, 1.02)
  ax.legend(fontsize=6)
  fig.tight_layout()
  accuracy = os.path.join(figure_dir, "accuracy.png")
  fig.savefig(accuracy, dpi=110)
  plt.close(fig)
  dpa = [a for a in runs if testbed.ARMS[a].method == "dpa_grpo"]
  fig, axes = plt.subplots(1, 3, figsize=(10, 3), sharey=True)
  for ax, case in zip(axes, ("4", "1", "6a"), strict=True):
    for i, arm in enumerate(dpa):
      for j, evals in enumerate(runs[arm].values()):
        steps = sorted(evals)
        ax.plot(steps, [evals[s]["cases"][case]["rate"] for s in steps], "o-", color=f"C{i}", ms=3,
                label=arm if j == 0 else None)  # fmt: skip
    ax.set_title(f"case {case} (test play)")
    ax.set_xlabel("training step")
  axes[0].set_ylabel("rate")
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  cases = os.path.join(figure_dir, "cases.png")
  fig.savefig(cases, dpi=110)
  plt.close(fig)
  return [accuracy, cases]


def write(
  workdir: str, config: config_lib.ExperimentConfig, arms: Sequence[str], seeds: Sequence[int]
) -> dict[str, Any]:
  """Writes report.md, report.json and figures/ from the runs that exist; returns the summary."""
  runs = {arm: {s: e for s in seeds if (e := _evals(testbed.run_dir(workdir, arm, s)))} for arm in arms}
  runs = {arm: by_seed for arm, by_seed in runs.items() if by_seed}
  summary: dict[str, Any] = {"arms": {}, "predictions": {}}
  md = ["# DPA-GRPO copy-and-check testbed", ""]
  gates_path = os.path.join(workdir, "gates.json")
  if os.path.exists(gates_path):
    gates = rundir.read_json(gates_path)
    summary["gates"] = gates
    md += ["```", testbed.format_gates(gates), "```", ""]
  md += [
    f"Held-out test units: greedy play of the test split ({', '.join(config.rollout.lines)}); "
    f"{config.train.steps} training steps per run. Accuracy is post-revision for DPA-GRPO, the draft "
    "for GRPO; Wilson 95% intervals per seed; across seeds: mean ± sample standard deviation.",
    "",
    "| arm | seed | step 0 | final (step) | case 4 | case 1 | case 6a |",
    "|---|---|---|---|---|---|---|",
  ]
  for arm, by_seed in runs.items():
    finals = []
    for seed, evals in by_seed.items():
      first, last = evals[min(evals)], evals[max(evals)]
      finals.append(last["accuracy"])
      cases = ["—"] * 3
      if "cases" in last:
        cases = [
          f"{_fmt(*_proportion(first, ('case', c)))} → {_fmt(*_proportion(last, ('case', c)))}"
          for c in ("4", "1", "6a")
        ]
      md.append(
        f"| {arm} | {seed} | {_fmt(*_proportion(first, ('accuracy',)))} | "
        f"{_fmt(*_proportion(last, ('accuracy',)))} ({max(evals)}) | " + " | ".join(cases) + " |"
      )
    summary["arms"][arm] = {"label": testbed.ARMS[arm].label, "final_accuracy": finals}
    md.append(f"| {arm} | all | | {_spread(finals)} | | | |")
  md += ["", "Pre-registered predictions (docs/dpa_grpo.md, testbed), judged per seed:", ""]
  md += ["| id | prediction | per-seed separation | verdict |", "|---|---|---|---|"]
  for pid, text, kind, pair, quantity, direction in PREDICTIONS:
    seps = []
    for seed in seeds:
      try:
        if kind == "change":
          evals = runs[pair[0]][seed]
          seps.append(separation(_proportion(evals[max(evals)], quantity), _proportion(evals[0], quantity)))
        else:
          a, b = runs[pair[0]][seed], runs[pair[1]][seed]
          seps.append(separation(_proportion(a[max(a)], quantity), _proportion(b[max(b)], quantity)))
      except KeyError:
        continue  # that arm / seed has not run yet
    verdict = judge(seps, direction)
    summary["predictions"][pid] = {"statement": text, "separations": seps, "verdict": verdict}
    md.append(f"| {pid} | {text} | {seps} | **{verdict}** |")
  md += ["", "Separation: +1 the later / first-named interval wholly above, −1 wholly below, 0 overlap."]
  if runs:
    summary["figures"] = _figures(runs, os.path.join(workdir, "figures"))
    md += ["", "![accuracy](figures/accuracy.png)", "![cases](figures/cases.png)"]
  ode = testbed_theory.for_workdir(workdir, config, "dpa_k1", seeds)
  if ode is not None:
    summary["ode_out_of_sample"] = ode
    rows = [
      f"- seed {s}: ODE RMS error {r['ode_rmse']:.3f}, step-0 predictor {r['step0_rmse']:.3f}"
      for s, r in ode["seeds"].items()
    ]
    md += [
      "",
      "The ODE out of sample (`dpa_grpo.testbed_theory`; DPA-GRPO, reference loss): game per line from "
      "the step-0 gate rollout (the control line's verifier and generator pooled over correctness), "
      f"generator clock over SAC'd units, κ = {ode['kappa']:.3g} fitted on seed 0 only (in-sample RMS "
      f"{ode['fit_rmse']:.3f}); predicted case-rate trajectories of the training rollouts, RMS over the "
      "8 rates and every window of steps:",
      "",
      *rows,
      "",
      "![ODE out of sample](figures/ode_out_of_sample.png)",
    ]
  theory_dir = os.path.join(workdir, "theory")  # `python -m launch.theory --workdir=<workdir>/theory`
  if os.path.isdir(theory_dir):
    pngs = sorted(f for f in os.listdir(theory_dir) if f.endswith(".png"))
    md += ["", "Theory figures (`python -m launch.theory`, docs/theory.md):", ""]
    md += [f"![{f[:-4]}](theory/{f})" for f in pngs]
  rundir.atomic_write_text(os.path.join(workdir, "report.md"), "\n".join(md) + "\n")
  rundir.write_json(os.path.join(workdir, "report.json"), summary)
  return summary
