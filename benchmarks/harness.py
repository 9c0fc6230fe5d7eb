"""What the interleaved benchmarks share: worker processes, rotating trials, spreads, the machine.

`benchmarks.sampler_bench` (decoding against other engines) and `benchmarks.rl_bench` (a DPA-GRPO
step against PyTorch) both run every side in its own long-lived process (`Worker`, JSON over a pipe,
answered by `benchmarks.engines.serve`), start the workers one at a time (`start`, so load times are
not shared), then run trials in which every side runs once, in an order that rotates from trial to
trial (`interleave`), so a slow moment of the loaded machine falls on every side alike. Ratios are
taken within a trial (`ratios`) and reported as median [min–max] (`fmt`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

from lm.machine import cpu_description

T = TypeVar("T")


def spread(values: list[float]) -> dict[str, float]:
  return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(values: list[float], digits: int = 1) -> str:
  s = spread(values)
  return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


def ratios(ours: list[float], theirs: list[float]) -> list[float]:
  """ours ÷ theirs trial by trial: a slow moment of the machine slows both sides of one trial and
  cancels, where a ratio of medians taken separately would not."""
  return [a / b for a, b in zip(ours, theirs, strict=True)]


class Worker:
  """A process answering `benchmarks.engines.serve`'s protocol: one JSON command a line on stdin,
  one JSON answer a line on stdout; its stderr goes to `log`.

  `argv` starts it (an interpreter and a script or module); `source` is its working directory and
  PYTHONPATH: the repository itself, or an older commit's `lm` extracted to measure a change.
  """

  def __init__(
    self, name: str, argv: list[str], log: pathlib.Path, env: dict[str, str], source: pathlib.Path
  ):
    self.name = name
    self.log = log
    self._log_file = open(log, "w")  # noqa: SIM115 - closed in close()
    self.proc = subprocess.Popen(
      argv,
      cwd=source,
      env={**env, "PYTHONPATH": str(source)},
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=self._log_file,
      text=True,
    )

  def call(self, **command) -> dict:
    self.proc.stdin.write(json.dumps(command) + "\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      tail = "".join(self.log.read_text().splitlines(keepends=True)[-15:])
      raise RuntimeError(f"{self.name} worker exited (code {self.proc.wait()}); its log ends:\n{tail}")
    reply = json.loads(line)
    if "error" in reply:
      raise RuntimeError(f"{self.name}: {reply['error']}")
    return reply

  def close(self) -> None:
    if self.proc.poll() is None:
      try:
        self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)
      except (BrokenPipeError, subprocess.TimeoutExpired):
        self.proc.kill()
        self.proc.wait()
    self._log_file.close()


def start(
  makers: dict[str, Callable[[], Worker]], warm_up: Callable[[Worker], T]
) -> tuple[dict[str, Worker], dict[str, dict], dict[str, T], dict[str, str]]:
  """Starts the workers one at a time: each loads (`{"cmd": "load"}`), then runs `warm_up` (its
  first, compiling calls) before the next starts.

  Returns (workers that started, their load replies, their warm-up results, failures: name ->
  why). A worker that fails is closed and left out; the caller closes the others.
  """
  workers, info, first, failures = {}, {}, {}, {}
  for name, make in makers.items():
    worker = make()
    try:
      info[name] = worker.call(cmd="load")
      first[name] = warm_up(worker)
      workers[name] = worker
    except RuntimeError as e:
      failures[name] = str(e)
      worker.close()
  return workers, info, first, failures


def interleave(
  workers: dict[str, Worker], trials: int, measure: Callable[[str, Worker], T]
) -> dict[str, list[T]]:
  """`measure(name, worker)` of every worker in every trial, the order rotating by one each trial
  (trial t starts with worker t mod W), so no side always runs first or right after another."""
  order = list(workers)
  out = {name: [] for name in order}
  for trial in range(trials):
    k = trial % len(order) if order else 0
    for name in order[k:] + order[:k]:
      out[name].append(measure(name, workers[name]))
  return out


def run(
  makers: dict[str, Callable[[], Worker]],
  warm_up: Callable[[Worker], T],
  trials: int,
  measure: Callable[[str, Worker], T],
) -> tuple[dict[str, dict], dict[str, T], dict[str, str], dict[str, list]]:
  """`start`, then `interleave`, then every started worker closed (also on error): what each
  benchmark does with its engines. Returns (load replies, warm-up results, failures, measured)."""
  workers, info, first, failures = start(makers, warm_up)
  try:
    measured = interleave(workers, trials, measure)
  finally:
    for worker in workers.values():
      worker.close()
  return info, first, failures, measured


def measure_bandwidth(num_bytes: int = 1 << 29) -> float:
  """Read bandwidth in bytes/s: a jitted sum over a buffer far larger than the caches, best of 5."""
  import jax
  import jax.numpy as jnp

  x = jnp.ones((num_bytes // 4,), jnp.float32)
  total = jax.jit(jnp.sum)
  total(x).block_until_ready()
  times = []
  for _ in range(5):
    start_time = time.perf_counter()
    total(x).block_until_ready()
    times.append(time.perf_counter() - start_time)
  return num_bytes / min(times)


def measure_peak_flops(n: int = 2048, dtype: str = "float32") -> float:
  """Compute peak in FLOP/s as the roofline's bound: a jitted [n, n] × [n, n] product of `dtype`
  operands accumulated in float32 (XLA:CPU's own dot, every core), best of 5.

  Per dtype because the kernels differ: a bfloat16 dot can run on AMX or avx512_bf16 units that a
  float32 one never touches. Accumulated in float32 (`preferred_element_type`) because that is the
  product a bfloat16 step wants and the one XLA:CPU runs fast: on the 2-core Xeon with AMX,
  [2048, 2048] bfloat16 operands gave 673 GFLOP/s with a float32 result and 115 with a bfloat16
  one (float32 operands: 115; one run each, 2026-12-04)."""
  import jax
  import jax.numpy as jnp

  a = jnp.ones((n, n), jnp.dtype(dtype))
  product = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
  product(a, a).block_until_ready()
  times = []
  for _ in range(5):
    start_time = time.perf_counter()
    product(a, a).block_until_ready()
    times.append(time.perf_counter() - start_time)
  return 2 * n**3 / min(times)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dims:
  """A Qwen3-shaped decoder's dimensions, for counting its FLOPs and bytes (the roofline)."""

  layers: int
  hidden: int
  intermediate: int
  heads: int
  kv_heads: int
  head_dim: int
  vocab: int

  @property
  def layer_params(self) -> int:
    """Weights of the layers' products (q, k, v, o, gate, up, down), all layers."""
    attention = self.hidden * (2 * self.heads + 2 * self.kv_heads) * self.head_dim
    return self.layers * (attention + 3 * self.hidden * self.intermediate)

  def forward_flops(self, tokens: int, context: float, scored: int) -> float:
    """A forward pass over `tokens` positions attending to `context` keys on average, the output
    projection at `scored` of them: 2 FLOPs a weight a token, 4·N·H a key a layer for the scores
    and the weighted sum, 2·D·V a scored position."""
    attention = 4 * self.layers * self.heads * self.head_dim * context
    return tokens * (2 * self.layer_params + attention) + scored * 2 * self.hidden * self.vocab

  def decode_bytes(self, rows: int, context: float, itemsize: int = 4) -> float:
    """Bytes one decode step must read: every weight once (the layers' and the [V, D] head) and
    each row's keys and values over `context` slots."""
    kv = rows * self.layers * 2 * self.kv_heads * self.head_dim * context
    return itemsize * (self.layer_params + self.vocab * self.hidden + kv)


def describe_machine(threads: int, quick: bool) -> dict:
  """The machine as every run prints it first: CPUs, SIMD flags, read bandwidth, compute peak
  (both measured here, the roofline's bounds), load average."""
  load = os.getloadavg()
  bandwidth = measure_bandwidth(1 << 26 if quick else 1 << 29)
  peak = measure_peak_flops(1024 if quick else 2048)
  print(
    f"machine: {os.cpu_count()} CPUs, {cpu_description()}; measured read bandwidth "
    f"{bandwidth / 1e9:.1f} GB/s, float32 matmul peak {peak / 1e9:.0f} GFLOP/s; load average "
    f"{' '.join(f'{x:.2f}' for x in load)} (1/5/15 min) at start; {threads} threads per side",
    flush=True,
  )
  return {
    "bandwidth_gb_s": bandwidth / 1e9,
    "peak_gflop_s": peak / 1e9,
    "cpu": cpu_description(),
    "load_before": load,
    "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    "commit": _commit(),
  }


def _commit() -> str:
  """The repository's HEAD (with "+changes" when the code the benchmarks run, lm/, dpa_grpo/ and
  benchmarks/, differs from it), or "unknown"."""
  root = pathlib.Path(__file__).resolve().parents[1]
  try:
    git = lambda *args: subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)  # noqa: E731
    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "lm", "dpa_grpo", "benchmarks")
  except OSError:
    return "unknown"
  if head.returncode:
    return "unknown"
  return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def end_load() -> tuple[float, float, float]:
  load = os.getloadavg()
  print(f"\nload average {' '.join(f'{x:.2f}' for x in load)} at the end")
  return load
