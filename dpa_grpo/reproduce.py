"""One experiment end to end: warm start, the configured method, its baselines, the report.

`run(config, workdir)` is what `python -m launch.dpa_grpo` calls:

  warm_start/       a supervised warm start on the training cases (`config.warm_start.steps` > 0 and
                    no `model.checkpoint`): both roles start able to play, far from right;
  <method>/         `dpa_grpo.train.run` of `config.method` from that backbone (its resolved
                    config in config.json);
  <baseline>/       the same for every method of `config.compare` (e.g. generator-only GRPO), with
                    the same backbone, cases, rollout and optimiser, and its own loss settings
                    (`baseline.<method>`, by default its paper's);
  report.md, report.json, figures/   `dpa_grpo.report`: accuracies and 8-case tables before and
                    after with 95% intervals, per-line accuracy curves, the theory overlay.

Every stage resumes: a finished stage is skipped, an interrupted run continues from its checkpoint.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from dpa_grpo import config as config_lib
from dpa_grpo import report, setup, train, warm_start
from lm import rundir

_log = logging.getLogger(__name__)


def run(
  config: config_lib.ExperimentConfig, workdir: str, *, allow_config_change: bool = False
) -> dict[str, Any]:
  """Runs every stage (skipping finished ones) and returns the report's summary. Each stage's
  directory follows `allow_config_change` as the top one does (`lm.rundir.prepare_workdir`)."""
  checkpoint = config.model.checkpoint
  if config.warm_start.steps > 0 and not checkpoint:
    train_cases, _ = setup.load_data(config.data)
    checkpoint = warm_start.run(config, os.path.join(workdir, "warm_start"), train_cases)
  methods = (config.method, *(m for m in config.compare if m != config.method))
  for method in methods:
    _log.info("running %s", method)
    method_cfg = config.for_method(method, checkpoint)
    train.run(
      method_cfg,
      rundir.prepare_workdir(os.path.join(workdir, method), method_cfg, allow_changes=allow_config_change),
    )
  return report.write(workdir, config, methods)
