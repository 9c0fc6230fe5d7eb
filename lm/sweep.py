"""Config-override sweeps for any launcher: every point a sub-directory, an index, resumable.

A sweep's points come from the command line (`lm-sweep --sweep=...`, parsed by `parse_axes`) or from
the config file's `get_sweep` beside `get_config`:

    def get_sweep(h):
      return h.product([h.sweep("config.loss.kl", ["k1", "k3"]), h.sweep("config.loss.beta", [0.04, 1.0])])

`h.sweep(key, values)` is one axis, `h.product` its cartesian product, `h.zip` an element-wise
pairing; each point is a dict {"config.a.b": value} that becomes `--config.a.b=value` on the
launcher's command line. `run_sweep` runs the points as subprocesses, `workers` at a time
(`python -m <launcher> --config=<file[:preset]> <fixed overrides> --config.a.b=v ...
--workdir=<workdir>/<point>`). `<workdir>/index.json` records each point's overrides, sub-directory,
status ("planned", "running", "done", "failed", "stopped"), return code and wall time; a re-run skips
the points already "done" (one stopped midway starts again, and its launcher resumes from its own
run directory). Once every point has run, `summary.csv` and `summary.md` hold one row per point with
its final metrics (`final_metrics`). `emit` writes the same commands as a cluster's own job: a SLURM
job array, or one job per TPU slice through launch/tpu_pod.sh.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import importlib
import importlib.util
import io
import itertools
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from lm import rundir

Point = dict[str, Any]
EMITS = ("slurm", "tpu")
DONE = "sweep.done"  # written into a point's run directory when it finished (here or as a SLURM task)
MD_METRICS = 8  # metric columns summary.md shows (a report can hold dozens; summary.csv keeps all)


class Helper:
  """The `h` handed to a config file's `get_sweep(h)`."""

  @staticmethod
  def sweep(key: str, values: Sequence[Any]) -> list[Point]:
    if not key.startswith("config."):
      raise ValueError(f"sweep key {key!r} must name a config field, e.g. 'config.loss.beta'")
    return [{key: v} for v in values]

  @staticmethod
  def product(axes: Sequence[list[Point]]) -> list[Point]:
    return [_merge(combo) for combo in itertools.product(*axes)]

  @staticmethod
  def zip(axes: Sequence[list[Point]]) -> list[Point]:
    lengths = [len(a) for a in axes]
    if len(set(lengths)) > 1:
      raise ValueError(f"h.zip needs axes of equal length, got lengths {lengths}")
    return [_merge(combo) for combo in zip(*axes, strict=True)]


def _merge(parts: Sequence[Point]) -> Point:
  out: Point = {}
  for part in parts:
    clash = set(out) & set(part)
    if clash:
      raise ValueError(f"sweep axes set the same key twice: {sorted(clash)}")
    out.update(part)
  return out


def _values(key: str, text: str) -> list[str]:
  """`a,b,c` as given, or `lo:hi[:step]` as the integers lo..hi inclusive (`seed=0:9`: ten seeds)."""
  if re.fullmatch(r"-?\d+:-?\d+(:\d+)?", text):
    lo, hi, *step = (int(x) for x in text.split(":"))
    if hi < lo or (step and step[0] < 1):
      raise ValueError(f"--sweep={key}={text}: a range lo:hi[:step] needs lo <= hi and step >= 1")
    return [str(v) for v in range(lo, hi + 1, step[0] if step else 1)]
  values = text.split(",")
  if not text or "" in values:
    raise ValueError(f"--sweep={key}={text}: give values as a,b,c or a range lo:hi")
  return values


def parse_axes(specs: Sequence[str]) -> list[Point]:
  """The points of `--sweep` flags: each flag is one axis, the axes' product is the sweep.

  An axis is `key=a,b,c` or `key=lo:hi[:step]` (integers, both ends included); `key` is a config
  field with or without its `config.` prefix. Keys joined by `/` in one flag move together (a zip):
  `--sweep=loss.kl/loss.beta=k1/0.04,k3/0.01` gives two points. Values stay strings, parsed by the
  launcher's config flag as `--config.<key>=<value>` would be.
  """
  axes = []
  for spec in specs:
    keys_text, sep, values_text = spec.partition("=")
    if not sep or not keys_text:
      raise ValueError(f"--sweep={spec}: expected key=a,b,c or key=lo:hi")
    keys = ["config." + k.removeprefix("config.") for k in keys_text.split("/")]
    if len(keys) == 1:
      axes.append(Helper.sweep(keys[0], _values(keys_text, values_text)))
      continue
    tuples = [v.split("/") for v in values_text.split(",")]
    if any(len(t) != len(keys) for t in tuples):
      raise ValueError(f"--sweep={spec}: each value of a zip needs {len(keys)} parts joined by '/'")
    axes.append([dict(zip(keys, t, strict=True)) for t in tuples])
  return Helper.product(axes)


