"""kace.v3_run: the trained comparison stops at a failed calibration gate before any arm runs,
resumes build by build under one config, and labels every prediction from the scripted readers.
Scripted readers stand in for the trained solver here (the model reader is tested in
tests/kace/v3_solver_test.py); the config file's solver and teacher agree with the libraries."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import pytest

from configs import kace_v3 as presets
from kace import readers, v3_arms, v3_learn, v3_run, v3_solver, v3_teacher

READER = {r.name: r for r in readers.READERS}


def test_the_config_file_writes_out_the_libraries_defaults_and_types_once():
  assert presets.SOLVER == dataclasses.asdict(v3_solver.V3SolverConfig())
  assert presets.TEACHER == dataclasses.asdict(v3_teacher.V3TeacherConfig())
  typed = v3_run.V3RunConfig.from_dict(presets.get_config().to_dict())
  assert typed == v3_run.V3RunConfig() and typed.builds == tuple(range(10))
  smoke = v3_run.V3RunConfig.from_dict(presets.get_config("smoke").to_dict())
  assert smoke.builds == (0,) and smoke.solver.steps == 2
  with pytest.raises(ValueError, match="unknown key"):
    v3_run.V3RunConfig.from_dict({**presets.get_config().to_dict(), "bulids": (0,)})
  with pytest.raises(ValueError, match="solver: unknown key"):
    v3_run.V3RunConfig.from_dict({"solver": {"stpes": 3}})


def test_a_failed_gate_stops_before_the_test_split(tmp_path):
  # scope_exact's arithmetic is exact: it fails the large-class and exit-separation gates
  config = v3_run.V3RunConfig(builds=(0,), bootstrap=200)
  out = v3_run.run(str(tmp_path), config, progress=lambda _: None, reader=READER["scope_exact"],
                   teacher=v3_learn.PROGRAMMATIC)  # fmt: skip
  assert "stopped" in out and "'exit_separation'" in out["stopped"] and "pooled" in out["stopped"]
  assert not os.path.exists(tmp_path / "build0.json") and os.path.exists(tmp_path / "gates.json")


def test_every_build_is_saved_resumed_and_labelled(tmp_path, monkeypatch):
  config = v3_run.V3RunConfig(builds=(0, 1), bootstrap=200)
  scripted = (READER["mix"], READER["scope_exact"])
  kwargs = dict(progress=lambda _: None, reader=READER["mix"], teacher=v3_learn.PROGRAMMATIC)
  record = v3_run.run(str(tmp_path), config, scripted_readers=scripted, **kwargs)
  assert [r["prediction"] for r in record["verdicts"]][:2] == ["v3-1", "v3-2"]
  first = record["verdicts"][0]
  assert set(first["scripted"]) == {"mix", "scope_exact"} and first["tested"] is False  # both: held
  assert "kace_oracle_teacher" in record["counts"]["mix"] and len(record["counts"]["mix"]["kace"]) == 2
  assert record["pooled_gates"]["all_passed"] and record["verdicts_on_those_builds"]
  report = (tmp_path / "report.md").read_text()
  assert "| v3-1 |" in report and "not tested" in report and "whose own gates all pass" in report

  def no_rerun(*args, **kwargs):
    raise AssertionError("a saved build ran again")

  with monkeypatch.context() as m:  # a rerun reads every build back and writes the same verdicts
    m.setattr(v3_learn, "run", no_rerun)
    again = v3_run.run(str(tmp_path), config, scripted_readers=scripted, **kwargs)
  assert again["verdicts"] == json.loads(json.dumps(record["verdicts"]))
  # a record written under another config (another solver) is made again, not read
  path = str(tmp_path / "build1.json")
  assert v3_run._load_or(
    path, {"solver": "mix", "teacher": "programmatic teacher", "builds": [0, 1]}, no_rerun
  )
  remade = v3_run._load_or(path, {"solver": "other"}, lambda: {"x": 1})
  assert remade == {"stamp": {"solver": "other"}, "x": 1}


def test_the_gates_pooled_over_builds_are_their_mean_judged_once():
  def build(separation):
    rates = {"small_true_card": 0.99, "no_card": 0.08, "large_true_card": 0.36, "exit_separation": separation}
    return v3_arms.judge_gates(rates)

  per_build = [build(0.19), build(0.45)]  # the first fails its own exit-separation gate
  assert [g["all_passed"] for g in per_build] == [False, True]
  pooled = v3_arms.pooled_gates(per_build)
  assert pooled["rates"]["exit_separation"] == pytest.approx(0.32) and pooled["all_passed"]
  assert not v3_arms.pooled_gates([build(0.19), build(0.39)])["all_passed"]  # mean 0.29 < 0.3


@pytest.mark.slow
@pytest.mark.integration
def test_the_launcher_as_the_readme_writes_it_stops_at_the_gates_at_smoke_size(tmp_path):
  """`python -m launch.kace_v3 --workdir=...` at smoke size: a 2-step solver fails the gates, so the
  run stops before the test split (exit non-zero, verdicts.json says why, no teacher built); a rerun
  into the same directory with another config stops in one line naming the key."""
  root = pathlib.Path(__file__).parents[2]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(root))
  base = [sys.executable, "-m", "launch.kace_v3", f"--workdir={tmp_path / 'run'}",
          "--config=configs/kace_v3.py:smoke", f"--config.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
  done = subprocess.run(base, cwd=root, env=env, capture_output=True, text=True, timeout=900, check=False)
  assert done.returncode != 0 and "stopped: the trained solver fails the gate(s)" in done.stderr, done.stderr[
    -2000:
  ]
  assert json.loads((tmp_path / "run" / "verdicts.json").read_text())["stopped"]
  assert not any(p.name.startswith("learned-teacher") for p in (tmp_path / "cache").iterdir())
  again = subprocess.run([*base, "--config.bootstrap=300"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=300, check=False)  # fmt: skip
  assert again.returncode != 0 and "bootstrap" in again.stderr and "--allow_config_change" in again.stderr
