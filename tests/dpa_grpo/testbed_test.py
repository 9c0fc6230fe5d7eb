"""The testbed's gates, arms, warm-start cache key and the prediction-judging rule, on hand-built
records; and (slow) the whole pipeline at smoke size: gates refuse, or arms x seeds resume."""

import dataclasses
import json
import os

import numpy as np
import pytest

from configs import dpa_grpo as dpa_config
from dpa_grpo import game, metrics, setup, testbed, testbed_report, warm_start
from dpa_grpo.config import ExperimentConfig, rollout_config
from dpa_grpo.envs import copycheck, taxcalc
from lm import tokenizer as tokenizer_lib


def _rec(line, x_right, sac, z_right=None):
  return {"line": line, "x_right": x_right, "verifier_action": "SAC" if sac else "NS", "z_right": z_right}


def _passing_records():
  recs = []
  for line in ("1a", "25d", "12"):
    recs += [_rec(line, True, i < 2) for i in range(12)]  # 12 right: 2 SAC'd
    recs += [_rec(line, False, i < 6, z_right=(i < 6 and i % 2 == 0) if i < 6 else None) for i in range(8)]
  return recs


def test_gate_measures_count_what_the_gates_read():
  m = testbed.gate_measures(_passing_records())
  assert m["units"] == 60
  assert m["x_right"]["1a"]["rate"] == pytest.approx(12 / 20)
  assert m["sac_on_wrong"]["k"] == 18 and m["sac_on_wrong"]["n"] == 24
  assert m["sac_on_right"]["k"] == 6 and m["sac_on_right"]["n"] == 36
  assert m["z_right_given_x_wrong"]["rate"] == pytest.approx(9 / 18)
  assert testbed.judge_gates(m) == []


def test_each_gate_fails_on_its_own():
  recs = _passing_records()
  perfect = [dict(r, verifier_action="SAC" if not r["x_right"] else "NS") for r in recs]
  perfect = [dict(r, z_right=True if not r["x_right"] else None) for r in perfect]
  failed = testbed.judge_gates(testbed.gate_measures(perfect))
  assert any("SAC rate" in f for f in failed) and any("P(z right" in f for f in failed)
  blind = [dict(r, verifier_action="SAC") for r in recs]
  assert any("SAC rate" in f for f in testbed.judge_gates(testbed.gate_measures(blind)))
  no_copy = [dict(r, x_right=False, z_right=r["z_right"] or False) if r["line"] == "1a" else r for r in recs]
  assert any("line 1a" in f for f in testbed.judge_gates(testbed.gate_measures(no_copy)))
  no_revision = [dict(r, z_right=None) for r in recs]  # no SAC'd wrong draft with a revision: nan fails
  assert any("P(z right" in f for f in testbed.judge_gates(testbed.gate_measures(no_revision)))


def test_gates_refuse_before_any_arm_when_gates_json_says_failed(tmp_path):
  config = ExperimentConfig.from_dict(dpa_config.get_config("testbed").to_dict())
  m = testbed.gate_measures([dict(r, verifier_action="SAC") for r in _passing_records()])
  failed = testbed.judge_gates(m)
  (tmp_path / "gates.json").write_text(json.dumps({"measures": m, "failed": failed, "checkpoint": ""}))
  with pytest.raises(testbed.GateError, match="SAC rate"):
    testbed.gates(config, "", str(tmp_path))


def test_arm_configs_change_only_their_keys():
  config = ExperimentConfig.from_dict(dpa_config.get_config("testbed").to_dict())
  k1 = testbed.arm_config(config, testbed.ARMS["dpa_k1"], 1, "/ckpt")
  k3 = testbed.arm_config(config, testbed.ARMS["dpa_k3"], 1, "/ckpt")
  ref = testbed.arm_config(config, testbed.ARMS["grpo_reference"], 2, "/ckpt")
  lib = testbed.arm_config(config, testbed.ARMS["grpo"], 2, "/ckpt")
  assert (k1.method, k1.loss.kl, k1.loss.weighting, k1.seed) == ("dpa_grpo", "k1", "pair", 1)
  assert (k3.loss.kl, k3.model.checkpoint, k3.warm_start.steps) == ("k3", "/ckpt", 0)
  assert (ref.method, ref.baseline.mode, ref.rollout.group_size, ref.rollout.group_carry) == (
    "grpo",
    "reference",
    2,
    "best",
  )
  assert (lib.baseline.mode, lib.rollout.group_size) == ("library", config.rollout.group_size)
  assert k1.rollout == lib.rollout and k1.data == ref.data and k1.train == lib.train


