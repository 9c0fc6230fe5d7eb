"""DPA-GRPO with rollouts from a serving engine (`rollout.engine="openai"`): two steps against our
`lm.server` started as a real process on the tiny preset's base weights, saved to a checkpoint
both the trainer and the server load. Each role is served as its LoRA adapter by name; the trainer
writes the adapters in PEFT format and reloads them through /v1/load_lora_adapter after every
update, rescores what the server sampled, and logs the engine-vs-trainer log-prob gap."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from benchmarks.vllm_rollout import base_checkpoint
from configs import dpa_grpo as dpa_config
from dpa_grpo import train
from dpa_grpo.config import ExperimentConfig
from lm import rundir

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _start_server(base: str, log_path: str) -> tuple[subprocess.Popen, str]:
  """`python -m launch.serve` on `base` at a free local port, once /v1/models answers; its log
  goes to a file (a pipe left unread would fill and stall the server)."""
  with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
  command = [
    sys.executable, "-m", "launch.serve", "--config=configs/serve.py",
    f"--config.model.checkpoint={base}", "--config.model.dtype=float32", f"--config.server.port={port}",
  ]  # fmt: skip
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  with open(log_path, "w") as log:
    server = subprocess.Popen(command, cwd=ROOT, env=env, stderr=log, stdout=log)
  base_url, deadline = f"http://127.0.0.1:{port}/v1", time.time() + 600
  while time.time() < deadline:
    assert server.poll() is None, "the server exited: " + open(log_path).read()[-2000:]
    try:
      urllib.request.urlopen(f"{base_url}/models", timeout=10).read()
      return server, base_url
    except OSError:
      time.sleep(1)
  server.kill()
  raise AssertionError(f"the server did not answer {base_url}/models in 600 s")


def _probe(base_url: str, model: str) -> list[float]:
  """The served log-probs of a fixed prompt's greedy continuation under `model`."""
  body = {
    "model": model,
    "prompt": "Line 1a: wages | ",
    "max_tokens": 6,
    "temperature": 0.0,
    "logprobs": 0,
    "return_tokens_as_token_ids": True,
  }
  request = urllib.request.Request(
    f"{base_url}/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
  )
  with urllib.request.urlopen(request, timeout=300) as response:
    return json.loads(response.read())["choices"][0]["logprobs"]["token_logprobs"]


def test_two_steps_from_our_server_with_adapters_reloaded(tmp_path):
  c = dpa_config.get_config("tiny")
  config = ExperimentConfig.from_dict(c.to_dict())
  base = base_checkpoint(config, str(tmp_path))
  server, base_url = _start_server(base, str(tmp_path / "server.log"))
  try:
    served_base = _probe(base_url, "local")
    c.model.checkpoint = base
    c.rollout.update(engine="openai", engine_url=base_url, engine_adapter_dir=str(tmp_path / "adapters"))
    run_config = ExperimentConfig.from_dict(c.to_dict())
    workdir = rundir.prepare_workdir(str(tmp_path / "run"), run_config)
    train.run(run_config, workdir)
    served_after = _probe(base_url, "generator")
  finally:
    server.terminate()
    server.wait(timeout=60)
  steps = [r for r in rundir.read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "eval" not in r]
  assert [r["step"] for r in steps] == [1, 2] and all(r["grad_norm"] > 0 for r in steps)
  # Step 1 samples the initial adapters, step 2 those of the first update, reloaded under the same
  # names: the trainer's own log-probs of the sampled ids agree with the server's both times.
  for r in steps:
    assert r["engine_gap/tokens"] > 0 and r["engine_gap/mean_abs"] < 1e-4 and r["engine_gap/max"] < 1e-3, r
  # The generator's adapter started at B = 0 (the base model); after two updates and reloads the
  # served "generator" is another model.
  assert np.max(np.abs(np.subtract(served_after, served_base))) > 1e-3, (served_base, served_after)
  peft = json.loads((tmp_path / "adapters" / "generator" / "adapter_config.json").read_text())
  assert peft["r"] == config.lora.rank and (tmp_path / "adapters" / "verifier").is_dir()
  print("engine gap per step:", [(r["engine_gap/mean_abs"], r["engine_gap/max"]) for r in steps])
  print("served log-probs before / after:", served_base, served_after)
