"""Trains generator and verifier with DPA-GRPO (or a baseline) and writes the report.

The default config is the CPU-scale reproduction (warm start, DPA-GRPO, generator-only GRPO, the
report with the theory overlay; about 10 minutes on 2 cores). See configs/dpa_grpo.py,
docs/dpa_grpo.md.

  python -m launch.dpa_grpo --workdir=runs/dpa_grpo                 # CPU default, synthetic forms
  python -m launch.dpa_grpo --config=configs/dpa_grpo.py:tiny --workdir=/tmp/dpa_tiny
  python -m launch.dpa_grpo --config=configs/dpa_grpo.py:qwen3_4b --workdir=... \
      --config.model.checkpoint=/models/Qwen3-4B --config.data.root=.../ty24/test_data
"""

from absl import app, flags
from ml_collections import config_flags

from dpa_grpo import reproduce
from dpa_grpo.config import ExperimentConfig
from launch import common
from lm import sharding

_CONFIG = config_flags.DEFINE_config_file("config", "configs/dpa_grpo.py", lock_config=True)


def main(argv):
  del argv
  sharding.initialize_distributed()
  config = ExperimentConfig.from_dict(_CONFIG.value.to_dict())  # typed once, here
  workdir = common.prepare_workdir(config)
  reproduce.run(config, workdir, allow_config_change=common.ALLOW_CONFIG_CHANGE.value)


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir"])
  app.run(main)
