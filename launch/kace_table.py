"""The paper-style table: every method of `config.table.methods` on every benchmark of
`config.table.benchmarks` (learned artefacts built first), with the paper's numbers beside ours.
See configs/kace.py and docs/kace.md ("The table").

python -m launch.kace_table --workdir=/tmp/kace_table                    # CPU scale, synthetic maths
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
  pipeline.table(config, workdir, allow_config_change=common.ALLOW_CONFIG_CHANGE.value)
  print(open(f"{workdir}/table.md").read())


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir"])
  app.run(main)
