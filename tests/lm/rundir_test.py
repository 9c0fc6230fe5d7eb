"""lm.rundir: a run directory belongs to one resolved config; truncated run files name themselves."""

import json
import logging
import os
import pathlib
import subprocess
import sys

import ml_collections
import pytest

from configs import theory as theory_config
from lm import rundir


def _config(**train):
  return ml_collections.ConfigDict(
    dict(
      seed=0,
      optim=dict(lr=0.01),
      train=dict(steps=6, progress=True, **train),
      roles=dict(solver=dict(timeout=60)),
    )
  )


def test_a_rerun_with_the_same_config_or_safe_changes_resumes(tmp_path):
  rundir.prepare_workdir(tmp_path, _config())
  rundir.prepare_workdir(tmp_path, _config())
  changed = _config()
  changed.train.steps, changed.train.progress, changed.roles.solver.timeout = 12, False, 600
  rundir.prepare_workdir(tmp_path, changed)
  assert rundir.read_json(tmp_path / "config.json")["train"]["steps"] == 12
  assert sorted(os.listdir(tmp_path)) == ["config.json"]


def _record(workdir):
  rundir.append_jsonl(os.path.join(workdir, "metrics.jsonl"), [{"step": 0}])


def test_a_start_that_wrote_nothing_takes_a_corrected_config(tmp_path):
  """A directory holding only its config (a start that stopped before any record) is not locked."""
  rundir.prepare_workdir(tmp_path, _config())
  changed = _config()
  changed.optim.lr = 0.5
  rundir.prepare_workdir(tmp_path, changed)
  assert rundir.read_json(tmp_path / "config.json")["optim"]["lr"] == 0.5
  assert sorted(os.listdir(tmp_path)) == ["config.json"]
  assert not rundir.has_records(tmp_path)
  _record(tmp_path)
  assert rundir.has_records(tmp_path)


def test_a_rerun_with_another_config_stops_naming_the_keys(tmp_path):
  rundir.prepare_workdir(tmp_path, _config())
  _record(tmp_path)
  changed = _config(eval_every=5, batch=4)  # a new key counts as a difference; eval_every is safe
  changed.optim.lr, changed.seed = 0.5, 1
  with pytest.raises(rundir.ConfigFileError, match=r"optim\.lr, seed, train\.batch differ") as e:
    rundir.prepare_workdir(tmp_path, changed)
  assert "train.steps" in str(e.value)  # the safe keys are listed
  assert rundir.read_json(tmp_path / "config.json")["optim"]["lr"] == 0.01  # left as it was


def test_allowed_changes_keep_the_old_config_beside_and_warn(tmp_path, caplog):
  rundir.prepare_workdir(tmp_path, _config())
  _record(tmp_path)
  for lr in (0.5, 0.7):
    changed = _config()
    changed.optim.lr = lr
    with caplog.at_level(logging.WARNING):
      rundir.prepare_workdir(tmp_path, changed, allow_changes=True)
  assert rundir.read_json(tmp_path / "config.json")["optim"]["lr"] == 0.7
  assert rundir.read_json(tmp_path / "config.1.json")["optim"]["lr"] == 0.01
  assert rundir.read_json(tmp_path / "config.2.json")["optim"]["lr"] == 0.5
  assert sum("optim.lr" in r.getMessage() for r in caplog.records) == 2


def test_a_truncated_config_json_is_an_error_naming_the_file(tmp_path):
  rundir.prepare_workdir(tmp_path, _config())
  _record(tmp_path)
  path = tmp_path / "config.json"
  path.write_text(path.read_text()[:20])
  with pytest.raises(rundir.ConfigFileError, match=str(path)):
    rundir.read_json(path)
  with pytest.raises(rundir.ConfigFileError, match=str(path)):
    rundir.prepare_workdir(tmp_path, _config())
  rundir.prepare_workdir(tmp_path, _config(), allow_changes=True)
  assert rundir.read_json(path) == json.loads(json.dumps(_config().to_dict()))


@pytest.mark.slow
@pytest.mark.integration
def test_a_launcher_refuses_a_workdir_of_another_config(tmp_path):
  """`launch.theory` rerun with another β stops before computing anything, naming the key; with
  --allow_config_change it runs and keeps the old config beside."""
  old = theory_config.get_config("smoke")
  old.loss.beta = 0.2
  rundir.prepare_workdir(tmp_path, old)
  (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')  # a run wrote records: the config is locked
  command = [
    sys.executable,
    "-m",
    "launch.theory",
    "--config=configs/theory.py:smoke",
    f"--workdir={tmp_path}",
  ]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)
  assert result.returncode != 0
  assert "loss.beta differ" in result.stderr
  assert sorted(os.listdir(tmp_path)) == ["config.json", "metrics.jsonl"]  # nothing was computed
  # The same rerun with the flag that says the change is meant: it runs, the old config kept beside.
  result = subprocess.run(
    [*command, "--allow_config_change"], capture_output=True, text=True, timeout=600, env=env, check=False
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert rundir.read_json(tmp_path / "config.1.json")["loss"]["beta"] == 0.2
  assert (
    rundir.read_json(tmp_path / "config.json")["loss"]["beta"] == theory_config.get_config("smoke").loss.beta
  )


def test_build_once_publishes_a_finished_build_only_and_builds_it_once(tmp_path):
  calls = []

  def build(path):
    calls.append(path)
    (pathlib.Path(path) / "weights").write_text("w")
    (pathlib.Path(path) / "done.json").write_text("{}")

  def crash(path):
    (pathlib.Path(path) / "weights").write_text("half")
    raise KeyboardInterrupt  # killed mid-build

  target = tmp_path / "cache" / "key"
  with pytest.raises(KeyboardInterrupt):
    rundir.build_once(target, crash, marker="done.json")
  assert not target.exists() and not list((tmp_path / "cache").iterdir())  # no half build left behind
  with pytest.raises(RuntimeError, match="without writing done.json"):
    rundir.build_once(target, lambda path: None, marker="done.json")
  assert rundir.build_once(target, build, marker="done.json") == str(target)
  assert rundir.build_once(target, build, marker="done.json") == str(target)
  assert len(calls) == 1 and (target / "weights").read_text() == "w"