def test_warm_start_key_follows_what_the_warm_start_reads():
  base = dpa_config.get_config("testbed")
  key = testbed.warm_start_key(ExperimentConfig.from_dict(base.to_dict()))
  same = base.to_dict() | {"train": dict(base.train.to_dict(), steps=99), "compare": ("grpo",)}
  assert testbed.warm_start_key(ExperimentConfig.from_dict(same)) == key
  sampling = base.to_dict()
  sampling["rollout"] = dict(sampling["rollout"], temperature=0.3, verdict_tokens=7)
  assert testbed.warm_start_key(ExperimentConfig.from_dict(sampling)) == key
  other = base.to_dict()
  other["warm_start"] = dict(other["warm_start"], draft_wrong=0.3)
  assert testbed.warm_start_key(ExperimentConfig.from_dict(other)) != key


def test_warm_start_key_follows_the_prompts_wording(monkeypatch):
  """A prompt reworded in code changes the warm start without any config value changing."""
  config = ExperimentConfig.from_dict(dpa_config.get_config("testbed").to_dict())
  key = testbed.warm_start_key(config)
  monkeypatch.setattr(copycheck, "verifier_note", lambda case, line_id, proposal: "another note")
  assert testbed.warm_start_key(config) != key


def test_separation_and_the_judging_rule():
  assert testbed_report.separation((80, 100), (50, 100)) == 1
  assert testbed_report.separation((50, 100), (80, 100)) == -1
  assert testbed_report.separation((55, 100), (50, 100)) == 0
  assert testbed_report.judge([1, 1, 0], "up") == "held"
  assert testbed_report.judge([-1, -1, 0], "down") == "held"
  assert testbed_report.judge([1, 1, -1], "up") == "inconclusive"
  assert testbed_report.judge([-1, -1, 0], "up") == "not held"
  assert testbed_report.judge([0, 0, 1], "up") == "inconclusive"
  assert testbed_report.judge([1, 1], "up") == "inconclusive"  # fewer than three seeds


def test_the_across_seed_rule():
  rises = [0.05, 0.02, 0.08, 0.04, 0.06, 0.03, 0.07, 0.05, 0.01]  # nine seeds, all up
  mean, (low, high), verdict = testbed_report.across_seeds(rises, "up")
  assert mean == pytest.approx(0.41 / 9) and 0 < low < mean < high and verdict == "held"
  assert testbed_report.across_seeds(rises, "down")[2] == "not held"
  assert testbed_report.across_seeds(rises[:8], "up")[2] == "inconclusive"  # fewer than nine seeds
  mixed = [0.05, -0.04, 0.02, -0.03, 0.01, 0.0, -0.02, 0.04, -0.01]
  assert testbed_report.across_seeds(mixed, "up")[2] == "inconclusive"
  assert testbed_report.across_seeds([0.0] * 9, "down")[2] == "inconclusive"  # no change, no verdict
  assert testbed_report.across_seeds(mixed, None)[2] == "no effect (contains 0)"  # a control
  assert testbed_report.across_seeds(rises, None)[2] == "effect"


def _smoke_args(workdir):
  return [
    "--config=configs/dpa_grpo.py:testbed",
    f"--workdir={workdir}",
    "--seeds=0",
    "--config.data.synthetic.n=12",
    "--config.warm_start.steps=2",
    f"--config.warm_start.cache_dir={workdir}_cache",  # never the user's ~/.cache
    "--config.train.steps=1",
    "--config.train.eval_every=1",
    "--config.rollout.revisions=2",
  ]


def _smoke_config(**optim):
  c = dpa_config.get_config("testbed")
  c.data.synthetic.n = 12
  c.warm_start.update(steps=2, cache_dir="")  # "": inside the run directory
  c.train.update(steps=1, eval_every=1)
  c.rollout.revisions = 2
  c.optim.update(optim)
  return ExperimentConfig.from_dict(c.to_dict())


