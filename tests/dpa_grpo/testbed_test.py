"""The testbed's gates, arms, warm-start cache key and the prediction-judging rule, on hand-built
records; and (slow) the whole pipeline at smoke size: gates refuse, or arms x seeds resume."""

import json
import os

import pytest

from configs import dpa_grpo as dpa_config
from dpa_grpo import testbed, testbed_report
from dpa_grpo.config import ExperimentConfig
from dpa_grpo.envs import copycheck


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
