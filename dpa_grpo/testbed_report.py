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
it; **inconclusive** otherwise (including fewer than three seeds run). That rule is applied to
the registered seeds 0, 1, 2 whatever else has run.

The across-seed rule (amendment of 2026-12-02, docs/dpa_grpo.md, written before the nine-seed run):
per seed the difference of the two proportions (final − step 0, or first-named − other arm), then
the mean over seeds with its Student-t 95% interval, seeds being the independent replicates. **held**
when the interval lies wholly on the predicted side of 0, **not held** when wholly on the other
side, **inconclusive** when it contains 0 or fewer than nine seeds have run. The controls (a
quantity no role can learn) are reported by whether their interval contains 0.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpa_grpo import config as config_lib
from dpa_grpo import metrics, testbed_arms, testbed_theory
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
# Controls: the draft of line 12 copies one of two amounts by a coin no input shows, so no role can
# learn it and its accuracy should not move (across-seed rule; "no effect" expected).
CONTROLS = (
  ("C1", "line 12 (hidden coin) accuracy does not change (DPA-GRPO)", "change", ("dpa_k1",), ("line", "12")),
  ("C2", "line 12 (hidden coin) accuracy does not change (GRPO)", "change", ("grpo",), ("line", "12")),
)
SEEDS_NEEDED = 3
REGISTERED_SEEDS = (0, 1, 2)  # the per-seed rule's three seeds
ACROSS_SEEDS_NEEDED = 9  # the across-seed rule's (amendment of 2026-12-02)

# Testbed v2 (docs/dpa_grpo.md, "Testbed v2: predictions (registered 2026-12-03, before any run)"),
# judged by the across-seed rule only, on nine seeds. Kinds: "change" (an arm's final − step 0),
# "did" (the first arm's change − the second's), "versus" (first arm's final − second's). The
# decision rates (`metrics.decision_rates`) are read on the copy lines, where the decision's note
# says which amount matches; "not up": held when the interval's upper bound is <= NO_RISE_MARGIN,
# not held when its lower bound is > 0, else inconclusive.
V2_DECISION_LINES = ("1a", "25d")
NO_RISE_MARGIN = 0.05
V2_PREDICTIONS = (
  ("R1", "P(REVISE | SAC, draft wrong) rises more under DPA-GRPO than under the proposal-only ablation",
   "did", ("dpa_paper", "proposal_only"), ("decision", "revise_given_sac_wrong"), "up"),
  ("R2", "P(REVISE | SAC, draft right) does not rise under DPA-GRPO", "change", ("dpa_paper",),
   ("decision", "revise_given_sac_right"), "not up"),
  ("R3", "P(z right | SAC, draft wrong) rises more under DPA-GRPO than under the ablation", "did",
   ("dpa_paper", "proposal_only"), ("decision", "z_right_given_sac_wrong"), "up"),
  ("R4", "P(NS | draft right) rises under DPA-GRPO", "change", ("dpa_paper",),
   ("decision", "ns_given_right"), "up"),
  ("R5", "what revision adds (final post-revision − draft accuracy) is larger under DPA-GRPO", "versus",
   ("dpa_paper", "proposal_only"), ("gain",), "up"),
  ("R6", "DPA-GRPO's final post-revision accuracy exceeds the ablation's", "versus",
   ("dpa_paper", "proposal_only"), ("accuracy",), "up"),
)  # fmt: skip
V2_CONTROLS = (
  (
    "C1",
    "line 12 (hidden coin) accuracy does not change (DPA-GRPO)",
    "change",
    ("dpa_paper",),
    ("line", "12"),
  ),
  (
    "C2",
    "line 12 (hidden coin) accuracy does not change (ablation)",
    "change",
    ("proposal_only",),
    ("line", "12"),
  ),
)

