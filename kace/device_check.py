"""KACE's planned row for the device check (`lm.device_check`, run by `launch.device_check`).

The row is docs/scale.md's for this device: the solver's sampler program (prefill and decode at
`roles.solver.sampler.max_rows` rows, a 2,048-token prompt, `sampling.max_tokens` = 38,912 new
tokens) of `configs/kace.py:qwen3_4b@<target>` (h200x1: 16 rows), compiled from the plan's own
abstract inputs (`kace.plan.shaped`) and run on random bf16 weights. Its memory is judged as
the DPA-GRPO rows' are: the program's own peak against the plan's record of that configuration
(docs/results/plan.jsonl), else this device's own compile.

Its time is a truncated measurement. The planned program decodes 38,912 tokens: on h200x1 its
roofline alone is about 850 s, more than the whole check may take. So the program is compiled at
its full shapes (a KV cache of prompt + 38,912 slots: its memory is the plan's) and run with every
row's runtime `max_new` (`ShapedSampler.host_inputs`) set to `STEPS`: a row is done once it has
chosen `max_new` tokens, and the decode loop stops when every row is done (`lm.sampler`: `choose`,
`keep_going`), so a call runs the prefill and `STEPS` decode steps. The steps it ran are counted from
its outputs (random weights may sample EOS early; the loop runs until the longest row is done) and
its time is judged against the roofline of those steps (`lm.plan.sampler_model` with the compiled
cache, which an accelerator's decode step reads whole; `lm.device_check.Truncation`).

Cost on h200x1 (16 rows): the roofline's decode step reads the weights (8 GB) and 16 rows' caches
of 40,960 slots (97 GB), 22 ms at 4.8 TB/s; 1,024 steps at the 2.3-2.5x of the roofline the DPA
sampler row measured there take about 55 s (22 s at the roofline), plus its compile (not yet timed
on a device; the check compiles every row before it runs any).

`--cpu` runs a tiny model's solver instead (8 rows, a 32-token prompt, 128 new tokens compiled, 16
run): measured, not judged. The solver's generator config has no attention option (it runs the
model's default), so the command line's `--attention_impl` does not apply to this row: its record
says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from configs import kace as presets
from kace import plan as kace_plan
from lm import device_check
from lm import plan as plan_lib
from lm import sharding as sharding_lib

PRESET = "qwen3_4b"
STEPS = 1024  # decode steps a call runs, of the plan's 38,912 (the module's docstring: its cost)
CPU_STEPS = 16
MESH = tuple(f"roles.solver.mesh.{axis}" for axis in ("data", "fsdp", "tp"))


def _planned(cpu: bool) -> tuple[dict, plan_lib.Target, int, str]:
  """The row's config (as a dict, `kace.plan`'s input), this host as a target, the prompt tokens and
  the row's name."""
  target = plan_lib.local_target()
  if cpu:
    c = presets.get_config(PRESET)
    c.roles.solver.update(preset="tiny_qwen3", dtype="float32")
    c.roles.solver.sampler.update(min_prompt_bucket=16, step_bucket=64, max_rows=8)
    c.sampling.max_tokens = 128
    return c.to_dict(), target, 32, f"{PRESET} (a tiny_qwen3 solver)"
  if target.name not in presets.TARGETS[PRESET]:
    raise ValueError(f"no docs/scale.md row plans {target.name!r} (device {jax.devices()[0].device_kind!r})")
  name = f"{PRESET}@{target.name}"
  return presets.get_config(name).to_dict(), target, kace_plan.PROMPT_TOKENS, name


def recorded_peak(
  config: dict, target: str, devices: int, path: str = device_check.PLAN_RECORDS
) -> float | None:
  """The plan's figure for the solver program's own peak at `config`'s rows and mesh on `target` (of
  `devices` devices), `lm.device_check.recorded_peak` of the preset's records; None if never compiled.
  A record's tried lines name the rows and the mesh; a line naming no mesh is at the record's own
  (a plan that searched the preset's mesh only), so the mesh must be the record's for any figure."""
  solver = config["roles"]["solver"]
  rows, mesh = solver["sampler"]["max_rows"], {k: solver["mesh"][k.rsplit(".", 1)[1]] for k in MESH}
  label = plan_lib.mesh_label(sharding_lib.MeshConfig(*mesh.values()), devices)
  return device_check.recorded_peak(
    f"configs/kace.py:{PRESET}", target, "sample", {"roles.solver.sampler.max_rows": rows, **mesh},
    rf"{rows} rows(?:, {label}[^:]*)?: peak ([\d.]+) GiB", fixed=dict.fromkeys(MESH), path=path,
  )  # fmt: skip