def load_points(config_arg: str) -> list[Point]:
  """The points of the sweep that `get_sweep` defines in the config file of `file.py[:preset]`."""
  path = config_arg.split(":", 1)[0]
  if not os.path.exists(path):
    raise FileNotFoundError(f"sweep config file {path!r} (from --config={config_arg}) does not exist")
  spec = importlib.util.spec_from_file_location("_sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_sweep"):
    raise ValueError(f"{path} defines no get_sweep(h); give the axes with --sweep=key=a,b")
  points = module.get_sweep(Helper())
  if not points:
    raise ValueError(f"{path}: get_sweep(h) returned no points")
  return points


def point_name(index: int, point: Point) -> str:
  """A sub-directory name readable at a glance: '003_loss.kl=k3,loss.beta=0.2'."""
  parts = [f"{k.removeprefix('config.')}={v}" for k, v in point.items()]
  return f"{index:03d}_" + re.sub(r"[^A-Za-z0-9._=,+-]", "_", ",".join(parts))[:150]


def command(
  launcher: str, config_arg: str, point: Point, workdir: str, fixed: Sequence[str] = ()
) -> list[str]:
  """The point's command line: the launcher, its config, the fixed overrides, the point's, the run dir."""
  return [
    sys.executable,
    "-m",
    launcher,
    f"--config={config_arg}",
    *fixed,
    *(f"--{k}={v}" for k, v in point.items()),
    f"--workdir={workdir}",
  ]


def plan(
  config_arg: str, launcher: str, workdir: str, points: Sequence[Point], fixed: Sequence[str] = ()
) -> dict[str, Any]:
  """The sweep's index (nothing written): each point's name, overrides, sub-directory, command,
  and status ("done" where a previous run's index says so or the point's `DONE` file is there, else
  "planned")."""
  index_path = os.path.join(workdir, "index.json")
  previous = rundir.read_json(index_path) if os.path.exists(index_path) else {"points": []}
  done = {p["name"]: p for p in previous["points"] if p["status"] == "done"}
  entries = []
  for i, p in enumerate(points):
    name = point_name(i, p)
    cmd = command(launcher, config_arg, p, os.path.join(workdir, name), fixed)
    finished = name in done or os.path.exists(os.path.join(workdir, name, DONE))
    entry = dict(name=name, overrides=p, subdir=name, command=shlex.join(cmd), status="planned")
    if finished:  # as the run that finished it recorded it (return code, wall time)
      entry.update({k: v for k, v in done.get(name, {}).items() if k in ("returncode", "wall_seconds")})
      entry["status"] = "done"
    entries.append(entry)
  return {"config": config_arg, "launcher": launcher, "fixed": list(fixed), "points": entries}


def run_sweep(
  config_arg: str,
  launcher: str,
  workdir: str,
  *,
  points: Sequence[Point] | None = None,
  fixed: Sequence[str] = (),
  workers: int = 1,
  dry_run: bool = False,
  summary: str = "",
) -> dict[str, Any]:
  """Runs (or, with dry_run, prints) every point of the sweep; returns the index.

  Args:
    config_arg: the launcher's `--config` value, `file.py[:preset]`.
    launcher: module run per point with `python -m`, e.g. "launch.theory".
    workdir: the sweep's directory; point i runs in `<workdir>/<point_name(i, point)>`.
    points: the points (`parse_axes`); None: the config file's `get_sweep`.
    fixed: `--config.*` overrides given to every point.
    workers: points run at once, each its own process.
    dry_run: print one shell command per point and write nothing.
    summary: optional "package.module.function" called as function(workdir) once every point is done.

  Raises:
    RuntimeError: naming the failed points (after running all the others).
  """
  points = load_points(config_arg) if points is None else points
  index = plan(config_arg, launcher, workdir, points, fixed)
  if dry_run:
    for entry in index["points"]:
      print(entry["command"])
    return index
  index_path = os.path.join(workdir, "index.json")
  os.makedirs(workdir, exist_ok=True)
  rundir.write_json(index_path, index)
  lock, live, stopping = threading.Lock(), set(), threading.Event()

  def run_point(entry: dict[str, Any]) -> None:
    sub = os.path.join(workdir, entry["subdir"])
    os.makedirs(sub, exist_ok=True)
    with lock:
      if stopping.is_set():
        return
      entry["status"] = "running"
      rundir.write_json(index_path, index)
    start = time.time()
    with open(os.path.join(sub, "sweep.log"), "w") as log:
      proc = subprocess.Popen(shlex.split(entry["command"]), stdout=log, stderr=subprocess.STDOUT)
      live.add(proc)
      rc = proc.wait()
      live.discard(proc)
    status = "stopped" if stopping.is_set() else "done" if rc == 0 else "failed"
    if status == "done":
      rundir.atomic_write_text(os.path.join(sub, DONE), "")
    with lock:
      entry.update(status=status, returncode=rc, wall_seconds=time.time() - start)
      rundir.write_json(index_path, index)

  todo = [e for e in index["points"] if e["status"] != "done"]
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers))
  with _terminate_as_interrupt():
    try:
      list(pool.map(run_point, todo))
    except BaseException:  # Ctrl-C or kill: stop the points' processes too; a rerun resumes them
      stopping.set()
      for proc in list(live):
        proc.terminate()
      raise
    finally:
      pool.shutdown(wait=True)
  write_summary(workdir, index)
  failed = [e["name"] for e in index["points"] if e["status"] == "failed"]
  if failed:
    raise RuntimeError(f"{len(failed)} sweep point(s) failed (see their sweep.log): {failed}")
  if summary:
    _resolve(summary)(workdir)
  return index