# The follow-up of 2026-12-03 (docs/dpa_grpo.md, "Testbed v2 follow-up: the k3 anchor", registered
# before it ran): R1-R6 and C1-C2 on the k3 pair (ids suffixed "k3"), and F1k3 / F2k3, each arm's
# share of training verdicts that parse in the last fifth of its steps against FORMAT_BOUND (the
# per-seed difference share − bound, "up"). A pair is judged when one of its arms is in the report.
V2_PAIRS = {
  ("dpa_paper", "proposal_only"): "",
  ("dpa_paper_k3", "proposal_only_k3"): "k3",
  **{(f"dpa_paper_{s}", f"proposal_only_{s}"): s for s in testbed_arms.V2_ABLATIONS},
}
FORMAT_BOUND = 0.9
V2_FORMAT_PREDICTIONS = {
  # The collapse ablations (registered 2026-12-03, before their runs): each arm keeps the format.
  **{
    s: (
      (f"F1{s}", f"verdicts still parse in the last fifth under DPA-GRPO ({what}): share − 0.9",
       f"dpa_paper_{s}"),
      (f"F2{s}", f"verdicts still parse in the last fifth under the ablation ({what}): share − 0.9",
       f"proposal_only_{s}"),
    )
    for s, (what, _, _) in testbed_arms.V2_ABLATIONS.items()
  },
  # The as-registered arm beside the ablations on another warm start (amendment of 2026-12-04).
  "": (
    ("F1₀", "verdicts still parse in the last fifth under DPA-GRPO (as registered): share − 0.9",
     "dpa_paper"),
    ("F2₀", "verdicts still parse in the last fifth under the ablation (as registered): share − 0.9",
     "proposal_only"),
  ),
  "k3": (
    ("F1k3", "verdicts still parse in the last fifth of training under DPA-GRPO (k3): share − 0.9",
     "dpa_paper_k3"),
    ("F2k3", "verdicts still parse in the last fifth of training under the ablation (k3): share − 0.9",
     "proposal_only_k3"),
  ),
}  # fmt: skip

# Testbed v3 (docs/dpa_grpo.md, "Testbed v3: predictions", registered before any v3 arm ran). v2's
# rows re-stated where v2's wording made them empty: with the format kept, the drafts of the copy
# lines are all right by step 60 in most seeds (v2 with the fix, a5: 7 of 9 seeds had no SAC'd
# wrong draft at the final evaluation) and P(NS | draft right) starts at 1.00, so a rate read at the
# final evaluation alone has no unit or no room. The "pooled" quantities read every evaluation after
# step 0 (steps 15-60) together: a decision rate over their units pooled, the gain of revision as
# the mean over them; "change" is then pooled − step 0. Every row counts only the seeds whose runs
# of its arms all pass the validity gate (`testbed_arms.GATE_V3_FORMAT`; an arm whose verifier is
# not trained has none), and still needs nine such seeds for a verdict.
V3_PREDICTIONS = (
  ("R1", "P(REVISE | SAC, draft wrong), pooled after step 0, rises more under DPA-GRPO than under the "
   "proposal-only ablation", "did", ("dpa_paper", "proposal_only"), ("pooled", "revise_given_sac_wrong"),
   "up"),
  ("R2", "P(REVISE | SAC, draft right), pooled after step 0, does not rise under DPA-GRPO", "change",
   ("dpa_paper",), ("pooled", "revise_given_sac_right"), "not up"),
  ("R3", "P(z right | SAC, draft wrong), pooled after step 0, rises more under DPA-GRPO than under the "
   "ablation", "did", ("dpa_paper", "proposal_only"), ("pooled", "z_right_given_sac_wrong"), "up"),
  ("R4", "P(SAC | draft wrong), pooled after step 0, rises under DPA-GRPO", "change", ("dpa_paper",),
   ("pooled", "sac_given_wrong"), "up"),
  ("R5", "what revision adds (post-revision − draft accuracy), mean over the evaluations after step 0, "
   "is larger under DPA-GRPO than under the ablation", "versus", ("dpa_paper", "proposal_only"),
   ("pooled_gain",), "up"),
  ("R6", "DPA-GRPO's final post-revision accuracy exceeds the ablation's", "versus",
   ("dpa_paper", "proposal_only"), ("accuracy",), "up"),
  ("V1", "DPA-GRPO's final post-revision accuracy exceeds generator-only GRPO's (verifier frozen; "
   "its draft's)", "versus", ("dpa_paper", "grpo"), ("accuracy",), "up"),
  ("V2", "DPA-GRPO's final post-revision accuracy exceeds that of GRPO training the verifier too",
   "versus", ("dpa_paper", "grpo_verifier"), ("accuracy",), "up"),
  ("V3", "P(SAC | draft wrong), pooled after step 0, rises more under DPA-GRPO than under GRPO "
   "training the verifier too", "did", ("dpa_paper", "grpo_verifier"), ("pooled", "sac_given_wrong"), "up"),
  ("V4", "P(REVISE | SAC, draft wrong), pooled after step 0, rises more under DPA-GRPO than under GRPO "
   "training the verifier too", "did", ("dpa_paper", "grpo_verifier"),
   ("pooled", "revise_given_sac_wrong"), "up"),
  ("C1", "line 12 (hidden coin) accuracy does not change (DPA-GRPO)", "change", ("dpa_paper",),
   ("line", "12"), None),
  ("C2", "line 12 (hidden coin) accuracy does not change (ablation)", "change", ("proposal_only",),
   ("line", "12"), None),
  ("C3", "line 12 (hidden coin) accuracy does not change (GRPO training the verifier too)", "change",
   ("grpo_verifier",), ("line", "12"), None),
)  # fmt: skip
# The format rows, one per arm with a trained verifier: the validity gate's quantity as a row.
V3_FORMAT_PREDICTIONS = (
  ("F1", "verdicts still parse in the last fifth under DPA-GRPO: share − 0.9", "dpa_paper"),
  ("F2", "verdicts still parse in the last fifth under the ablation: share − 0.9", "proposal_only"),
  ("F3", "verdicts still parse in the last fifth under GRPO training the verifier: share − 0.9",
   "grpo_verifier"),
)  # fmt: skip