@pytest.mark.slow
def test_smoke_pipeline_runs_arms_resumes_and_refuses_a_changed_config(tmp_path, monkeypatch):
  """The pipeline past the gates at smoke size: the 2-step warm start fails them (the test below),
  so they are stubbed here to test what follows them — every (arm, seed) runs once, a rerun
  trains nothing, a changed config stops. One arm, two seeds: the second run reuses the first's
  compiled programs (each arm's training is tested in `train_test.py`, its config above)."""
  monkeypatch.setattr(testbed, "gates", lambda *a, **k: {"failed": []})
  calls = []
  real_run = testbed.train.run
  monkeypatch.setattr(testbed.train, "run", lambda cfg, path: calls.append(path) or real_run(cfg, path))
  workdir = str(tmp_path / "t")
  arms, seeds = ("dpa_k1",), (0, 1)
  testbed.run(_smoke_config(), workdir, arms=arms, seeds=seeds)
  assert sorted(os.path.relpath(p, workdir) for p in calls) == ["dpa_k1/seed0", "dpa_k1/seed1"]
  report = (tmp_path / "t" / "report.md").read_text()
  assert "| dpa_k1 | 0 |" in report and "| dpa_k1 | 1 |" in report and "P4" in report
  assert "| C1 | line 12" in report and "Across seeds" in report  # the amendment's table and control
  assert len(os.listdir(tmp_path / "t" / "warm_start")) == 1
  testbed.run(_smoke_config(), workdir, arms=arms, seeds=seeds)  # resumed: nothing retrains
  assert len(calls) == 2
  with pytest.raises(ValueError, match="another config"):
    testbed.run(_smoke_config(lr=0.5), workdir, arms=arms, seeds=seeds)


@pytest.mark.slow
def test_a_warm_start_is_exported_for_from_dir_only_when_its_gates_pass(tmp_path, monkeypatch):
  """`testbed.select_warm_start` (how testbed v3's committed start was chosen): a start whose gates
  fail leaves nothing at the destination; one whose gates pass is written there with its key, and
  a config naming it in `warm_start.from_dir` plays it without training (the gates themselves are
  tested above and below; here they are stubbed, as in the test before)."""
  from lm.gates import GateError

  config, dest, workdir = _smoke_config(), tmp_path / "committed", str(tmp_path / "w")

  def failing(*args, **kwargs):
    raise GateError("step-0 gates failed (gates.json): stub")

  monkeypatch.setattr(testbed, "gates", failing)
  with pytest.raises(GateError):
    testbed.select_warm_start(config, workdir, str(dest))
  assert not dest.exists()
  monkeypatch.setattr(testbed, "gates", lambda *a, **k: {"failed": []})
  testbed.select_warm_start(config, workdir, str(dest))  # the same start, trained once
  assert sorted(os.listdir(dest)) == sorted(testbed._WARM_START_FILES)
  committed = dataclasses.replace(
    config, warm_start=dataclasses.replace(config.warm_start, from_dir=str(dest))
  )
  assert testbed.ensure_warm_start(committed, str(tmp_path / "unused")) == str(dest)
  assert not (tmp_path / "unused").exists()


