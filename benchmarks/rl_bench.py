"""One DPA-GRPO step — its rollout sampling and its train step — in JAX (this project) and PyTorch.

  python -m benchmarks.rl_bench            # 4 layers × 256, V 8192; 8 pairs × 256 tokens; 7 trials
  python -m benchmarks.rl_bench --quick    # a tiny model and batch, 3 trials: seconds (a test runs it)

The same interleaved harness as `benchmarks.sampler_bench` (`benchmarks.harness`): each side in its
own worker process (`benchmarks.rl_workers`), started one at a time, then trials in which each side
runs once, in an order that rotates from trial to trial. Both load the same random float32 Qwen3
checkpoint (transformers `save_pretrained`, weights std 0.1 so greedy rows do not repeat a token)
and the same inputs. A side's trial is one step:

- rollout: P prompts (the batch's), `--samples` samples each of `--new_tokens` tokens, EOS
  ignored, at the draft turn's sampling settings of `dpa_grpo.rollout.RolloutConfig` (temperature
  0.2, top-p 0.9). JAX: `lm.Sampler` with the trainer's settings; PyTorch: transformers `generate`.
- train: the DPA-GRPO loss (pair weights, k1, β 0.04) on P packed pairs, backward, AdamW.
  JAX: `dpa_grpo.step` as the trainer runs it (`--chunks` accumulation chunks, donated buffers, the
  sampler refreshed after the update); PyTorch: `benchmarks.train_step_bench.TorchStep`.
  Both JAX and the `torch_window` side project onto the vocabulary only at the batch's completion
  window (`lm.scoring.pack_pairs`' `completion_positions`: the loss reads no other position);
  `torch` projects every position, as a plain PyTorch loss would.

Agreement, checked before any trial is timed: greedy tokens over the first 16 steps, and the first
train step's loss and gradient global norm (both sides start from the same weights) within
LOSS_RTOL / NORM_RTOL. Reported per side, median [min–max] over the trials: rollout tokens/s, train
tokens/s (non-pad tokens of the batch a second), the whole step's seconds; and JAX ÷ PyTorch of each,
computed within every trial; load and warm-up (compilation) time. Roofline: each side's train step
as counted FLOPs a second over a float32 matmul peak measured in this process, its rollout against
the decode bound (weights and KV cache read once a step at the measured read bandwidth).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile

from benchmarks import harness
from benchmarks.harness import fmt

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIDES = ("jax", "torch", "torch_window")
AGREEMENT_STEPS = 16
LOSS_RTOL = 1e-4  # |Δloss| ≤ LOSS_RTOL·max(1, |loss|): float32, different kernels and summation order
NORM_RTOL = 1e-3  # relative difference of the gradient's global norm
COLUMNS = (
  "side",
  "rollout tok/s",
  "jax÷ rollout",
  "train tok/s",
  "jax÷ train",
  "step s",
  "jax÷ step",
  "load s",
  "warm-up s",
  "loss",
  "grad norm",
  "agree",
  "version",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Setup:
  """The step a run measures."""

  pairs: int
  length: int
  vocab: int
  chunks: int
  samples: int
  new_tokens: int
  hidden: int = 256
  layers: int = 4
  heads: int = 4
  kv_heads: int = 2
  head_dim: int = 64

  @property
  def dims(self) -> harness.Dims:
    return harness.Dims(
      layers=self.layers,
      hidden=self.hidden,
      intermediate=3 * self.hidden,  # train_step_bench.small_qwen3's MLP
      heads=self.heads,
      kv_heads=self.kv_heads,
      head_dim=self.head_dim,
      vocab=self.vocab,
    )

  def train_flops(self, scored_per_row: int) -> float:
    """A train step's counted FLOPs: the policy's forward and backward (3 forwards) and the
    reference's forward over 2P rows of `length` tokens (full masked attention: `length` keys a
    query), the output projection at `scored_per_row` positions a row (rematerialisation not
    counted)."""
    rows = 2 * self.pairs
    return 4 * self.dims.forward_flops(rows * self.length, self.length, rows * scored_per_row)

  def rollout_bound(self, bandwidth_gb_s: float) -> float:
    """Decode tokens/s if every step only read the weights and the KV cache at the measured
    bandwidth (prompts of `length` - 16 tokens, `new_tokens` more; prefill not counted)."""
    rows = self.pairs * self.samples
    step = self.dims.decode_bytes(rows, self.length - 16 + self.new_tokens / 2)
    return rows * bandwidth_gb_s * 1e9 / step


QUICK = dict(
  pairs=2, length=32, vocab=512, chunks=2, samples=2, new_tokens=8, hidden=64, layers=2, head_dim=16
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepTrial:
  """One side's timed calls in one trial."""

  rollout_s: float
  train_s: float
  rollout_tokens: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class SideResult:
  side: str
  version: str
  threads: int
  load_s: float
  warmup_s: float
  trials: list[StepTrial]
  rollout_tok_s: list[float]
  train_tok_s: list[float]
  step_s: list[float]
  first_loss: float  # the first train step's, from the shared initial weights
  first_grad_norm: float
  greedy_tokens: list[list[int]]


