"""Testbed v3's scripted readers on every arm, with the programmatic teacher (no model): the verdicts
the registration (docs/kace_v3.md) puts beside each prediction. See kace/v3_verdicts.py.

python -m launch.kace_v3_readers --workdir=/tmp/kace_v3_readers
"""

from kace import v3_verdicts
from launch import common

common.define_workdir(config_change=False)  # no config to change: the registered design is code


def main(_):
  with common.work(f"testbed v3 scripted readers into {common.WORKDIR.value}"):
    v3_verdicts.run(common.WORKDIR.value)
  with open(f"{common.WORKDIR.value}/readers.md", encoding="utf-8") as f:
    print(f.read())


def run():
  """The console entry point."""
  common.run(main)


if __name__ == "__main__":
  run()
