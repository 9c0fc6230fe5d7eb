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

The sampler row runs first: a program's peak is observable only when nothing earlier in the process
peaked higher (`lm.device_check.measure`), and the sampler's is the smaller.

`--cpu` runs the tiny preset's programs instead (the step at 64-token rows): measured, not judged
(the CPU reports no memory in use and has no published figures).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
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
RECORDS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs/results/plan.jsonl")


def recorded_peak(
  target: str, program: str, overrides: dict[str, Any], tried: str, path: str = RECORDS
) -> float | None:
  """The plan's figure for `program`'s own peak (bytes, resident left out) on `target` at the
  configuration `overrides` names: the newest record's chosen program when its overrides agree,
  else the candidate of those it tried that `tried` (a regex with one group, GiB) matches (its
  peak is written to 0.1 GiB there); None when the plan never compiled that configuration."""
  if not os.path.exists(path):
    return None
  record = None
  with open(path) as f:
    for line in f:
      r = json.loads(line) if line.strip() else {}
      if r.get("preset") == f"configs/dpa_grpo.py:{PRESET}" and r.get("target") == target:
        record = r
  if record is None or not record.get("programs"):
    return None
  chosen = next((p for p in record["programs"] if p["name"] == program), None)
  if chosen is None:
    return None
  impl = overrides.get("model.attention_impl", "blockwise")
  if record["overrides"].get("model.attention_impl", "blockwise") != impl:
    return None  # another attention's program: the plan never compiled this one
  rest = {k: v for k, v in overrides.items() if k != "model.attention_impl"}
  if all(record["overrides"].get(k) == v for k, v in rest.items()):
    return float(chosen["peak"] - chosen["resident"])
  for line in record.get("tried", ()):
    found = re.match(tried, line)
    if found:
      return float(found.group(1)) * plan_lib.GiB - chosen["resident"]  # same state beside it
  return None


def _random_like(abstract: Any, seed: int) -> Any:
  """Arrays of `abstract`'s shapes, dtypes and shardings: normal(0, 0.02) for floats, made on the
  devices (one leaf at a time), so no host holds 8 GB of weights."""
  leaves, treedef = jax.tree.flatten(abstract)
  out = []
  for i, x in enumerate(leaves):
    if x is None:
      out.append(None)
      continue
    make = jax.jit(
      lambda key, x=x: (
        (0.02 * jax.random.normal(key, x.shape, jnp.float32)).astype(x.dtype)
        if jnp.issubdtype(x.dtype, jnp.floating)
        else jnp.zeros(x.shape, x.dtype)
      ),
      out_shardings=x.sharding,
    )
    out.append(make(jax.random.key(seed + i)))
  return jax.tree.unflatten(treedef, out)


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


def _row_record(
  *,
  row: str,
  program: str,
  target: plan_lib.Target,
  cpu: bool,
  recorded: float | None,
  here: plan_lib.ProgramPlan,
  measured: dict[str, Any],
  tolerances: device_check.Tolerances | None,
  memory_stats,
) -> dict[str, Any]:
  """One row's record: predicted (the plan's record where there is one, else this compile) beside
  measured, and the judgement."""
  own = here.arguments + here.outputs - here.aliased + here.temporaries
  predicted = recorded if recorded is not None else own
  judgement = device_check.judge(
    predicted_bytes=predicted,
    measured_bytes=measured["peak_bytes"],
    predicted_seconds=None if cpu else here.seconds,  # a CPU has no published figures
    measured_seconds=measured["seconds"],
    tolerances=tolerances or device_check.Tolerances(),
    require=() if cpu and memory_stats is None else ("memory",) if cpu else ("memory", "time"),
  )
  return {
    "row": row,
    "program": program,
    "target": dataclasses.asdict(target),
    "predicted": {
      "peak_bytes": predicted,
      "source": "plan record (docs/results/plan.jsonl, deviceless compile)" if recorded is not None else
      "compile (this device's memory analysis)",
      "this_compile_peak_bytes": own,
      "this_compile_temporaries_bytes": here.temporaries,
      "roofline_seconds": here.seconds,
      "roofline_source": "model (counted FLOPs and bytes over the device's published peak)",
    },
    "measured": measured,
    "judgement": judgement,
  }  # fmt: skip


