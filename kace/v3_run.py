"""Testbed v3's registered comparison with the trained solver and the learned teacher, resumable.

Why: docs/kace_v3.md registered twelve predictions for the trained v3 solver (`kace.v3_reader`,
`kace.v3_solver`) with the learned teacher (`kace.v3_teacher`) writing every arm's cards, judged on
the test split of ten builds with intervals clustered by build, each labelled tested or not by the
scripted readers' verdicts (section 7). This module runs exactly that through the same code that
gave the readers' verdicts (`kace.v3_learn.run`, `kace.v3_arms`): the trained arms and the readers
differ only in who reads the cards, so a difference between them is the solver's.

Order (registered, section 3): the solver's gates on each build's calibration split first; a solver
that fails a gate in any build stops the comparison before the test split is read. Then, per build,
every arm of `v3_arms.TRAINED_ARMS` (the registered arms and the labelled upper-bound arm
`kace_oracle_teacher`), saved as `build<b>.json` when it ends, so an interrupted run resumes at the
next build; then the scripted readers (programmatic teacher, as registered) for the labels; then the
verdicts (`kace.v3_verdicts.labelled`). Every file is stamped with the config; `launch.kace_v3`
stops a rerun with another config in one line.

    python -m launch.kace_v3 --workdir=runs/kace_v3
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kace import readers, v3_arms, v3_learn, v3_reader, v3_solver, v3_teacher, v3_verdicts
from lm import rundir


@dataclasses.dataclass(frozen=True, kw_only=True)
class V3RunConfig:
  """The trained comparison (configs/kace_v3.py).

  Attributes:
    builds: the tree builds (seeds of `testbed_v3.WorldConfig`); registered: 0-9.
    cache_dir: where the solver and the teacher are built once (keyed by their configs and code).
    bootstrap: resamples of the clustered bootstrap.
    solver: the v3 solver's build (`v3_solver.V3SolverConfig`).
    teacher: the learned teacher's build (`v3_teacher.V3TeacherConfig`).
  """

  builds: tuple[int, ...] = v3_verdicts.BUILDS
  cache_dir: str = "~/.cache/kace"
  bootstrap: int = 2000
  solver: v3_solver.V3SolverConfig = v3_solver.V3SolverConfig()
  teacher: v3_teacher.V3TeacherConfig = v3_teacher.V3TeacherConfig()

  def __post_init__(self):
    if not self.builds or len(set(self.builds)) != len(self.builds) or min(self.builds) < 0:
      raise ValueError(f"builds must be distinct seeds >= 0, got {self.builds}")
    if self.bootstrap < 100:
      raise ValueError(f"bootstrap must be >= 100 resamples, got {self.bootstrap}")

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> V3RunConfig:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"unknown key(s) {unknown}; known: {sorted(known)}")
    values = dict(d)
    values["builds"] = tuple(int(b) for b in values.get("builds", cls.builds))
    for name, typ in (("solver", v3_solver.V3SolverConfig), ("teacher", v3_teacher.V3TeacherConfig)):
      if name in values and not isinstance(values[name], typ):
        fields = {f.name for f in dataclasses.fields(typ)}
        bad = sorted(set(values[name]) - fields)
        if bad:
          raise ValueError(f"{name}: unknown key(s) {bad}")
        values[name] = typ(**{k: tuple(v) if isinstance(v, list) else v for k, v in values[name].items()})
    return cls(**values)

  def to_dict(self) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(self)))


def _keyed(outcomes: Mapping) -> dict:
  """(build, id) keys as "build|id" strings (JSON), and back (`_unkeyed`)."""
  return {arm: {"|".join(k): list(v) for k, v in by.items()} for arm, by in outcomes.items()}


def _unkeyed(outcomes: Mapping) -> dict:
  return {arm: {tuple(k.split("|", 1)): tuple(v) for k, v in by.items()} for arm, by in outcomes.items()}


def _load_or(path: str, stamp: Mapping, make: Callable[[], dict]) -> dict:
  """The record at `path` when it was written under `stamp`, else `make()` written there."""
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    if saved.get("stamp") == stamp:
      return saved
  record = {"stamp": dict(stamp), **make()}
  rundir.write_json(path, record)
  return record


def run(
  workdir: str,
  config: V3RunConfig,
  progress: Callable[[str], None] = print,
  reader: Any = None,
  teacher: v3_learn.Teacher | None = None,
  scripted_readers: Sequence[readers.Reader] = readers.READERS,
) -> dict:
  """The comparison into `workdir` (module docstring); returns {"stopped": reason} or the verdicts.
  `reader` / `teacher`: the config's trained solver and learned teacher unless given (tests give
  scripted ones, which the stamp then names); `scripted_readers`: the registered readers whose
  verdicts label each prediction (tests give fewer)."""
  cache = os.path.expanduser(config.cache_dir)
  stamp = {
    "solver": config.solver.key() if reader is None else reader.name,
    "teacher": config.teacher.key() if teacher is None else teacher.name,
    "builds": list(config.builds),
  }
  reader = reader or v3_reader.ModelReader.build(cache, config.solver)
  gates = _load_or(
    os.path.join(workdir, "gates.json"),
    stamp,
    lambda: {"gates": v3_reader.calibration_gates(reader, config.builds)},
  )["gates"]
  pooled = v3_arms.pooled_gates(gates)
  if not pooled["all_passed"]:
    failed = sorted(n for n, ok in pooled["passed"].items() if not ok)
    reason = f"the trained solver fails the gate(s) {failed} on the calibration split of builds"
    reason += f" {list(config.builds)} pooled: the test split is not read"
    rundir.write_json(
      os.path.join(workdir, "verdicts.json"),
      {"stamp": stamp, "stopped": reason, "gates": gates, "pooled_gates": pooled},
    )
    progress(reason)
    return {"stopped": reason, "gates": gates, "pooled_gates": pooled}
  teacher = teacher or v3_teacher.LearnedV3Teacher.build(cache, config.teacher)  # past the gates only
  per_build = []
  for b in config.builds:

    def one(b=b) -> dict:
      r = v3_learn.run([reader], [b], arms=v3_arms.TRAINED_ARMS, teacher=teacher)
      return {"outcomes": _keyed(r["outcomes"][reader.name]), "counts": r["counts"][reader.name],
              "gates": r["gates"][reader.name], "teachers": r.get("teachers", {})}  # fmt: skip

    per_build.append(_load_or(os.path.join(workdir, f"build{b}.json"), stamp, one))
    progress(f"testbed v3, trained solver: build {b} done")
  merged: dict = {"outcomes": {reader.name: {}}, "counts": {reader.name: {}}, "gates": {reader.name: []}}
  for rec in per_build:
    for arm, by in _unkeyed(rec["outcomes"]).items():
      merged["outcomes"][reader.name].setdefault(arm, {}).update(by)
    for arm, c in rec["counts"].items():
      merged["counts"][reader.name].setdefault(arm, []).extend(c)
    merged["gates"][reader.name].extend(rec["gates"])
  scripted_stamp = {"builds": list(config.builds), "readers": [r.name for r in scripted_readers]}
  scripted = _load_or(
    os.path.join(workdir, "readers.json"),
    scripted_stamp,
    lambda: _serialisable(v3_learn.run(scripted_readers, config.builds, progress=progress)),
  )
  scripted = {**scripted, "outcomes": {n: _unkeyed(o) for n, o in scripted["outcomes"].items()}}
  scripted_rows = v3_verdicts.verdicts(scripted, config.bootstrap)
  rows = v3_verdicts.labelled(
    v3_verdicts.verdicts(merged, config.bootstrap), scripted_rows, scripted["gates"]
  )
  # beside it, not instead: the builds whose own calibration gates all pass (docs/kace_v3.md, section 9)
  passing = [g["build"] for g in gates if g["all_passed"]]
  only = _builds(merged, passing)
  on_passing = v3_verdicts.labelled(
    v3_verdicts.verdicts(only, config.bootstrap), scripted_rows, scripted["gates"]
  )
  record = {
    "stamp": stamp, "builds": list(config.builds), "verdicts": rows, "counts": merged["counts"],
    "gates": merged["gates"], "calibration_gates": gates, "pooled_gates": pooled,
    "builds_passing_their_own_gates": passing, "verdicts_on_those_builds": on_passing,
    "teachers": per_build[0].get("teachers", {}),
    "labels": {reader.name: getattr(reader, "label", readers.LABEL), "teacher": teacher.name},
  }  # fmt: skip
  rundir.write_json(os.path.join(workdir, "verdicts.json"), record)
  rates = ", ".join(f"{n} {v:.3f}" for n, v in pooled["rates"].items())
  head = [
    f"Solver: {record['labels'][reader.name]}; teacher: {teacher.name}; builds {list(config.builds)}.",
    f"Calibration gates, pooled over the builds: {rates} (all passed); each build's own gates: "
    f"{len(passing)} of {len(gates)} builds pass all.",
    "",
  ]
  beside = v3_verdicts.trained_markdown(on_passing, only).split("\nAccuracy")[0]
  tail = [
    "",
    f"The same predictions on the {len(passing)} builds whose own gates all pass (beside):",
    "",
    beside,
  ]
  with open(os.path.join(workdir, "report.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(head) + v3_verdicts.trained_markdown(rows, merged) + "\n".join(tail) + "\n")
  return record


def _builds(result: Mapping, builds: Sequence[int]) -> dict:
  """`result` (one reader's) restricted to `builds`."""
  keep = {f"build{b}" for b in builds}
  (name,) = result["outcomes"]
  outcomes = {a: {k: v for k, v in by.items() if k[0] in keep} for a, by in result["outcomes"][name].items()}
  counts = {a: [c for c in cs if c["build"] in builds] for a, cs in result["counts"][name].items()}
  gates = [g for g in result["gates"][name] if g.get("build", -1) in builds or "build" not in g]
  return {"outcomes": {name: outcomes}, "counts": {name: counts}, "gates": {name: gates}}


def _serialisable(result: Mapping) -> dict:
  return {
    "outcomes": {n: _keyed(o) for n, o in result["outcomes"].items()},
    "counts": result["counts"],
    "gates": result["gates"],
  }
