"""Where the planned DPA-GRPO `accumulate` spends its time on this device, and whether the plan's
memory figure moves with the compiler or with the compile being deviceless.

Run on the accelerator after the device check (scripts/device_check.sh) says a row disagrees:

  python -m tools.device_profile --out=$OUT                # on the device: writes profile.json,
                                                           # accumulate.hlo.txt.gz
  python -m tools.device_profile --out=$OUT --attention=blockwise,cudnn --skip_deviceless
  python -m tools.device_profile --out=/tmp/p --pairs=1    # CPU: the same code at the tiny preset

Two parts, each recorded even when the other fails:
  profile    the row's program at `--pairs` pairs a chunk (fewer rows than planned: the work per
             token is the same, and the trace stays small), for each `--attention` implementation
             (`ModelConfig.attention_impl`) on the same random weights and batch, whose gradients
             and loss are compared with the first's; one call traced with jax.profiler after a
             warm-up; the device's events summed by name (and by name with its ".N" suffix cut,
             so every fusion of one kind adds up), the top ones with one event's arguments; the
             compiled HLO text beside it, so a fusion's name can be read back to its operations.
  deviceless the row at the planned pairs compiled for the target's topology description (as
             `launch.plan` compiles it, but with this machine's jax), beside this device's own
             compile: the two memory figures say whether the plan record's distance from the device
             comes from the compiler's version or from compiling without the device.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time
import traceback
from typing import Any


def _events(trace_dir: str) -> list[dict[str, Any]]:
  (path,) = glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "perfetto_trace.json.gz"))
  with gzip.open(path) as f:
    trace = json.load(f)
  return trace["traceEvents"] if isinstance(trace, dict) else trace


def summarize(events: list[dict[str, Any]], top: int = 40) -> dict[str, Any]:
  """Device time by event name, on the processes whose name says they are a device (a GPU's or
  TPU's streams; on a CPU, the host's XLA threads), as microseconds and shares of their sum."""
  meta = [e for e in events if e.get("ph") == "M" and e.get("name") == "process_name"]
  names = {e["pid"]: e["args"]["name"] for e in meta}
  device = {pid for pid, n in names.items() if "/device:" in n} or set(names)
  spans = [e for e in events if e.get("ph") == "X" and e.get("pid") in device]
  spans = [e for e in spans if not e["name"].startswith("$")]  # Python frames, not device work
  by_name: collections.Counter[str] = collections.Counter()
  by_kind: collections.Counter[str] = collections.Counter()
  example: dict[str, Any] = {}
  for e in spans:
    by_name[e["name"]] += e.get("dur", 0.0)
    by_kind[re.sub(r"\.\d+$", "", e["name"])] += e.get("dur", 0.0)
    example.setdefault(e["name"], e.get("args", {}))
  total = sum(by_name.values()) or 1.0
  return {
    "device_processes": sorted(names[p] for p in device),
    "events": len(spans),
    "total_us": total,
    "top_names": [
      {"name": n, "us": us, "share": us / total, "args": example[n]} for n, us in by_name.most_common(top)
    ],
    "top_kinds": [{"kind": k, "us": us, "share": us / total} for k, us in by_kind.most_common(top)],
  }


def _profile(pairs: int, cpu: bool, out: str, impls: tuple[str, ...], trace: bool = True) -> dict[str, Any]:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from dpa_grpo import device_check as dpa_device_check
  from dpa_grpo import plan as dpa_plan
  from dpa_grpo import step
  from lm import device_check

  base, target, length, name = dpa_device_check._planned(cpu)  # noqa: SLF001 -- the row's own config
  base = dataclasses.replace(base, train=dataclasses.replace(base.train, pairs_per_chunk=pairs))
  record: dict[str, Any] = {"row": f"configs/dpa_grpo.py:{name} accumulate at {pairs} pairs a chunk"}
  drawn, first = None, None
  for variant in impls:  # the same random weights and batch for each: their gradients must agree
    impl, _, dtype = variant.partition(":")
    overrides = dict(base.model.overrides)
    if cpu:  # 64-token rows: blocks of 16 so that the long-sequence path (CausalMask) runs
      overrides["attention_block"] = 16
    model = dataclasses.replace(base.model, overrides=overrides, attention_impl=impl)
    if dtype:  # e.g. "xla:float32": the same weights, cast up, as a higher-precision reference
      model = dataclasses.replace(model, dtype=dtype)
    exp = dataclasses.replace(base, model=model)
    su = dpa_plan.shaped_step(exp, target, length)
    start = time.perf_counter()
    compiled = step.accumulate.lower(*su.accumulate_args, **su.accumulate_kwargs).compile()
    compile_s = time.perf_counter() - start
    if variant == impls[0] and trace:
      with gzip.open(os.path.join(out, "accumulate.hlo.txt.gz"), "wt") as f:
        f.write(compiled.as_text())
    _, trainable, frozen, batch, key = su.accumulate_args
    if drawn is None:  # drawn once, then rounded to the preset's dtype: every variant's values
      drawn = (
        device_check.random_like(trainable, 1),
        device_check.random_like(frozen, 1000),
      )
    weights = tuple(
      jax.tree.map(lambda w, a: _cast(w, base.model.dtype, a.dtype), w, a)
      for w, a in zip(drawn, (trainable, frozen), strict=True)
    )
    batch = {k: jax.device_put(v, batch[k].sharding) for k, v in su.chunk.items()}
    key = None if key is None else jax.device_put(jax.random.key(0), key.sharding)

    def call(trace_dir: str | None = None, batch=batch, key=key, compiled=compiled, weights=weights):
      args = (jax.tree.map(jnp.zeros_like, weights[0]), *weights, batch, key)
      jax.block_until_ready(args)
      begin = time.perf_counter()
      if trace_dir is None:
        result = jax.block_until_ready(compiled(*args))
      else:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
          result = jax.block_until_ready(compiled(*args))
      return time.perf_counter() - begin, result

    warm, _ = call()
    trace_dir = tempfile.mkdtemp() if trace else None
    timed, (grads, value, _) = call(trace_dir)
    flat = np.concatenate([np.asarray(g, np.float32).ravel() for g in jax.tree.leaves(grads)])
    entry = {
      "program": su.detail,
      "dtype": exp.model.dtype,
      "compile_s": compile_s,
      "seconds_warm_up": warm,
      "seconds_traced" if trace else "seconds": timed,
      "loss": float(value),
      "grad_norm": float(np.linalg.norm(flat)),
    }
    if trace:
      entry["summary"] = summarize(_events(trace_dir))
    if first is None:
      first = (variant, flat, float(value))
    else:
      entry.update(compare(flat, float(value), first[1], first[2], first[0]))
    record[variant] = entry
  how = "jax.profiler trace of one call" if trace else "one call"
  record["source"] = f"measured ({how} after a warm-up; same weights, cast per variant, and batch)"
  return record


def _cast(w: Any, rounding: str, dtype: Any) -> Any:
  """`w` rounded to `rounding` (the preset's dtype), then in `dtype`: a float32 variant reads the
  very values the bfloat16 ones do."""
  import jax.numpy as jnp

  if not jnp.issubdtype(w.dtype, jnp.floating):
    return w
  return w.astype(jnp.dtype(rounding)).astype(dtype)


def compare(flat: Any, loss: float, ref: Any, ref_loss: float, name: str) -> dict[str, float]:
  """How far one variant's gradient and loss lie from the first variant's (`name`): the relative L2
  distance, the cosine, and the share of gradient entries more than 10% off among those whose
  reference magnitude is above the reference's root mean square (small entries are noise in any
  dtype)."""
  import numpy as np

  big = np.abs(ref) > np.sqrt(np.mean(np.square(ref)))
  off = np.abs(flat[big] - ref[big]) > 0.1 * np.abs(ref[big])
  return {
    f"relative_grad_difference_from_{name}": float(np.linalg.norm(flat - ref) / np.linalg.norm(ref)),
    f"grad_cosine_with_{name}": float(flat @ ref / (np.linalg.norm(flat) * np.linalg.norm(ref))),
    f"share_of_large_entries_10pct_off_{name}": float(off.mean()) if off.size else 0.0,
    f"loss_difference_from_{name}": loss - ref_loss,
  }


def _deviceless(cpu: bool) -> dict[str, Any]:
  from dpa_grpo import device_check as dpa_device_check
  from dpa_grpo import plan as dpa_plan
  from lm import plan as plan_lib

  exp, local, _, name = dpa_device_check._planned(cpu)  # noqa: SLF001
  target = plan_lib.cpu_target(1, 16 * plan_lib.GiB) if cpu else plan_lib.TARGETS[local.name]
  start = time.perf_counter()
  (acc,) = dpa_plan.programs(exp, target, sample=False, train=True)[:1]
  return {
    "row": f"configs/dpa_grpo.py:{name} accumulate for {target.name}'s topology description",
    "own_peak_bytes": acc.arguments + acc.outputs - acc.aliased + acc.temporaries,
    "temporaries_bytes": acc.temporaries,
    "compile_s": time.perf_counter() - start,
    "source": "compile (deviceless, this machine's jax)",
  }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="folder for profile.json and accumulate.hlo.txt.gz")
  parser.add_argument("--pairs", type=int, default=4, help="pairs a chunk of the profiled call")
  parser.add_argument("--cpu", action="store_true", help="the tiny preset on the CPU (tests)")
  parser.add_argument("--skip_deviceless", action="store_true")
  parser.add_argument("--no_trace", action="store_true", help="time one call, no profiler trace or HLO")
  parser.add_argument(
    "--attention",
    default="blockwise",
    help="ModelConfig.attention_impl values, comma-separated, each with an optional model dtype"
    " (`xla:float32`); the first is the one the others are compared with (same weights)",
  )
  args = parser.parse_args(argv)
  from lm import memory

  memory.set_gpu_fraction()
  import jax

  os.makedirs(args.out, exist_ok=True)
  record: dict[str, Any] = {"jax": jax.__version__, "devices": [d.device_kind for d in jax.devices()]}
  impls = tuple(a.strip() for a in args.attention.split(",") if a.strip())
  parts = {"profile": lambda: _profile(args.pairs, args.cpu, args.out, impls, not args.no_trace)}
  if not args.skip_deviceless:
    parts["deviceless"] = lambda: _deviceless(args.cpu)
  for part, fn in parts.items():
    try:
      record[part] = fn()
    except Exception as e:  # noqa: BLE001 -- one part's failure keeps the other's record
      record[part] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}
    with open(os.path.join(args.out, "profile.json"), "w") as f:
      json.dump(record, f, indent=1, default=str)
    print(f"device profile: {part}: {json.dumps(record[part], default=str)[:3000]}", flush=True)
  return 0 if all("error" not in record[p] for p in parts) else 1


if __name__ == "__main__":
  sys.exit(main())