SCREEN_SEEDS = 3  # the collapse ablations' screening (docs/dpa_grpo.md): seeds 0-2 before nine


def screening(differences: Sequence[float]) -> str | None:
  """A format row's status before its nine seeds, by the ablations' screening rule: "not held at
  screening" when at least SCREEN_SEEDS seeds ran and every one ended below the bound (difference
  < 0), "passes screening" when at least SCREEN_SEEDS ran and one did not (it runs on to nine seeds
  and only then gets a verdict); None with fewer seeds or once nine have run."""
  if not SCREEN_SEEDS <= len(differences) < ACROSS_SEEDS_NEEDED:
    return None
  return "not held at screening" if all(d < 0 for d in differences) else "passes screening"


def _pair_rows(pair: tuple[str, str], suffix: str) -> tuple[tuple, ...]:
  """V2_PREDICTIONS and V2_CONTROLS (direction None) for the arm pair `pair`, ids suffixed."""
  rename = dict(zip(("dpa_paper", "proposal_only"), pair, strict=True))
  rows = V2_PREDICTIONS + tuple(c + (None,) for c in V2_CONTROLS)
  note = f" ({suffix})" if suffix else ""
  return tuple(
    (pid + suffix, text + note, kind, tuple(rename[a] for a in arms), quantity, direction)
    for pid, text, kind, arms, quantity, direction in rows
  )


def _evals(path: str) -> dict[int, dict[str, Any]]:
  metrics = os.path.join(path, "metrics.jsonl")
  if not os.path.exists(metrics):
    return {}
  return {r["step"]: r["eval"] for r in rundir.read_jsonl(metrics) if "eval" in r}


def _eval_records(path: str) -> dict[int, list[dict[str, Any]]]:
  """{step: the unit records of that evaluation} of a run (records/eval.jsonl)."""
  p = os.path.join(path, "records", "eval.jsonl")
  out: dict[int, list[dict[str, Any]]] = {}
  if os.path.exists(p):
    for r in rundir.read_jsonl(p):
      out.setdefault(r["step"], []).append(r)
  return out


def v2_value(
  evaluation: dict[str, Any], records: Sequence[dict[str, Any]], quantity: tuple[str, ...]
) -> float:
  """One evaluation's value of a v2 quantity: a decision rate of its records on the copy lines
  (nan when its condition has no unit), the accuracy, the gain of revision (post − pre revision
  accuracy), or one line's post-revision accuracy."""
  if quantity[0] == "decision":
    return metrics.decision_rates(records, V2_DECISION_LINES)[quantity[1]]["rate"]
  if quantity[0] == "gain":
    return evaluation["accuracy"] - evaluation["pre_revision_accuracy"]
  k, n = _proportion(evaluation, quantity)
  return k / n


def v2_difference(
  runs: dict[str, dict[int, tuple[dict, dict]]], kind: str, pair, quantity, seed: int
) -> float:
  """A v2 row's difference in one seed; `runs[arm][seed]` = ({step: eval}, {step: records});
  KeyError when an arm / seed has not run, nan when a rate's condition is empty."""

  def value(arm: str, last: bool) -> float:
    evals, records = runs[arm][seed]
    first, later = min(evals), [s for s in sorted(evals) if s != min(evals)]
    if quantity[0] == "pooled":  # testbed v3: every evaluation after step 0, units pooled
      units = [r for s in (later if last else [first]) for r in records.get(s, [])]
      return metrics.decision_rates(units, V2_DECISION_LINES)[quantity[1]]["rate"]
    if quantity[0] == "pooled_gain":  # the mean over those evaluations of the gain of revision
      return float(np.mean([v2_value(evals[s], [], ("gain",)) for s in (later if last else [first])]))
    step = max(evals) if last else first
    return v2_value(evals[step], records.get(step, []), quantity)

  change = lambda arm: value(arm, True) - value(arm, False)
  if kind == "change":
    return change(pair[0])
  if kind == "did":
    return change(pair[0]) - change(pair[1])
  if kind == "versus":
    return value(pair[0], True) - value(pair[1], True)
  raise ValueError(f"unknown v2 prediction kind {kind!r}")


