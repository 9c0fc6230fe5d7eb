"""The DPA-GRPO copy-and-check testbed: warm start, step-0 gates, every arm x seed, the report with
the pre-registered predictions judged (dpa_grpo.testbed). See configs/dpa_grpo.py:testbed and
docs/dpa_grpo.md (the testbed section).

  python -m launch.dpa_testbed --workdir=runs/dpa_testbed
  python -m launch.dpa_testbed --workdir=/tmp/t --seeds=0 --arms=dpa_k1,grpo --config.train.steps=2
  python -m launch.dpa_testbed --workdir=/tmp/t --dry_run   # the step's memory plan; writes nothing

A warm start that fails a gate stops the run (GateError) before any arm trains: gates.json says
which. A finished arm / seed is not rerun; a rerun with another config stops unless
--allow_config_change.
"""

import os

from absl import flags

from dpa_grpo import testbed
from dpa_grpo.config import ExperimentConfig
from launch import common
from lm import sharding

_CONFIG = common.define_config("config", "configs/dpa_grpo.py:testbed")
common.define_workdir()
_DRY_RUN = common.define_dry_run()
_ARMS = flags.DEFINE_list(
  "arms",
  [],
  f"Arms to run, of {list(testbed.ALL_ARMS)}; empty: the preset's (v1 {list(testbed.ARMS)}, "
  f"testbed_v2 {list(testbed.V2_ARMS)}).",
)
_SEEDS = flags.DEFINE_list(
  "seeds", [], f"Seeds of every arm; empty: the preset's (v1 {list(testbed.SEEDS)}, testbed_v2 0-8)."
)

_OTHER = flags.DEFINE_string(
  "other_warm_start",
  "",
  "A testbed work directory of the same preset from another warm start (--config.warm_start.seed=1); "
  "the report's ODE, fitted on this one's seed 0, also predicts its runs (docs/theory.md).",
)


_WAIVE = flags.DEFINE_list(
  "waive_gates",
  [],
  f"Step-0 gates, of {list(testbed.GATE_NAMES)}, whose failure does not stop the run: only under a "
  "dated protocol amendment whose judged rows do not read them (docs/dpa_grpo.md). A waived failure "
  "is printed in the gates and the report; the waiver is part of the work directory's stamp.",
)


_EXPORT = flags.DEFINE_string(
  "export_warm_start",
  "",
  "Instead of the arms: train the preset's warm start (never a committed one), play its step-0 "
  "gates into --workdir and, if every gate passes, write it to this directory for "
  "warm_start.from_dir (how testbed v3's was chosen: docs/dpa_grpo.md, 'Testbed v3').",
)


def typed_config(config) -> ExperimentConfig:
  """The typed config of this launcher (lm-sweep checks every point with it)."""
  return ExperimentConfig.from_dict(config.to_dict())


def main(argv):
  del argv
  config = common.typed(_CONFIG, typed_config)  # typed once, here
  unknown = sorted(set(_ARMS.value) - set(testbed.ALL_ARMS))
  if unknown:
    common.fail(f"--arms: unknown arm(s) {unknown}; arms are {list(testbed.ALL_ARMS)}")
  unknown = sorted(set(_WAIVE.value) - set(testbed.GATE_NAMES))
  if unknown:
    common.fail(f"--waive_gates: unknown gate(s) {unknown}; gates are {list(testbed.GATE_NAMES)}")
  try:
    arms = tuple(_ARMS.value) or testbed.default_arms(config)
    seeds = tuple(int(s) for s in _SEEDS.value) or (
      testbed.V2_SEEDS if testbed.is_v2(config) else testbed.SEEDS
    )
  except ValueError:
    common.fail(f"--seeds must be integers, got {_SEEDS.value}")
  sharding.initialize_distributed()
  if _DRY_RUN.value:  # every arm trains the same programs: accumulate, apply, the sampler
    from dpa_grpo import plan as dpa_plan

    common.dry_run(dpa_plan.check, _CONFIG.value)
  workdir = common.WORKDIR.value
  if _EXPORT.value:
    with common.work(f"warm start and its gates into {workdir}, then {_EXPORT.value}"):
      testbed.select_warm_start(config, workdir, _EXPORT.value)
    return
  with common.work(f"testbed into {workdir}"):
    testbed.run(
      config,
      workdir,
      arms=arms,
      seeds=seeds,
      allow_config_change=common.ALLOW_CONFIG_CHANGE.value,
      other_warm_start=_OTHER.value,
      waive_gates=tuple(_WAIVE.value),
    )
  with open(os.path.join(workdir, "report.md"), encoding="utf-8") as f:
    print(f.read())


def run():
  """The console entry point (setup.py)."""
  common.run(main)


if __name__ == "__main__":
  run()
