"""End to end on a tiny model: DPA-GRPO trains, evaluates, checkpoints; kill -9 + restart is exact.

One uninterrupted run goes in-process; the same run in a subprocess is killed with SIGKILL after
its first checkpoint and restarted, and its final parameters must equal the first run's bit for bit.
The run is the tiny preset's (the README's smoke run) for one step more, so that its programs are
the ones that run and the other tiny-preset tests compile: they are shared through the persistent
compilation cache of tests/conftest.py.
"""

import os
import signal
import subprocess
import sys
import time

import filelock
import jax
import numpy as np
import pytest

from configs import dpa_grpo as dpa_config
from dpa_grpo import game, train
from dpa_grpo.config import ExperimentConfig
from lm import checkpoint as ckpt_lib
from lm import rundir

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # tiny end-to-end runs, one in a subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 3
OVERRIDES = {"train.steps": STEPS, "train.eval_every": STEPS, "train.checkpoint_every": 1}


def _config(preset="tiny", **train_overrides):
  c = dpa_config.get_config(preset)
  for key, value in OVERRIDES.items():
    section, field = key.split(".")
    c[section][field] = value
  c.train.update(train_overrides)
  return ExperimentConfig.from_dict(c.to_dict())


def _final_params(workdir, trainer_like):
  manager = ckpt_lib.CheckpointManager(os.path.join(workdir, "checkpoints"))
  target = ckpt_lib.abstract_like({"params": trainer_like.trainable, "opt_state": trainer_like.opt_state})
  state, meta = manager.restore(STEPS, target)
  manager.close()
  return state["params"], meta


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, worker_id):
  """The run, once a session: xdist may hand this module's tests to both workers, which then share
  one run through a lock in the session's temporary root (the tests only read it or copy it)."""
  root = tmp_path_factory.getbasetemp()
  root = root if worker_id == "master" else root.parent  # gw0's and gw1's common parent
  workdir = root / "dpa_grpo_uninterrupted"
  config = _config()
  with filelock.FileLock(str(root / "dpa_grpo_uninterrupted.lock")):
    if not (workdir / "summary.json").exists():  # written last, when the run is complete
      rundir.prepare_workdir(str(workdir), config)
      train.run(config, str(workdir))
  return str(workdir), config, rundir.read_json(workdir / "summary.json")


def test_end_to_end_run_writes_everything(uninterrupted):
  workdir, config, summary = uninterrupted
  entries = list(rundir.read_jsonl(os.path.join(workdir, "metrics.jsonl")))
  steps = [e for e in entries if "eval" not in e]
  evals = [e for e in entries if "eval" in e]
  assert [e["step"] for e in steps] == [1, 2, 3] and [e["step"] for e in evals] == [0, STEPS]
  assert all(np.isfinite(e["verifier/loss"]) and e["grad_norm"] > 0 for e in steps)
  before = summary["before"]
  lines = set(config.rollout.lines)  # the tiny preset's two, over its one test case
  assert set(before["cases"]) == set(game.CASES) and before["units"] == len(lines) == 2
  assert 0.0 <= before["accuracy_ci"][0] <= before["accuracy"] <= before["accuracy_ci"][1] <= 1.0
  assert set(before["per_line_post"]) == lines
  records = list(rundir.read_jsonl(os.path.join(workdir, "records", "train.jsonl")))
  assert len(records) == STEPS * config.data.batch_cases * len(lines)  # one a unit
  assert {"x", "verifier", "sac", "revisions", "case"} <= set(records[0])
  assert summary["best_step"] in (0, STEPS) and os.listdir(os.path.join(workdir, "tb"))


def test_kill_minus_nine_and_resume_is_bit_identical(uninterrupted, tmp_path):
  workdir_a, config, _ = uninterrupted
  workdir_b = str(tmp_path / "resumed")
  # XLA's flags, the precision and the compilation cache: tests/conftest.py's, inherited
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  command = [
    sys.executable,
    "-m",
    "launch.dpa_grpo",
    "--config=configs/dpa_grpo.py:tiny",
    f"--workdir={workdir_b}",
  ]
  command += ["--verbosity=-1"]
  command += [f"--config.{k}={v}" for k, v in OVERRIDES.items()]
  proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  run_b = os.path.join(workdir_b, "dpa_grpo")  # the launcher's layout (dpa_grpo.reproduce)
  first = os.path.join(run_b, "checkpoints", "1")
  deadline = time.time() + 600
  while not os.path.isdir(first) and proc.poll() is None and time.time() < deadline:
    time.sleep(0.05)
  assert proc.poll() is None, (
    f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
  )
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not os.path.isdir(os.path.join(run_b, "checkpoints", str(STEPS)))
  done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=900)
  assert done.returncode == 0, done.stderr.decode()[-3000:]

  trainer_like = train.Trainer(config, workdir_a)  # its tokenizer: the run's own
  params_a, meta_a = _final_params(workdir_a, trainer_like)
  params_b, meta_b = _final_params(run_b, trainer_like)
  leaves_a, leaves_b = jax.tree.leaves(params_a), jax.tree.leaves(params_b)
  assert len(leaves_a) == len(leaves_b) > 0
  for a, b in zip(leaves_a, leaves_b, strict=True):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  assert meta_a == meta_b
  steps_b = [e["step"] for e in rundir.read_jsonl(os.path.join(run_b, "metrics.jsonl")) if "eval" not in e]
  assert steps_b == [1, 2, 3]  # the killed run's lines after its checkpoint were dropped
  assert os.path.exists(os.path.join(workdir_b, "report.md"))


