r"""Learns the artefacts (KACE trees, ablation trees, ACE playbook, GEPA prompt) that the methods of
`config.methods` read, into a run directory. See configs/kace.py and docs/kace.md ("Learning").

python -m launch.kace_build --workdir=/tmp/kace_build '--config.methods=("kace",)'     # CPU scale
python -m launch.kace_eval --workdir=/tmp/kace_eval --config.learn.dir=/tmp/kace_build \
    --config.kace.tree=/tmp/kace_build/kace/tree.json
python -m launch.kace_build --workdir=/tmp/kace_build --dry_run   # memory plan only; writes nothing
"""

from kace import budget, data, pipeline
from kace import config as kace_config
from launch import common
from lm import sharding

_CONFIG = common.define_config("config", "configs/kace.py")
common.define_workdir()
_DRY_RUN = common.define_dry_run()


def typed_config(config) -> kace_config.KaceConfig:
  """The typed config of this launcher (lm-sweep checks every point with it)."""
  return kace_config.KaceConfig.from_dict(config)


def main(_):
  config = common.typed(_CONFIG, typed_config)  # typed once, here
  sharding.initialize_distributed()
  if _DRY_RUN.value:
    from kace import plan as kace_plan

    common.dry_run(kace_plan.check, _CONFIG.value)
  workdir = common.prepare_workdir(config)
  with common.work(f"build into {workdir}"):
    try:
      pipeline.build(config, workdir)
    except (budget.EndpointError, data.DataSourceError) as e:  # one line, before any call
      common.fail(str(e))


def run():
  """The console entry point (setup.py)."""
  common.run(main)


if __name__ == "__main__":
  run()