# ---- the summary table ---------------------------------------------------------------------------------


def _flatten(record: Any, prefix: str = "") -> dict[str, float]:
  """Numeric leaves of nested dicts as {"a.b": value} (lists and texts are left out)."""
  out: dict[str, float] = {}
  if isinstance(record, dict):
    for key, value in record.items():
      out.update(_flatten(value, f"{prefix}{key}."))
  elif isinstance(record, int | float) and not isinstance(record, bool):
    out[prefix[:-1]] = record
  return out


# A finished run's final numbers, the first of these files it has: the DPA-GRPO report (launch.dpa_grpo,
# launch.dpa_testbed), a training run's summary, KACE's metrics (launch.kace_eval) and testbed results
# (launch.kace_testbed), the theory's numbers (launch.theory).
FINAL_FILES = ("report.json", "summary.json", "metrics.json", "results.json", "theory.json")


def final_metrics(run_dir: str) -> dict[str, float]:
  """A finished run's final numbers: the numeric leaves of its first `FINAL_FILES`, else the last
  value of each key in its `metrics.jsonl`."""
  for name in FINAL_FILES:
    path = os.path.join(run_dir, name)
    if os.path.exists(path):
      return _flatten(rundir.read_json(path))
  path = os.path.join(run_dir, "metrics.jsonl")
  last: dict[str, float] = {}
  for record in rundir.read_jsonl(path) if os.path.exists(path) else []:
    last.update(_flatten(record))
  return last


def write_summary(workdir: str, index: dict[str, Any]) -> tuple[str, str]:
  """`summary.csv` (every final metric) and `summary.md` (the first `MD_METRICS`) of the sweep's points."""
  rows, metric_keys = [], []
  for entry in index["points"]:
    metrics = final_metrics(os.path.join(workdir, entry["subdir"])) if entry["status"] == "done" else {}
    metric_keys += [k for k in metrics if k not in metric_keys]
    overrides = {k.removeprefix("config."): v for k, v in entry["overrides"].items()}
    wall = entry.get("wall_seconds")
    rows.append({"point": entry["name"], **overrides, "status": entry["status"],
                 "wall_s": "" if wall is None else f"{wall:.1f}", **metrics})  # fmt: skip
  columns = list(dict.fromkeys(k for row in rows for k in row if k not in metric_keys)) + metric_keys
  text = io.StringIO()
  writer = csv.DictWriter(text, columns, restval="", lineterminator="\n")
  writer.writeheader()
  writer.writerows(rows)
  csv_path, md_path = os.path.join(workdir, "summary.csv"), os.path.join(workdir, "summary.md")
  rundir.atomic_write_text(csv_path, text.getvalue())

  def cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)

  shown = columns[: len(columns) - len(metric_keys) + MD_METRICS]
  lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
  lines += ["| " + " | ".join(cell(row.get(c, "")) for c in shown) + " |" for row in rows]
  if len(metric_keys) > MD_METRICS:
    lines += ["", f"The first {MD_METRICS} of {len(metric_keys)} metrics; summary.csv has them all."]
  rundir.atomic_write_text(md_path, "\n".join(lines) + "\n")
  return csv_path, md_path