def _proportion(e: dict[str, Any], quantity: tuple[str, ...]) -> tuple[int, int]:
  """(successes, n) of a quantity of one evaluation: its accuracy or one case's count."""
  n = e["units"]
  if quantity[0] == "accuracy":
    return round(e["accuracy"] * n), n
  if quantity[0] == "line":  # post-revision accuracy of one line; GRPO's evaluation has the draft's
    line = e["per_line_post" if "per_line_post" in e else "per_line"][quantity[1]]
    return round(line["accuracy"] * line["n"]), line["n"]
  return e["cases"][quantity[1]]["count"], n


def _difference(
  runs: dict[str, dict[int, dict[int, dict]]],
  kind: str,
  pair: tuple[str, ...],
  quantity: tuple[str, ...],
  seed: int,
) -> tuple[tuple[int, int], tuple[int, int]]:
  """The two proportions a prediction compares in one seed: (final, step 0) of one arm for a
  "change", (first arm's final, second arm's final) for a "versus"; KeyError when one has not run."""
  if kind == "change":
    evals = runs[pair[0]][seed]
    return _proportion(evals[max(evals)], quantity), _proportion(evals[0], quantity)
  a, b = runs[pair[0]][seed], runs[pair[1]][seed]
  return _proportion(a[max(a)], quantity), _proportion(b[max(b)], quantity)


def across_seeds(
  differences: Sequence[float], direction: str | None, seeds_needed: int = ACROSS_SEEDS_NEEDED
) -> tuple[float, tuple[float, float], str]:
  """(mean, t 95% interval, verdict) of the per-seed differences by the across-seed rule (module
  docstring); direction None for a control: its verdict says whether the interval contains 0."""
  if not differences:
    return float("nan"), (float("nan"), float("nan")), "inconclusive" if direction else "—"
  mean = float(np.mean(differences))
  low, high = stats.t_interval(differences)
  if direction is None:
    if len(differences) < 2:
      return mean, (low, high), "—"
    return mean, (low, high), "no effect (contains 0)" if low <= 0 <= high else "effect"
  if len(differences) < seeds_needed:
    return mean, (low, high), "inconclusive"
  if direction == "not up":
    return mean, (low, high), "held" if high <= NO_RISE_MARGIN else "not held" if low > 0 else "inconclusive"
  toward = (low, high) if direction == "up" else (-high, -low)  # the interval, predicted side up
  verdict = "held" if toward[0] > 0 else "not held" if toward[1] < 0 else "inconclusive"
  return mean, (low, high), verdict


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
              label=testbed_arms.ALL_ARMS[arm].label if j == 0 else None)  # fmt: skip
  ax.set_xlabel("training step")
  ax.set_ylabel("test accuracy (greedy; post-revision for DPA-GRPO)")
  ax.set_ylim(-0.02, 1.02)
  ax.legend(fontsize=6)
  fig.tight_layout()
  accuracy = os.path.join(figure_dir, "accuracy.png")
  fig.savefig(accuracy, dpi=110)
  plt.close(fig)
  dpa = [a for a in runs if testbed_arms.ALL_ARMS[a].method == "dpa_grpo"]
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


def _v1_predictions(runs, seeds: Sequence[int], summary: dict[str, Any]) -> list[str]:
  """The v1 testbed's predictions and controls, both rules (markdown lines; into `summary`)."""
  md = ["", "Pre-registered predictions (docs/dpa_grpo.md, testbed), judged per seed:", ""]
  md += ["| id | prediction | per-seed separation | verdict |", "|---|---|---|---|"]
  across_md = []
  for pid, text, kind, pair, quantity, direction in PREDICTIONS + tuple(c + (None,) for c in CONTROLS):
    seps, diffs, ran = [], [], []
    for seed in seeds:
      try:
        a, b = _difference(runs, kind, pair, quantity, seed)
      except KeyError:
        continue  # that arm / seed has not run yet
      seps.append(separation(a, b))
      diffs.append(a[0] / a[1] - b[0] / b[1])
      ran.append(seed)
    registered = [s for s, seed in zip(seps, ran, strict=True) if seed in REGISTERED_SEEDS]
    verdict = judge(registered, direction) if direction else "—"
    mean, (low, high), across = across_seeds(diffs, direction)
    summary["predictions"][pid] = {
      "statement": text,
      "seeds": ran,
      "separations": seps,
      "verdict": verdict,
      "differences": diffs,
      "across_seeds": {"mean": mean, "ci": [low, high], "verdict": across},
    }
    if direction:
      md.append(f"| {pid} | {text} | {registered} | **{verdict}** |")
    hits = f"{sum(s == 1 for s in seps)} / {sum(s == 0 for s in seps)} / {sum(s == -1 for s in seps)}"
    across_md.append(
      f"| {pid} | {text} | {len(diffs)} | {mean:+.3f} [{low:+.3f}, {high:+.3f}] | {hits} | **{across}** |"
    )
  md += ["", "Separation: +1 the later / first-named interval wholly above, −1 wholly below, 0 overlap."]
  md += [
    "",
    f"Across seeds (amendment of 2026-12-02; verdicts need {ACROSS_SEEDS_NEEDED} seeds): per seed the "
    "difference (final − step 0, or first-named − other arm), its mean with a Student-t 95% interval; "
    "per-seed separations counted up / none / down:",
    "",
    "| id | prediction or control | seeds | mean difference [95% t] | separations ↑ / 0 / ↓ | verdict |",
    "|---|---|---|---|---|---|",
    *across_md,
  ]
  return md


