"""Two JAX processes x 2 CPU devices on localhost run like one process x 4 devices (docs/multihost.md).

For the tiny DPA-GRPO preset and a tiny KACE evaluation, launched as users launch them
(`python -m launch.<job>` with JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID): both
processes are killed with SIGKILL mid-run, restarted, and exit 0; the run directory's logs hold each
record once, and equal a one-process, four-device run's (texts exactly, numbers to float tolerance).
"""

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # launcher subprocesses, 2 at a time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 900
TIMING_KEYS = ("_s", "seconds", "tokens_per_s")  # wall-clock fields differ between any two runs


def _env(devices: int, process_id: int | None = None, port: int | None = None) -> dict[str, str]:
  """The tests' environment (compilation cache, precision: tests/conftest.py) with `devices` CPU
  devices, and for a process of a 2-process job the variables lm.sharding.initialize_distributed reads."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR")}
  flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
  env.update(
    JAX_PLATFORMS="cpu", XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={devices}".strip()
  )
  env.pop("JAX_NUM_PROCESSES", None)
  env.pop("JAX_PROCESS_ID", None)
  if process_id is not None:
    env.update(
      JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(process_id)
    )
  return env


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(command: list[str], processes: int, log_dir) -> list[subprocess.Popen]:
  """`command` as one process with 4 devices, or as 2 processes with 2 devices each."""
  port = _free_port()
  procs = []
  for i in range(processes):
    env = _env(4) if processes == 1 else _env(2, i, port)
    log = open(os.path.join(log_dir, f"process{i}-{time.monotonic_ns()}.log"), "wb")
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = log.name  # Popen.stdout is None when stdout is a file
    procs.append(proc)
  return procs


def _wait(procs: list[subprocess.Popen]) -> None:
  for p in procs:
    rc = p.wait(timeout=TIMEOUT_S)
    if rc != 0:
      with open(p.log_path, "rb") as f:
        tail = f.read()[-3000:].decode(errors="replace")
      raise AssertionError(f"{p.args} exited {rc}:\n{tail}")


def _kill_when(procs: list[subprocess.Popen], ready) -> None:
  """SIGKILL every process once `ready()` holds (all still running then)."""
  deadline = time.time() + TIMEOUT_S
  while not ready() and all(p.poll() is None for p in procs) and time.time() < deadline:
    time.sleep(0.05)
  assert all(p.poll() is None for p in procs), "a process ended before the kill"
  for p in procs:
    p.send_signal(signal.SIGKILL)
  for p in procs:
    p.wait()


def _jsonl(path) -> list:
  with open(path) as f:
    return [json.loads(line) for line in f]


def _differences(a, b, path="") -> list[str]:
  """Where two JSON values differ: keys, lengths, strings exactly, floats beyond rtol 1e-4 / atol 1e-5."""
  if isinstance(a, dict) and isinstance(b, dict):
    if set(a) != set(b):
      return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
    return [d for k in a if not k.endswith(TIMING_KEYS) for d in _differences(a[k], b[k], f"{path}.{k}")]
  if isinstance(a, list) and isinstance(b, list):
    if len(a) != len(b):
      return [f"{path}: {len(a)} vs {len(b)} items"]
    return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")]
  if isinstance(a, float) or isinstance(b, float):
    return [] if math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5) else [f"{path}: {a} vs {b}"]
  return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def _assert_same_logs(two, one, names):
  for name in names:
    a, b = _jsonl(os.path.join(two, name)), _jsonl(os.path.join(one, name))
    assert len(a) == len(b) > 0, (name, len(a), len(b))
    assert not (d := _differences(a, b)), f"{name}: {d[:5]}"


def test_dpa_grpo_two_processes_killed_and_resumed_match_one_process(tmp_path):
  def command(workdir):
    return [
      sys.executable, "-m", "launch.dpa_grpo", "--config=configs/dpa_grpo.py:tiny", f"--workdir={workdir}",
      "--verbosity=-1",
    ]  # fmt: skip

  two, one = tmp_path / "two", tmp_path / "one"
  # The tiny preset: 2 steps, a checkpoint after each; killed once step 1's is complete.
  _kill_when(_start(command(two), 2, tmp_path), lambda: (two / "dpa_grpo" / "checkpoints" / "1").is_dir())
  assert not (two / "dpa_grpo" / "checkpoints" / "2").exists()
  _wait(_start(command(two), 2, tmp_path))
  _wait(_start(command(one), 1, tmp_path))
  run_two, run_one = two / "dpa_grpo", one / "dpa_grpo"
  # written once: 2 steps + 2 evaluations; 2 steps x 2 cases x 2 lines; 2 evaluations x 2 units
  logs = ["metrics.jsonl", "records/train.jsonl", "records/eval.jsonl"]
  assert [len(_jsonl(run_two / name)) for name in logs] == [4, 8, 4]
  _assert_same_logs(run_two, run_one, logs)
  # TensorBoard: one events file a start of the run (killed, resumed), none from process 1
  assert len(os.listdir(run_two / "tb")) == 2 and (two / "report.md").exists()
  # The one-process leg is the README's `python -m launch.dpa_grpo --config=configs/dpa_grpo.py:tiny`
  # (it once failed at the report: a Wilson upper bound below the point estimate).
  report = (one / "report.md").read_text()
  assert report.startswith("# DPA-GRPO experiment report") and "accuracy" in report
  assert (one / "figures" / "per_line_accuracy.png").stat().st_size > 1000
  assert not _differences(
    json.loads((run_two / "summary.json").read_text()), json.loads((run_one / "summary.json").read_text())
  )


def test_kace_eval_two_processes_killed_and_resumed_match_one_process(tmp_path):
  from flax import nnx

  import lm
  from kace import synthetic
  from lm.config import ModelConfig
  from lm.tokenizer import load_tokenizer
  from tests.kace.evaluate_test import _eval_command
  from tests.lm.tokenizer_helpers import make_tiny_tokenizer

  checkpoint = make_tiny_tokenizer(tmp_path / "solver")
  lm.save_hf(
    lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=load_tokenizer(checkpoint).vocab_size), rngs=nnx.Rngs(0)),
    checkpoint,
  )
  tree = str(tmp_path / "tree.json")
  synthetic.demo_tree().save(tree)

  def command(workdir):  # tests/kace/evaluate_test.py's tiny evaluation: 6 problems x 2 methods
    return [*_eval_command(workdir, checkpoint, tree), "--verbosity=-1"]

  two, one = tmp_path / "two", tmp_path / "one"
  rates = two / "solve_rates.jsonl"
  _kill_when(
    _start(command(two), 2, tmp_path), lambda: rates.exists() and len(rates.read_text().splitlines()) >= 2
  )
  _wait(_start(command(two), 2, tmp_path))
  _wait(_start(command(one), 1, tmp_path))
  assert len(_jsonl(two / "records.jsonl")) == 12 and len(_jsonl(rates)) == 6  # each written once
  _assert_same_logs(two, one, ["records.jsonl", "solve_rates.jsonl"])
  assert not _differences(
    json.loads((two / "metrics.json").read_text()), json.loads((one / "metrics.json").read_text())
  )


_BROADCAST = """
import json, sys
import jax
from lm import sharding
sharding.initialize_distributed()
mine = {"texts": ["x" * 5000, "\\u00e9"], "ids": [[1, 2], [3]]} if jax.process_index() == 0 else None
print(json.dumps(sharding.broadcast_object(mine)))
"""


def test_broadcast_object_gives_every_process_process_0s_value(tmp_path):
  """What only process 0 fetches (a serving engine's samples, dpa_grpo.rollout.EngineRolePolicy)
  reaches the other process whole: same text, same ids."""
  procs = _start([sys.executable, "-c", _BROADCAST], 2, tmp_path)
  _wait(procs)
  outputs = []
  for p in procs:
    with open(p.log_path) as f:
      outputs.append(json.loads(f.read().strip().splitlines()[-1]))
  assert outputs[0] == outputs[1] == {"texts": ["x" * 5000, "\u00e9"], "ids": [[1, 2], [3]]}