@pytest.mark.slow
@pytest.mark.integration
def test_the_launcher_as_the_readme_writes_it_stops_at_the_gates_at_smoke_size(tmp_path):
  """`python -m launch.dpa_testbed --workdir=...` with smoke-size overrides: a 2-step warm start
  cannot copy, so the step-0 gates fail, gates.json says which, and no arm has trained."""
  import subprocess
  import sys

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  workdir = tmp_path / "t"
  done = subprocess.run(
    [sys.executable, "-m", "launch.dpa_testbed", *_smoke_args(workdir)],
    cwd=root,
    env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": root},
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert done.returncode != 0 and "GateError" in done.stderr, done.stderr[-3000:]
  gates = json.loads((workdir / "gates.json").read_text())
  assert gates["failed"] and "step-0 gates" in done.stdout
  assert not any((workdir / arm).exists() for arm in testbed.ARMS)


# ---- testbed v2: the conditional decision rates, its gates, its arms, its report ----


def _unit(line, x_right, sac, action=None, z_right=None, forced=False, step=None):
  r = {
    "line": line,
    "x_right": x_right,
    "verifier_action": "SAC" if sac else "NS",
    "generator_action": action,
    "z_right": z_right,
    "forced_revise": forced,
    "gold": 415.0,
    "revision_amounts": [],
  }
  return r if step is None else dict(r, step=step)


def test_decision_rates_measure_the_decision_and_the_draft_apart():
  recs = (
    [_unit("1a", False, True, "REVISE", True)] * 3  # fixable, revised
    + [_unit("1a", False, True, "KEEP", True)] * 1  # fixable, kept
    + [_unit("1a", False, True, "KEEP", False)] * 4  # revision wrong, kept
    + [_unit("1a", False, True, "REVISE", False)] * 2  # revision wrong, revised
    + [_unit("1a", False, True, "REVISE", True, forced=True)] * 5  # forced: not the policy's
    + [_unit("1a", True, True, "REVISE", False)] * 1 + [_unit("1a", True, True, "KEEP", True)] * 3
    + [_unit("1a", True, False)] * 6 + [_unit("1a", False, False)] * 2
    + [_unit("12", False, True, "REVISE", True)] * 7  # another line
  )  # fmt: skip
  m = metrics.decision_rates(recs, ("1a",))
  assert (m["revise_given_sac_wrong"]["k"], m["revise_given_sac_wrong"]["n"]) == (5, 10)
  assert (m["revise_given_sac_right"]["k"], m["revise_given_sac_right"]["n"]) == (1, 4)
  assert (m["revise_given_fixable"]["k"], m["revise_given_fixable"]["n"]) == (3, 4)
  assert (m["ns_given_right"]["k"], m["ns_given_right"]["n"]) == (6, 10)
  assert (m["z_right_given_sac_wrong"]["k"], m["z_right_given_sac_wrong"]["n"]) == (
    9,
    15,
  )  # forced count here
  assert (m["revision_success"]["k"], m["revision_success"]["n"]) == (3, 5)
  low, high = m["revision_success"]["ci"]
  assert low < 0.6 < high and 0 < low and high < 1  # a Wilson interval
  everywhere = metrics.decision_rates(recs)
  assert everywhere["revise_given_sac_wrong"]["n"] == 17
  assert np.isnan(metrics.decision_rates([], ("1a",))["revision_success"]["rate"])


def _v2_gate_inputs(keep_fixable: int, revise_fixable: int, off_pool: int):
  sampled = [
    dict(_unit("1a", False, True, "KEEP", False), revision_amounts=[380.0, 415.0, 560.0]),  # 2 wrong, on pool
    dict(_unit("12", False, True, "KEEP", False), gold=146.0, revision_amounts=[195.0] + [999.0] * off_pool),
  ] * 4
  greedy = [_unit("1a", False, True, "KEEP", True)] * keep_fixable + [
    _unit("25d", False, True, "REVISE", True)
  ] * revise_fixable
  return sampled, greedy


def test_v2_gates_need_pool_revisions_and_a_greedy_decision_that_is_not_constant():
  m = testbed.gate_measures(_passing_records())
  m["v2"] = testbed.v2_gate_measures(*_v2_gate_inputs(keep_fixable=6, revise_fixable=6, off_pool=0))
  assert m["v2"]["wrong_revision_on_pool"]["rate"] == 1.0 and m["v2"]["wrong_revision_on_pool"]["n"] == 12
  assert m["v2"]["greedy_keep_fixable"]["rate"] == 0.5 and testbed.judge_gates(m) == []
  assert "greedy KEEP" in testbed.format_gates({"measures": m, "failed": []})
  constant = dict(m, v2=testbed.v2_gate_measures(*_v2_gate_inputs(12, 0, 0)))
  assert any("greedy KEEP rate" in f for f in testbed.judge_gates(constant))
  few = dict(m, v2=testbed.v2_gate_measures(*_v2_gate_inputs(3, 3, 0)))
  assert any("fewer than" in f for f in testbed.judge_gates(few))
  off_pool = dict(m, v2=testbed.v2_gate_measures(*_v2_gate_inputs(6, 6, 2)))  # 12 of 20 on the pool
  assert any("answer pool" in f for f in testbed.judge_gates(off_pool))


def test_v2_preset_arms_and_warm_start_key():
  v1 = ExperimentConfig.from_dict(dpa_config.get_config("testbed").to_dict())
  v2 = ExperimentConfig.from_dict(dpa_config.get_config("testbed_v2").to_dict())
  assert not testbed.is_v2(v1) and testbed.default_arms(v1) == tuple(testbed.ARMS)
  assert testbed.is_v2(v2) and testbed.default_arms(v2) == ("dpa_paper", "proposal_only")
  assert (v2.rollout.decision_note, v2.train.steps, v2.warm_start.decide_keep) == (True, 60, 0.5)
  assert v1.warm_start.decide_style == "oracle" and not v1.rollout.decision_note  # v1 as recorded
  paper = testbed.arm_config(v2, testbed.V2_ARMS["dpa_paper"], 3, "/ckpt")
  ablation = testbed.arm_config(v2, testbed.V2_ARMS["proposal_only"], 3, "/ckpt")
  assert (paper.loss.revision_weight, paper.loss.decision_weight, paper.loss.revision_filter) == (
    1.0,
    1.0,
    True,
  )
  assert (ablation.loss.revision_weight, ablation.loss.decision_weight) == (0.0, 0.0)
  import dataclasses

  same = dict(revision_weight=0.0, decision_weight=0.0, revision_filter=False)
  assert dataclasses.replace(paper.loss, **same) == ablation.loss and paper.rollout == ablation.rollout
  assert paper.loss.proposal_weight == ablation.loss.proposal_weight == 1.0 and paper.train == ablation.train
  # v2's fields at their defaults leave v1's warm-start key as it was; v2's warm start is its own.
  assert testbed.warm_start_key(v1) != testbed.warm_start_key(v2)
  d = v1.to_dict()
  d["warm_start"] = dict(d["warm_start"], decide_keep=0.5)
  assert testbed.warm_start_key(ExperimentConfig.from_dict(d)) != testbed.warm_start_key(v1)


@pytest.mark.slow  # ~13 s on the shared 2-core machine (fitting the task tokenizer)
def test_v2_warm_start_decisions_see_pool_revisions_and_keep_by_desk(tmp_path):
  config = dpa_config.get_config("tiny")
  config.rollout.lines = copycheck.LINES
  config.rollout.decision_note = True
  cases = copycheck.generate_cases(200, seed=5)
  cfg = rollout_config(config.rollout)
  tokenizer = tokenizer_lib.load_tokenizer(setup.task_tokenizer(str(tmp_path), cases[:20], cfg, 512))
  ws = warm_start.WarmStartConfig(decide_style="habit", decide_keep=0.5, seed=4)
  got = warm_start.examples(cases, tokenizer, cfg, ws)
  revise_rate = {"north": [], "south": []}
  for (prompt, completion), (case, line_id) in zip(
    got["decide"], [(c, i) for c in cases for i in cfg.lines], strict=True
  ):
    text = tokenizer.decode(prompt)
    revision = text.split("Your revised answer is:\n", 1)[1].split("\n", 1)[0]
    z = taxcalc.parse_line_answer(revision, line_id).value
    assert copycheck.on_pool(line_id, z)  # right, or another value of the line's pool
    proposal = text.split("Your earlier answer was:\n", 1)[1].split("\n", 1)[0]
    fixable = z == case.gold[line_id] != taxcalc.parse_line_answer(proposal, line_id).value
    action = game.parse_decision(tokenizer.decode(completion[:-1])).action
    if fixable:
      revise_rate[case.forms["desk"]].append(action == game.REVISE)
    else:
      assert action == game.KEEP
  north, south = (sum(v) / len(v) for v in (revise_rate["north"], revise_rate["south"]))
  assert 0.08 < north < 0.35 and 0.65 < south < 0.92  # REVISE kept with 1 - 0.5 x 1.6 = 0.2, 1 - 0.2 = 0.8


def _write_v2_run(workdir, arm, seed, before, after):
  """A run directory with evaluations at steps 0 and 60: `before` / `after` = (revise on SAC'd
  wrong drafts of 10, revise on SAC'd right drafts of 10, accuracy, pre-revision accuracy)."""
  path = os.path.join(testbed.run_dir(str(workdir), arm, seed))
  os.makedirs(os.path.join(path, "records"))
  lines, records = [], []
  for step, (wrong, right, acc, pre) in ((0, before), (60, after)):
    cases = {c: {"rate": 0.0, "count": 0} for c in game.CASES}
    lines.append({"step": step, "eval": {"units": 100, "accuracy": acc, "pre_revision_accuracy": pre,
                  "per_line_post": {"12": {"accuracy": 0.5, "n": 30}}, "cases": cases}})  # fmt: skip
    units = [
      _unit("1a", False, True, "REVISE" if i < wrong else "KEEP", i % 2 == 0, step=step) for i in range(10)
    ]
    units += [_unit("25d", True, True, "REVISE" if i < right else "KEEP", True, step=step) for i in range(10)]
    units += [_unit("12", False, True, "REVISE", True, step=step)] * 5  # not a copy line: not counted
    records += units
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in lines)
  with open(os.path.join(path, "records", "eval.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)


def test_v2_report_judges_the_registered_predictions_from_the_records(tmp_path):
  config = ExperimentConfig.from_dict(dpa_config.get_config("testbed_v2").to_dict())
  seeds = tuple(range(9))
  for seed in seeds:
    _write_v2_run(tmp_path, "dpa_paper", seed, (3, 2, 0.70, 0.70), (7 + seed % 2, 2, 0.78, 0.74))
    _write_v2_run(tmp_path, "proposal_only", seed, (3, 2, 0.70, 0.70), (3 - seed % 2, 2, 0.74, 0.74))
  summary = testbed_report.write(str(tmp_path), config, ("dpa_paper", "proposal_only"), seeds)
  p = summary["predictions"]
  assert p["R1"]["across_seeds"]["verdict"] == "held" and len(p["R1"]["differences"]) == 9
  assert p["R1"]["across_seeds"]["mean"] == pytest.approx(np.mean([0.4 + 0.2 * (s % 2) for s in seeds]))
  assert p["R2"]["across_seeds"]["verdict"] == "held"  # P(REVISE | SAC, right) unchanged: <= 0.05
  assert p["R5"]["across_seeds"]["mean"] == pytest.approx(0.04) and p["R6"]["across_seeds"][
    "mean"
  ] == pytest.approx(0.04)
  assert p["C1"]["across_seeds"]["verdict"] == "—" or "contains 0" in p["C1"]["across_seeds"]["verdict"]
  report = (tmp_path / "report.md").read_text()
  assert "P(REVISE | SAC, draft wrong)" in report and "| R1 |" in report and "P4" not in report
  assert summary["decision_rates"]["dpa_paper"][0]["final"]["revise_given_sac_wrong"]["n"] == 10
  # Eight seeds: no verdict (the across-seed rule needs nine).
  eight = testbed_report.write(str(tmp_path), config, ("dpa_paper", "proposal_only"), seeds[:8])
  assert eight["predictions"]["R1"]["across_seeds"]["verdict"] == "inconclusive"


def test_the_not_up_rule():
  flat = [0.01, -0.02, 0.0, 0.01, -0.01, 0.02, 0.0, -0.01, 0.01]
  assert testbed_report.across_seeds(flat, "not up")[2] == "held"
  assert testbed_report.across_seeds([0.1 + 0.01 * i for i in range(9)], "not up")[2] == "not held"
  assert testbed_report.across_seeds([0.06 * (-1) ** i for i in range(9)], "not up")[2] == "inconclusive"


def test_k3_follow_up_arms_change_only_the_estimator_and_are_judged_with_format_rows(tmp_path):
  """The registered follow-up (docs/dpa_grpo.md, "Testbed v2 follow-up"): its arms are v2's with
  kl="k3", outside the preset's defaults; its report judges R1k3... on the k3 pair only and F1k3 /
  F2k3 on the last fifth's verdict format, which holds in one arm and collapses in the other here."""
  config = ExperimentConfig.from_dict(dpa_config.get_config("testbed_v2").to_dict())
  assert testbed.default_arms(config) == ("dpa_paper", "proposal_only")
  for name in ("dpa_paper", "proposal_only"):
    k1 = testbed.arm_config(config, testbed.ALL_ARMS[name], 0, "/ckpt")
    k3 = testbed.arm_config(config, testbed.ALL_ARMS[name + "_k3"], 0, "/ckpt")
    assert (k1.loss.kl, k3.loss.kl) == ("k1", "k3")
    assert dataclasses.replace(k3, loss=dataclasses.replace(k3.loss, kl="k1")) == k1
  seeds = tuple(range(9))
  arms = ("dpa_paper_k3", "proposal_only_k3")
  for seed in seeds:
    for arm, collapse in zip(arms, (False, True), strict=True):
      _write_v2_run(tmp_path, arm, seed, (3, 2, 0.70, 0.70), (7, 2, 0.78, 0.74))
      path = testbed.run_dir(str(tmp_path), arm, seed)
      valid = lambda s: not (collapse and s > 50 + seed % 2)  # noqa: B023
      train = [{"step": s, "verifier_valid": valid(s), "decision": None} for s in range(1, 61)]
      with open(os.path.join(path, "records", "train.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in train)
      with open(os.path.join(path, "summary.json"), "w") as f:
        f.write("{}")
  summary = testbed_report.write(str(tmp_path), config, arms, seeds)
  p = summary["predictions"]
  assert "R1" not in p and "R1k3" in p and len(p["R1k3"]["differences"]) == 9
  assert p["R1k3"]["across_seeds"]["verdict"] == "inconclusive"  # both arms rise alike: DiD 0
  assert p["F1k3"]["across_seeds"]["verdict"] == "held"  # every verdict parses: 1.0 − 0.9
  assert p["F1k3"]["across_seeds"]["mean"] == pytest.approx(0.1)
  assert p["F2k3"]["across_seeds"]["verdict"] == "not held"  # the last fifth (steps 49-60) parses 2-3 of 12
  assert "| F2k3 |" in (tmp_path / "report.md").read_text()


def test_the_ablations_screening_rule_and_its_rows_for_the_as_registered_arm(tmp_path):
  """docs/dpa_grpo.md, collapse ablations: three seeds all below the format bound are "not held at
  screening"; one at or above it passes on to nine seeds; nine get the across-seed verdict. The
  as-registered pair has its own rows (F1₀ / F2₀, amendment of 2026-12-04)."""
  assert testbed_report.screening([-0.9, -0.9]) is None  # fewer than three seeds: no status yet
  assert testbed_report.screening([-0.9, -0.85, -0.01]) == "not held at screening"
  assert testbed_report.screening([-0.9, 0.0, -0.5]) == "passes screening"  # 0.9 itself is not below
  assert testbed_report.screening([-0.5] * 9) is None
  config = ExperimentConfig.from_dict(dpa_config.get_config("testbed_v2").to_dict())
  arms, seeds = ("dpa_paper", "dpa_paper_a2"), (0, 1, 2)
  for seed in seeds:
    for arm, collapse in zip(arms, (True, False), strict=True):
      _write_v2_run(tmp_path, arm, seed, (3, 2, 0.70, 0.70), (7, 2, 0.78, 0.74))
      path = testbed.run_dir(str(tmp_path), arm, seed)
      valid = lambda s: not (collapse and s > 30)  # noqa: B023
      train = [{"step": s, "verifier_valid": valid(s), "decision": None} for s in range(1, 61)]
      with open(os.path.join(path, "records", "train.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in train)
      with open(os.path.join(path, "summary.json"), "w") as f:
        f.write("{}")
  p = testbed_report.write(str(tmp_path), config, arms, seeds)["predictions"]
  assert p["F1₀"]["across_seeds"]["verdict"] == "not held at screening"
  assert p["F1a2"]["across_seeds"]["verdict"] == "passes screening"
  assert "F2₀" in p and p["F2₀"]["differences"] == []  # proposal_only did not run
  assert "| F1a2 |" in (tmp_path / "report.md").read_text()


def test_a_waived_gate_is_named_kept_and_printed_and_only_the_named_one_is_waived():
  m = testbed.gate_measures(_passing_records())
  constant = dict(m, v2=testbed.v2_gate_measures(*_v2_gate_inputs(12, 0, 0)))  # the decision gate fails
  assert set(testbed.gate_failures(constant)) == {"decision"}
  assert testbed.judge_gates(constant, waive=("decision",)) == []
  assert testbed.judge_gates(constant, waive=("on_pool",)) == testbed.judge_gates(constant)
  result = testbed.judged({"measures": constant, "failed": testbed.judge_gates(constant)}, ("decision",))
  assert result["failed"] == [] and len(result["waived"]) == 1 and "greedy KEEP rate" in result["waived"][0]
  shown = testbed.format_gates(result)
  assert "all gates pass" in shown and "WAIVED" in shown and "greedy KEEP rate" in shown
  both = dict(constant, v2=testbed.v2_gate_measures(*_v2_gate_inputs(12, 0, 2)))  # and off the pool
  assert testbed.judge_gates(both, waive=("decision",)) == [
    s for s in testbed.judge_gates(both) if "answer pool" in s
  ]
  with pytest.raises(ValueError, match="unknown gate"):
    testbed.gates(None, "", "/nonexistent", waive=("decisions",))


def _write_training_verdicts(workdir, arm, seed, valid_until=60):
  """records/train.jsonl of a finished run whose training verdicts parse up to `valid_until`."""
  path = testbed.run_dir(str(workdir), arm, seed)
  train = [{"step": s, "verifier_valid": s <= valid_until, "decision": None} for s in range(1, 61)]
  with open(os.path.join(path, "records", "train.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in train)
  with open(os.path.join(path, "summary.json"), "w") as f:
    f.write("{}")


def test_v3_preset_committed_warm_start_and_rows_on_the_runs_that_keep_the_format(tmp_path):
  """docs/dpa_grpo.md, "Testbed v3": the preset is v2 with the collapse's fix and four arms; its
  committed warm start is the one its recipe trains (a changed knob stops, naming the field); a run
  that leaves the verdict format is left out of every row that reads its arm, so that row has eight
  seeds and no verdict, while the rows of the arms that kept it are judged."""
  v2 = ExperimentConfig.from_dict(dpa_config.get_config("testbed_v2").to_dict())
  config = ExperimentConfig.from_dict(dpa_config.get_config("testbed_v3").to_dict())
  assert testbed.is_v3(config) and not testbed.is_v3(v2) and testbed.is_v2(config)
  assert testbed.default_arms(config) == ("dpa_paper", "proposal_only", "grpo", "grpo_verifier")
  assert (config.loss.pair_actions, config.loss.invalid_penalty) == ("reference_stub", 0.0)
  path = testbed.ensure_warm_start(config, str(tmp_path / "unused"))
  assert os.path.exists(os.path.join(path, "model.safetensors")) and not os.path.exists(tmp_path / "unused")
  other = dataclasses.replace(config, warm_start=dataclasses.replace(config.warm_start, decide_keep=0.4))
  with pytest.raises(ValueError, match="warm_start.from_dir"):
    testbed.ensure_warm_start(other, str(tmp_path))
  assert "from_dir" not in v2.to_dict()["warm_start"]  # v2's run directories keep their stamp
  # the launcher's first line: v2 trains its start from random weights here, v3 loads its committed one
  assert dpa_config.random_init("testbed_v2", dpa_config.get_config("testbed_v2"))
  assert not dpa_config.random_init("testbed_v3", dpa_config.get_config("testbed_v3"))

  seeds = tuple(range(9))
  for seed in seeds:
    _write_v2_run(tmp_path, "dpa_paper", seed, (3, 2, 0.70, 0.70), (7 + seed % 2, 2, 0.78, 0.74))
    _write_v2_run(tmp_path, "proposal_only", seed, (3, 2, 0.70, 0.70), (3 - seed % 2, 2, 0.74, 0.74))
    _write_v2_run(tmp_path, "grpo", seed, (3, 2, 0.70, 0.70), (3, 2, 0.76 - 0.01 * (seed % 2), 0.76))
    _write_v2_run(tmp_path, "grpo_verifier", seed, (3, 2, 0.70, 0.70), (3, 2, 0.72, 0.72))
    for arm in ("dpa_paper", "proposal_only", "grpo_verifier"):
      _write_training_verdicts(
        tmp_path, arm, seed, valid_until=30 if (arm, seed) == ("grpo_verifier", 4) else 60
      )
    grpo = testbed.run_dir(str(tmp_path), "grpo", seed)
    with open(os.path.join(grpo, "summary.json"), "w") as f:
      f.write("{}")  # generator-only GRPO: its verifier is frozen, it plays no verdict in training
    with open(os.path.join(grpo, "records", "eval.jsonl"), "w") as f:  # and evaluates drafts only
      f.writelines(json.dumps({"step": s, "line": "1a", "x_right": True}) + "\n" for s in (0, 60))
  summary = testbed_report.write(str(tmp_path), config, testbed.default_arms(config), seeds)
  p = summary["predictions"]
  assert p["R1"]["across_seeds"]["verdict"] == "held" and len(p["R1"]["differences"]) == 9
  assert p["V1"]["across_seeds"]["verdict"] == "held" and len(p["V1"]["differences"]) == 9  # grpo: no gate
  assert p["V2"]["seeds"] == [0, 1, 2, 3, 5, 6, 7, 8]  # grpo_verifier's seed 4 left the format
  assert p["V2"]["across_seeds"]["verdict"] == "inconclusive"  # eight seeds: no verdict
  assert p["F3"]["across_seeds"]["verdict"] == "inconclusive" and p["F1"]["across_seeds"]["verdict"] == "held"
  assert summary["validity"]["grpo_verifier"][4]["passes"] is False and summary["validity"]["grpo"][0] is None
  report = (tmp_path / "report.md").read_text()
  assert "Validity gate" in report and "| V4 |" in report and "F1₀" not in report
  assert "grpo" not in summary["decision_rates"] and "| grpo | 0 | no trained verifier | yes |" in report
  assert (
    p["R1"]["tested"] == "tested" and p["V2"]["tested"] == "not tested: 1 of 9 seeds failed the validity gate"
  )
  three = testbed_report.write(str(tmp_path), config, testbed.default_arms(config), seeds[:3])
  assert three["predictions"]["R1"]["tested"] == "not tested: 3 of 9 seeds ran"  # the main job's three
