"""The testbed's pre-registered predictions (docs/kace.md, "Pre-registered predictions"), judged from
the records of runs over several seeds.

Each prediction compares two methods on the same problems: the per-problem paired difference
(correct under A minus correct under B), pooled over every seed's problems, has a mean and a 95%
percentile-bootstrap interval (`lm.stats.bootstrap_ci`). "A > B" is held when the interval lies
above 0 (and the mean reaches `min_gap`), not held when it lies below 0 or the mean misses
`min_gap` with the interval above 0, else inconclusive; "A ≈ B" is held when the interval lies
within ±`margin`, not held when it lies wholly outside, else inconclusive. The predictions are
transcribed from the docs as written before the first comparison run; this module only judges them.

`clustered=True` (testbed v3; v1 and v2 keep the pooled bootstrap their results were reported with)
takes the interval from a bootstrap clustered by run (`lm.stats.clustered_bootstrap_ci`): each run is
one tree build, the unit that varies, so builds are resampled, then problems within them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from kace import evaluate
from lm import rundir, stats

MARGIN = 0.10


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prediction:
  """`a` `relation` `b` (">" or "≈") on the problems of `levels` (None: all), as numbered in the docs."""

  number: str
  a: str
  relation: str
  b: str
  levels: tuple[int, ...] | None = None
  min_gap: float = 0.0
  subset: str = ""  # "": every problem; else a named set of problems (`report`'s `subsets`: "null")

  def __str__(self) -> str:
    where = "" if self.levels is None else f" (level {', '.join(map(str, self.levels))})"
    where += f" ({self.subset} problems)" if self.subset else ""
    gap = f", gap >= {self.min_gap:.2f}" if self.min_gap else ""
    return f"{self.a} {self.relation} {self.b}{where}{gap}"


# Predictions 1-8 of the main run (control "none"); 9-11 are judged on the control runs.
MAIN = (
  Prediction(number="1", a="kace", relation=">", b="tiered", min_gap=0.15),
  Prediction(number="2", a="kace", relation=">", b="best_of_n"),
  Prediction(number="3", a="kace", relation=">", b="raw_reflections"),
  Prediction(number="4", a="kace", relation=">", b="llm_router"),
  Prediction(number="5a", a="kace", relation=">", b="ace_playbook"),
  Prediction(number="5b", a="kace", relation=">", b="gepa"),
  Prediction(number="5c", a="kace", relation=">", b="tiered_gepa"),
  Prediction(number="6a", a="no_domain", relation="≈", b="kace"),
  Prediction(number="6b", a="no_difficulty", relation="≈", b="kace"),
  Prediction(number="7", a="embedding_retrieval", relation="≈", b="kace"),
  Prediction(number="8", a="kace", relation="≈", b="tiered", levels=(1,)),
)
CONTROLS = {
  "identity": (Prediction(number="9", a="kace", relation=">", b="tiered"),),
  "shared": (Prediction(number="10", a="no_difficulty", relation="≈", b="kace"),),
  "level1": (Prediction(number="11", a="kace", relation="≈", b="tiered", levels=(1,)),),
}


# Testbed v2 (variant "conflict"; docs/kace.md, "Testbed v2: predictions"), judged per arm: the
# paired-problem claims of the main arm (noise 0), its noise arms and its identity control. The
# build-log claims (wrong cards kept, REFINE operations) are judged from `v2_build_facts`.
V2 = (
  Prediction(number="v2-1", a="kace", relation=">", b="tiered", min_gap=0.15),
  Prediction(number="v2-2", a="kace", relation=">", b="no_domain"),
  Prediction(number="v2-3", a="kace", relation=">", b="no_difficulty"),
  Prediction(number="v2-4", a="kace", relation=">", b="ace_playbook"),
  Prediction(number="v2-5", a="kace", relation=">", b="embedding_retrieval"),
  Prediction(number="v2-6", a="kace", relation="≈", b="tiered", levels=(1,)),
  Prediction(number="v2-7", a="kace", relation="≈", b="tiered", subset="null"),
)
V2_NOISE = (Prediction(number="v2-9", a="kace", relation=">", b="tiered"),)
V2_CONTROLS = {"identity": (Prediction(number="v2-8", a="no_domain", relation="≈", b="kace"),)}


def outcomes(eval_dirs: Sequence[str]) -> dict[str, dict[tuple[str, str], tuple[int, bool]]]:
  """{method: {(run, problem id): (level, correct)}} from every run's `records.jsonl`."""
  out: dict[str, dict] = {}
  for run in eval_dirs:
    for r in rundir.read_jsonl(os.path.join(run, evaluate.RECORDS)):
      out.setdefault(r["method"], {})[(run, r["id"])] = (r["level"], bool(r["correct"]))
  return out