def steps_run(tokens: np.ndarray, stopped: np.ndarray) -> int:
  """New tokens the longest row chose, from a call's outputs: its tokens ([B, steps], -1 at EOS and
  after a row is done) and whether it stopped on EOS (the EOS token was chosen, not kept)."""
  return int(((tokens >= 0).sum(axis=1) + stopped).max())


def solver_row(
  *,
  cpu: bool,
  steps: int = 0,
  attention_impl: str = "",
  tolerances: device_check.Tolerances | None = None,
  memory_stats=None,
  trials: int = 1,
) -> device_check.CompiledRow:
  """The planned solver program on this host's devices, compiled; run for `steps` decode steps
  (default `STEPS`, `CPU_STEPS` with `cpu`) on random weights and the plan's own inputs, it records
  predicted beside measured, judged (`lm.device_check.compiled_row`, its time truncated).
  `memory_stats`: the device's, unless a test gives its own."""
  config, target, prompt_tokens, name = _planned(cpu)
  steps = steps or (CPU_STEPS if cpu else STEPS)
  rows = config["roles"]["solver"]["sampler"]["max_rows"]
  solver = kace_plan.shaped(config, "solver", target, rows=rows, prompt_tokens=prompt_tokens)
  shaped = solver.shaped
  (call,) = shaped.programs  # on a mesh, every platform: one program, prefill then decode
  compiled = call.fn.lower(*call.args, **call.kwargs).compile()
  here = kace_plan.compiled_program(solver, target, compiled)
  recorded = None if cpu else recorded_peak(config, target.name, target.devices)
  outputs = []  # the last call's tokens and stop flags (small), to count its steps

  def measure() -> dict[str, Any]:
    host = {**shaped.host_inputs, "max_new": np.minimum(shaped.host_inputs["max_new"], steps)}
    args = device_check.random_like(call.args, 3000)
    kwargs = {k: jax.device_put(host[k], v.sharding) for k, v in call.kwargs.items()}

    def call_once(*a):
      out = compiled(*a, **kwargs)
      outputs[:] = [out[0], out[3]]
      return out

    return device_check.measure(  # tens of seconds a call on a GPU: no warm-up call
      call_once, lambda: args, trials=trials, warmup=cpu, memory_stats=memory_stats
    )

  def truncation() -> device_check.Truncation:
    ran = steps_run(*sharding_lib.to_host(tuple(outputs)))
    model = plan_lib.sampler_model(
      solver.model.config, prompts=shaped.prompts, prompt_len=shaped.prompt_len, steps=ran, n=1,
      weights_bytes=plan_lib.tree_bytes(shaped.weights), devices=solver.mesh.devices.size,
      itemsize=solver.model.dtype.itemsize, cache_steps=shaped.steps,
    )  # fmt: skip
    return device_check.Truncation(
      steps_run=ran, planned_steps=shaped.steps, model_flops=model[0], model_bytes=model[1],
      roofline_seconds=plan_lib.roofline_seconds(model, target),
    )  # fmt: skip

  program = here.detail
  if attention_impl:
    program += f"; --attention_impl={attention_impl} not applied: the solver runs the model's default"
  return device_check.compiled_row(
    here, row=f"configs/kace.py:{name}: the solver's sampler on {target.name}", program=program,
    target=target, cpu=cpu, recorded=recorded, measure=measure, truncation=truncation, tolerances=tolerances,
    memory_stats=memory_stats,
  )  # fmt: skip


def rows(cpu: bool, attention_impl: str = "") -> dict[str, Callable[[], device_check.CompiledRow]]:
  """The planned row `launch.device_check` adds to the check, compiling it (`attention_impl` does
  not apply: the record says so)."""
  return {"kace sampler": lambda: solver_row(cpu=cpu, attention_impl=attention_impl)}
