"""DPA-GRPO's planned rows for the device check (`lm.device_check`, run by `launch.device_check`).

The rows are docs/scale.md's for this device, the two programs a trainer runs there: the train
step's `accumulate` and a role's sampler (prefill and decode at `sampler.max_rows` rows), of the 4B
preset with the overrides planned for it (`configs/dpa_grpo.py:qwen3_4b@<target>`, e.g. h200x1:
16 pairs a chunk, 32 rows of 4,096 tokens, remat full; the sampler at 64 rows of a 2,048-token
prompt and 2,048 new tokens). Each is compiled from the plan's own abstract inputs
(`dpa_grpo.plan.shaped_step`, `lm.sampler.shaped_programs`) and run on random bf16 weights. The
prediction it is judged against is the plan's record of that row (docs/results/plan.jsonl, a
deviceless compile) where there is one, else this device's own compile of the same program; the
roofline time is the plan's model. Memory compares the program's own peak (arguments + outputs −
aliased + temporaries): the check holds no optimiser state or other samplers beside it, so the
plan's `resident` is left out.

Each row function compiles its program and returns it with its own peak by that compile
(`lm.device_check.CompiledRow`): the check runs the rows (these and KACE's, `kace.device_check`) in
ascending order of it, since a program's peak is observable only when nothing earlier in the process
peaked higher (`lm.device_check.measure`). On h200x1: this sampler (73.0 GiB measured, 2026-12-04),
KACE's solver (105.8 planned), this step (117.5 measured).

`--cpu` runs the tiny preset's programs instead (the step at 64-token rows): measured, not judged
(the CPU reports no memory in use and has no published figures).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from configs import dpa_grpo as presets
from dpa_grpo import config as config_lib
from dpa_grpo import plan as dpa_plan
from dpa_grpo import step
from lm import device_check
from lm import plan as plan_lib
from lm import sampler as sampler_lib

PRESET = "qwen3_4b"
# The plan compiles the blockwise attention (`dpa_grpo.plan.shaped_step`): a row run with another has
# no figure in its records.
PLANNED_ATTENTION = {"model.attention_impl": "blockwise"}


def _planned(
  cpu: bool, attention_impl: str = ""
) -> tuple[config_lib.ExperimentConfig, plan_lib.Target, int, str]:
  """The row's config (its attention `attention_impl` when given, else the preset's), this host as
  a target, the loss rows' width (0: the plan's) and its name."""
  target = plan_lib.local_target()
  if cpu:
    c = presets.get_config("tiny")
    c.model.preset = "tiny_qwen3"
    c.train.pairs_per_chunk = 2
    c.sampler.max_rows = 8
    length, name = 64, "tiny"
  else:
    if target.name not in presets.TARGETS[PRESET]:
      raise ValueError(
        f"no docs/scale.md row plans {target.name!r} (device {jax.devices()[0].device_kind!r})"
      )
    c, length, name = presets.get_config(f"{PRESET}@{target.name}"), 0, f"{PRESET}@{target.name}"
  if attention_impl:
    c.model.attention_impl = attention_impl
    name = f"{name} --config.model.attention_impl={attention_impl}"
  return config_lib.ExperimentConfig.from_dict(c.to_dict()), target, length, name


def accumulate_row(
  *,
  cpu: bool,
  attention_impl: str = "",
  tolerances: device_check.Tolerances | None = None,
  memory_stats=None,
  trials: int = 2,
) -> device_check.CompiledRow:
  """The planned `accumulate` on this host's devices, compiled; run, it records predicted (the
  plan's record, this device's compile, the roofline model) beside measured
  (`lm.device_check.measure`), and the judgement. `memory_stats`: the device's, unless a test gives
  its own."""
  exp, target, length, name = _planned(cpu, attention_impl)
  su = dpa_plan.shaped_step(exp, target, length)
  compiled = step.accumulate.lower(*su.accumulate_args, **su.accumulate_kwargs).compile()
  here = plan_lib.figures("accumulate", compiled, target, model=su.model, detail=su.detail)

  pairs, remat = exp.train.pairs_per_chunk, exp.loss.remat
  recorded = None if cpu else device_check.recorded_peak(
    f"configs/dpa_grpo.py:{PRESET}", target.name, "accumulate",
    {"train.pairs_per_chunk": pairs, "loss.remat": remat, "model.attention_impl": exp.model.attention_impl},
    rf"remat {remat}, {pairs} pairs: peak ([\d.]+) GiB", fixed=PLANNED_ATTENTION,
  )  # fmt: skip

  def measure() -> dict[str, Any]:
    grads, trainable, frozen, batch, key = su.accumulate_args
    trainable, frozen = device_check.random_like(trainable, 1), device_check.random_like(frozen, 1000)
    batch = {k: jax.device_put(v, batch[k].sharding) for k, v in su.chunk.items()}
    key = None if key is None else jax.device_put(jax.random.key(0), key.sharding)

    def make_args():  # fresh gradients each call: accumulate donates them
      return (jax.tree.map(jnp.zeros_like, trainable), trainable, frozen, batch, key)

    return device_check.measure(compiled, make_args, trials=trials, memory_stats=memory_stats)

  return device_check.compiled_row(
    here, row=f"configs/dpa_grpo.py:{name} accumulate on {target.name}", program=su.detail, target=target,
    cpu=cpu, recorded=recorded, measure=measure, tolerances=tolerances, memory_stats=memory_stats,
  )  # fmt: skip


def sample_row(
  *,
  cpu: bool,
  attention_impl: str = "",
  tolerances: device_check.Tolerances | None = None,
  memory_stats=None,
  trials: int = 1,
) -> device_check.CompiledRow:
  """The planned sampler program (a role's prefill and decode at `sampler.max_rows` rows, the
  plan's prompt length and the preset's `max_new_tokens`) on this host's devices, compiled; run on
  random weights and the plan's own inputs (`ShapedSampler.host_inputs`), it records predicted
  beside measured, judged."""
  exp, target, length, name = _planned(cpu, attention_impl)
  su = dpa_plan.shaped_step(exp, target, length)
  sampled = su.policies.policy(su.trainable, su.frozen, su.accumulate_kwargs["role"])
  rows, prompt_len = exp.sampler.max_rows, 32 if cpu else dpa_plan.PROMPT_TOKENS
  shaped = sampler_lib.shaped_programs(
    sampled, su.mesh, rows=rows, prompt_len=prompt_len, new_tokens=exp.rollout.max_new_tokens, n=1,
    config=exp.sampler, platform=plan_lib.sampler_platform(target),
  )  # fmt: skip
  (call,) = shaped.programs  # on a mesh, every platform: one program, prefill then decode
  compiled = call.fn.lower(*call.args, **call.kwargs).compile()
  here = plan_lib.sampler_program(
    sampled, su.mesh, target, rows=rows, prompt_len=prompt_len, new_tokens=exp.rollout.max_new_tokens,
    n=1, config=exp.sampler, shaped=shaped, compiled=compiled,
  )  # fmt: skip

  recorded = None if cpu else device_check.recorded_peak(
    f"configs/dpa_grpo.py:{PRESET}", target.name, "sample",
    {"sampler.max_rows": rows, "model.attention_impl": exp.model.attention_impl},
    rf"sampler at {rows} rows: peak ([\d.]+) GiB", fixed=PLANNED_ATTENTION,
  )  # fmt: skip

  def measure() -> dict[str, Any]:
    args = device_check.random_like(call.args, 2000)
    kwargs = {k: jax.device_put(shaped.host_inputs[k], v.sharding) for k, v in call.kwargs.items()}
    return device_check.measure(  # tens of seconds a call on a GPU: no warm-up call
      lambda *a: compiled(*a, **kwargs), lambda: args, trials=trials, warmup=cpu, memory_stats=memory_stats
    )

  return device_check.compiled_row(
    here, row=f"configs/dpa_grpo.py:{name} sampler on {target.name}", program=here.detail, target=target,
    cpu=cpu, recorded=recorded, measure=measure, tolerances=tolerances, memory_stats=memory_stats,
  )  # fmt: skip


def rows(cpu: bool, attention_impl: str = "") -> dict[str, Callable[[], device_check.CompiledRow]]:
  """The planned rows `launch.device_check` adds to the check, each compiling its row
  (`attention_impl`: the rows' attention instead of the preset's)."""
  return {
    "dpa_grpo sampler": lambda: sample_row(cpu=cpu, attention_impl=attention_impl),
    "dpa_grpo accumulate": lambda: accumulate_row(cpu=cpu, attention_impl=attention_impl),
  }
