"""Evaluates KACE and its baselines into a run directory. See configs/kace.py and docs/kace.md.

python -m launch.kace_eval --workdir=/tmp/kace_run                      # CPU scale, a few minutes
python -m launch.kace_eval --config=configs/kace.py:openai --workdir=... --config.roles.solver.base_url=...
python -m launch.kace_eval --workdir=/tmp/kace_run --dry_run   # the in-process roles' memory plan for
                                                                # this host's devices; writes nothing
"""

from kace import budget, data, evaluate, methods
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
  if _DRY_RUN.value:  # before `resolve`, which may build the CPU solver into its cache
    from kace import plan as kace_plan

    common.dry_run(kace_plan.check, _CONFIG.value)
  # resolved first: evaluate.run records the resolved config, which a resume must compare against
  with common.work(f"evaluation into {common.WORKDIR.value}"):
    config = evaluate.resolve(config)
    if not config.plan.dry_run:  # a plan needs no artefact; a run stops here, before any write
      try:
        methods.check_artifacts(config.methods, config.method_options())
      except methods.MissingArtifact as e:
        common.fail(f"--config.methods: {e}")
    workdir = common.prepare_workdir(config)
    try:
      evaluate.run(config, workdir)
    except (budget.EndpointError, data.DataSourceError) as e:  # one line, before any call
      common.fail(str(e))


def run():
  """The console entry point (setup.py)."""
  common.run(main)


if __name__ == "__main__":
  run()