def write_inputs(setup: Setup, path: pathlib.Path) -> int:
  """The checkpoint, `batch.npz` and `rollout.json` every side reads; returns the batch's non-pad
  tokens (the train step's token count) and its completion window (positions scored a row)."""
  import numpy as np

  from benchmarks import train_step_bench as tsb
  from dpa_grpo.rollout import RolloutConfig

  model = tsb.small_qwen3(
    setup.vocab,
    hidden=setup.hidden,
    layers=setup.layers,
    heads=setup.heads,
    kv_heads=setup.kv_heads,
    head_dim=setup.head_dim,
    init_std=0.1,
  )
  model.save_pretrained(path)
  batch = tsb.make_batch(setup.pairs, setup.length, setup.vocab)
  np.savez(path / "batch.npz", **batch)
  prompt_rows = (batch["attention_mask"] == 1) & (batch["completion_mask"] == 0)
  prompts = [row[keep].tolist() for row, keep in zip(batch["tokens"][::2], prompt_rows[::2], strict=True)]
  draft = RolloutConfig()
  settings = dict(
    prompts=prompts,
    samples=setup.samples,
    new_tokens=setup.new_tokens,
    temperature=draft.temperature,
    top_p=draft.top_p,
    chunks=setup.chunks,
  )
  (path / "rollout.json").write_text(json.dumps(settings))
  return int(batch["attention_mask"].sum()), batch["completion_positions"].shape[1]


def agreement(results: dict[str, SideResult], theirs: str = "torch") -> dict:
  """Greedy tokens and the first step's loss and gradient norm, JAX against a PyTorch side."""
  ours, theirs = results["jax"], results[theirs]
  same = [
    a == b
    for ra, rb in zip(ours.greedy_tokens, theirs.greedy_tokens, strict=True)
    for a, b in zip(ra[:AGREEMENT_STEPS], rb[:AGREEMENT_STEPS], strict=True)
  ]
  loss_diff = abs(ours.first_loss - theirs.first_loss)
  norm_rel = abs(ours.first_grad_norm - theirs.first_grad_norm) / max(abs(theirs.first_grad_norm), 1e-12)
  return {
    "greedy": sum(same) / len(same),
    "distinct_greedy_ids": len({t for row in ours.greedy_tokens for t in row}),
    "loss_abs_diff": loss_diff,
    "grad_norm_rel_diff": norm_rel,
    "within_tolerance": loss_diff <= LOSS_RTOL * max(1.0, abs(theirs.first_loss)) and norm_rel <= NORM_RTOL,
  }


