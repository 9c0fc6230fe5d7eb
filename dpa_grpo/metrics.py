"""Evaluation metrics of played units and groups: accuracies with Wilson intervals, the 8-case
table, and the flattening of a metrics dict into TensorBoard scalars."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpa_grpo import game, rollout
from dpa_grpo.envs import taxcalc
from lm import stats

BEST_METRIC = "accuracy"  # post-revision accuracy (DPA-GRPO); draft accuracy (generator-only)


def per_line(units_or_groups, flag: str) -> dict[str, dict[str, float]]:
  """Accuracy of each line with its Wilson 95% interval."""
  out = {}
  lines = sorted({u.line_id for u in units_or_groups}, key=taxcalc.LINE_IDS.index)
  for line_id in lines:
    hits = [bool(getattr(u, flag)) for u in units_or_groups if u.line_id == line_id]
    low, high = stats.wilson_interval(sum(hits), len(hits))
    out[line_id] = {"accuracy": sum(hits) / len(hits), "ci_low": low, "ci_high": high, "n": len(hits)}
  return out


def both_scorings(pairs, tolerance: float = taxcalc.STRICT_TOLERANCE) -> dict[str, float]:
  """Accuracy of (amount, gold) pairs under both readings of a missing or unparsable amount: as
  wrong (the benchmark's grader) and as 0.0 (the reference code's evaluator: right where gold is 0)."""
  pairs = list(pairs)
  n = max(len(pairs), 1)
  wrong = sum(taxcalc.line_correct(a, g, tolerance) for a, g in pairs)
  zero = sum(taxcalc.line_correct(0.0 if a is None else a, g, tolerance) for a, g in pairs)
  return {"accuracy_missing_wrong": wrong / n, "accuracy_missing_as_zero": zero / n}


def game_metrics(
  units: Sequence[rollout.Unit], tolerance: float = taxcalc.STRICT_TOLERANCE
) -> dict[str, Any]:
  """Accuracies, SAC / revise rates, invalid replies and the 8-case table of played units; the
  post-revision accuracy under both scorings of a missing amount beside the configured one."""
  n = len(units)
  challenged = [u for u in units if u.challenged]
  pre = sum(u.x_right for u in units)
  post = sum(u.submitted_right for u in units)
  return {
    BEST_METRIC: post / n,
    "accuracy_ci": stats.wilson_interval(post, n),
    "pre_revision_accuracy": pre / n,
    "pre_revision_accuracy_ci": stats.wilson_interval(pre, n),
    "sac_rate": len(challenged) / n,
    "revise_rate": sum(u.generator_action == game.REVISE for u in challenged) / max(len(challenged), 1),
    "invalid_verdicts": sum(not u.verdict.parsed.valid for u in units),
    "invalid_decisions": sum(not u.decision.parsed.valid for u in challenged),
    "units": n,
    "cases": game.case_table(u.case for u in units),
    "per_line_post": per_line(units, "submitted_right"),
    "per_line_pre": per_line(units, "x_right"),
    **both_scorings(((u.submitted, u.draft.gold) for u in units), tolerance),
  }


def proportion(hits: Sequence[bool]) -> dict[str, Any]:
  """{rate, ci (Wilson 95%), k, n} of a list of outcomes; rate nan when empty."""
  k, n = sum(bool(h) for h in hits), len(hits)
  low, high = stats.wilson_interval(k, n)
  return {"rate": k / n if n else float("nan"), "ci": [low, high], "k": k, "n": n}


# The conditional decision rates of played units' records (testbed v2, docs/dpa_grpo.md): key and
# printed name (`decision_rates` computes them).
DECISION_RATES = {
  "revise_given_sac_wrong": "P(REVISE | SAC, draft wrong)",
  "revise_given_sac_right": "P(REVISE | SAC, draft right)",
  "revise_given_fixable": "P(REVISE | SAC, draft wrong, revision right)",
  "ns_given_right": "P(NS | draft right)",
  "sac_given_wrong": "P(SAC | draft wrong)",
  "z_right_given_sac_wrong": "P(z right | SAC, draft wrong)",
  "revision_success": "P(z right | REVISE, draft wrong)",
}


def decision_rates(records: Sequence[dict[str, Any]], lines: Sequence[str] | None = None) -> dict[str, Any]:
  """`DECISION_RATES` of unit records (`rollout.Unit.record`), on `lines` (None: all), so the
  decision and the draft are measured apart: each a `proportion`. A decision forced by exploration
  (`forced_revise`) is not the policy's, so it leaves the decision rates (not the z rates)."""
  rs = [r for r in records if lines is None or r["line"] in lines]
  sac = [r for r in rs if r["verifier_action"] == "SAC"]
  chosen = [r for r in sac if not r.get("forced_revise") and r.get("generator_action") is not None]
  revise = lambda r: r["generator_action"] == "REVISE"
  wrong = [r for r in chosen if not r["x_right"]]
  sac_wrong = [r for r in sac if not r["x_right"] and r["z_right"] is not None]
  return {
    "revise_given_sac_wrong": proportion([revise(r) for r in wrong]),
    "revise_given_sac_right": proportion([revise(r) for r in chosen if r["x_right"]]),
    "revise_given_fixable": proportion([revise(r) for r in wrong if r["z_right"]]),
    "ns_given_right": proportion([r["verifier_action"] == "NS" for r in rs if r["x_right"]]),
    "sac_given_wrong": proportion([r["verifier_action"] == "SAC" for r in rs if not r["x_right"]]),
    "z_right_given_sac_wrong": proportion([bool(r["z_right"]) for r in sac_wrong]),
    "revision_success": proportion([bool(r["z_right"]) for r in wrong if revise(r)]),
  }


@dataclasses.dataclass
class _GroupView:
  line_id: str
  right: bool


def draft_metrics(
  groups: Sequence[rollout.Group], tolerance: float = taxcalc.STRICT_TOLERANCE
) -> dict[str, Any]:
  """Accuracy of the first completion of each group (the greedy draft in evaluation), and under
  both scorings of a missing amount."""
  views = [_GroupView(g.line_id, g.rewards[0] > 0) for g in groups]
  hits = sum(v.right for v in views)
  return {
    BEST_METRIC: hits / len(views),
    "accuracy_ci": stats.wilson_interval(hits, len(views)),
    "units": len(views),
    "per_line": per_line(views, "right"),
    **both_scorings(((g.amounts[0], g.gold) for g in groups), tolerance),
  }


def scalars(prefix: str, metrics: dict[str, Any]) -> dict[str, float]:
  """The numeric leaves of a metrics dict, flattened as `prefix/key/...` for TensorBoard."""
  flat = {}
  for key, value in metrics.items():
    name = f"{prefix}/{key}"
    if isinstance(value, dict):
      flat.update(scalars(name, value))
    elif isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool):
      flat[name] = float(value)
  return flat
