"""The KACE `openai` preset end to end against `lm.server` started as a real process (`python -m
launch.serve`, a random tiny Qwen3): the context check stops a preset asking for more than the server
holds before any call; the dry run (`--config.plan.dry_run=True`, through the launcher) makes no
call; the run's calls, counted in its on-disk response cache (one file per server response), match
the plan: never above the worst case, and exact given the exit tiers; a rerun pays for nothing."""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import configs.kace
from kace import budget, evaluate, methods, tiers
from kace import config as config_lib
from lm import rundir
from tests.lm.generator_helpers import CHAT_WORDS
from tests.lm.tokenizer_helpers import make_tiny_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONTEXT = 512  # the server's max_model_len (server.max_context_tokens)
MAX_TOKENS = 8
PROBLEMS = 3


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  """`python -m launch.serve` on a random tiny Qwen3, as a user starts it; its base URL once it answers."""
  tokenizer = make_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"), vocab_words=CHAT_WORDS)
  port = _free_port()
  command = [
    sys.executable, "-m", "launch.serve", "--config=configs/serve.py:tiny",
    f"--config.model.tokenizer={tokenizer}", f"--config.server.port={port}",
    "--config.server.model_name=tiny", f"--config.server.max_context_tokens={CONTEXT}",
  ]  # fmt: skip
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  log = open(tmp_path_factory.mktemp("server") / "server.log", "w")  # a file: a full pipe would block it
  proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
  base_url = f"http://127.0.0.1:{port}/v1"
  try:
    deadline = time.time() + 300
    while True:
      assert proc.poll() is None, f"the server exited: {open(log.name).read()[-2000:]}"
      assert time.time() < deadline, "the server never answered GET /v1/models"
      try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=5):
          break
      except OSError:
        time.sleep(0.5)
    yield base_url
  finally:
    proc.kill()
    proc.wait()
    log.close()


def _overrides(base_url, tmp_path):
  """The `openai` preset at tiny size, pointed at the test server: 3 AIME-format problems."""
  source = tmp_path / "aime.jsonl"
  with open(source, "w") as f:
    for i in range(PROBLEMS):
      f.write(
        json.dumps({"problem_idx": i + 1, "problem": f"Find n if 2n + {i} = {2 * i + 6}.", "answer": "3"})
      )
      f.write("\n")
  return {
    "roles.solver.base_url": base_url, "roles.solver.model": "tiny",
    "roles.solver.cache_dir": str(tmp_path / "cache"), "roles.solver.max_retries": 0,
    "data.source": str(source), "data.train_name": "", "methods": ("best_of_n", "tiered"),
    "best_of_n.n": 2, "eval.solve_rate_k": 2, "eval.bootstrap": 20, "grader.workers": 1,
    "sampling.max_tokens": MAX_TOKENS, "classifier_sampling.max_tokens": 4,
  }  # fmt: skip


def _config(overrides, **more) -> config_lib.KaceConfig:
  c = configs.kace.get_config("openai")
  for key, value in {**overrides, **more}.items():
    section, name = key.rsplit(".", 1) if "." in key else ("", key)
    target = c
    for part in filter(None, section.split(".")):
      target = target[part]
    target[name] = value
  return config_lib.KaceConfig.from_dict(c)


def _cached(cache_dir) -> list[dict]:
  """Every response the server gave, as the cache stored it (request and samples)."""
  files = [os.path.join(d, f) for d, _, fs in os.walk(cache_dir) for f in fs if f.endswith(".json")]
  return [rundir.read_json(f) for f in files]


@pytest.mark.slow
@pytest.mark.integration
def test_openai_preset_against_lm_server_matches_its_dry_run(server, tmp_path):
  overrides = _overrides(server, tmp_path)
  cache = tmp_path / "cache"
  # 1. Asking for more than the server's context stops before any call, naming the field.
  too_long = _config(overrides, **{"sampling.max_tokens": CONTEXT})
  with pytest.raises(ValueError, match=r"config\.sampling\.max_tokens=512 .* max_model_len=512"):
    evaluate.run(too_long, str(tmp_path / "refused"))
  assert not cache.exists()

  # 2. The dry run, through the launcher as a user types it: a plan, no call.
  args = [f"--config.{k}={v}" for k, v in overrides.items() if k != "methods"]
  dry = tmp_path / "dry"
  command = [
    sys.executable, "-m", "launch.kace_eval", "--config=configs/kace.py:openai", f"--workdir={dry}",
    "--config.methods=('best_of_n','tiered')", "--config.plan.dry_run=True", *args,
  ]  # fmt: skip
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "no generation call" in done.stdout and not cache.exists()
  plan = rundir.read_json(dry / "plan.json")
  assert plan["limits"]["solver"]["max_model_len"] == CONTEXT
  lines = {line["what"]: line for line in plan["lines"]}

  # 3. The run itself, in this process (same config), then its calls against the plan.
  config = _config(overrides)
  evaluate.run(config, str(tmp_path / "run"))
  responses = _cached(cache)
  samples = sum(len(r["generations"]) for r in responses)
  assert all(g["completion_tokens"] <= MAX_TOKENS for r in responses for g in r["generations"])
  records = list(rundir.read_jsonl(tmp_path / "run" / evaluate.RECORDS))
  options = config.method_options()
  predicted = 0
  for name in config.methods:
    rows = [r for r in records if r["method"] == name]
    schedule = methods.schedule(name, options)
    # the tier accounting is exact given the answers: a problem's samples follow from its exit tier
    drawn = [sum(len(st["samples"]) for st in r["stages"]) for r in rows]
    assert drawn == [budget.samples_given_exit(schedule, r["exit_tier"]) for r in rows]
    assert all(
      s["finish_reason"] in ("stop", "length") for r in rows for st in r["stages"] for s in st["samples"]
    )
    assert sum(drawn) <= lines[f"method {name}"]["samples_worst"]
    predicted += sum(drawn)
  fixed = lines["classify domains"]["samples_worst"] + lines["solve rates"]["samples_worst"]
  # every sample the server gave is one the plan accounts for
  assert samples == predicted + fixed, (samples, predicted, fixed, [r["method"] for r in records])
  assert samples <= plan["totals"]["samples_worst"]
  tiered = [r["exit_tier"] for r in records if r["method"] == "tiered"]
  assert set(tiered) <= {tiers.ES, tiers.MS, tiers.HS, tiers.POOL}

  # 4. A rerun into a new run directory replays the cache: the server is asked nothing more.
  evaluate.run(dataclasses.replace(config), str(tmp_path / "rerun"))
  assert len(_cached(cache)) == len(responses)