def run(setup: Setup, sides: list[str], trials: int, threads: int, workdir: pathlib.Path) -> dict:
  """The sides, trials interleaved; the measurements, agreement (JAX against each PyTorch side)
  and failures."""
  checkpoint = workdir / "checkpoint"
  tokens, window = write_inputs(setup, checkpoint)
  env = {
    k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "PYTHONPATH", "XLA_FLAGS")
  }
  env.update(JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS=str(threads))

  def maker(side: str):
    argv = [sys.executable, "-m", "benchmarks.rl_workers", side, str(checkpoint)]
    return lambda: harness.Worker(side, argv, workdir / f"{side}.log", env, ROOT)

  def warm_up(worker: harness.Worker) -> dict:
    greedy = worker.call(cmd="greedy", new=AGREEMENT_STEPS)
    return {"greedy": greedy, "rollout": worker.call(cmd="rollout"), "train": worker.call(cmd="train")}

  def measure(side: str, worker: harness.Worker) -> StepTrial:
    rollout = worker.call(cmd="rollout")
    train = worker.call(cmd="train")
    return StepTrial(rollout_s=rollout["seconds"], train_s=train["seconds"], rollout_tokens=rollout["tokens"])

  info, first, failures, timed = harness.run({s: maker(s) for s in sides}, warm_up, trials, measure)
  expected = setup.pairs * setup.samples * setup.new_tokens
  results = {}
  for side, runs in timed.items():
    if any(r.rollout_tokens != expected for r in runs):
      raise RuntimeError(f"{side} rollouts gave {[r.rollout_tokens for r in runs]} tokens, not {expected}")
    warm = first[side]
    results[side] = SideResult(
      side=side,
      version=info[side]["version"],
      threads=info[side]["threads"],
      load_s=info[side]["load_s"],
      warmup_s=warm["rollout"]["seconds"]
      + warm["train"]["seconds"]
      - statistics.median(r.rollout_s for r in runs)
      - statistics.median(r.train_s for r in runs),
      trials=runs,
      rollout_tok_s=[r.rollout_tokens / r.rollout_s for r in runs],
      train_tok_s=[tokens / r.train_s for r in runs],
      step_s=[r.rollout_s + r.train_s for r in runs],
      first_loss=warm["train"]["loss"],
      first_grad_norm=warm["train"]["grad_norm"],
      greedy_tokens=warm["greedy"]["tokens"],
    )
  agree = {s: agreement(results, s) for s in results if s != "jax" and "jax" in results}
  scored = {s: window if s in ("jax", "torch_window") else setup.length - 1 for s in results}
  return {
    "results": results,
    "agreement": agree,
    "failures": failures,
    "train_tokens": tokens,
    "train_flops": {s: setup.train_flops(k) for s, k in scored.items()},
  }


def roofline(setup: Setup, measured: dict, machine: dict) -> dict:
  """Each side's fraction of the bounds: its train step's counted FLOPs a second over the measured
  float32 matmul peak; its rollout tokens/s over the decode bound at the measured bandwidth."""
  bound = setup.rollout_bound(machine["bandwidth_gb_s"])
  out = {}
  for side, r in measured["results"].items():
    flops = measured["train_flops"][side]
    out[side] = {
      "train_gflop": flops / 1e9,
      "train_of_peak": [flops / t.train_s / (machine["peak_gflop_s"] * 1e9) for t in r.trials],
      "rollout_bound_tok_s": bound,
      "rollout_of_bound": [x / bound for x in r.rollout_tok_s],
    }
  return out


