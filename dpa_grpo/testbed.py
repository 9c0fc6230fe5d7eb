"""The copy-and-check testbed: warm start, step-0 gates, arms x seeds, the judged predictions.

`run(config, workdir, arms, seeds)` is what `python -m launch.dpa_testbed` calls, on the `testbed`
preset of configs/dpa_grpo.py (copy-and-check cases, `dpa_grpo.envs.copycheck`):

  warm_start/<key>/  one supervised warm start per warm-start-relevant config (`warm_start_key`),
                     shared by every arm and seed and by reruns;
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
from collections.abc import Sequence
from typing import Any

from dpa_grpo import config as config_lib
from dpa_grpo import game, rollout, setup, train, warm_start
from dpa_grpo.envs import copycheck
from lm import rundir, stats
from lm.gates import GateError

_log = logging.getLogger(__name__)

VALIDATION_CASES = 60  # the gates' validation draw (x 3 lines = 180 units)
VALIDATION_SPLIT = "validation"

# The step-0 gates, fixed before any comparison was run (docs/dpa_grpo.md, the testbed section).
# They are the testbed's definition of "every role can learn and has room to move": a run whose
# warm start fails one is not a test of the method, so it stops. Never loosen them to pass.
GATE_DRAFT = (0.4, 0.8)  # P(x right) of every line: about 0.5-0.7
GATE_SAC_GAP = (0.1, 0.7)  # SAC rate on wrong drafts minus on right drafts: informative, far from perfect
GATE_FIX = (0.2, 0.6)  # P(z right | x wrong) after a SAC


@dataclasses.dataclass(frozen=True, kw_only=True)
class Arm:
  """One compared training: the method and the config keys it changes, and why."""

  name: str
  method: str
  label: str
  loss: dict[str, Any] = dataclasses.field(default_factory=dict)
  baseline_mode: str = "library"
  rollout: dict[str, Any] = dataclasses.field(default_factory=dict)


ARMS = {
  a.name: a
  for a in (
    Arm(name="dpa_k1", method="dpa_grpo", label="DPA-GRPO, reference loss (pair / k1)", loss=dict(kl="k1")),
    Arm(name="dpa_k3", method="dpa_grpo", label="DPA-GRPO, anchored loss (pair / k3)", loss=dict(kl="k3")),
    Arm(
      name="grpo_reference",
      method="grpo",
      label="GRPO, the reference's baseline mode (pairs of drafts, pair loss)",
      baseline_mode="reference",
      rollout=dict(group_size=2, group_carry="best"),
    ),
    Arm(name="grpo", method="grpo", label="GRPO, library-standard (groups of 4)"),
  )
}
SEEDS = (0, 1, 2)


def arm_config(config: config_lib.ExperimentConfig, arm: Arm, seed: int, checkpoint: str):
  """The experiment config of one arm and seed, from the warm-started `checkpoint`."""
  c = config.for_method(arm.method, checkpoint)
  return dataclasses.replace(
    c,
    seed=seed,
    compare=(),
    warm_start=dataclasses.replace(c.warm_start, steps=0),
    loss=dataclasses.replace(c.loss, **arm.loss),
    baseline=dataclasses.replace(c.baseline, mode=arm.baseline_mode),
    rollout=dataclasses.replace(c.rollout, **arm.rollout),
  )


# The rollout fields the warm start's examples and task tokenizer read (`rollout.gold_episodes`,
# `RolloutConfig.answer`); sampling settings do not change what it trains on.
_WARM_START_ROLLOUT_KEYS = ("lines", "answer_format", "compact_forms", "enable_thinking")


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
  parts["warm_start"] = {k: v for k, v in d["warm_start"].items() if k != "cache_dir"}  # where, not what
  parts["rollout"] = {k: d["rollout"][k] for k in _WARM_START_ROLLOUT_KEYS}
  parts["seed"], parts["vocab_chunk"] = d["seed"], d["loss"]["vocab_chunk"]
  parts["prompts"] = _prompt_texts(config)
  text = json.dumps(parts, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def ensure_warm_start(config: config_lib.ExperimentConfig, workdir: str) -> str:
  """The warm-started checkpoint directory of `config`, trained once per `warm_start_key` into
  `warm_start.cache_dir` (or `<workdir>/warm_start/` when that is empty) and reused after."""
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

  def rate(hits: Sequence[bool]) -> dict[str, Any]:
    k, n = sum(hits), len(hits)
    low, high = stats.wilson_interval(k, n)
    return {"rate": k / n if n else float("nan"), "ci": [low, high], "k": k, "n": n}

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


def judge_gates(m: dict[str, Any]) -> list[str]:
  """The failed gates of `gate_measures` output, each as a sentence (empty: all pass)."""
  failed = []
  inside = lambda v, bounds: bounds[0] <= v <= bounds[1]
  for line, r in m["x_right"].items():
    if not inside(r["rate"], GATE_DRAFT):
      failed.append(f"P(x right) of line {line} is {r['rate']:.3f}, outside {GATE_DRAFT}")
  gap = m["sac_on_wrong"]["rate"] - m["sac_on_right"]["rate"]
  if not inside(gap, GATE_SAC_GAP):
    failed.append(
      f"SAC rate on wrong drafts {m['sac_on_wrong']['rate']:.3f} minus on right drafts "
      f"{m['sac_on_right']['rate']:.3f} = {gap:.3f}, outside {GATE_SAC_GAP}"
    )
  fix = m["z_right_given_x_wrong"]["rate"]
  if not inside(fix, GATE_FIX):  # nan (no SAC'd wrong draft) fails too
    failed.append(f"P(z right | x wrong) is {fix:.3f}, outside {GATE_FIX}")
  return failed


def gates(config: config_lib.ExperimentConfig, checkpoint: str, workdir: str) -> dict[str, Any]:
  """Plays the validation draw once at step 0 with the warm-started roles (the training
  temperature, exploration on, as a training step plays) and writes gates.json; raises GateError
  when a gate fails. Done once: a second call reads gates.json."""
  path = os.path.join(workdir, "gates.json")
  if os.path.exists(path):
    result = rundir.read_json(path)
  else:
    arm = ARMS["dpa_k1"]
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
    result = {"measures": measures, "failed": judge_gates(measures), "checkpoint": checkpoint}
    rundir.write_json(path, result)
  print(format_gates(result))
  if result["failed"]:
    raise GateError("step-0 gates failed (gates.json): " + "; ".join(result["failed"]))
  return result


def format_gates(result: dict[str, Any]) -> str:
  """The gates as printed at step 0 and shown in the report."""
  m = result["measures"]
  fmt = lambda r: f"{r['rate']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] ({r['k']}/{r['n']})"
  rows = [f"step-0 gates on {m['units']} validation units:"]
  rows += [f"  P(x right), line {line}: {fmt(r)}  gate {GATE_DRAFT}" for line, r in m["x_right"].items()]
  rows.append(f"  SAC rate on wrong drafts: {fmt(m['sac_on_wrong'])}")
  rows.append(f"  SAC rate on right drafts: {fmt(m['sac_on_right'])}  gap gate {GATE_SAC_GAP}")
  for line, r in m["sac_by_line"].items():
    rows.append(f"    line {line}: on wrong {fmt(r['on_wrong'])}, on right {fmt(r['on_right'])}")
  rows.append(f"  P(z right | x wrong): {fmt(m['z_right_given_x_wrong'])}  gate {GATE_FIX}")
  rows.append("  all gates pass" if not result["failed"] else "  FAILED: " + "; ".join(result["failed"]))
  return "\n".join(rows)


def run_dir(workdir: str, arm: str, seed: int) -> str:
  return os.path.join(workdir, arm, f"seed{seed}")


def run(
  config: config_lib.ExperimentConfig,
  workdir: str,
  *,
  arms: Sequence[str] = tuple(ARMS),
  seeds: Sequence[int] = SEEDS,
  allow_config_change: bool = False,
) -> dict[str, Any]:
  """Warm start, gates, then every arm for every seed (seed-major, so a partial run covers every
  arm), the report rewritten after each; returns the report's summary. `workdir` is created or
  resumed for this config, arms and seeds (`lm.rundir.prepare_workdir`), as is each run in it."""
  from dpa_grpo import testbed_report  # the report imports this module's constants

  unknown = sorted(set(arms) - set(ARMS))
  if unknown:
    raise ValueError(f"unknown arm(s) {unknown}; arms are {sorted(ARMS)}")
  stamp = {"experiment": config.to_dict(), "testbed": {"arms": list(arms), "seeds": list(seeds)}}
  rundir.prepare_workdir(workdir, stamp, allow_changes=allow_config_change)
  checkpoint = ensure_warm_start(config, workdir)
  gates(config, checkpoint, workdir)
  summary: dict[str, Any] = {}
  for seed in seeds:
    for name in arms:
      cfg = arm_config(config, ARMS[name], seed, checkpoint)
      path = run_dir(workdir, name, seed)
      done = os.path.exists(os.path.join(path, "summary.json"))
      rundir.prepare_workdir(path, cfg, allow_changes=allow_config_change)
      if not done:
        _log.info("testbed: %s seed %d", name, seed)
        train.run(cfg, path)
      summary = testbed_report.write(workdir, config, arms, seeds)
  return summary