def by_run(values: Mapping[tuple[str, str], float]) -> list[list[float]]:
  """{(run, problem id): value} as one list of values per run, runs and problems sorted: the
  clusters of `lm.stats.clustered_bootstrap_ci`."""
  out: dict[str, list[float]] = {}
  for (run, _), v in sorted(values.items()):
    out.setdefault(run, []).append(v)
  return list(out.values())


def interval(
  values: Mapping[tuple[str, str], float], bootstrap: int = 2000, clustered: bool = False
) -> tuple[float, float]:
  """95% interval of the mean of {(run, problem id): value}: pooled-problem bootstrap, or clustered
  by run (builds, then problems within them)."""
  if clustered:
    return stats.clustered_bootstrap_ci(by_run(values), samples=bootstrap)
  return stats.bootstrap_ci([values[k] for k in sorted(values)], samples=bootstrap)


def accuracy(
  by_method: Mapping[str, Mapping], method: str, bootstrap: int = 2000, clustered: bool = False
) -> dict:
  """`method`'s accuracy over every (run, problem) and its 95% interval (`interval`)."""
  values = {k: float(correct) for k, (_, correct) in by_method.get(method, {}).items()}
  if not values:
    return {"method": method, "problems": 0, "accuracy": None, "ci": None}
  return {
    "method": method,
    "problems": len(values),
    "runs": len(by_run(values)),
    "accuracy": sum(values.values()) / len(values),
    "ci": list(interval(values, bootstrap, clustered)),
  }


def judge(
  prediction: Prediction,
  by_method: Mapping[str, Mapping],
  bootstrap: int = 2000,
  subsets: Mapping | None = None,
  clustered: bool = False,
) -> dict:
  """The prediction's estimate (mean paired difference a − b), its interval (`interval`, clustered by
  run when `clustered`) and its verdict; `subsets` maps a prediction's `subset` name to the (run,
  problem id) keys it judges."""
  a, b = by_method.get(prediction.a, {}), by_method.get(prediction.b, {})
  keys = sorted(k for k in set(a) & set(b) if prediction.levels is None or a[k][0] in prediction.levels)
  if prediction.subset:
    keys = [k for k in keys if k in (subsets or {}).get(prediction.subset, ())]
  paired = {k: float(a[k][1]) - float(b[k][1]) for k in keys}
  row = {"prediction": prediction.number, "claim": str(prediction), "problems": len(paired)}
  if not paired:
    return {**row, "mean": None, "ci": None, "verdict": "inconclusive (no paired problems)"}
  mean = sum(paired.values()) / len(paired)
  low, high = interval(paired, bootstrap, clustered)
  if prediction.relation == ">":
    if low > 0:
      verdict = "held" if mean >= prediction.min_gap else "not held (gap below the predicted size)"
    else:
      verdict = "not held" if high < 0 else "inconclusive"
  else:
    if -MARGIN <= low and high <= MARGIN:
      verdict = "held"
    else:
      verdict = "not held" if high < -MARGIN or low > MARGIN else "inconclusive"
  return {**row, "mean": mean, "ci": [low, high], "verdict": verdict}