def print_table(setup: Setup, measured: dict, fractions: dict) -> None:
  results, agree = measured["results"], measured["agreement"]
  n = len(next(iter(results.values())).trials) if results else 0
  print(
    f"\nDPA-GRPO step: Qwen3 {setup.layers} layers × {setup.hidden}, heads {setup.heads}/{setup.kv_heads}, "
    f"V {setup.vocab}; rollout {setup.pairs} prompts × {setup.samples} samples × {setup.new_tokens} "
    f"tokens; train {2 * setup.pairs} rows × {setup.length} ({measured['train_tokens']} tokens); "
    f"medians [min–max] over {n} interleaved trials; ratios JAX ÷ PyTorch within each trial "
    f"(for step s, below 1 means JAX is faster); torch_window: PyTorch with logits only at the "
    f"completion window, as JAX scores"
  )
  widths = (12, 20, 19, 20, 19, 19, 19, 7, 9, 10, 10, 5, 0)
  cells = [
    f"{c:{w}}" if i in (0, len(COLUMNS) - 1) else f"{c:>{w}}"
    for i, (c, w) in enumerate(zip(COLUMNS, widths, strict=True))
  ]
  print(" ".join(cells[:-1]) + "  " + cells[-1])
  for side, r in results.items():
    if side != "jax" and "jax" in results:
      cells = [
        fmt(harness.ratios(getattr(results["jax"], f), getattr(r, f)), 2)
        for f in ("rollout_tok_s", "train_tok_s", "step_s")
      ]
    else:
      cells = ["1", "1", "1"]
    agree_cell = f"{agree[side]['greedy']:.2f}" if side in agree else "—"
    print(
      f"{side:12} {fmt(r.rollout_tok_s):>20} {cells[0]:>19} {fmt(r.train_tok_s):>20} {cells[1]:>19} "
      f"{fmt(r.step_s, 2):>19} {cells[2]:>19} {r.load_s:7.1f} {r.warmup_s:9.1f} {r.first_loss:10.5f} "
      f"{r.first_grad_norm:10.5f} {agree_cell:>5}  {r.version}, {r.threads} threads",
      flush=True,
    )
  for side, a in agree.items():
    print(
      f"agreement with {side}: greedy {a['greedy']:.2f} over {AGREEMENT_STEPS} steps (JAX emitted "
      f"{a['distinct_greedy_ids']} distinct ids); first step |Δloss| {a['loss_abs_diff']:.2e}, "
      f"grad-norm relative difference {a['grad_norm_rel_diff']:.2e} (tolerances {LOSS_RTOL:g} "
      f"relative to max(1, |loss|), {NORM_RTOL:g}): {'held' if a['within_tolerance'] else 'FAILED'}"
    )
  for side, f in fractions.items():
    print(
      f"roofline, {side}: train {fmt([100 * x for x in f['train_of_peak']])}% of the measured matmul "
      f"peak ({f['train_gflop']:.1f} GFLOP counted a step); rollout "
      f"{fmt([100 * x for x in f['rollout_of_bound']])}% of the decode bandwidth bound "
      f"({f['rollout_bound_tok_s']:.0f} tok/s, prefill not counted)"
    )
  for side, why in measured["failures"].items():
    print(f"{side}: FAILED — {why}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="a tiny model and batch, 3 trials: seconds")
  parser.add_argument("--trials", type=int, default=None, help="interleaved trials (default 7; quick 3)")
  parser.add_argument("--pairs", type=int, default=8, help="pairs (decision units) in the step; 2 rows each")
  parser.add_argument("--length", type=int, default=256, help="tokens per packed row (prompt + action)")
  parser.add_argument("--vocab", type=int, default=8192)
  parser.add_argument("--chunks", type=int, default=2, help="gradient-accumulation chunks of the JAX step")
  parser.add_argument("--samples", type=int, default=2, help="rollout samples per prompt")
  parser.add_argument("--new_tokens", type=int, default=64, help="rollout tokens per sample")
  parser.add_argument("--threads", type=int, default=0, help="threads per side (0: every core)")
  parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {','.join(SIDES)}")
  parser.add_argument("--out", default="", help="also write every measurement to this JSON file")
  args = parser.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if args.quick:
    setup = Setup(**QUICK)
  else:
    setup = Setup(
      pairs=args.pairs,
      length=args.length,
      vocab=args.vocab,
      chunks=args.chunks,
      samples=args.samples,
      new_tokens=args.new_tokens,
    )
  trials = args.trials or (3 if args.quick else 7)
  threads = args.threads or os.cpu_count()
  sides = args.sides.split(",")
  if "jax" not in sides or not set(sides) <= set(SIDES):
    parser.error(f"--sides must name jax and only sides of {SIDES}, got {args.sides!r}")
  machine = harness.describe_machine(threads, args.quick)
  record = {**machine, "setup": dataclasses.asdict(setup), "threads": threads, "command": sys.argv}
  workdir = pathlib.Path(tempfile.mkdtemp(prefix="rl_bench_"))
  measured, fractions = {"failures": {"harness": "did not finish"}}, {}
  try:
    measured = run(setup, sides, trials, threads, workdir)
    fractions = roofline(setup, measured, machine)
    print_table(setup, measured, fractions)
  finally:
    if measured["failures"]:
      print(f"(worker logs kept in {workdir})")
    else:
      shutil.rmtree(workdir, ignore_errors=True)
  record.update(
    results={s: dataclasses.asdict(r) for s, r in measured.get("results", {}).items()},
    agreement=measured.get("agreement"),
    failures=measured["failures"],
    train_tokens=measured.get("train_tokens"),
    roofline=fractions,
    load_after=harness.end_load(),
  )
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(record, indent=2))
  agree = measured.get("agreement") or {}
  if measured["failures"] or not agree or not all(a["within_tolerance"] for a in agree.values()):
    sys.exit(1)


if __name__ == "__main__":
  main()
