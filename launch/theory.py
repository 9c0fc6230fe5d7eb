"""Writes the DPA-GRPO theory figures and their numbers. See configs/theory.py and docs/theory.md.

python -m launch.theory --config=configs/theory.py --workdir=/tmp/theory
"""

from dpa_grpo import plots
from dpa_grpo.theory_config import TheoryConfig
from launch import common
from lm import sharding

_CONFIG = common.define_config("config", "configs/theory.py")


def main(_):
  config = common.typed(_CONFIG, lambda c: TheoryConfig.from_dict(c.to_dict()))  # typed once, here
  sharding.initialize_distributed()
  workdir = common.prepare_workdir(config)
  with common.work(f"theory into {workdir}"):
    plots.run_theory(config, workdir)


def run():
  """The console entry point (setup.py)."""
  common.run(main)


if __name__ == "__main__":
  run()
