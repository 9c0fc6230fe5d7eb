"""Testbed v3's registered predictions and the scripted readers' verdict on each.

Why (issue 47, item 6): a prediction counts as *tested* only where fixed readers that could stand in
for the solver give different verdicts; if every reader gives the same one, the testbed's
construction gives it, whatever a trained solver does. This module judges each prediction (docs/
kace_v3.md) for every reader of `kace.readers.READERS` on the arms of `kace.v3_arms` (their trees
built by `kace.v3_learn`), with the bootstrap clustered by build
(`kace.predictions.judge(clustered=True)`), and labels it tested or not. Every number it writes is
a scripted reader's, with the programmatic teacher.

    python -m launch.kace_v3_readers --workdir=/tmp/kace_v3_readers
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from kace import predictions, readers, v3_learn

P = predictions.Prediction
# Registered in docs/kace_v3.md before any trained arm runs; "main": the class-dependent family,
# "control": the family whose rule ignores the class. Not to be edited after registration.
V3 = (
  P(number="v3-1", a="kace", relation=">", b="tiered", min_gap=0.15),
  P(number="v3-2", a="kace", relation=">", b="tiers_pooled", subset="main"),
  P(number="v3-3", a="kace", relation=">", b="domains_pooled"),
  P(number="v3-4", a="kace", relation=">", b="monolithic"),
  P(number="v3-5", a="kace", relation=">", b="ace_playbook"),
  P(number="v3-6", a="kace", relation=">", b="gepa"),
  P(number="v3-7", a="kace", relation=">", b="embedding_top_k"),
  P(number="v3-8", a="kace", relation=">", b="add_accept_all"),
  P(number="v3-9", a="kace", relation=">", b="add_no_refine"),
  P(number="v3-10", a="kace", relation=">", b="refine_shuffled_credit"),
  P(number="v3-11", a="kace", relation=">", b="refine_no_rollback"),
  P(number="v3-12", a="tiers_pooled", relation="≈", b="kace", subset="control"),
)
# Claims about REFINE count only in builds where REFINE applied at least one operation.
REFINE_CLAIMS = ("v3-9", "v3-10", "v3-11")
BUILDS = tuple(range(10))


def subsets(outcomes: Mapping[str, Mapping]) -> dict[str, set]:
  """{"main" | "control": the (build, problem id) keys of that family}."""
  keys = {k for by in outcomes.values() for k in by}
  return {family: {k for k in keys if f"/{family}/" in k[1]} for family in ("main", "control")}


def refine_applied(counts: Sequence[Mapping]) -> list[int]:
  """Per build, the REFINE operations applied (every `<op>_applied` count)."""
  return [sum(v for k, v in c.items() if k.endswith("_applied")) for c in counts]


def verdicts(result: Mapping, bootstrap: int = 2000) -> list[dict]:
  """Per prediction: every reader's estimate, clustered interval and verdict, and whether it counts
  as tested (the readers' verdicts are not all the same)."""
  rows = []
  for p in V3:
    by_reader = {}
    for name, outcomes in result["outcomes"].items():
      applied = None
      if p.number in REFINE_CLAIMS:  # judged on the builds where REFINE made operations only
        per_build = result["counts"][name]["kace"]
        applied = dict(zip((f"build{c['build']}" for c in per_build), refine_applied(per_build), strict=True))
        outcomes = {arm: {k: v for k, v in by.items() if applied[k[0]] > 0} for arm, by in outcomes.items()}
      j = predictions.judge(p, outcomes, bootstrap, subsets(outcomes), clustered=True)
      if applied is not None:
        j["refine_applied"] = list(applied.values())
      by_reader[name] = j
    distinct = {j["verdict"] for j in by_reader.values()}
    rows.append({"prediction": p.number, "claim": str(p), "readers": by_reader, "tested": len(distinct) > 1})
  return rows


def gate_passing(gates: Mapping[str, Sequence[Mapping]]) -> list[str]:
  """The readers that pass every gate in most builds (a solver like them would run the arms):
  the registration's third reading (docs/kace_v3.md, section 7) leaves the others out."""
  return [n for n, per in gates.items() if 2 * sum(g["all_passed"] for g in per) > len(per)]


def labelled(trained: Sequence[Mapping], scripted: Sequence[Mapping], gates: Mapping) -> list[dict]:
  """The trained solver's verdict rows (`verdicts` on its result: one "reader", the model), each
  with the scripted readers' verdicts beside it and the registered labels: `tested` (the readers'
  verdicts differ), `held_against_not_held` (some reader's "held" against another's "not held") and
  `tested_gate_passing` (the verdicts differ among the readers that pass the gates)."""
  passing = gate_passing(gates)
  out = []
  for t, r in zip(trained, scripted, strict=True):
    if t["prediction"] != r["prediction"]:
      raise ValueError(f"rows out of order: {t['prediction']} beside {r['prediction']}")
    verdicts_by = {n: j["verdict"] for n, j in r["readers"].items()}
    plain = {v.split(" (")[0] for v in verdicts_by.values()}
    among = {verdicts_by[n] for n in passing if n in verdicts_by}
    out.append({
      **t,
      "scripted": verdicts_by,
      "tested": r["tested"],
      "held_against_not_held": {"held", "not held"} <= plain,
      "tested_gate_passing": len(among) > 1,
      "gate_passing_readers": passing,
    })  # fmt: skip
  return out


def trained_markdown(rows: Sequence[Mapping], result: Mapping) -> str:
  """The trained solver's verdict on each prediction, the scripted readers' beside it and whether it
  counts as tested; then `markdown`'s accuracies, gates and operations for the trained run."""
  (name,) = result["outcomes"]
  lines = [
    f"| # | prediction | {name}: A − B [95% interval clustered by build] | verdict | scripted readers "
    "| tested? (registered rule) | held vs not held among readers | among gate-passing readers |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    j = r["readers"][name]
    ci = "–" if j["ci"] is None else f"[{j['ci'][0]:+.3f}, {j['ci'][1]:+.3f}]"
    est = "–" if j["mean"] is None else f"{j['mean']:+.3f}"
    if "refine_applied" in j:
      est += f" ({sum(a > 0 for a in j['refine_applied'])} builds with REFINE operations)"
    scripted = "; ".join(f"{n} {v}" for n, v in r["scripted"].items())
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    lines.append(
      f"| {r['prediction']} | {r['claim']} | {est} {ci} | **{j['verdict']}** | {scripted} | "
      f"{'**tested**' if r['tested'] else 'not tested'} | {yes(r['held_against_not_held'])} | "
      f"{yes(r['tested_gate_passing'])} |"
    )
  rest = markdown([{**r, "readers": {name: r["readers"][name]}} for r in rows], result)
  return "\n".join(lines) + "\n" + rest[rest.index("\nAccuracy") :]


def markdown(rows: Sequence[Mapping], result: Mapping) -> str:
  """The verdict table (one column per reader), then accuracies and each arm's operations per build."""
  names = list(result["outcomes"])
  head = "| # | prediction | " + " | ".join(f"{n} (scripted)" for n in names) + " | tested? |"
  lines = [head, "|" + "---|" * (len(names) + 3)]
  for r in rows:
    cells = []
    for n in names:
      j = r["readers"][n]
      ci = "–" if j["ci"] is None else f"[{j['ci'][0]:+.3f}, {j['ci'][1]:+.3f}]"
      est = "–" if j["mean"] is None else f"{j['mean']:+.3f}"
      cells.append(f"{est} {ci} **{j['verdict']}**")
    tested = "tested (readers disagree)" if r["tested"] else "not tested (readers agree)"
    if any("refine_applied" in j for j in r["readers"].values()):
      tested += "; builds with REFINE operations: " + ", ".join(
        f"{n} {sum(a > 0 for a in r['readers'][n]['refine_applied'])}" for n in names
      )
    lines.append(f"| {r['prediction']} | {r['claim']} | " + " | ".join(cells) + f" | {tested} |")
  lines += ["", "Accuracy on the test split, mean over builds [95% interval clustered by build]:", ""]
  lines += ["| arm | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
  for arm in result["outcomes"][names[0]]:
    cells = []
    for n in names:
      a = predictions.accuracy(result["outcomes"][n], arm, clustered=True)
      cells.append(f"{a['accuracy']:.3f} [{a['ci'][0]:.3f}, {a['ci'][1]:.3f}]")
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  lines += ["", "Gates on the calibration split (`v3_arms.GATES`), mean over builds (builds passing all):"]
  lines += [""]
  for n in names:
    per = result["gates"][n]
    mean = {g: sum(x["rates"][g] for x in per) / len(per) for g in per[0]["rates"]}
    passing = sum(x["all_passed"] for x in per)
    lines.append(f"- {n}: " + ", ".join(f"{g} {v:.2f}" for g, v in mean.items()) + f" ({passing}/{len(per)})")
  lines += ["", "Build operations, per build (teacher calls used; cards; operations):", ""]
  for n in names:
    for arm, per_build in result["counts"][n].items():
      ops = sorted({k for c in per_build for k in c if k != "build"})
      summary = "; ".join(f"{k} " + "/".join(str(c.get(k, 0)) for c in per_build) for k in ops)
      lines.append(f"- {n} / {arm}: {summary}")
  return "\n".join(lines) + "\n"


def run(workdir: str, builds: Sequence[int] = BUILDS, bootstrap: int = 2000) -> list[dict]:
  """Every reader on every arm and build; writes `verdicts.json` and `readers.md` to `workdir`."""
  result = v3_learn.run(readers.READERS, builds, progress=print)
  rows = verdicts(result, bootstrap)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "verdicts.json"), "w") as f:
    record = {"builds": list(builds), "verdicts": rows, "counts": result["counts"], "gates": result["gates"]}
    json.dump(record, f)
  with open(os.path.join(workdir, "readers.md"), "w") as f:
    f.write(markdown(rows, result))
  return rows
