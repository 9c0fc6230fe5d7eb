"""KACE testbed v3's registered comparison: the trained solver and the learned teacher on every arm,
ten builds, each prediction judged and labelled tested or not by the scripted readers
(kace.v3_run; docs/kace_v3.md).

python -m launch.kace_v3 --workdir=runs/kace_v3
python -m launch.kace_v3 --workdir=/tmp/kace_v3_smoke --config=configs/kace_v3.py:smoke
python -m launch.kace_v3 --workdir=runs/kace_v3_b5 "--config.builds=(0,1,2,3,4)" --config.bootstrap=5000

Builds the solver and the teacher once into --config.cache_dir, measures the solver's gates on every
build's calibration split (a failed gate stops the run before the test split is read: verdicts.json
says which), then every arm build by build (build<b>.json: an interrupted run resumes at the next
build), the scripted readers, and report.md.
"""

from kace import v3_run
from launch import common

_CONFIG = common.define_config("config", "configs/kace_v3.py")
common.define_workdir()


def typed_config(config) -> v3_run.V3RunConfig:
  """The typed config of this launcher (lm-sweep checks every point with it)."""
  return v3_run.V3RunConfig.from_dict(config.to_dict())


def main(_):
  config = common.typed(_CONFIG, typed_config)  # typed once, here
  workdir = common.prepare_workdir(config.to_dict())
  with common.work(f"testbed v3, trained solver, into {workdir}"):
    record = v3_run.run(workdir, config)
  if "stopped" in record:
    common.fail(f"stopped: {record['stopped']} ({workdir}/verdicts.json)")
  with open(f"{workdir}/report.md", encoding="utf-8") as f:
    print(f.read())


def run():
  """The console entry point."""
  common.run(main)


if __name__ == "__main__":
  run()