def report(
  eval_dirs: Sequence[str],
  predictions: Sequence[Prediction] = MAIN,
  bootstrap: int = 2000,
  subsets: Mapping[str, set] | None = None,
  clustered: bool = False,
) -> str:
  """A Markdown table: every prediction judged on the pooled runs (intervals clustered by run when
  `clustered`)."""
  by_method = outcomes(eval_dirs)
  kind = "bootstrap interval clustered by run (builds, then problems)" if clustered else "bootstrap interval"
  lines = [
    f"Pooled over {len(eval_dirs)} run(s). Mean paired difference (A − B, per problem) with its 95% "
    f"{kind}; ≈ means within ±{MARGIN:.2f}.",
    "",
    "| # | prediction | problems | A − B | 95% CI | verdict |",
    "|---|---|---|---|---|---|",
  ]
  for p in predictions:
    j = judge(p, by_method, bootstrap, subsets, clustered)
    est = "–" if j["mean"] is None else f"{j['mean']:+.3f}"
    ci = "–" if j["ci"] is None else f"[{j['ci'][0]:+.3f}, {j['ci'][1]:+.3f}]"
    lines.append(f"| {j['prediction']} | {j['claim']} | {j['problems']} | {est} | {ci} | {j['verdict']} |")
  return "\n".join(lines) + "\n"


def card_verdicts(tree, rules: Mapping, kinds: Mapping) -> dict[str, int]:
  """How many of `tree`'s cards are "right" (their rule is their kind word's rule in every domain
  whose problems read them), "misplaced" (right in some of those domains, not all: a pooled or
  universal card of a shared kind word), "wrong" (right in none) or "other" (not a testbed card)."""
  from kace import cards, testbed  # here: this module is imported by kace.pipeline's callers too

  counts = {"right": 0, "misplaced": 0, "wrong": 0, "other": 0}
  for card in tree.cards:
    parsed = testbed.parse_card(card.text)
    if parsed is None:
      counts["other"] += 1
      continue
    kind, rule = parsed
    read_by = [d for d, _ in rules if card.universal or card.domain in (cards.ANY, d)]
    cells = [(d, lv) for d, lv in rules if d in read_by and kinds[(d, lv)] == kind]
    right = sum(rules[c] == rule for c in cells)
    counts["wrong" if not right else "right" if right == len(cells) else "misplaced"] += 1
  return counts


def v2_build_facts(build_dir: str, rules: Mapping, kinds: Mapping) -> dict[str, dict]:
  """Per tree artefact built in `build_dir` (kace, no_domain, no_difficulty): its cards by
  `card_verdicts`, ADD's cards kept and rejected, and REFINE's operations applied, rolled back and
  refused (the build log); plus the k each retrieval method chose on validation."""
  from kace import cards, learn

  out: dict[str, dict] = {}
  for artifact in ("kace", "no_domain", "no_difficulty"):
    tree_path = os.path.join(build_dir, artifact, learn.TREE)
    if not os.path.exists(tree_path):
      continue
    log = list(rundir.read_jsonl(os.path.join(build_dir, artifact, learn.LOG)))
    adds = [c for r in log if r.get("phase") == "add" for c in r["cards"]]
    refine = [r for r in log if r.get("phase") == "refine"]
    out[artifact] = {
      **card_verdicts(cards.EpistemicTree.load(tree_path), rules, kinds),
      "add_kept": sum(c["accepted"] for c in adds),
      "add_rejected": sum(not c["accepted"] for c in adds),
      **{f"refine_{k}": sum(len(r[k]) for r in refine) for k in ("applied", "rolled_back", "refused")},
    }
  for name in ("embedding_retrieval", "llm_router"):
    path = os.path.join(build_dir, f"{name}_k.json")
    if os.path.exists(path):
      out[f"{name}_k"] = rundir.read_json(path)
  return out
