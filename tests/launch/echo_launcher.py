"""A launcher for the sweep tests: the project's launcher conventions, no JAX, one line per run."""

import os

from absl import app, flags
from ml_collections import config_flags

from lm import rundir

_CONFIG = config_flags.DEFINE_config_file("config", None, lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.")


def main(_):
  workdir = rundir.prepare_workdir(_WORKDIR.value, _CONFIG.value)
  with open(os.path.join(workdir, "runs.txt"), "a") as f:
    f.write("run\n")


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir"])
  app.run(main)
