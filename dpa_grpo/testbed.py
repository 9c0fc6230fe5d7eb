"""The copy-and-check testbed: warm start, step-0 gates, arms x seeds, the judged predictions.

`run(config, workdir, arms, seeds)` is what `python -m launch.dpa_testbed` calls, on the `testbed`
preset of configs/dpa_grpo.py (copy-and-check cases, `dpa_grpo.envs.copycheck`):

  warm_start/<key>/  one supervised warm start per warm-start-relevant config (`warm_start_key`),
                     shared by every arm and seed and by reruns; or the committed one that
                     `warm_start.from_dir` names (testbed v3), checked against the key;
  gates.json         a step-0 play of a separate validation draw (never the test split) with the
                     warm-started roles at the training temperature: P(x right) per line, the
                     verifier's SAC rate on wrong and on right drafts, P(z right | x wrong). A
                     failed gate raises `GateError` before any arm trains (fix the testbed, never
                     the gate); gates/records.jsonl keeps every unit (the ODE's game is estimated
                     from it, not from training);
  <arm>/seed<k>/     `dpa_grpo.train.run` of the arm (`ARMS`) with seed k; a finished run
                     (summary.json) is not rerun;
  report.md, report.json, figures/   `dpa_grpo.testbed_report`, rewritten after every run.

Every stage resumes, and every run directory follows `allow_config_change` as the launcher's does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Sequence
from typing import Any

from dpa_grpo import config as config_lib
from dpa_grpo import game, metrics, rollout, setup, testbed_report, train, warm_start
from dpa_grpo.envs import copycheck
from dpa_grpo.testbed_arms import (  # noqa: F401  (re-exported: callers read them here too)
  ALL_ARMS,
  ARMS,
  GATE_DRAFT,
  GATE_FIX,
  GATE_NAMES,
  GATE_SAC_GAP,
  GATE_V2_KEEP_FIXABLE,
  GATE_V2_MIN_FIXABLE,
  GATE_V2_ON_POOL,
  SEEDS,
  V2_ARMS,
  V2_SEEDS,
  Arm,
  arm_config,
  default_arms,
  format_gates,
  gate_failures,
  is_v2,
  is_v3,
  judge_gates,
  judged,
  run_dir,
)
from lm import progress, rundir
from lm.gates import GateError

_log = logging.getLogger(__name__)

VALIDATION_CASES = 60  # the gates' validation draw (x 3 lines = 180 units)
VALIDATION_SPLIT = "validation"

# The rollout fields the warm start's examples and task tokenizer read (`rollout.gold_episodes`,
# `RolloutConfig.answer`); sampling settings do not change what it trains on.
_WARM_START_ROLLOUT_KEYS = ("lines", "answer_format", "compact_forms", "enable_thinking")
# Warm-start fields added for testbed v2: left out of the key at these values, so v1's warm starts
# (and their recorded results) keep their keys.
_WARM_START_V2_DEFAULTS = {"decide_style": "oracle", "decide_keep": 0.0}


def _prompt_texts(config: config_lib.ExperimentConfig) -> list[str]:
  """Every prompt of the first training case's episode, as the warm start renders them: a change
  of a prompt's wording in code changes the warm start without changing any config value."""
  (case, *_), _ = setup.load_data(config.data)
  texts = []
  for c, line_id, prompt in rollout.gold_episodes([case], config.rollout):
    answer = config.rollout.answer(line_id, c.gold[line_id], setup.EXPLANATION)
    sac = setup.reviewer_sac(c, line_id)
    texts += [
      prompt,
      rollout.verifier_prompt(c, line_id, prompt, answer),
      game.revision_prompt(prompt, answer, sac),
      rollout.decision_prompt(c, line_id, prompt, answer, sac, answer, config.rollout),
    ]
  return texts


