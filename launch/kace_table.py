"""The paper-style table: every method of `config.table.methods` on every benchmark of
`config.table.benchmarks` (learned artefacts built first), with the paper's numbers beside ours.
See configs/kace.py and docs/kace.md ("The table").

python -m launch.kace_table --workdir=/tmp/kace_table                    # CPU scale, synthetic maths
"""

from absl import app, flags
from ml_collections import config_flags

from kace import config as kace_config
from kace import pipeline
from lm import rundir, sharding

_CONFIG = config_flags.DEFINE_config_file("config", "configs/kace.py", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumed if it exists).")


def main(_):
  sharding.initialize_distributed()
  config = kace_config.KaceConfig.from_dict(_CONFIG.value)  # typed once, here
  workdir = rundir.prepare_workdir(_WORKDIR.value, config)
  pipeline.table(config, workdir)
  print(open(f"{workdir}/table.md").read())


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir"])
  app.run(main)