def test_generator_only_baseline_trains(tmp_path):
  config = _config("tiny_grpo", steps=1, eval_every=1)
  summary = train.run(config, str(tmp_path))
  entries = list(rundir.read_jsonl(os.path.join(tmp_path, "metrics.jsonl")))
  step = next(e for e in entries if "eval" not in e)
  assert np.isfinite(step["generator/loss"]) and "verifier/loss" not in step
  assert summary["method"] == "grpo" and set(summary["before"]["per_line"]) == {"1a", "9"}


def test_a_damaged_newest_checkpoint_resumes_from_the_one_before(uninterrupted, tmp_path, caplog):
  """The newest step zeroed on disk: the run resumes from the step before, warns once naming the
  damaged step, redoes the last step and ends bit-identical to the uninterrupted run."""
  import shutil

  workdir_a, config, _ = uninterrupted
  workdir_c = str(tmp_path / "damaged")
  shutil.copytree(workdir_a, workdir_c)
  newest = os.path.join(workdir_c, "checkpoints", str(STEPS))
  files = [os.path.join(d, f) for d, _, names in os.walk(newest) for f in names]
  assert files
  for path in files:
    size = os.path.getsize(path)
    with open(path, "wb") as f:
      f.write(b"\0" * size)
  with caplog.at_level("WARNING"):
    train.run(config, workdir_c)
  warnings = [
    r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "damaged" in r.getMessage()
  ]
  assert len(warnings) == 1 and f"step {STEPS} " in warnings[0], warnings
  assert os.path.isdir(newest + ".damaged")

  trainer_like = train.Trainer(config, workdir_a)
  params_a, meta_a = _final_params(workdir_a, trainer_like)
  params_c, meta_c = _final_params(workdir_c, trainer_like)
  for a, c in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_c), strict=True):
    assert np.asarray(a).tobytes() == np.asarray(c).tobytes()
  assert meta_a == meta_c


@pytest.mark.parametrize("schedule, updates", [("step", 1), ("case", 3)])
def test_optimiser_updates_per_training_step(tmp_path, monkeypatch, schedule, updates):
  """The reference code's schedule makes one AdamW update per case (3 cases: 3 updates, each case
  played with the parameters the previous one left); today's makes one per step."""
  from dpa_grpo import step as step_lib

  c = dpa_config.get_config("tiny")
  c.rollout.lines = ("1a",)
  c.data.batch_cases = 3
  c.train.update(steps=1, update_every=schedule)
  config = ExperimentConfig.from_dict(c.to_dict())
  trainer = train.Trainer(config, str(tmp_path))
  calls = []
  apply = step_lib.apply
  monkeypatch.setattr(step_lib, "apply", lambda *a, **k: calls.append(1) or apply(*a, **k))
  entry = trainer.train_step(1)
  assert len(calls) == updates and np.isfinite(entry["verifier/loss"])
  assert entry.get("updates", 1) == updates
  counts = [int(x) for x in jax.tree.leaves(trainer.opt_state) if np.ndim(x) == 0]
  assert counts and all(n == updates for n in counts)  # AdamW's step counter
  records = list(rundir.read_jsonl(os.path.join(tmp_path, "records", "train.jsonl")))
  assert len(records) == 3  # one unit per case


@pytest.mark.parametrize("select_initial, best_step, stopped", [(True, 0, True), (False, 2, False)])
def test_the_initial_evaluation_competes_for_best_only_when_selected(
  tmp_path, monkeypatch, select_initial, best_step, stopped
):
  """Scripted accuracies 0.9 (before training), 0.2, 0.3, 0.1: counted, the untrained model stays
  best and two evaluations without improvement stop the run at step 2; not counted (the
  reference's selection), step 2 is best and patience has seen one bad evaluation at the end."""
  c = dpa_config.get_config("tiny")
  c.train.update(steps=3, eval_every=1, patience=2, checkpoint_every=1, select_initial=select_initial)
  config = ExperimentConfig.from_dict(c.to_dict())
  scripted = {0: 0.9, 1: 0.2, 2: 0.3, 3: 0.1}
  monkeypatch.setattr(train.Trainer, "evaluate", lambda self, step: {"accuracy": scripted[step]})
  monkeypatch.setattr(train.Trainer, "train_step", lambda self, step: {"step": step})
  summary = train.run(config, str(tmp_path))
  assert summary["best_step"] == best_step and summary["stopped_early"] == stopped
  assert summary["before"] == {"accuracy": 0.9}  # logged either way
  assert summary["last_step"] == (2 if stopped else 3)


def test_the_tensorboard_writer_does_not_import_torch_and_writes_the_scalars(tmp_path):
  """In a fresh process (as a launcher starts): writing TensorBoard scalars leaves torch unimported
  (3–8 s of every training process's start) and the event file holds the scalar's tag."""
  code = (
    "import sys; from dpa_grpo import train; "
    f"w = train._summary_writer({str(tmp_path)!r}, 0); w.add_scalar('gen/loss', 0.5, 1); w.close(); "
    "print('torch' in sys.modules)"
  )
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": root}
  done = subprocess.run(
    [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300
  )
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == "False"
  (events,) = tmp_path.glob("events.out.tfevents.*")
  assert b"gen/loss" in events.read_bytes()
