"""The latent-convention testbed: the solver's gates, every method once per seed, the pre-registered
predictions judged (kace.pipeline.testbed_comparison). See configs/kace.py:testbed and docs/kace.md.

python -m launch.kace_testbed --workdir=runs/kace_testbed
python -m launch.kace_testbed --workdir=runs/kace_testbed_identity --config.testbed.control=identity
"""

from absl import app, flags
from ml_collections import config_flags

from kace import config as kace_config
from kace import pipeline
from lm import rundir

_CONFIG = config_flags.DEFINE_config_file("config", "configs/kace.py:testbed", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumed if it exists).")


def main(_):
  config = kace_config.KaceConfig.from_dict(_CONFIG.value)  # typed once, here
  workdir = rundir.prepare_workdir(_WORKDIR.value, config)
  pipeline.testbed_comparison(config, workdir)
  print(open(f"{workdir}/report.md").read())


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir"])
  app.run(main)
