"""Evaluates KACE and its baselines into a run directory. See configs/kace.py and docs/kace.md.

python -m launch.kace_eval --workdir=/tmp/kace_run                      # CPU scale, a few minutes
python -m launch.kace_eval --config=configs/kace.py:openai --workdir=... --config.roles.solver.base_url=...
"""

from absl import app, flags
from ml_collections import config_flags

from kace import config as kace_config
from kace import evaluate
from launch import common
from lm import sharding

_CONFIG = config_flags.DEFINE_config_file("config", "configs/kace.py", lock_config=True)


def main(_):
  sharding.initialize_distributed()
  config = kace_config.KaceConfig.from_dict(_CONFIG.value)  # typed once, here
  # resolved first: evaluate.run records the resolved config, which a resume must compare against
  config = evaluate.resolve(config)
  workdir = common.prepare_workdir(config)
  evaluate.run(config, workdir)


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir"])
  app.run(main)
