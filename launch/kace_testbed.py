"""The latent-convention testbed: the solver's gates, every method once per seed, the pre-registered
predictions judged (kace.pipeline.testbed_comparison). See configs/kace.py:testbed and docs/kace.md.

python -m launch.kace_testbed --workdir=runs/kace_testbed
python -m launch.kace_testbed --workdir=runs/kace_testbed_identity --config.testbed.control=identity

A solver that fails a gate stops the run (GateError) before any comparison: gates.json says which.
"""

import os

from absl import app, flags
from ml_collections import config_flags

from kace import config as kace_config
from kace import pipeline
from launch import common
from lm import sharding

_CONFIG = config_flags.DEFINE_config_file("config", "configs/kace.py:testbed", lock_config=True)


def main(_):
  sharding.initialize_distributed()
  config = kace_config.KaceConfig.from_dict(_CONFIG.value)  # typed once, here
  workdir = common.prepare_workdir(config)
  pipeline.testbed_comparison(config, workdir)
  with open(os.path.join(workdir, "report.md"), encoding="utf-8") as f:
    print(f.read())


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir"])
  app.run(main)
