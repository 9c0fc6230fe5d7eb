"""Whether GPU presets should train with cuDNN's fused attention: its gradient against a float32
reference beside our blockwise attention's, and what it does to the planned row's memory and time.

Registered rule (docs/results/2026-12-04-attention-choice.md, committed before the run): cuDNN
becomes the GPU targets' attention when its gradient's relative L2 distance from the float32
reference is at most 1.25x that of the blockwise bfloat16 attention, on the same weights and batch.

Three parts, each written to `--out`/attention_choice.json when it ends (a run cut by its limit keeps
what it measured):
  precision  the planned DPA accumulate at `--pairs` pairs a chunk for each of `VARIANTS` (the
             first is the reference; `tools.device_profile`'s comparison, no trace)
  row        the planned row (docs/scale.md, this device) run with cuDNN's attention
             (`dpa_grpo.device_check.accumulate_row`): memory against this device's own compile (the
             plan has no cuDNN compile: a deviceless XLA:GPU compile has no cuDNN library), time
             against the roofline model
  headroom   this device's own compile of the accumulate with cuDNN's attention at `--sweep` pairs a
             chunk: what a cuDNN preset could carry (compile figures, not runs)

  python -m tools.attention_choice --out=$OUT         # on the GPU (scripts/device_check.sh exec ...)
  python -m tools.attention_choice --out=/tmp/a --cpu # the tiny preset here: the same code, xla for cudnn
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback
from typing import Any

# role -> variant (`tools.device_profile`'s "impl[:dtype]"; no dtype: the preset's, bfloat16): the
# float32 reference first, a second float32 attention as the control (near 0 if the reference is
# sound), the two a GPU preset could train with, and XLA's own fused attention beside them. On the
# CPU (tests) the tiny preset is float32, so its bfloat16 variants are named, and xla stands for cudnn.
VARIANTS = {
  "reference": "xla:float32",
  "control": "blockwise:float32",
  "ours": "blockwise",
  "fused": "cudnn",
  "xla": "xla",
}
CPU_VARIANTS = {**VARIANTS, "ours": "blockwise:bfloat16", "fused": "xla:bfloat16", "xla": "xla:bfloat16"}
RATIO = 1.25  # the registered rule's factor


def decide(precision: dict[str, Any], variants: dict[str, str] = VARIANTS) -> dict[str, Any]:
  """The registered rule on the precision part's record."""
  key = f"relative_grad_difference_from_{variants['reference']}"
  distance = {role: precision[v][key] for role, v in variants.items() if role != "reference"}
  return {
    "rule": f"{variants['fused']} if its distance from the reference <= {RATIO} x {variants['ours']}'s",
    "distance_from_reference": distance,
    "ratio": distance["fused"] / distance["ours"],
    "choose_fused": bool(distance["fused"] <= RATIO * distance["ours"]),
  }


def _headroom(pairs: tuple[int, ...], cpu: bool, impl: str) -> dict[str, Any]:
  from dpa_grpo import device_check as dpa_device_check
  from dpa_grpo import plan as dpa_plan
  from dpa_grpo import step
  from lm import plan as plan_lib

  exp, target, length, name = dpa_device_check._planned(cpu, impl)  # noqa: SLF001
  out: dict[str, Any] = {"row": name, "source": "compile (this device's memory analysis), not a run"}
  for p in pairs:
    e = dataclasses.replace(exp, train=dataclasses.replace(exp.train, pairs_per_chunk=p))
    su = dpa_plan.shaped_step(e, target, length)
    start = time.perf_counter()
    compiled = step.accumulate.lower(*su.accumulate_args, **su.accumulate_kwargs).compile()
    here = plan_lib.figures("accumulate", compiled, target, model=su.model, detail=su.detail)
    out[str(p)] = {
      "program": su.detail,
      "own_peak_gib": (here.arguments + here.outputs - here.aliased + here.temporaries) / plan_lib.GiB,
      "temporaries_gib": here.temporaries / plan_lib.GiB,
      "roofline_s": here.seconds,
      "compile_s": time.perf_counter() - start,
    }
  return out


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--pairs", type=int, default=2, help="pairs a chunk of the precision part")
  parser.add_argument("--sweep", default="16,24,32", help="pairs a chunk compiled for the headroom part")
  parser.add_argument("--parts", default="precision,row,headroom")
  parser.add_argument("--cpu", action="store_true", help="the tiny preset (tests); xla stands for cudnn")
  args = parser.parse_args(argv)
  from lm import memory

  memory.set_gpu_fraction()
  import jax

  from dpa_grpo import device_check as dpa_device_check
  from tools import device_profile

  variants = CPU_VARIANTS if args.cpu else VARIANTS
  fused = "xla" if args.cpu else "cudnn"  # cuDNN's attention runs on NVIDIA GPUs only
  os.makedirs(args.out, exist_ok=True)
  record: dict[str, Any] = {"jax": jax.__version__, "devices": [d.device_kind for d in jax.devices()]}
  parts = {
    "precision": lambda: device_profile._profile(
      args.pairs, args.cpu, args.out, tuple(variants.values()), trace=False
    ),  # noqa: SLF001
    "row": lambda: dpa_device_check.accumulate_row(cpu=args.cpu, attention_impl=fused).run(),
    "headroom": lambda: _headroom(tuple(int(p) for p in args.sweep.split(",")), args.cpu, fused),
  }
  chosen = [p.strip() for p in args.parts.split(",") if p.strip()]
  if not chosen or set(chosen) - set(parts):
    parser.error(f"--parts must be some of {tuple(parts)}, got {args.parts!r}")
  for part in chosen:
    start = time.perf_counter()
    try:
      record[part] = parts[part]()
      if part == "precision":
        record["decision"] = decide(record[part], variants)
    except Exception as e:  # noqa: BLE001 -- one part's failure keeps the others' records
      record[part] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}
    record[part]["part_s"] = time.perf_counter() - start
    with open(os.path.join(args.out, "attention_choice.json"), "w") as f:
      json.dump(record, f, indent=1, default=str)
    print(f"attention choice: {part}: {json.dumps(record[part], default=str)[:2500]}", flush=True)
  if "decision" in record:
    print(f"attention choice: decision: {json.dumps(record['decision'])}", flush=True)
  return 0 if all("error" not in record[p] for p in chosen) else 1


if __name__ == "__main__":
  sys.exit(main())
