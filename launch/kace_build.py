"""Learns the artefacts (KACE trees, ablation trees, ACE playbook, GEPA prompt) that the methods of
`config.methods` read, into a run directory. See configs/kace.py and docs/kace.md ("Learning").

python -m launch.kace_build --workdir=/tmp/kace_build '--config.methods=("kace",)'     # CPU scale
python -m launch.kace_eval --workdir=/tmp/kace_eval --config.learn.dir=/tmp/kace_build \
    --config.kace.tree=/tmp/kace_build/kace/tree.json
"""

from absl import app, flags
from ml_collections import config_flags

from kace import config as kace_config
from kace import pipeline
from launch import common
from lm import sharding

_CONFIG = config_flags.DEFINE_config_file("config", "configs/kace.py", lock_config=True)


def main(_):
  sharding.initialize_distributed()
  config = kace_config.KaceConfig.from_dict(_CONFIG.value)  # typed once, here
  workdir = common.prepare_workdir(config)
  pipeline.build(config, workdir)


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir"])
  app.run(main)
