"""launch.common: `--help` exits 0 on every launcher; a bad key, value, path or a real-weights preset
without weights stops in one line with exit status 2 before anything is written."""

import json
import os
import pathlib
import re
import subprocess
import sys

import ml_collections
import pytest

from launch import common
from lm import rundir

ROOT = pathlib.Path(__file__).parents[2]
LAUNCHERS = (
  "dpa_grpo", "dpa_testbed", "kace_build", "kace_eval", "kace_table", "kace_testbed", "kace_v3",
  "kace_v3_readers", "main", "plan", "serve", "sweep", "theory",
)  # fmt: skip
ENV = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")

# Every launcher's `run()` in one process (a process each costs ~5 s of imports), each with its own
# argv: prints "=== name", what the launcher printed, "EXIT name code", and the config files it
# defined (JSON). Each launcher's flags are removed before the next defines its own of the same names.
_WALK = """
import contextlib, importlib, io, json, sys
from absl import flags
import launch.common as common
for name, *args in json.loads(sys.argv[1]):
  before = set(flags.FLAGS)
  sys.argv = [name, *args]
  out, err, code = io.StringIO(), io.StringIO(), "returned"
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      importlib.import_module("launch." + name).run()
    except SystemExit as e:
      code = e.code
    except Exception as e:
      code = f"raised {type(e).__name__}: {e}"
  configs = {n: common.config_source(n) for n in common._CONFIGS if n in flags.FLAGS}
  print(json.dumps(dict(name=name, code=code, out=out.getvalue(), err=err.getvalue(), configs=configs)))
  for flag in set(flags.FLAGS) - before:
    delattr(flags.FLAGS, flag)
  sys.modules.pop("launch." + name, None)
"""


def _walk(runs, timeout=600):
  """Each (launcher, *args) of `runs` run in one process (`_WALK`): a record per run."""
  done = _run([sys.executable, "-c", _WALK, json.dumps(runs)], timeout=timeout)
  assert done.returncode == 0, done.stderr[-3000:]
  return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


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


# Launchers that write a run directory, so offer --workdir (lm-sweep: without --allow_config_change).
WRITES_WORKDIR = {"dpa_grpo", "dpa_testbed", "kace_build", "kace_eval", "kace_table", "kace_testbed",
                  "kace_v3", "kace_v3_readers", "main", "sweep", "theory"}  # fmt: skip
NO_CONFIG_CHANGE = {"sweep", "kace_v3_readers"}  # write a directory but have no config to change


@pytest.mark.slow
@pytest.mark.integration
def test_help_lists_presets_own_examples_that_parse_and_only_the_flags_used():
  records = _walk([[name, "--help"] for name in LAUNCHERS])
  assert [r["name"] for r in records] == list(LAUNCHERS)
  for r in records:
    name, text = r["name"], r["out"]
    assert r["code"] == 0 and "Config overrides" in text, (name, r)
    assert ("--workdir" in text) == (name in WRITES_WORKDIR), name
    assert ("--allow_config_change" in text) == (name in WRITES_WORKDIR - NO_CONFIG_CHANGE), name
    usage = text.split("\nflags:\n")[0]  # the launcher's docstring: its examples
    for flag, (path, _) in r["configs"].items():
      if not path:  # lm-sweep's --config has no default: the launcher's presets apply
        continue
      assert f"presets (--{flag}=" in text, name
      examples = [e.rstrip("'\"") for e in re.findall(rf"--{flag}\.[\w.]+=\S+", usage)]
      for example in examples:  # parses against this launcher's own config file
        common.config_with_overrides(path, [example.replace(f"--{flag}.", "--config.", 1)])
    if name not in ("main", "sweep", "kace_v3_readers"):  # v3_readers has no config: its design is code
      assert re.search(r"--config\.[\w.]+=", usage), f"{name} --help shows no override example"
  real = _run([sys.executable, "-m", "launch.theory", "--help"])  # as a user runs it
  assert real.returncode == 0 and "smoke" in real.stdout and "--workdir" in real.stdout


@pytest.mark.slow
@pytest.mark.integration
def test_every_entry_point_stops_a_bad_input_in_one_line_leaving_the_workdir_as_it_was(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  rundir.write_json(workdir / "config.json", {"seed": 0})
  rundir.append_jsonl(workdir / "metrics.jsonl", [{"step": 0}])
  before = {p: p.read_bytes() for p in workdir.iterdir()}
  w = f"--workdir={workdir}"
  cases = [
    (["dpa_grpo", "--config.trian.steps=1", w], "unknown key trian.steps; did you mean train.steps?"),
    (["dpa_grpo", "--config.loss.kl=k9", w], "loss.kl must be one of"),
    (["dpa_grpo", "--config=configs/dpa_grpo.py:qwen3_4b", w],
     "model.checkpoint is empty: the qwen3_4b preset needs real weights; download Qwen/Qwen3-4B"),
    (["dpa_testbed", "--arms=dpa_k9", w], "unknown arm(s) ['dpa_k9']"),
    (["dpa_testbed", w], "differ from"),  # reruns with another config: the testbeds' own directories
    (["kace_testbed", w], "differ from"),
    (["theory", "--config=configs/theory.py:smok", w], "unknown preset 'smok'; did you mean 'smoke'?"),
    (["theory", "--config=configs/theory.py:smoke", w], "differ from"),  # a rerun with another config
    (["kace_build", "--config.learn.budget_tokens=many", w], "--config.learn.budget_tokens=many"),
    # the `kace` method with no learned tree: stops before the endpoint is asked anything
    (["kace_eval", "--config=configs/kace.py:openai", w], "--config.methods: the 'kace' artefact needs"),
    (["kace_table", "--config.tabel.methods=x", w], "did you mean table.methods?"),
    (["kace_testbed", "--config.seeed=1", w], "did you mean seed?"),
    (["main", "--parts=dpa", w], "unknown part(s) ['dpa']"),
    (["plan", "--target=h100x9"], "unknown targets ['h100x9']"),
    (["plan", "--target=v5p-8"], "scripts/plan_venvs.sh tpu"),
    (["serve", f"--config.model.checkpoint={tmp_path}/missing"], "model.checkpoint: "),
    (["serve", "--config=configs/serve.py:tiny", "--config.build_tokenizer="], "model.tokenizer=DIR"),
    (["serve", "--config=configs/serve.py:tiny", f"--config.model.tokenizer={tmp_path}",
      "--config.server.max_tokens=0"], "max_tokens=0"),  # fmt: skip
    (["sweep", "--config=configs/theory.py", "--launcher=launch.theroy", w], "did you mean launch.theory?"),
    (["sweep", "--config=configs/dpa_grpo.py:tiyn", "--launcher=launch.dpa_grpo", w], "did you mean 'tiny'?"),
    (["sweep", "--config=configs/theory.py:smoke", "--launcher=launch.theory", "--sweep=loss.kl=k1,k9", w],
     "point 001_loss.kl=k9: loss.kl must be one of"),
  ]  # fmt: skip
  records = _walk([args for args, _ in cases])
  assert len(records) == len(cases)
  for r, (args, message) in zip(records, cases, strict=True):
    assert r["code"] == 2 and message in r["err"], (args, r)
    assert len((r["out"] + r["err"]).splitlines()) <= 5, (args, r)
  assert {p: p.read_bytes() for p in workdir.iterdir()} == before  # nothing written, nothing locked
  assert not (tmp_path / "run" / "000_loss.kl=k1").exists()


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