# ---- cluster jobs --------------------------------------------------------------------------------------


def _portable(index: dict[str, Any], root: str) -> list[list[str]]:
  """Each point's command with the interpreter as `python` and paths under `root` relative to it, as
  a job that starts in `root` on another machine runs it."""
  out = []
  for entry in index["points"]:
    cmd = shlex.split(entry["command"])
    cmd[0] = "python"
    out.append([a.replace(root + os.sep, "") if a.startswith("--config=") else a for a in cmd])
  return out


def index_dir(index: dict[str, Any], i: int) -> str:
  """Point i's run directory (its command's --workdir)."""
  return shlex.split(index["points"][i]["command"])[-1].removeprefix("--workdir=")


def emit(kind: str, index: dict[str, Any], root: str) -> str:
  """The sweep as a cluster job script, run from `root` (the repository):

  - "slurm": a job array, one index a point (`sbatch [options] FILE`), each writing its `DONE` file
    when it succeeds; `DRY_RUN=1 SLURM_ARRAY_TASK_ID=i bash FILE` prints point i's command instead;
  - "tpu": one job per TPU slice through launch/tpu_pod.sh (`TPU_NAMES="n0 n1 ..." ZONE=z bash FILE`),
    all at once; DRY_RUN=1 passes through to tpu_pod.sh.
  The points' run directories resume, so a job rerun continues where it stopped.
  """
  if kind not in EMITS:
    raise ValueError(f"--emit={kind}: one of {', '.join(EMITS)}")
  commands = _portable(index, root)
  n = len(commands)
  head = [
    "#!/bin/bash",
    f"# lm-sweep: {n} point(s) of {index['launcher']} ({index['config']}), one run directory each.",
  ]
  if kind == "slurm":
    head += [
      "# Submit: sbatch [--time=... --gpus-per-node=...] FILE. A point reruns where it stopped.",
      "#SBATCH --job-name=lm-sweep",
      f"#SBATCH --array=0-{n - 1}",
      "#SBATCH --output=lm-sweep-%A_%a.out",
      "set -euo pipefail",
      f"cd {shlex.quote(root)}",
      'case "${SLURM_ARRAY_TASK_ID:?set by sbatch --array}" in',
      *(
        f"  {i}) cmd=({shlex.join(c)}); done_file={shlex.quote(os.path.join(index_dir(index, i), DONE))} ;;"
        for i, c in enumerate(commands)
      ),  # fmt: skip
      '  *) echo "no sweep point $SLURM_ARRAY_TASK_ID (0-' + str(n - 1) + ')" >&2; exit 2 ;;',
      "esac",
      'if [[ "${DRY_RUN:-0}" == 1 ]]; then echo "${cmd[*]@Q}"; exit 0; fi',
      '"${cmd[@]}" && touch "$done_file"  # lm-sweep with the same flags then skips it',
    ]
  else:
    head += [
      f"# One TPU slice per point: TPU_NAMES='slice0 ... slice{n - 1}' ZONE=... bash FILE",
      "set -euo pipefail",
      f"cd {shlex.quote(root)}",
      'read -ra slices <<<"${TPU_NAMES:?set TPU_NAMES to ' + str(n) + ' TPU VM names, one per point}"',
      f"(( ${{#slices[@]}} == {n} )) || "
      f'{{ echo "TPU_NAMES names ${{#slices[@]}} slice(s); this sweep needs {n}" >&2; exit 2; }}',
      "pids=()",
      *(
        f'TPU_NAME="${{slices[{i}]}}" launch/tpu_pod.sh {shlex.join(c[2:])} & pids+=($!)'
        for i, c in enumerate(commands)
      ),  # fmt: skip
      'status=0; for p in "${pids[@]}"; do wait "$p" || status=1; done; exit $status',
    ]
  return "\n".join(head) + "\n"


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
  """SIGTERM (a plain `kill`) raises KeyboardInterrupt while the sweep runs, as Ctrl-C does, so the
  points' processes stop with it (in the main thread only: elsewhere signals cannot be handled)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")

  previous = signal.signal(signal.SIGTERM, interrupt)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def _resolve(dotted: str) -> Callable[[str], Any]:
  module, _, name = dotted.rpartition(".")
  if not module:
    raise ValueError(f"--summary must be 'package.module.function', got {dotted!r}")
  return getattr(importlib.import_module(module), name)


def describe(index: dict[str, Any]) -> str:
  """One line: how many points, how many already done."""
  done = sum(e["status"] == "done" for e in index["points"])
  return f"{len(index['points'])} point(s) of {index['launcher']}, {done} already done"
