"""The latent-convention testbed: the solver's gates, every method once per seed, the pre-registered
predictions judged (kace.pipeline.testbed_comparison). See configs/kace.py:testbed and docs/kace.md.

python -m launch.kace_testbed --workdir=runs/kace_testbed
python -m launch.kace_testbed --workdir=runs/kace_testbed_identity --config.testbed.control=identity

A solver that fails a gate stops the run (GateError) before any comparison: gates.json says which.
`--gates_only` builds (or finds) the solver and measures its gates and its card map (card_map.json:
the solve rate with each card alone), nothing else (a solver build).
"""

from absl import flags

from kace import config as kace_config
from kace import pipeline
from launch import common
from lm import sharding

_CONFIG = common.define_config("config", "configs/kace.py:testbed")
common.define_workdir()
_GATES_ONLY = flags.DEFINE_bool("gates_only", False, "only build the solver; measure its gates and card map")


def typed_config(config) -> kace_config.KaceConfig:
  """The typed config of this launcher (lm-sweep checks every point with it)."""
  return kace_config.KaceConfig.from_dict(config)


def main(_):
  config = common.typed(_CONFIG, typed_config)  # typed once, here
  sharding.initialize_distributed()
  with common.work(f"testbed into {common.WORKDIR.value}"):
    path = pipeline.run_testbed(
      common.WORKDIR.value,
      config,
      allow_config_change=common.ALLOW_CONFIG_CHANGE.value,
      gates_only=_GATES_ONLY.value,
    )
  with open(path, encoding="utf-8") as f:
    print(f.read())


def run():
  """The console entry point (setup.py)."""
  common.run(main)


if __name__ == "__main__":
  run()
