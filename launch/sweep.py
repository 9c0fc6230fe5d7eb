"""Runs every point of a config file's sweep (`get_sweep`) with a launcher. See lm/sweep.py.

  python -m launch.sweep --config=configs/theory.py --launcher=launch.theory --workdir=/tmp/sweep \
      --summary=dpa_grpo.plots.summarize_sweep

Unlike the other launchers this one takes `--config` as a string (passed through to every point,
whose launcher loads it) and starts no JAX runtime (each point's launcher starts its own).
"""

from absl import flags

from launch import common
from lm import sweep

_CONFIG = flags.DEFINE_string(
  "config", None, "Config file of the launcher, file.py[:preset]; defines get_sweep."
)
_LAUNCHER = flags.DEFINE_string("launcher", None, "Module run per point with python -m, e.g. launch.theory.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print one command per point instead of running them.")
_SUMMARY = flags.DEFINE_string(
  "summary", "", "Optional package.module.function(workdir) run after all points."
)


def main(_):
  sweep.run_sweep(
    common.resolve_config_path(_CONFIG.value),
    _LAUNCHER.value,
    common.WORKDIR.value,
    dry_run=_DRY_RUN.value,
    summary=_SUMMARY.value,
  )


def run():
  """The console entry point (setup.py)."""
  common.run(main, required=("config", "launcher", "workdir"))


if __name__ == "__main__":
  run()
