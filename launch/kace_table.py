"""The paper-style table: every method of `config.table.methods` on every benchmark of
`config.table.benchmarks` (learned artefacts built first), with the paper's numbers beside ours.
See configs/kace.py and docs/kace.md ("The table").

python -m launch.kace_table --workdir=/tmp/kace_table                    # CPU scale, synthetic maths
python -m launch.kace_table --workdir=/tmp/kace_table_3 '--config.table.methods=("best_of_n","tiered","kace")'
"""

from kace import budget, data, pipeline
from kace import config as kace_config
from launch import common
from lm import sharding

_CONFIG = common.define_config("config", "configs/kace.py")
common.define_workdir()


def typed_config(config) -> kace_config.KaceConfig:
  """The typed config of this launcher (lm-sweep checks every point with it)."""
  return kace_config.KaceConfig.from_dict(config)


def main(_):
  config = common.typed(_CONFIG, typed_config)  # typed once, here
  sharding.initialize_distributed()
  workdir = common.prepare_workdir(config)
  with common.work(f"table into {workdir}"):
    try:
      pipeline.table(config, workdir, allow_config_change=common.ALLOW_CONFIG_CHANGE.value)
    except (budget.EndpointError, data.DataSourceError) as e:  # one line, before any call
      common.fail(str(e))
  if not config.plan.dry_run:  # a dry run printed its plans instead
    print(open(f"{workdir}/table.md").read())


def run():
  """The console entry point (setup.py)."""
  common.run(main)


if __name__ == "__main__":
  run()
