"""Batched tier-by-tier solving vs one problem at a time: same generator, same problems, one run.

  python -m benchmarks.kace_bench                          # the CPU-scale tiny solver (built once)
  python -m benchmarks.kace_bench --checkpoint=/path/Qwen3-4B --max_tokens=2048 --problems=64

Both modes run `kace.solve.solve` with the paper's schedule; "batched" hands it every problem at
once (one generator call per stage), "sequential" one problem per call. Sampling seeds depend only
on (seed, problem, stage), so both modes draw identical samples and do identical work per problem:
the ratio is the price of not batching. Each mode runs once untimed first, so every shape is
compiled before the timed run. It also prints the mean solver calls per problem of `tiered` and
`best_of_n` (N=5) on the same problems.
"""

from __future__ import annotations

import os
import time

from absl import app, flags

from kace import answers, solve, synthetic, tiers
from lm import generators

_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "HF checkpoint directory (default: the CPU tiny solver).")
_CACHE = flags.DEFINE_string("cache_dir", "~/.cache/kace", "Where the tiny solver is built / found.")
_PROBLEMS = flags.DEFINE_integer(
  "problems", 48, "Synthetic held-out problems to solve (at most 48 by default)."
)
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 12, "Tokens per sample.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.7, "Sampling temperature.")


def _timed(fn):
  fn()  # compile every shape first
  start = time.perf_counter()
  result = fn()
  return result, time.perf_counter() - start


def main(argv):
  del argv
  config = synthetic.TinySolverConfig()
  checkpoint = _CHECKPOINT.value or synthetic.ensure_tiny_solver(os.path.expanduser(_CACHE.value), config)
  sampler = dict(min_prompt_bucket=64, step_bucket=16, max_rows=512)
  generator = generators.make_generator(
    generators.GeneratorConfig(checkpoint=checkpoint, dtype="float32", sampler=sampler)
  )
  problems = config.problems()[1][: _PROBLEMS.value]
  domains = {p.id: p.domain for p in problems}
  params = generators.GenerationParams(max_tokens=_MAX_TOKENS.value, temperature=_TEMPERATURE.value)
  with answers.Grader() as grader:
    run = lambda batch, schedule: solve.solve(
      batch, domains, generator=generator, grader=grader, schedule=schedule, params=params
    )
    batched, batched_s = _timed(lambda: run(problems, tiers.Schedule()))
    sequential, sequential_s = _timed(lambda: [s for p in problems for s in run([p], tiers.Schedule())])
    best_of_n = run(problems, tiers.Schedule.best_of_n(5))
  mean_calls = lambda solutions: sum(s.calls for s in solutions) / len(solutions)
  print(f"problems: {len(problems)}  checkpoint: {checkpoint}")
  print(f"batched tier-by-tier: {len(problems) / batched_s:8.2f} problems/s ({batched_s:.2f} s)")
  print(f"one at a time:        {len(problems) / sequential_s:8.2f} problems/s ({sequential_s:.2f} s)")
  print(f"ratio batched / one at a time: {sequential_s / batched_s:.1f}x")
  print(f"identical solutions in both modes: {batched == sequential}")
  print(
    f"mean solver calls per problem: tiered {mean_calls(batched):.2f}, best_of_n {mean_calls(best_of_n):.2f}"
  )


if __name__ == "__main__":
  app.run(main)