_KL = "verifier/verdict/kl"


def training_health(train: Sequence[dict[str, Any]], logs: Sequence[dict[str, Any]], windows: int = 5):
  """Per window of training steps: the share of verifier replies that parse as a verdict, of
  generator decisions that parse, and the verifier's mean KL term (the arm's estimator; training
  rollouts and metrics.jsonl, never the test split). A verdict share falling toward 0 with the KL
  estimate going far below 0 is the policy leaving its reference's format: the collapse the 60-step
  runs of testbed v2 showed (docs/dpa_grpo.md)."""
  steps = np.array([r["step"] for r in train])
  edges = np.linspace(steps.min(), steps.max() + 1, windows + 1).round().astype(int)
  rows = []
  for lo, hi in zip(edges[:-1], edges[1:], strict=True):
    units = [r for r in train if lo <= r["step"] < hi]
    decided = [bool(r["decision_valid"]) for r in units if r.get("decision") is not None]
    kl = [m[_KL] for m in logs if lo <= m.get("step", -1) < hi and _KL in m]
    rows.append({
      "steps": [int(lo), int(hi) - 1],
      "valid_verdict": float(np.mean([bool(r["verifier_valid"]) for r in units])) if units else float("nan"),
      "valid_decision": float(np.mean(decided)) if decided else float("nan"),
      "verifier_kl": float(np.mean(kl)) if kl else float("nan"),
    })  # fmt: skip
  return rows


def run_training_health(path: str) -> list[dict[str, Any]] | None:
  """`training_health` of the finished run in `path` from its records (the played units' verdicts
  of its training rollouts); None when the run is unfinished or played no verdict in training."""
  train_path = os.path.join(path, "records", "train.jsonl")
  if not os.path.exists(os.path.join(path, "summary.json")) or not os.path.exists(train_path):
    return None
  train = [r for r in rundir.read_jsonl(train_path) if "verifier_valid" in r]
  if not train:
    return None
  return training_health(train, list(rundir.read_jsonl(os.path.join(path, "metrics.jsonl"))))


def v3_format_gate(path: str) -> dict[str, Any] | None:
  """Testbed v3's validity gate on the finished run in `path`: its format health — the share of its
  training-rollout verdicts that parse in the last fifth of its steps, the F1k3 / F2k3 rows'
  quantity (`run_training_health`) — against `testbed_arms.GATE_V3_FORMAT`. {"share", "bound",
  "passes"} (a nan share, no verdict in that fifth, fails); None when `run_training_health` is."""
  rows = run_training_health(path)
  if rows is None:
    return None
  share = rows[-1]["valid_verdict"]
  bound = testbed_arms.GATE_V3_FORMAT
  return {"share": share, "bound": bound, "passes": bool(share >= bound)}


def format_health(
  workdir: str, arms: Sequence[str], seeds: Sequence[int], summary: dict[str, Any]
) -> list[str]:
  """`training_health` of every finished run with a verifier (markdown lines; into `summary`)."""
  md = []
  for arm in arms:
    for seed in seeds:
      rows = run_training_health(testbed_arms.run_dir(workdir, arm, seed))
      if rows is None:
        continue
      summary.setdefault("training_health", {}).setdefault(arm, {})[seed] = rows
      cells = " | ".join(
        f"{r['valid_verdict']:.2f} / {r['valid_decision']:.2f} / {r['verifier_kl']:+.2f}" for r in rows
      )
      md.append(f"| {arm} | {seed} | {cells} |")
  if not md:
    return []
  head = ["", "Format health of the training rollouts (`testbed_report.training_health`): per fifth of "
          "the training steps, share of verdicts that parse / of decisions that parse / the verifier's mean "
          "KL term (the arm's estimator: k1 or k3):", "",
          "| arm | seed | " + " | ".join(f"fifth {i + 1}" for i in range(5)) + " |",
          "|---|---|" + "---|" * 5]  # fmt: skip
  return head + md


