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

import sys

from absl import flags

from dpa_grpo import reproduce
from dpa_grpo.config import ExperimentConfig
from launch import common
from lm import sharding

_CONFIG = common.define_config("config", "configs/dpa_grpo.py")
common.define_workdir()


def typed_config(config) -> ExperimentConfig:
  """The typed config of this launcher (lm-sweep checks every point with it)."""
  return ExperimentConfig.from_dict(config.to_dict())


_DRY_RUN = flags.DEFINE_bool(
  "dry_run",
  False,
  "Check the config, compile its programs for this host's devices and print their memory against "
  "the budget (lm.plan), then stop: nothing is written, --workdir is not created. Exit 1 if a "
  "program does not fit.",
)


def dry_run(config_dict: dict) -> bool:
  """Prints the plan of the config's programs (accumulate, apply, the sampler) for this host's
  devices (`dpa_grpo.plan.check`); whether they fit."""
  from dpa_grpo import plan as dpa_plan
  from lm import plan as plan_lib

  path, preset = common.config_source("config")
  record = plan_lib.run_plan(
    dpa_plan.check, f"{path}:{preset}", config_dict, plan_lib.local_target(), plan_lib.HEADROOM
  )
  print(plan_lib.summary(record))
  return bool(record.get("fits"))


def main(argv):
  del argv
  config = common.typed(_CONFIG, typed_config)  # typed once, here
  sharding.initialize_distributed()
  if _DRY_RUN.value:
    sys.exit(0 if dry_run(_CONFIG.value.to_dict()) else 1)
  workdir = common.prepare_workdir(config)
  with common.work(f"{config.method} into {workdir}"):
    reproduce.run(config, workdir, allow_config_change=common.ALLOW_CONFIG_CHANGE.value)


def run():
  """The console entry point (setup.py)."""
  common.run(main)


if __name__ == "__main__":
  run()
