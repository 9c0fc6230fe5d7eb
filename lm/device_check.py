"""The device check: what a session lent a GPU (or a TPU VM) runs once, in under 10 minutes, to find
out whether the plan (docs/scale.md) is right about this device.

`scripts/device_check.sh` runs `launch.device_check`, which adds the papers' planned rows (their
programs at the shapes docs/scale.md plans for this device: `dpa_grpo.device_check`'s sampler and
train step, `kace.device_check`'s solver, whose time is a truncated measurement) to this module's
parts:

  parity   our forward of a tiny random Qwen3 checkpoint (committed: `lm/parity_inputs/`, from
           `prepare`, where transformers is installed) in float32 and in bfloat16 against
           transformers' float32 logits (the float32 run at `highest` matmul precision, so that TF32
           is not mistaken for a bug);
  memory   the measured memory bandwidth (a jitted copy, best of 5);
  decode   a reduced Qwen3-4B (its widths, vocabulary and heads, fewer layers, random bf16
           weights): the sampler's decode tokens/s against the memory-bandwidth roofline;
  rows     each planned program compiled as the plan compiles it and run on random weights
           (`measure`): its own peak memory and its time against the plan's (`judge`: memory within
           10%, time within 2x of the roofline model, `Tolerances`). Every row is compiled first and
           they run in ascending order of their own peaks by this device's compile (`CompiledRow`).

Every part writes its record to the output JSON even when another fails, and says where each
figure comes from ("measured", "compile", "model"). The check passes only when every part ran,
parity held and every planned row was judged and agreed. `--cpu` runs the same code at toy sizes so
CI exercises it; its numbers say nothing about an accelerator (a CPU reports no memory in use, and
its roofline figures are nominal, so its rows are measured but not judged).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

PARITY_TOKENS = 24  # tokens per row of the parity batch
PARITY_ROWS = 3
PARITY_INPUTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "parity_inputs")  # committed


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckConfig:
  """Sizes of one device check (`for_mode` builds the two shipped ones).

  Attributes:
    layers: decoder layers of the reduced Qwen3-4B (its other dimensions are the real model's).
    rows: decode rows (prompts x samples) of the decode measurement.
    prompt_len, new_tokens: prompt and generated tokens per row.
    bandwidth_bytes: size of the array the bandwidth measurement copies.
    tiny_widths: use the tiny test model's widths instead of Qwen3-4B's (the `--cpu` mode).
  """

  layers: int
  rows: int
  prompt_len: int
  new_tokens: int
  bandwidth_bytes: int
  tiny_widths: bool

  @classmethod
  def for_mode(cls, cpu: bool) -> CheckConfig:
    if cpu:
      return cls(layers=2, rows=2, prompt_len=16, new_tokens=16, bandwidth_bytes=1 << 24, tiny_widths=True)
    return cls(layers=4, rows=8, prompt_len=512, new_tokens=256, bandwidth_bytes=1 << 30, tiny_widths=False)


def prepare(directory: str, seed: int = 0) -> str:
  """Writes the parity inputs: a tiny Qwen3 checkpoint and transformers' float32 logits of it."""
  import torch
  import transformers

  from lm.config import ModelConfig

  os.makedirs(directory, exist_ok=True)
  config = ModelConfig.tiny_qwen3(vocab_size=128)
  hf_config = transformers.Qwen3Config(**config.to_hf_dict())
  torch.manual_seed(seed)
  model = transformers.Qwen3ForCausalLM(hf_config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.1 * torch.randn_like(p))
  checkpoint = os.path.join(directory, "tiny_qwen3")
  model.save_pretrained(checkpoint)
  tokens = np.random.default_rng(seed).integers(2, config.vocab_size, (PARITY_ROWS, PARITY_TOKENS))
  with torch.no_grad():
    logits = model(torch.as_tensor(tokens)).logits.float().numpy()
  np.savez(os.path.join(directory, "parity_reference.npz"), tokens=tokens, logits=logits)
  return directory


def _parity(inputs: str) -> dict[str, Any]:
  import jax
  import jax.numpy as jnp

  from lm import hf

  ref = np.load(os.path.join(inputs, "parity_reference.npz"))
  tokens, want = jnp.asarray(ref["tokens"]), ref["logits"]
  out: dict[str, Any] = {"source": "measured", "reference": "transformers float32 (prepared on CPU)"}
  for dtype in ("float32", "bfloat16"):
    model = hf.load_hf(os.path.join(inputs, "tiny_qwen3"), dtype=dtype)
    with jax.default_matmul_precision("highest"):
      got = np.asarray(jax.jit(lambda t, m=model: m(t))(tokens), np.float32)
    err = np.abs(got - want)
    out[dtype] = {
      "max_abs_err": float(err.max()),
      "max_abs_err_over_logit_std": float(err.max() / want.std()),
      "argmax_agreement": float((got.argmax(-1) == want.argmax(-1)).mean()),
    }
  # float32 must match to rounding; bfloat16 weights and activations (8 bits of mantissa) to a
  # few percent of the logits' spread, with the same top token nearly everywhere.
  out["ok"] = bool(
    out["float32"]["max_abs_err"] < 1e-3
    and out["bfloat16"]["max_abs_err_over_logit_std"] < 0.1
    and out["bfloat16"]["argmax_agreement"] >= 0.9
  )
  return out


def measure_bandwidth(num_bytes: int, repeats: int = 5) -> float:
  """Bytes per second of a jitted elementwise pass over `num_bytes` of float32 (read + write)."""
  import jax
  import jax.numpy as jnp

  x = jnp.ones((num_bytes // 4,), jnp.float32)
  f = jax.jit(lambda a: a * 1.0001)
  f(x).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    f(x).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * num_bytes / best


def reduced_qwen3_4b(cfg: CheckConfig):
  """Qwen3-4B's widths with `cfg.layers` layers (or the tiny test widths in `--cpu` mode)."""
  from lm.config import ModelConfig

  base = ModelConfig.tiny_qwen3() if cfg.tiny_widths else ModelConfig.qwen3_4b()
  return dataclasses.replace(base, num_layers=cfg.layers)


def decode_roofline(config, *, rows: int, context: int, dtype_bytes: int, bandwidth: float) -> float:
  """Decode tokens/s the memory-bandwidth bound allows: every step reads every weight once and
  each row's KV cache of `context` slots (its mean length over the generation)."""
  from lm import plan

  weight_bytes = config.num_params * dtype_bytes
  return rows * bandwidth / (weight_bytes + rows * plan.kv_row_bytes(config, context, dtype_bytes))


def _decode(cfg: CheckConfig, bandwidth: float) -> dict[str, Any]:
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from lm.model import Qwen
  from lm.sampler import Sampler

  config = reduced_qwen3_4b(cfg)
  dtype = jnp.float32 if cfg.tiny_widths else jnp.bfloat16
  model = Qwen(config, rngs=nnx.Rngs(0), param_dtype=dtype)
  sampler = Sampler(model)
  prompts = [[int(t) for t in np.arange(cfg.prompt_len) % 97 + 3] for _ in range(cfg.rows)]

  def timed(new_tokens: int) -> float:
    kwargs = dict(max_new_tokens=new_tokens, temperature=0.0, seed=0)
    sampler.generate(prompts, **kwargs)  # compiles
    start = time.perf_counter()
    sampler.generate(prompts, **kwargs)
    return time.perf_counter() - start

  first = timed(1)  # prefill and one token
  whole = timed(cfg.new_tokens)
  decode_s = max(whole - first, 1e-9)
  tok_s = cfg.rows * (cfg.new_tokens - 1) / decode_s
  bound = decode_roofline(
    config,
    rows=cfg.rows,
    context=cfg.prompt_len + cfg.new_tokens // 2,
    dtype_bytes=jnp.dtype(dtype).itemsize,
    bandwidth=bandwidth,
  )
  return {
    "model": {"layers": config.num_layers, "hidden": config.hidden_size, "params": config.num_params},
    "rows": cfg.rows,
    "prompt_len": cfg.prompt_len,
    "new_tokens": cfg.new_tokens,
    "prefill_and_first_token_s": first,
    "decode_tokens_per_s": tok_s,
    "roofline_tokens_per_s": bound,
    "fraction_of_roofline": tok_s / bound,
    "source": "measured (tokens/s); model (roofline: weight + KV bytes per step over measured bandwidth)",
    "backend": jax.default_backend(),
  }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tolerances:
  """How close a measurement must come to the plan for the check to pass.

  memory: |measured − predicted| / predicted of a program's own peak bytes (the compile's buffer
    assignment is exact, so more than 10% off means the plan reads the wrong program or shapes).
  time: measured seconds / the roofline model's within [1 / time, time] (the roofline is a lower
    bound that a good program comes within 2x of; slower means the plan's times are not to be
    believed on this device).
  """

  memory: float = 0.10
  time: float = 2.0


def _device_bytes(tree: Any, device: Any) -> int:
  """Bytes of a tree's arrays that live on `device` (its shards there)."""
  total = 0
  import jax

  for leaf in jax.tree.leaves(tree):
    for shard in getattr(leaf, "addressable_shards", ()):
      if shard.device == device:
        total += shard.data.nbytes
  return total


def measure(
  fn: Callable[..., Any],
  make_args: Callable[[], tuple],
  *,
  trials: int = 3,
  warmup: bool = True,
  memory_stats: Callable[[], dict | None] | None = None,
) -> dict[str, Any]:
  """Runs a compiled program `trials` times, after one call that warms up unless `warmup` is False
  (a program that runs for tens of seconds spends no measurable share of them starting), on fresh
  arguments (`make_args()`, made outside the timing: a program may donate them) and measures, on
  the first local device, its seconds (median) and its own peak memory: its arguments' bytes there
  plus how far the device's peak bytes in use rose above what was in use before the first call.

  The device's peak is the process's peak so far, which cannot be reset; the rise over the bytes
  in use before the call is the program's own only when the call set a new peak. When it did not
  (something earlier in the process peaked higher), the peak is reported as not observable (None),
  never as the earlier figure. `memory_stats`: the device's `memory_stats` (a test passes its own).
  """
  import jax

  device = jax.local_devices()[0]
  stats = memory_stats or device.memory_stats
  seconds, before, args_bytes = [], None, 0
  for i in range(trials + int(warmup)):
    args = make_args()
    jax.block_until_ready(args)
    if i == 0:
      before, args_bytes = stats() or {}, _device_bytes(args, device)
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    seconds.append(time.perf_counter() - start)
    del args
  after = stats() or {}
  timed = seconds[int(warmup) :]
  out: dict[str, Any] = {
    "seconds": float(np.median(timed)),
    "seconds_all": timed,
    "argument_bytes": args_bytes,
    "source": f"measured (seconds: median of {trials}{' after a warm-up call' if warmup else ''}; peak: "
    "arguments + the rise of the device's peak bytes in use over the bytes in use before the first call)",
  }
  if "peak_bytes_in_use" not in after or "bytes_in_use" not in before:
    out["peak_bytes"], out["peak_note"] = None, "this backend reports no memory in use"
  elif after["peak_bytes_in_use"] <= before.get("peak_bytes_in_use", 0):
    out["peak_bytes"] = None
    out["peak_note"] = "not observable: the process had peaked higher before the program ran"
  else:
    out["peak_bytes"] = args_bytes + after["peak_bytes_in_use"] - before["bytes_in_use"]
  return out


def judge(
  *,
  predicted_bytes: float,
  measured_bytes: float | None,
  predicted_seconds: float | None,
  measured_seconds: float,
  tolerances: Tolerances = Tolerances(),
  require: tuple[str, ...] = ("memory", "time"),
) -> dict[str, Any]:
  """Prediction against measurement, each within its tolerance. A quantity in `require` that could
  not be compared (not measured; no published figures for a roofline) fails the check: a check
  that cannot compare has not shown the plan right. Others are reported, not judged."""
  out: dict[str, Any] = {"tolerances": dataclasses.asdict(tolerances)}
  if measured_bytes is None or not predicted_bytes:
    out["memory"] = {"ok": None, "why": "not measured"}
  else:
    err = abs(measured_bytes - predicted_bytes) / predicted_bytes
    out["memory"] = {"ok": err <= tolerances.memory, "relative_error": err}
  if predicted_seconds is None or not np.isfinite(predicted_seconds) or predicted_seconds <= 0:
    out["time"] = {"ok": None, "why": "no roofline: no published figures for this device"}
  else:
    ratio = measured_seconds / predicted_seconds
    out["time"] = {"ok": 1 / tolerances.time <= ratio <= tolerances.time, "measured_over_roofline": ratio}
  judged = [out[q]["ok"] for q in ("memory", "time")]
  out["ok"] = all(out[q]["ok"] is True for q in require) and False not in judged
  return out


PLAN_RECORDS = os.path.normpath(os.path.join(os.path.dirname(PARITY_INPUTS), "..", "docs/results/plan.jsonl"))


def recorded_peak(
  preset: str,
  target: str,
  program: str,
  overrides: Mapping[str, Any],
  tried: str,
  *,
  fixed: Mapping[str, Any] | None = None,
  path: str = PLAN_RECORDS,
) -> float | None:
  """The plan's figure for `program`'s own peak (bytes, resident left out) of `preset` (e.g.
  "configs/kace.py:qwen3_4b") on `target` at the configuration `overrides` names, from the newest
  record (the file is append-only): its chosen program when its overrides agree, else the candidate
  of those it tried that `tried` (a regex with one group, GiB) matches (its peak is written to 0.1
  GiB there); None when the plan never compiled that configuration.

  `fixed`: overrides a record's tried lines do not vary (they name only rows, pairs, remat, mesh),
  mapped to the value a record without the key compiled: a row whose value differs from the record's
  has no figure there at all (the DPA rows' attention: the plan compiles the blockwise one)."""
  if not os.path.exists(path):
    return None
  record = None
  with open(path) as f:
    for line in f:
      r = json.loads(line) if line.strip() else {}
      if r.get("preset") == preset and r.get("target") == target:
        record = r
  if record is None or not record.get("programs"):
    return None
  chosen = next((p for p in record["programs"] if p["name"] == program), None)
  if chosen is None:
    return None
  fixed = fixed or {}
  if any(record["overrides"].get(k, d) != overrides.get(k, d) for k, d in fixed.items()):
    return None  # another configuration's program: the plan never compiled this one
  rest = {k: v for k, v in overrides.items() if k not in fixed}
  if all(record["overrides"].get(k) == v for k, v in rest.items()):
    return float(chosen["peak"] - chosen["resident"])
  for line in record.get("tried", ()):
    found = re.match(tried, line)
    if found:
      return float(found.group(1)) * 2**30 - chosen["resident"]  # same state beside it
  return None


def random_like(abstract: Any, seed: int) -> Any:
  """Arrays of `abstract`'s shapes, dtypes and shardings: normal(0, 0.02) for floats, made on the
  devices (one leaf at a time), so no host holds 8 GB of weights."""
  import jax
  import jax.numpy as jnp

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


def own_peak(here: Any) -> int:
  """A compiled program's own peak (`lm.plan.ProgramPlan`: arguments + outputs − aliased +
  temporaries): what `measure` measures; the plan's `resident` is state a run holds beside it."""
  return here.arguments + here.outputs - here.aliased + here.temporaries


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompiledRow:
  """A planned row compiled on this device, not yet run (what a paper's row function returns).

  own_bytes: its program's own peak by this device's compile (`own_peak`; on the H200 the compile
    came within 0.05% of the measurement): `check` runs the rows in ascending order of it, since a
    row's peak is observable only when nothing earlier in the process peaked higher (`measure`).
  run: runs it on random weights and returns its record (`compiled_row`).
  """

  own_bytes: int
  run: Callable[[], dict[str, Any]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Truncation:
  """A row that runs its planned program for fewer decode steps than it was compiled for (the
  runtime `max_new` of every row set lower: the program, its KV cache and so its memory are the
  plan's), so that a decode of minutes fits the check: its time is judged against the roofline of
  the steps it ran (`lm.plan.sampler_model` of those steps over the compiled cache).

  steps_run: new tokens the longest row chose (the decode loop runs until every row is done).
  planned_steps: the step bucket the program was compiled for.
  model_flops, model_bytes: per device, the model of the run (prefill and `steps_run` steps).
  roofline_seconds: `lm.plan.roofline_seconds` of that model.
  """

  steps_run: int
  planned_steps: int
  model_flops: float
  model_bytes: float
  roofline_seconds: float


def compiled_row(
  here: Any,
  *,
  row: str,
  program: str,
  target: Any,
  cpu: bool,
  recorded: float | None,
  measure: Callable[[], dict[str, Any]],
  truncation: Callable[[], Truncation] | None = None,
  tolerances: Tolerances | None = None,
  memory_stats: Callable[[], dict | None] | None = None,
) -> CompiledRow:
  """This device's compile `here` (a `lm.plan.ProgramPlan`) of a planned row, to run: `measure()`
  (`measure`'s record of it on random weights), then `truncation()` where the run was cut short,
  judged and recorded (`_row_record`)."""

  def run() -> dict[str, Any]:
    measured = measure()
    return _row_record(
      row=row, program=program, target=target, cpu=cpu, recorded=recorded, here=here, measured=measured,
      tolerances=tolerances, memory_stats=memory_stats, truncation=truncation() if truncation else None,
    )  # fmt: skip

  return CompiledRow(own_bytes=own_peak(here), run=run)


def _row_record(
  *,
  row: str,
  program: str,
  target: Any,
  cpu: bool,
  recorded: float | None,
  here: Any,
  measured: dict[str, Any],
  tolerances: Tolerances | None = None,
  memory_stats: Callable[[], dict | None] | None = None,
  truncation: Truncation | None = None,
) -> dict[str, Any]:
  """One planned row's record: predicted (the plan's record `recorded` where there is one, else this
  device's compile `here`, a `lm.plan.ProgramPlan`) beside measured, and the judgement. On a CPU
  (no published figures, no memory in use) the time is not judged, nor the memory unless a test
  plants `memory_stats`."""
  own = own_peak(here)
  predicted = recorded if recorded is not None else own
  seconds = truncation.roofline_seconds if truncation else here.seconds
  judgement = judge(
    predicted_bytes=predicted,
    measured_bytes=measured["peak_bytes"],
    predicted_seconds=None if cpu else seconds,  # a CPU has no published figures
    measured_seconds=measured["seconds"],
    tolerances=tolerances or Tolerances(),
    require=() if cpu and memory_stats is None else ("memory",) if cpu else ("memory", "time"),
  )
  roofline = {
    "roofline_seconds": seconds,
    "roofline_source": "model (counted FLOPs and bytes over the device's published peak)",
  }
  if truncation:
    roofline |= {
      "roofline_source": f"model of the steps run ({truncation.steps_run} of {truncation.planned_steps}: "
      "a truncated measurement), counted FLOPs and bytes over the device's published peak",
      "full_program_roofline_seconds": here.seconds,
      "full_program_model": {"flops": here.model_flops, "bytes": here.model_bytes},
      "truncation": dataclasses.asdict(truncation),
    }
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
      **roofline,
    },
    "measured": measured,
    "judgement": judgement,
  }  # fmt: skip


def _run_part(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
  start = time.perf_counter()
  try:
    result = fn()
  except Exception as e:  # one failed part never loses the others' records
    result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=6)}
  result["seconds"] = time.perf_counter() - start
  print(f"device check: {name}: {json.dumps(result, default=str)[:400]}", flush=True)
  return result


# cpu, then the row options the command line names (`--attention_impl`), to the rows by name, each
# a function that compiles its row
PlannedRows = Callable[..., Mapping[str, Callable[[], CompiledRow]]]
PARTS = ("parity", "memory", "rows", "decode")


def check(
  inputs: str,
  out_path: str,
  *,
  cpu: bool,
  rows: PlannedRows | None = None,
  parts: tuple[str, ...] = PARTS,
  row_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
  """Runs each of `parts` (all by default), the planned rows being `rows(cpu, **row_options)` (name
  → a function compiling it, `CompiledRow`, whose `run` returns its record with a `judgement` from
  `judge`), and writes the record to `out_path`; returns it. A check of fewer parts (a rerun of one
  row under another option) passes on the parts it ran; its record names them."""
  import jax

  cfg = CheckConfig.for_mode(cpu)
  record: dict[str, Any] = {
    "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "mode": "cpu" if cpu else "accelerator",
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "devices": [str(d.device_kind) for d in jax.devices()],
    "python": platform.python_version(),
    "config": dataclasses.asdict(cfg),
    "parts": list(parts),
    "row_options": dict(row_options or {}),
  }
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)

  def write() -> None:  # after every part: a run cut short by its time limit keeps what it measured
    with open(out_path, "w") as f:
      json.dump(record, f, indent=1, default=str)

  unknown = sorted(set(parts) - set(PARTS))
  if unknown or not parts:
    raise ValueError(f"device check parts must be some of {PARTS}, got {list(parts)}")
  record["ok"], record["why"] = False, "not finished"
  if "parity" in parts:
    record["parity"] = _run_part("parity", lambda: _parity(inputs))
    write()
  bandwidth: dict[str, Any] = {}
  if "memory" in parts:
    bandwidth = record["memory"] = _run_part(
      "memory", lambda: {"bytes_per_s": measure_bandwidth(cfg.bandwidth_bytes)}
    )
    write()
  # The planned rows before the decode measurement: they are what the check is for, and a row's
  # peak is observable only when nothing earlier in the process peaked higher (`measure`). So every
  # row is compiled first, and they run in ascending order of their own peaks (this device's
  # compile, exact where the plan's deviceless one is another compiler's).
  planned = dict(rows(cpu, **(row_options or {}))) if rows and "rows" in parts else {}
  compiled: dict[str, CompiledRow] = {}
  if "rows" in parts:
    record["rows"], compile_seconds = {}, {}

    def compile_row(name: str, make: Callable[[], CompiledRow]) -> dict[str, Any]:
      compiled[name] = make()
      return {"this_compile_peak_bytes": compiled[name].own_bytes}

    for name, make in planned.items():
      done = _run_part(f"{name} (compile)", lambda n=name, m=make: compile_row(n, m))
      compile_seconds[name] = done["seconds"]
      if name not in compiled:
        record["rows"][name] = done  # its error
    record["row_order"] = sorted(compiled, key=lambda name: compiled[name].own_bytes)
    for name in record["row_order"]:
      ran = _run_part(name, compiled.pop(name).run)  # its compile dropped once run
      record["rows"][name] = {**ran, "compile_seconds": compile_seconds[name]}
      write()
  if "decode" in parts:
    bw = bandwidth.get("bytes_per_s") or 1e9
    record["decode"] = _run_part("decode", lambda: _decode(cfg, bw))
  ran = all("error" not in record[p] for p in ("parity", "memory", "decode") if p in parts)
  ran = ran and all("error" not in r for r in record.get("rows", {}).values())
  agreed = all(r.get("judgement", {}).get("ok") for r in record.get("rows", {}).values())
  parity = record["parity"].get("ok") if "parity" in parts else True
  record["ok"] = bool(ran and parity and agreed and (planned or cpu or "rows" not in parts))
  del record["why"]
  if not planned and not cpu and "rows" in parts:
    record["why"] = "no planned row for this device: the plan was not checked"
  write()
  return record


def main(argv: list[str] | None = None, rows: PlannedRows | None = None) -> int:
  """`prepare` (writes the parity inputs) or `check` (every part, and `rows`' planned rows)."""
  import argparse

  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("step", choices=("prepare", "check"))
  parser.add_argument("--inputs", default=PARITY_INPUTS, help="folder of the parity inputs (committed)")
  parser.add_argument("--out", default="device_check.json", help="where `check` writes its record")
  parser.add_argument("--cpu", action="store_true", help="toy sizes on the CPU (what CI runs)")
  parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, some of {PARTS}")
  parser.add_argument(
    "--attention_impl",
    default="",
    help="the planned rows' ModelConfig.attention_impl instead of their preset's (blockwise, xla, cudnn)",
  )
  args = parser.parse_args(argv)
  if args.step == "prepare":
    print(f"device check inputs written to {prepare(args.inputs)}")
    return 0
  if not os.path.exists(os.path.join(args.inputs, "parity_reference.npz")):
    parser.error(f"--inputs={args.inputs} has no parity_reference.npz: run `prepare` first (where torch is)")
  parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
  if not parts or set(parts) - set(PARTS):
    parser.error(f"--parts must be some of {PARTS}, got {args.parts!r}")
  options = {"attention_impl": args.attention_impl} if args.attention_impl else {}
  record = check(args.inputs, args.out, cpu=args.cpu, rows=rows, parts=parts, row_options=options)
  print(f"device check {'passed' if record['ok'] else 'FAILED'}: {args.out}")
  return 0 if record["ok"] else 1


if __name__ == "__main__":
  raise SystemExit(main())