def v3_validity(
  workdir: str, arms: Sequence[str], seeds: Sequence[int], summary: dict[str, Any]
) -> tuple[dict[str, set[int]], list[str]]:
  """Testbed v3's validity gate on every finished run (`v3_format_gate`): ({arm: seeds whose run
  counts}, markdown lines; into `summary["validity"]`). A run whose verifier is not trained
  (generator-only GRPO) plays no verdict in training and has no gate: it counts."""
  valid: dict[str, set[int]] = {}
  md = ["", f"Validity gate (testbed v3, `testbed_arms.GATE_V3_FORMAT`): share of the training verdicts "
        f"that parse in the last fifth of the steps ≥ {testbed_arms.GATE_V3_FORMAT}; a run that fails it "
        "is left out of every row that reads its arm:", "", "| arm | seed | share | counts |",
        "|---|---|---|---|"]  # fmt: skip
  for arm in arms:
    for seed in seeds:
      path = testbed_arms.run_dir(workdir, arm, seed)
      if not os.path.exists(os.path.join(path, "summary.json")):
        continue
      gate = v3_format_gate(path)
      if gate is None or gate["passes"]:
        valid.setdefault(arm, set()).add(seed)
      summary.setdefault("validity", {}).setdefault(arm, {})[seed] = gate
      share = "no trained verifier" if gate is None else f"{gate['share']:.3f}"
      md.append(f"| {arm} | {seed} | {share} | {'yes' if gate is None or gate['passes'] else '**no**'} |")
  return valid, md


def v3_tested(finished: int, counted: int, defined: int) -> str:
  """Whether a v3 row's claim is tested, and why not: it is when nine seeds ran, passed the
  validity gate and had the row's condition (`defined`); the main job's three seeds, a run that
  left the format or an empty condition each leave it untested, said in those words."""
  need = ACROSS_SEEDS_NEEDED
  if defined >= need:
    return "tested"
  if finished < need:
    return f"not tested: {finished} of {need} seeds ran"
  if counted < need:
    return f"not tested: {need - counted} of {need} seeds failed the validity gate"
  return f"not tested: the condition had no unit in {need - defined} of {need} seeds"


def _v2_predictions(
  workdir: str,
  arms: Sequence[str],
  seeds: Sequence[int],
  summary: dict[str, Any],
  v3: bool = False,
) -> list[str]:
  """Testbed v2's conditional decision rates per arm and seed (step 0 → final, Wilson 95%), and its
  registered predictions and controls by the across-seed rule (markdown lines; into `summary`).
  `v3`: testbed v3's too (`V3_PREDICTIONS`), every row on the seeds that pass its validity gate."""
  runs: dict[str, dict[int, tuple[dict, dict]]] = {}
  md = ["", f"Conditional decision rates on the copy lines {V2_DECISION_LINES} (greedy test play, "
        "Wilson 95%), step 0 → final:", "", "| arm | seed | " + " | ".join(metrics.DECISION_RATES.values())
        + " |", "|---|---|" + "---|" * len(metrics.DECISION_RATES)]  # fmt: skip
  fmt = lambda r: f"{r['rate']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] ({r['k']}/{r['n']})"
  for arm in arms:
    for seed in seeds:
      path = testbed_arms.run_dir(workdir, arm, seed)
      evals, records = _evals(path), _eval_records(path)
      if not evals:
        continue
      runs.setdefault(arm, {})[seed] = (evals, records)
      if not any("verifier_action" in r for units in records.values() for r in units):
        continue  # generator-only GRPO's evaluation scores drafts; it plays no verdict or decision
      first, last = (
        metrics.decision_rates(records.get(s, []), V2_DECISION_LINES) for s in (min(evals), max(evals))
      )
      summary.setdefault("decision_rates", {}).setdefault(arm, {})[seed] = {"step0": first, "final": last}
      md.append(
        f"| {arm} | {seed} | "
        + " | ".join(f"{fmt(first[k])} → {fmt(last[k])}" for k in metrics.DECISION_RATES)
        + " |"
      )
  md += [
    "",
    f"Registered predictions (docs/dpa_grpo.md, Testbed v{3 if v3 else 2}), across-seed rule "
    f"({ACROSS_SEEDS_NEEDED} seeds{' that pass the validity gate' if v3 else ''}; "
    f"'not up' held when the upper bound <= {NO_RISE_MARGIN}); a seed whose rate has no unit is left out:",
    "",
    "| id | prediction or control | seeds | mean difference [95% t] | verdict |"
    + (" tested? |" if v3 else ""),
    "|---|---|---|---|---|" + ("---|" if v3 else ""),
  ]
  rows = [r for pair, suffix in V2_PAIRS.items() if set(pair) & set(arms) for r in _pair_rows(pair, suffix)]
  valid, validity_md = v3_validity(workdir, arms, seeds, summary) if v3 else ({}, [])
  if v3:  # v3's own rows in place of v2's
    rows = [r for r in V3_PREDICTIONS if set(r[3]) <= set(arms)]
  for pid, text, kind, pair, quantity, direction in rows:
    diffs, ran, finished, counted = [], [], 0, 0
    for seed in seeds:
      finished += all(seed in runs.get(a, {}) for a in pair)
      if v3 and not all(seed in valid.get(a, ()) for a in pair):
        continue
      try:
        d = v2_difference(runs, kind, pair, quantity, seed)
      except KeyError:
        continue
      counted += 1
      if np.isfinite(d):
        diffs.append(d)
        ran.append(seed)
    line = _judged_row(summary, pid, text, ran, diffs, direction)
    if v3:
      summary["predictions"][pid]["tested"] = tested = v3_tested(finished, counted, len(diffs))
      line += f" {tested} |"
    md.append(line)
  health = summary.get("training_health", {})
  for pair, suffix in V2_PAIRS.items() if not v3 else ():
    for pid, text, arm in V2_FORMAT_PREDICTIONS.get(suffix, ()) if set(pair) & set(arms) else ():
      by_seed, ran = _format_differences(health, arm, seeds)
      md.append(_judged_row(summary, pid, text, ran, [by_seed[s] for s in ran], "up", screen=True))
  for pid, text, arm in V3_FORMAT_PREDICTIONS if v3 else ():
    if arm in arms:
      by_seed, ran = _format_differences(health, arm, seeds)
      tested = v3_tested(len(by_seed), len(by_seed), len(ran))
      summary_line = _judged_row(summary, pid, text, ran, [by_seed[s] for s in ran], "up")
      summary["predictions"][pid]["tested"] = tested
      md.append(f"{summary_line} {tested} |")
  return validity_md + md


