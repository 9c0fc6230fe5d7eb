"""Writes the DPA-GRPO theory figures and their numbers. See configs/theory.py and docs/theory.md.

python -m launch.theory --config=configs/theory.py --workdir=/tmp/theory
python -m launch.theory --config=configs/theory.py:smoke --workdir=/tmp/theory_k3 --config.loss.kl=k3
"""

from dpa_grpo import plots
from dpa_grpo.theory_config import TheoryConfig
from launch import common
from lm import sharding

_CONFIG = common.define_config("config", "configs/theory.py")
common.define_workdir()


def typed_config(config) -> TheoryConfig:
  """The typed config of this launcher (lm-sweep checks every point with it)."""
  return TheoryConfig.from_dict(config.to_dict())


def main(_):
  config = common.typed(_CONFIG, typed_config)  # typed once, here
  sharding.initialize_distributed()
  workdir = common.prepare_workdir(config)
  with common.work(f"theory into {workdir}"):
    plots.run_theory(config, workdir)


def run():
  """The console entry point (setup.py)."""
  common.run(main)


if __name__ == "__main__":
  run()