def accumulate_row(
  *,
  cpu: bool,
  attention_impl: str = "",
  tolerances: device_check.Tolerances | None = None,
  memory_stats=None,
  trials: int = 2,
) -> dict[str, Any]:
  """The planned `accumulate` on this host's devices: predicted (the plan's record, this device's
  compile, the roofline model) beside measured (`lm.device_check.measure`), and the judgement.
  `memory_stats`: the device's, unless a test gives its own."""
  exp, target, length, name = _planned(cpu, attention_impl)
  su = dpa_plan.shaped_step(exp, target, length)
  compiled = step.accumulate.lower(*su.accumulate_args, **su.accumulate_kwargs).compile()
  here = plan_lib.figures("accumulate", compiled, target, model=su.model, detail=su.detail)
  pairs, remat = exp.train.pairs_per_chunk, exp.loss.remat
  recorded = None if cpu else recorded_peak(
    target.name, "accumulate",
    {"train.pairs_per_chunk": pairs, "loss.remat": remat, "model.attention_impl": exp.model.attention_impl},
    rf"remat {remat}, {pairs} pairs: peak ([\d.]+) GiB",
  )  # fmt: skip
  grads, trainable, frozen, batch, key = su.accumulate_args
  trainable, frozen = _random_like(trainable, 1), _random_like(frozen, 1000)
  batch = {k: jax.device_put(v, batch[k].sharding) for k, v in su.chunk.items()}
  key = None if key is None else jax.device_put(jax.random.key(0), key.sharding)

  def make_args():  # fresh gradients each call: accumulate donates them
    return (jax.tree.map(jnp.zeros_like, trainable), trainable, frozen, batch, key)

  measured = device_check.measure(compiled, make_args, trials=trials, memory_stats=memory_stats)
  return _row_record(
    row=f"configs/dpa_grpo.py:{name} accumulate on {target.name}", program=su.detail, target=target,
    cpu=cpu, recorded=recorded, here=here, measured=measured, tolerances=tolerances,
    memory_stats=memory_stats,
  )  # fmt: skip


def sample_row(
  *,
  cpu: bool,
  attention_impl: str = "",
  tolerances: device_check.Tolerances | None = None,
  memory_stats=None,
  trials: int = 1,
) -> dict[str, Any]:
  """The planned sampler program (a role's prefill and decode at `sampler.max_rows` rows, the
  plan's prompt length and the preset's `max_new_tokens`) on this host's devices, on random weights
  and the plan's own inputs (`ShapedSampler.host_inputs`): predicted beside measured, judged."""
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
  recorded = None if cpu else recorded_peak(
    target.name, "sample", {"sampler.max_rows": rows, "model.attention_impl": exp.model.attention_impl},
    rf"sampler at {rows} rows: peak ([\d.]+) GiB"
  )  # fmt: skip
  args = _random_like(call.args, 2000)
  kwargs = {k: jax.device_put(shaped.host_inputs[k], v.sharding) for k, v in call.kwargs.items()}
  measured = device_check.measure(  # tens of seconds a call on a GPU: no warm-up call
    lambda *a: compiled(*a, **kwargs), lambda: args, trials=trials, warmup=cpu, memory_stats=memory_stats
  )
  return _row_record(
    row=f"configs/dpa_grpo.py:{name} sampler on {target.name}", program=here.detail, target=target,
    cpu=cpu, recorded=recorded, here=here, measured=measured, tolerances=tolerances,
    memory_stats=memory_stats,
  )  # fmt: skip


def rows(cpu: bool, attention_impl: str = "") -> dict[str, Callable[[], dict[str, Any]]]:
  """The planned rows `launch.device_check` adds to the check, in the order they run
  (`attention_impl`: the rows' attention instead of the preset's)."""
  return {
    "dpa_grpo sampler": lambda: sample_row(cpu=cpu, attention_impl=attention_impl),
    "dpa_grpo accumulate": lambda: accumulate_row(cpu=cpu, attention_impl=attention_impl),
  }
