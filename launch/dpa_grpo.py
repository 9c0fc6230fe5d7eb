r"""Trains generator and verifier with DPA-GRPO (or a baseline) and writes the report.

The default config is the CPU-scale reproduction (warm start, DPA-GRPO, generator-only GRPO, the
report with the theory overlay; about 10 minutes on 2 cores). See configs/dpa_grpo.py,
docs/dpa_grpo.md.

  python -m launch.dpa_grpo --workdir=runs/dpa_grpo                 # CPU default, synthetic forms
  python -m launch.dpa_grpo --config=configs/dpa_grpo.py:tiny --workdir=/tmp/dpa_tiny
  python -m launch.dpa_grpo --workdir=/tmp/dpa_k3 --config.loss.kl=k3 --config.loss.beta=0.01 \
      --config.train.steps=50
  python -m launch.dpa_grpo --config=configs/dpa_grpo.py:qwen3_4b --workdir=... \
      --config.model.checkpoint=/models/Qwen3-4B --config.data.root=.../ty24/test_data
  python -m launch.dpa_grpo ... --dry_run   # checks the config, prints the plan for this host's
                                            # devices, writes nothing; exit 1 if it does not fit
"""

from dpa_grpo import reproduce
from dpa_grpo.config import ExperimentConfig
from launch import common
from lm import sharding

_CONFIG = common.define_config("config", "configs/dpa_grpo.py")
common.define_workdir()


def typed_config(config) -> ExperimentConfig:
  """The typed config of this launcher (lm-sweep checks every point with it)."""
  return ExperimentConfig.from_dict(config.to_dict())


_DRY_RUN = common.define_dry_run()


def main(argv):
  del argv
  config = common.typed(_CONFIG, typed_config)  # typed once, here
  sharding.initialize_distributed()
  if _DRY_RUN.value:  # accumulate, apply and the sampler as the config gives them
    from dpa_grpo import plan as dpa_plan

    common.dry_run(dpa_plan.check, _CONFIG.value)
  workdir = common.prepare_workdir(config)
  with common.work(f"{config.method} into {workdir}"):
    reproduce.run(config, workdir, allow_config_change=common.ALLOW_CONFIG_CHANGE.value)


def run():
  """The console entry point (setup.py)."""
  common.run(main)


if __name__ == "__main__":
  run()