def _format_differences(
  health: dict[str, dict[int, list]], arm: str, seeds: Sequence[int]
) -> tuple[dict[int, float], list[int]]:
  """A format row's per-seed differences (last-fifth share of parsing verdicts − FORMAT_BOUND) of
  every finished run of `arm`, and the seeds among `seeds` whose share is defined."""
  by_seed = {s: fifths[-1]["valid_verdict"] - FORMAT_BOUND for s, fifths in health.get(arm, {}).items()}
  return by_seed, [s for s in seeds if s in by_seed and np.isfinite(by_seed[s])]


def _judged_row(
  summary: dict[str, Any],
  pid: str,
  text: str,
  seeds: list[int],
  diffs: list[float],
  direction,
  screen: bool = False,
) -> str:
  """One v2 row judged by the across-seed rule: into `summary["predictions"]`; its markdown line.
  `screen`: a format row, whose verdict before nine seeds is its `screening` status."""
  mean, (low, high), verdict = across_seeds(diffs, direction)
  if screen:
    verdict = screening(diffs) or verdict
  summary["predictions"][pid] = {
    "statement": text, "seeds": seeds, "differences": diffs,
    "across_seeds": {"mean": mean, "ci": [low, high], "verdict": verdict},
  }  # fmt: skip
  return f"| {pid} | {text} | {len(diffs)} | {mean:+.3f} [{low:+.3f}, {high:+.3f}] | **{verdict}** |"


def write(
  workdir: str,
  config: config_lib.ExperimentConfig,
  arms: Sequence[str],
  seeds: Sequence[int],
  other_warm_start: str = "",
) -> dict[str, Any]:
  """Writes report.md, report.json and figures/ from the runs that exist; returns the summary.
  `other_warm_start`: a testbed workdir of another warm start whose runs of the ODE's arm the fit
  here also predicts (`testbed_theory.other_warm_start`)."""
  runs = {arm: {s: e for s in seeds if (e := _evals(testbed_arms.run_dir(workdir, arm, s)))} for arm in arms}
  runs = {arm: by_seed for arm, by_seed in runs.items() if by_seed}
  summary: dict[str, Any] = {"arms": {}, "predictions": {}}
  md = ["# DPA-GRPO copy-and-check testbed", ""]
  gates_path = os.path.join(workdir, "gates.json")
  if os.path.exists(gates_path):
    stamp_path = os.path.join(workdir, "config.json")
    stamp = rundir.read_json(stamp_path).get("testbed", {}) if os.path.exists(stamp_path) else {}
    gates = testbed_arms.judged(rundir.read_json(gates_path), stamp.get("waive_gates", ()))
    summary["gates"] = gates
    md += ["```", testbed_arms.format_gates(gates), "```", ""]
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
    summary["arms"][arm] = {"label": testbed_arms.ALL_ARMS[arm].label, "final_accuracy": finals}
    md.append(f"| {arm} | all | | {_spread(finals)} | | | |")
  health = format_health(workdir, arms, seeds, summary)  # before the v2 rows: F1k3 / F2k3 read it
  if testbed_arms.is_v2(config):
    md += _v2_predictions(workdir, arms, seeds, summary, v3=testbed_arms.is_v3(config))
  else:
    md += _v1_predictions(runs, seeds, summary)
  md += health
  if runs:
    summary["figures"] = _figures(runs, os.path.join(workdir, "figures"))
    md += ["", "![accuracy](figures/accuracy.png)", "![cases](figures/cases.png)"]
  ode_arm = "dpa_k1"
  if testbed_arms.is_v2(config):  # the paper arm of the first pair in the report
    ode_arm = next((p[0] for p in V2_PAIRS if p[0] in arms), "dpa_paper")
  ode = testbed_theory.for_workdir(workdir, config, ode_arm, seeds, other_warm_start)
  if ode is not None:
    summary["ode_out_of_sample"] = ode
    md += ["", *ode_markdown(ode, testbed_arms.ALL_ARMS[ode_arm].label)]
  theory_dir = os.path.join(workdir, "theory")  # `python -m launch.theory --workdir=<workdir>/theory`
  if os.path.isdir(theory_dir):
    pngs = sorted(f for f in os.listdir(theory_dir) if f.endswith(".png"))
    md += ["", "Theory figures (`python -m launch.theory`, docs/theory.md):", ""]
    md += [f"![{f[:-4]}](theory/{f})" for f in pngs]
  rundir.atomic_write_text(os.path.join(workdir, "report.md"), "\n".join(md) + "\n")
  rundir.write_json(os.path.join(workdir, "report.json"), summary)
  return summary


