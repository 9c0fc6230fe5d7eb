"""Writes the DPA-GRPO theory figures and their numbers. See configs/theory.py and docs/theory.md.

python -m launch.theory --config=configs/theory.py --workdir=/tmp/theory
"""

from absl import app, flags
from ml_collections import config_flags

from dpa_grpo import plots
from dpa_grpo.theory_config import TheoryConfig
from launch import common
from lm import sharding

_CONFIG = config_flags.DEFINE_config_file("config", "configs/theory.py", lock_config=True)


def main(_):
  sharding.initialize_distributed()
  config = TheoryConfig.from_dict(_CONFIG.value.to_dict())  # typed once, here
  workdir = common.prepare_workdir(config)
  plots.run_theory(config, workdir)


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir"])
  app.run(main)
