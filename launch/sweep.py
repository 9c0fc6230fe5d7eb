r"""Runs a sweep of a launcher's config: one run directory a point, N at a time, resumable, and a
summary table (summary.csv, summary.md) of each point's final metrics. See lm/sweep.py.

  lm-sweep --config=configs/dpa_grpo.py:tiny --launcher=launch.dpa_grpo --workdir=/tmp/sweep \
      --sweep=loss.beta=0.01,0.04 --sweep=seed=0:2 --workers=2        # 2 x 3 = 6 points
  lm-sweep --config=configs/theory.py:smoke --launcher=launch.theory --workdir=/tmp/theory_sweep \
      --sweep=loss.kl/loss.beta=k1/0.04,k3/0.2 --config.sa.seeds=4    # a zip: 2 points
  lm-sweep --config=configs/theory.py --launcher=launch.theory --workdir=/tmp/s --dry_run  # get_sweep
  lm-sweep ... --emit=slurm > sweep.sbatch && sbatch sweep.sbatch     # a SLURM job array

Axes: each --sweep is one axis, `key=a,b,c` or `key=lo:hi[:step]` (integers, both ends included);
several --sweep flags multiply; `k1/k2=a1/a2,b1/b2` moves keys together (a zip). Without --sweep the
config file's get_sweep(h) gives the points. --config.* overrides apply to every point.

The launcher, the preset, every key and every point's typed config are checked before anything
runs or is written (one line, exit 2). --dry_run prints each point's command and writes nothing. A
rerun skips the points already done; a point stopped midway resumes from its run directory.
--emit=slurm prints a SLURM array job (one index a point), --emit=tpu one launch/tpu_pod.sh job per
TPU slice; both write nothing.
"""

import difflib
import importlib
import importlib.util
import os
import pkgutil
import sys

from absl import flags

import launch
from launch import common
from lm import progress, sweep

_CONFIG = common.define_config("config", None, "The launcher's config, file.py[:preset].")
common.define_workdir(config_change=False)
_LAUNCHER = flags.DEFINE_string("launcher", None, "The launcher run per point, e.g. launch.dpa_grpo.")
_SWEEP = flags.DEFINE_multi_string(
  "sweep", [], "An axis, key=a,b,c or key=lo:hi (repeat: product; k1/k2=a1/a2,b1/b2: zip)."
)
_WORKERS = flags.DEFINE_integer("workers", 1, "Points run at once, each its own process.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print one command per point; run and write nothing.")
_EMIT = flags.DEFINE_enum("emit", None, list(sweep.EMITS), "Print a cluster job instead of running.")
_SUMMARY = flags.DEFINE_string("summary", "", "Optional package.module.function(workdir) run at the end.")


def sweepable() -> list[str]:
  """The launchers lm-sweep runs: those of launch/ with a `typed_config` (a run directory each)."""
  names = []
  for info in pkgutil.iter_modules(launch.__path__):
    with open(os.path.join(launch.__path__[0], f"{info.name}.py"), encoding="utf-8") as f:
      if "\ndef typed_config(" in f.read():
        names.append(f"launch.{info.name}")
  return sorted(names)


def _find(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except ImportError:  # a parent package that does not exist
    return False


def load_launcher(name: str):
  """The launcher module, imported; one line and exit 2 when it is not one lm-sweep can run (a
  module outside launch/, such as a test's, runs if it defines `typed_config`)."""
  valid = sweepable()
  if name not in valid and (name.startswith("launch.") or not _find(name)):
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    why = "writes no run directory" if _find(name) else "no such module"
    common.fail(f"--launcher={name}: {why}" + (f"; did you mean {close[0]}?" if close else "")
                + f" (launchers: {', '.join(valid)})")  # fmt: skip
  module = importlib.import_module(name)
  if not hasattr(module, "typed_config"):
    common.fail(f"--launcher={name}: defines no typed_config(config), so its points cannot be checked")
  reads = (common.SECOND_DEFAULTS.get("config") or "").partition(":")[0]
  given, _ = common.config_source("config")
  if reads and os.path.basename(reads) != os.path.basename(given):
    common.fail(f"--config={os.path.relpath(given, common.ROOT)}: {name} reads {reads}, not this file")
  return module


def checked_points(config_arg: str, module) -> tuple[list[sweep.Point], list[str]]:
  """The sweep's points and its fixed overrides, each point's typed config built (nothing written)."""
  fixed = [a for a in sys.argv[1:] if a.startswith(("--config.", "-config."))]
  try:
    points = sweep.parse_axes(_SWEEP.value) if _SWEEP.value else sweep.load_points(config_arg)
  except (ValueError, FileNotFoundError) as e:
    common.fail(str(e))
  for i, point in enumerate(points):
    args = [*fixed, *(f"--{k}={v}" for k, v in point.items())]
    try:
      config = common.config_with_overrides(config_arg, args)
      common.build_typed("config", config, module.typed_config)
    except (ValueError, TypeError, KeyError) as e:
      common.fail(f"point {sweep.point_name(i, point)}: {e}")
  return points, fixed


def main(_):
  path, preset = common.config_source("config")
  config_arg = f"{path}:{preset}" if preset else path
  module = load_launcher(_LAUNCHER.value)
  points, fixed = checked_points(config_arg, module)
  if _WORKERS.value < 1:
    common.fail(f"--workers={_WORKERS.value}: at least 1")
  workdir = common.WORKDIR.value  # absolute unless a URL (gs://...: a TPU slice's bucket)
  workdir = workdir if "://" in workdir else os.path.abspath(workdir)
  index = sweep.plan(config_arg, _LAUNCHER.value, workdir, points, fixed)
  if _EMIT.value:
    print(sweep.emit(_EMIT.value, index, common.ROOT), end="")
    return
  progress.say(f"lm-sweep: {sweep.describe(index)}; into {workdir}")
  try:
    sweep.run_sweep(config_arg, _LAUNCHER.value, workdir, points=points, fixed=fixed,
                    workers=_WORKERS.value, dry_run=_DRY_RUN.value, summary=_SUMMARY.value)  # fmt: skip
  except RuntimeError as e:
    common.fail(str(e))
  except KeyboardInterrupt:  # Ctrl-C or kill: the points' processes are stopped with it
    progress.say("lm-sweep: stopped; the same command resumes it (finished points are skipped)")
    sys.exit(130)
  if not _DRY_RUN.value:
    progress.say(f"lm-sweep: done; the table is {os.path.join(workdir, 'summary.md')}")


def run():
  """The console entry point (setup.py)."""
  common.run(main, required=("config", "launcher", "workdir"))


if __name__ == "__main__":
  run()
