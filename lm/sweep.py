"""Config-override sweeps for any launcher: every point a sub-directory, an index, resumable.

A config file defines its sweep beside `get_config`:

    def get_sweep(h):
      return h.product([h.sweep("config.loss.kl", ["k1", "k3"]), h.sweep("config.loss.beta", [0.04, 1.0])])

`h.sweep(key, values)` is one axis, `h.product` its cartesian product, `h.zip` an element-wise
pairing; each point is a dict {"config.a.b": value} that becomes `--config.a.b=value` on the
launcher's command line. `run_sweep` runs the points one after another as subprocesses
(`python -m <launcher> --config=<file[:preset]> --config.a.b=v ... --workdir=<workdir>/<point>`), or
with `dry_run` prints one command per point for a cluster. `<workdir>/index.json` records each
point's overrides, sub-directory, status ("planned", "running", "done", "failed"), return code and
wall time; a re-run skips the points already "done".
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from lm import rundir

Point = dict[str, Any]


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


def load_points(config_arg: str) -> list[Point]:
  """The points of the sweep that `get_sweep` defines in the config file of `file.py[:preset]`."""
  path = config_arg.split(":", 1)[0]
  if not os.path.exists(path):
    raise FileNotFoundError(f"sweep config file {path!r} (from --config={config_arg}) does not exist")
  spec = importlib.util.spec_from_file_location("_sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_sweep"):
    raise ValueError(f"{path} defines no get_sweep(h)")
  points = module.get_sweep(Helper())
  if not points:
    raise ValueError(f"{path}: get_sweep(h) returned no points")
  return points


def point_name(index: int, point: Point) -> str:
  """A sub-directory name readable at a glance: '003_loss.kl=k3,loss.beta=0.2'."""
  parts = [f"{k.removeprefix('config.')}={v}" for k, v in point.items()]
  return f"{index:03d}_" + re.sub(r"[^A-Za-z0-9._=,+-]", "_", ",".join(parts))[:150]


def command(launcher: str, config_arg: str, point: Point, workdir: str) -> list[str]:
  return [
    sys.executable,
    "-m",
    launcher,
    f"--config={config_arg}",
    *(f"--{k}={v}" for k, v in point.items()),
    f"--workdir={workdir}",
  ]


def run_sweep(
  config_arg: str,
  launcher: str,
  workdir: str,
  *,
  dry_run: bool = False,
  summary: str = "",
) -> dict[str, Any]:
  """Runs (or, with dry_run, prints) every point of the sweep; returns the index.

  Args:
    config_arg: the launcher's `--config` value, `file.py[:preset]`; its file defines `get_sweep`.
    launcher: module run per point with `python -m`, e.g. "launch.theory".
    workdir: the sweep's directory; point i runs in `<workdir>/<point_name(i, point)>`.
    dry_run: print one shell command per point instead of running them.
    summary: optional "package.module.function" called as function(workdir) once every point is done.

  Raises:
    RuntimeError: naming the failed points (after running all the others).
  """
  points = load_points(config_arg)
  index_path = os.path.join(workdir, "index.json")
  previous = rundir.read_json(index_path) if os.path.exists(index_path) else {"points": []}
  done = {p["name"] for p in previous["points"] if p["status"] == "done"}
  index = {
    "config": config_arg,
    "launcher": launcher,
    "points": [
      {
        "name": point_name(i, p),
        "overrides": p,
        "subdir": point_name(i, p),
        "status": "done" if point_name(i, p) in done else "planned",
      }
      for i, p in enumerate(points)
    ],
  }
  os.makedirs(workdir, exist_ok=True)
  rundir.write_json(index_path, index)
  for entry in index["points"]:
    cmd = command(launcher, config_arg, entry["overrides"], os.path.join(workdir, entry["subdir"]))
    entry["command"] = shlex.join(cmd)
    if dry_run:
      print(entry["command"])
      continue
    if entry["status"] == "done":
      continue
    entry["status"] = "running"
    rundir.write_json(index_path, index)
    sub = os.path.join(workdir, entry["subdir"])
    os.makedirs(sub, exist_ok=True)
    start = time.time()
    with open(os.path.join(sub, "sweep.log"), "w") as log:
      rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    entry.update(status="done" if rc == 0 else "failed", returncode=rc, wall_seconds=time.time() - start)
    rundir.write_json(index_path, index)
  rundir.write_json(index_path, index)
  failed = [e["name"] for e in index["points"] if e["status"] == "failed"]
  if failed:
    raise RuntimeError(f"{len(failed)} sweep point(s) failed (see their sweep.log): {failed}")
  if summary and not dry_run:
    _resolve(summary)(workdir)
  return index


def _resolve(dotted: str) -> Callable[[str], Any]:
  module, _, name = dotted.rpartition(".")
  if not module:
    raise ValueError(f"--summary must be 'package.module.function', got {dotted!r}")
  return getattr(importlib.import_module(module), name)