def ode_markdown(ode: dict[str, Any], label: str) -> list[str]:
  """The ODE-out-of-sample section of report.md: per predicted seed the RMS error of each predictor
  (`testbed_theory`'s module docstring), then the across-seed means and paired differences with
  their Student-t 95% intervals."""
  names = ("ode_rmse", "ode_drafts_rmse", "trend_rmse", "step0_rmse")
  heads = ("ODE, drafts held", "ODE, drafts moving", "trend (8 slopes)", "step-0 rates")
  md = [
    f"The ODE out of sample (`dpa_grpo.testbed_theory`; {label}): game per line from the step-0 gate "
    "rollout (the control line's verifier and generator pooled over correctness), generator clock over "
    f"SAC'd units; fitted on seed {ode['fit_seed']} only: κ = {ode['kappa']:.3g} (drafts held, in-sample "
    f"RMS {ode['fit_rmse']:.3f}), κ = {ode['kappa_drafts']:.3g} (drafts moving with the fit seed's "
    f"P(x right), {ode['fit_rmse_drafts']:.3f}), the trend's slopes ({ode['fit_rmse_trend']:.3f}). "
    "RMS error over the 8 case rates and every window of the predicted seeds' training rollouts:",
    "",
    "| seed | " + " | ".join(heads) + " |",
    "|---|" + "---|" * len(heads),
  ]
  md += [f"| {s} | " + " | ".join(f"{r[n]:.4f}" for n in names) + " |" for s, r in ode["seeds"].items()]
  rows = ode.get("across_seeds", {})

  def cell(name: str, table: dict[str, Any] = rows) -> str:
    row = table.get(name)
    if row is None:
      return "—"
    ci = row["interval"]
    return f"{row['mean']:+.4f}" + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "")

  if rows:
    md.append("| mean [95% t] | " + " | ".join(cell(n) for n in names) + " |")
    md += [
      "",
      "Paired differences across predicted seeds (negative: the ODE predicts better), mean [95% t]: "
      + "; ".join(
        f"{a.split('_rmse')[0]} − {b.split('_rmse')[0]} {cell(f'{a} - {b}')}"
        for a in ("ode_rmse", "ode_drafts_rmse")
        for b in ("trend_rmse", "step0_rmse")
      )
      + ".",
    ]
  other = ode.get("other_warm_start")
  if other:
    o_names = ("ode_rmse", "trend_rmse", "step0_rmse")
    o_cell = lambda n: cell(n, other["across_seeds"])
    md += [
      "",
      f"Another warm start (`{other['workdir']}`): its own step-0 game, κ = {other['kappa']:.3g} and the "
      f"trend's slopes from seed {ode['fit_seed']} above, unchanged (drafts held). RMS error per run:",
      "",
      "| seed | ODE, drafts held | trend (8 slopes) | step-0 rates |",
      "|---|---|---|---|",
      *(f"| {s} | " + " | ".join(f"{r[n]:.4f}" for n in o_names) + " |" for s, r in other["seeds"].items()),
      "| mean [95% t] | " + " | ".join(o_cell(n) for n in o_names) + " |",
      "",
      f"Paired, mean [95% t]: ode − trend {o_cell('ode_rmse - trend_rmse')}; "
      f"ode − step0 {o_cell('ode_rmse - step0_rmse')}.",
    ]
  return md + ["", "![ODE out of sample](figures/ode_out_of_sample.png)"]
