"""One experiment end to end: warm start, the configured method, its baselines, the report.

`run(config, workdir)` is what `python -m launch.dpa_grpo` calls:

  warm_start/       a supervised warm start on the training cases (`config.warm_start.steps` > 0 and
                    no `model.checkpoint`): both roles start able to play, far from right;
  <method>/         `dpa_grpo.train.run` of `config.method` from that backbone (its resolved
                    config in config.json);
  <baseline>/       the same for every method of `config.compare` (e.g. generator-only GRPO), with
                    the same backbone, cases, rollout and optimiser, and its paper loss settings;
  report.md, report.json, figures/   `dpa_grpo.report`: accuracies and 8-case tables before and
                    after with 95% intervals, per-line accuracy curves, the theory overlay.

Every stage resumes: a finished stage is skipped, an interrupted run continues from its checkpoint.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ml_collections

from dpa_grpo import losses, report, train, warm_start
from lm import rundir

_log = logging.getLogger(__name__)


def method_config(
  config: ml_collections.ConfigDict, method: str, checkpoint: str
) -> ml_collections.ConfigDict:
  """`config` for `method` from `checkpoint`: a baseline takes its paper loss settings."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.method = method
  if checkpoint:
    c.model.checkpoint = checkpoint
  if method in losses.BASELINES and method != config.method:
    paper = losses.BaselineConfig.paper(method)
    c.baseline.update(beta=paper.beta, eps_low=paper.eps_low, eps_high=paper.eps_high)
  if method == "zero_shot":
    c.train.steps = 0
  return c


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs every stage (skipping finished ones) and returns the report's summary."""
  checkpoint = config.model.checkpoint
  if config.warm_start.steps > 0 and not checkpoint:
    train_cases, _ = train.load_data(config)
    checkpoint = warm_start.run(config, os.path.join(workdir, "warm_start"), train_cases)
  methods = (config.method, *(m for m in config.compare if m != config.method))
  for method in methods:
    _log.info("running %s", method)
    method_cfg = method_config(config, method, checkpoint)
    train.run(method_cfg, rundir.prepare_workdir(os.path.join(workdir, method), method_cfg))
  return report.write(workdir, config, methods)
