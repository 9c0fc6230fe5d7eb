"""launch.common: `--help` exits 0 on every launcher; a bad key, value, path or a real-weights preset
without weights stops in one line with exit status 2 before anything is written."""

import os
import pathlib
import subprocess
import sys

import ml_collections
import pytest

from launch import common
from lm import rundir

ROOT = pathlib.Path(__file__).parents[2]
LAUNCHERS = (
  "dpa_grpo", "dpa_testbed", "kace_build", "kace_eval", "kace_table", "kace_testbed", "main", "plan",
  "serve", "sweep", "theory",
)  # fmt: skip
ENV = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")

# Every launcher's `run()` with --help in one process (a process each costs ~5 s of imports); each
# launcher's flags are removed before the next defines its own of the same names.
_HELP_ALL = """
import importlib, sys
from absl import flags
import launch.common
for name in sys.argv[1:]:
  before = set(flags.FLAGS)
  sys.argv = [name, "--help"]
  module = importlib.import_module("launch." + name)
  print("=== " + name, flush=True)
  try:
    module.run()
  except SystemExit as e:
    print("EXIT", name, e.code, flush=True)
  for flag in set(flags.FLAGS) - before:
    delattr(flags.FLAGS, flag)
"""


def _run(args, cwd=ROOT, timeout=120):
  return subprocess.run(args, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout, check=False)


def test_an_unknown_key_names_the_closest_valid_key():
  config = ml_collections.ConfigDict(dict(train=dict(steps=1, lr=0.1), roles=dict(teacher=None)))
  assert common.unknown_key(config, "trian.steps") == "unknown key trian.steps; did you mean train.steps?"
  assert common.unknown_key(config, "train.stepz") == "unknown key train.stepz; did you mean train.steps?"
  assert common.unknown_key(config, "train.steps") is None
  assert common.unknown_key(config, "roles.teacher.kind") is None  # an unset section: ml_collections decides


def test_config_paths_resolve_from_the_package_outside_the_checkout(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert common.resolve_config_path("configs/kace.py:testbed") == f"{ROOT}/configs/kace.py:testbed"
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "kace.py").write_text("")
  assert common.resolve_config_path("configs/kace.py") == f"{tmp_path}/configs/kace.py"  # the cwd's first


def test_input_paths_are_checked_and_hub_names_are_not(tmp_path):
  from configs import kace as kace_configs
  from kace.config import KaceConfig

  config = kace_configs.get_config("openai")
  config.data.source = "opencompass/AIME2025"  # a hub name
  common.check_paths(KaceConfig.from_dict(config))
  config.data.train_source = str(tmp_path / "missing.jsonl")
  with pytest.raises(ValueError, match=r"config\.data\.train_source: .*missing.jsonl does not exist"):
    common.check_paths(KaceConfig.from_dict(config))


@pytest.mark.slow
@pytest.mark.integration
def test_help_exits_0_on_every_launcher_and_lists_its_flags():
  done = _run([sys.executable, "-c", _HELP_ALL, *LAUNCHERS], timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  sections = done.stdout.split("=== ")[1:]
  assert [s.split("\n", 1)[0] for s in sections] == list(LAUNCHERS)
  for section in sections:
    name = section.split("\n", 1)[0]
    assert f"EXIT {name} 0" in section, section[-500:]
    assert "Config overrides" in section and ("--workdir" in section or name == "serve"), name
    assert "--config" in section or "--dpa_config" in section, name
  real = _run([sys.executable, "-m", "launch.theory", "--help"])  # as a user runs it
  assert real.returncode == 0 and "--config" in real.stdout and "--workdir" in real.stdout


@pytest.mark.slow
@pytest.mark.integration
def test_bad_key_value_or_weights_stop_in_one_line_leaving_the_workdir_as_it_was(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  rundir.write_json(workdir / "config.json", {"seed": 0})
  rundir.append_jsonl(workdir / "metrics.jsonl", [{"step": 0}])
  before = {p: p.read_bytes() for p in workdir.iterdir()}
  cases = {
    ("launch.dpa_grpo", "--config.trian.steps=1"): "unknown key trian.steps; did you mean train.steps?",
    ("launch.dpa_grpo", "--config.loss.kl=k9"): "loss.kl must be one of",
    ("launch.dpa_grpo", "--config=configs/dpa_grpo.py:qwen3_4b"): (
      "model.checkpoint is empty: the qwen3_4b preset needs real weights; download Qwen/Qwen3-4B"
    ),
    # the `kace` method with no learned tree: stops before the endpoint is asked anything
    ("launch.kace_eval", "--config=configs/kace.py:openai"): (
      "--config.methods: the 'kace' artefact needs config.learn.dir"
    ),
  }
  for (module, arg), message in cases.items():
    done = _run([sys.executable, "-m", module, arg, f"--workdir={workdir}"])
    assert done.returncode == 2, (arg, done.stderr[-2000:])
    assert message in done.stderr and len((done.stdout + done.stderr).splitlines()) <= 5, done.stderr
    assert {p: p.read_bytes() for p in workdir.iterdir()} == before  # nothing written, nothing locked


@pytest.mark.slow
@pytest.mark.integration
def test_an_entry_point_runs_from_the_root_directory(tmp_path):
  """`pip install -e .` puts `dpa-grpo` beside the interpreter; from `/` its default config file
  (configs/dpa_grpo.py, relative) resolves from the package: a typo is caught against it."""
  script = pathlib.Path(sys.executable).parent / "dpa-grpo"
  if not script.exists():
    pytest.skip("the package is not installed with its entry points (pip install -e .)")
  done = _run([str(script), "--config.trian.steps=1", f"--workdir={tmp_path / 'run'}"], cwd="/")
  assert done.returncode == 2 and "did you mean train.steps?" in done.stderr, done.stderr[-2000:]
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.integration
def test_dry_run_prints_the_plan_for_this_host_and_writes_nothing(tmp_path):
  workdir = tmp_path / "run"
  env = {k: v for k, v in ENV.items() if k != "XLA_PYTHON_CLIENT_MEM_FRACTION"}
  proc = subprocess.run(
    [sys.executable, "-m", "launch.dpa_grpo", "--config=configs/dpa_grpo.py:tiny", f"--workdir={workdir}",
     "--dry_run"],
    cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-2000:]
  for program in ("accumulate", "apply", "sample"):
    assert f"  {program} " in proc.stdout, proc.stdout
  assert "fits in" in proc.stdout and os.listdir(tmp_path) == []  # no run directory, nothing else