def warm_start_key(config: config_lib.ExperimentConfig) -> str:
  """A short hash of everything the warm start reads (model, data, rollout style, its own knobs,
  the prompts' wording): equal keys share one warm-start directory."""
  d = config.to_dict()
  parts = {k: d[k] for k in ("model", "data", "warm_start", "mesh")}
  where = ("cache_dir", "from_dir", "waive_gates")  # where the start lives and how it is judged
  parts["warm_start"] = {k: v for k, v in d["warm_start"].items() if k not in where}
  for key, default in _WARM_START_V2_DEFAULTS.items():  # v1's keys stay as they were before v2's fields
    if parts["warm_start"].get(key) == default:
      del parts["warm_start"][key]
  parts["rollout"] = {k: d["rollout"][k] for k in _WARM_START_ROLLOUT_KEYS}
  parts["seed"], parts["vocab_chunk"] = d["seed"], d["loss"]["vocab_chunk"]
  parts["prompts"] = _prompt_texts(config)
  text = json.dumps(parts, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WARM_START_FILES = (  # what a committed warm start holds (`export_warm_start`)
  "config.json",
  "generation_config.json",
  "model.safetensors",
  "tokenizer.json",
  "tokenizer_config.json",
  "chat_template.jinja",
  "warm_start.json",
)


def committed_warm_start(config: config_lib.ExperimentConfig) -> str:
  """The absolute directory of `warm_start.from_dir` (repository-relative unless absolute), after
  checking that its warm_start.json records this config's `warm_start_key`: a committed start
  stands for one recipe, so a changed prompt, knob or model stops here, naming the file, instead
  of playing weights trained for something else."""
  path = os.path.join(REPO_ROOT, os.path.expanduser(config.warm_start.from_dir))
  record = os.path.join(path, "warm_start.json")
  if not os.path.exists(record):
    raise FileNotFoundError(f"warm_start.from_dir: {record} does not exist")
  recorded, key = rundir.read_json(record).get("key"), warm_start_key(config)
  if recorded != key:
    raise ValueError(
      f"warm_start.from_dir: {record} records warm-start key {recorded!r}, this config's is {key!r} "
      "(the recipe, model, data or a prompt's wording changed since it was committed); retrain it "
      "with warm_start.from_dir='' and commit it again with testbed.export_warm_start"
    )
  return path


def export_warm_start(config: config_lib.ExperimentConfig, checkpoint: str, dest: str) -> str:
  """Copies the warm start `checkpoint` (trained by `config` with `from_dir` empty) to `dest`, its
  warm_start.json extended with the `warm_start_key` that `committed_warm_start` checks; returns
  `dest`. The tokenizer's sentencepiece-free files only: `lm.tokenizer` loads them."""
  os.makedirs(dest, exist_ok=True)
  for name in _WARM_START_FILES:
    if name != "warm_start.json":
      shutil.copy(os.path.join(checkpoint, name), os.path.join(dest, name))
  record = rundir.read_json(os.path.join(checkpoint, "warm_start.json"))
  record["key"] = warm_start_key(config)
  rundir.write_json(os.path.join(dest, "warm_start.json"), record)
  return dest


def select_warm_start(config: config_lib.ExperimentConfig, workdir: str, dest: str) -> str:
  """Trains `config`'s warm start (never its committed one), plays its step-0 gates into `workdir`
  and, only when every gate passes, exports it to `dest` (`export_warm_start`); a failed gate
  raises `GateError` and exports nothing. How testbed v3's committed start was chosen: this, for
  warm_start.seed 0, 1, 2, ... until one passed (docs/dpa_grpo.md, "Testbed v3")."""
  config = dataclasses.replace(config, warm_start=dataclasses.replace(config.warm_start, from_dir=""))
  rundir.prepare_workdir(workdir, {"experiment": config.to_dict(), "select_warm_start": dest})
  checkpoint = ensure_warm_start(config, workdir)
  gates(config, checkpoint, workdir)
  return export_warm_start(config, checkpoint, dest)


def ensure_warm_start(config: config_lib.ExperimentConfig, workdir: str) -> str:
  """The warm-started checkpoint directory of `config`: the committed one of `warm_start.from_dir`
  (`committed_warm_start`), or trained once per `warm_start_key` into `warm_start.cache_dir` (or
  `<workdir>/warm_start/` when that is empty) and reused after."""
  if config.warm_start.from_dir:
    return committed_warm_start(config)
  train_cases, _ = setup.load_data(config.data)
  base = config.warm_start.cache_dir or os.path.join(workdir, "warm_start")
  target = os.path.join(os.path.expanduser(base), warm_start_key(config))
  return rundir.build_once(target, lambda path: warm_start.run(config, path, train_cases), "warm_start.json")


def validation_cases(config: config_lib.ExperimentConfig):
  """The gates' validation draw: the family's cases of another split name (never train or test)."""
  syn = config.data.synthetic
  if syn.family != "copycheck":
    raise ValueError(f"the testbed needs data.synthetic.family='copycheck', got {syn.family!r}")
  return copycheck.generate_cases(VALIDATION_CASES, seed=syn.seed, split=VALIDATION_SPLIT)


def gate_measures(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """The step-0 measures of played units' records (`rollout.Unit.record`): P(x right) per line,
  the SAC rate on wrong and on right drafts, P(z right | x wrong) after a SAC, with Wilson
  intervals and counts."""

  rate = metrics.proportion
  lines = list(dict.fromkeys(r["line"] for r in records))
  sac = lambda rs: [r["verifier_action"] == "SAC" for r in rs]
  wrong = [r for r in records if not r["x_right"]]
  right = [r for r in records if r["x_right"]]
  fixed = [bool(r["z_right"]) for r in wrong if r["z_right"] is not None]
  return {
    "x_right": {line: rate([r["x_right"] for r in records if r["line"] == line]) for line in lines},
    "sac_on_wrong": rate(sac(wrong)),
    "sac_on_right": rate(sac(right)),
    "sac_by_line": {
      line: {
        "on_wrong": rate(sac([r for r in wrong if r["line"] == line])),
        "on_right": rate(sac([r for r in right if r["line"] == line])),
      }
      for line in lines
    },
    "z_right_given_x_wrong": rate(fixed),
    "units": len(records),
  }


def v2_gate_measures(records: Sequence[dict[str, Any]], greedy: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Testbed v2's step-0 measures: the share of wrong revisions (every sampled revision of a SAC'd
  wrong draft that is not the gold) on the line's answer pool, from the sampled play `records`;
  the greedy decision's KEEP rate on SAC'd wrong drafts whose revision is right, and its
  `metrics.decision_rates`, from the `greedy` play's records."""
  wrong_revisions = [
    (r["line"], a)
    for r in records
    if r["verifier_action"] == "SAC" and not r["x_right"]
    for a in r["revision_amounts"]
    if a is None or float(a) != float(r["gold"])
  ]
  fixable = [
    r
    for r in greedy
    if r["verifier_action"] == "SAC" and not r["x_right"] and r["z_right"] and not r.get("forced_revise")
  ]
  return {
    "wrong_revision_on_pool": metrics.proportion([copycheck.on_pool(line, a) for line, a in wrong_revisions]),
    "greedy_keep_fixable": metrics.proportion([r["generator_action"] == "KEEP" for r in fixable]),
    "greedy_decision": metrics.decision_rates(greedy),
  }


def gates(
  config: config_lib.ExperimentConfig, checkpoint: str, workdir: str, waive: Sequence[str] = ()
) -> dict[str, Any]:
  """Plays the validation draw once at step 0 with the warm-started roles (the training
  temperature, exploration on, as a training step plays) and writes gates.json; raises GateError
  when a gate fails. Testbed v2 (`is_v2`) also plays the draw greedily (evaluation) for its
  decision gate (gates/greedy_records.jsonl). Done once: a second call reads gates.json.

  `waive`: gate names (`GATE_NAMES`) whose failure does not stop the run, for a dated protocol
  amendment whose judged rows do not depend on them (docs/dpa_grpo.md); a waived failure is kept
  in the result ("waived") and printed in the gates and the report, never dropped."""
  unknown = sorted(set(waive) - set(GATE_NAMES))
  if unknown:
    raise ValueError(f"waive_gates: unknown gate(s) {unknown}; gates are {list(GATE_NAMES)}")
  path = os.path.join(workdir, "gates.json")
  if os.path.exists(path):
    result = rundir.read_json(path)
  else:
    arm = V2_ARMS["dpa_paper"] if is_v2(config) else ARMS["dpa_k1"]
    cfg = arm_config(config, arm, config.seed, checkpoint)
    run_dir = rundir.prepare_workdir(os.path.join(workdir, "gates"), cfg, allow_changes=True)
    trainer = train.Trainer(cfg, run_dir)
    g, v = trainer.samplers["generator"], trainer.samplers["verifier"]
    units = rollout.play(validation_cases(config), g, v, cfg.rollout, seed=config.seed, step=0)
    records = [u.record() for u in units]
    rundir.atomic_write_text(
      os.path.join(run_dir, "records.jsonl"), "".join(json.dumps(r) + "\n" for r in records)
    )
    measures = gate_measures(records)
    if is_v2(config):
      greedy = [
        u.record()
        for u in rollout.play(
          validation_cases(config), g, v, cfg.rollout, seed=config.seed, step=0, greedy=True
        )
      ]
      rundir.atomic_write_text(
        os.path.join(run_dir, "greedy_records.jsonl"), "".join(json.dumps(r) + "\n" for r in greedy)
      )
      measures["v2"] = v2_gate_measures(records, greedy)
    result = {"measures": measures, "failed": judge_gates(measures), "checkpoint": checkpoint}
    rundir.write_json(path, result)
  result = judged(result, waive)  # judged again: the waiver is this run's, not the file's
  print(format_gates(result))
  if result["failed"]:
    raise GateError("step-0 gates failed (gates.json): " + "; ".join(result["failed"]))
  return result


def run(
  config: config_lib.ExperimentConfig,
  workdir: str,
  *,
  arms: Sequence[str] | None = None,
  seeds: Sequence[int] | None = None,
  allow_config_change: bool = False,
  other_warm_start: str = "",
  waive_gates: Sequence[str] = (),
) -> dict[str, Any]:
  """Warm start, gates, then every arm for every seed (seed-major, so a partial run covers every
  arm), the report rewritten after each; returns the report's summary. `workdir` is created or
  resumed for this config, arms and seeds (`lm.rundir.prepare_workdir`), as is each run in it.
  `arms` / `seeds` None: the testbed's own (`default_arms`; v1 `SEEDS`, v2 `V2_SEEDS`).
  `other_warm_start`: another warm start's testbed workdir for the report's ODE section.
  `waive_gates`: see `gates`, with the committed start's registered ones (`warm_start.waive_gates`);
  part of the work directory's stamp, so a rerun cannot drop it."""
  waive_gates = tuple(sorted(set(waive_gates) | set(config.warm_start.waive_gates)))
  arms = default_arms(config) if arms is None else tuple(arms)
  seeds = (V2_SEEDS if is_v2(config) else SEEDS) if seeds is None else tuple(seeds)
  unknown = sorted(set(arms) - set(ALL_ARMS))
  if unknown:
    raise ValueError(f"unknown arm(s) {unknown}; arms are {sorted(ALL_ARMS)}")
  testbed_stamp: dict[str, Any] = {"arms": list(arms), "seeds": list(seeds)}
  if waive_gates:  # absent when empty, so existing work directories keep their stamp
    testbed_stamp["waive_gates"] = sorted(waive_gates)
  stamp = {"experiment": config.to_dict(), "testbed": testbed_stamp}
  rundir.prepare_workdir(workdir, stamp, allow_changes=allow_config_change)
  checkpoint = ensure_warm_start(config, workdir)
  progress.note("step-0 gates")
  gates(config, checkpoint, workdir, waive_gates)
  summary: dict[str, Any] = {}
  for seed in seeds:
    for name in arms:
      cfg = arm_config(config, ALL_ARMS[name], seed, checkpoint)
      path = run_dir(workdir, name, seed)
      done = os.path.exists(os.path.join(path, "summary.json"))
      rundir.prepare_workdir(path, cfg, allow_changes=allow_config_change)
      if not done:
        _log.info("testbed: %s seed %d", name, seed)
        progress.note(f"training arm {name}, seed {seed} ({len(arms)} arms x {len(seeds)} seeds)")
        train.run(cfg, path)
      summary = testbed_report.write(workdir, config, arms, seeds, other_warm_start)
  return summary
