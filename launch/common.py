"""The run-directory flags every launcher shares, and their one rule (`lm.rundir.prepare_workdir`).

A run directory belongs to one resolved config: a rerun whose config differs beyond a few safe keys
(step counts, logging cadence; `lm.rundir.SAFE_CONFIG_KEYS`) stops and names the differing keys,
unless `--allow_config_change` says the change is meant (the old config is then kept beside as
`config.<n>.json`). Stages a launcher writes into sub-directories follow the same flag.
"""

from typing import Any

from absl import flags

from lm import rundir

WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (created; resumed if it exists).")
ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
  "allow_config_change",
  False,
  "Resume a run directory whose saved config.json differs beyond the safe keys (the old one is "
  "kept as config.<n>.json). Without it such a rerun stops and names the differing keys.",
)


def prepare_workdir(config: Any) -> str:
  """`--workdir` created, checked against and stamped with `config` (see the module docstring)."""
  return rundir.prepare_workdir(WORKDIR.value, config, allow_changes=ALLOW_CONFIG_CHANGE.value)
