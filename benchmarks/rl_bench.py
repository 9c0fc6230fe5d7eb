"""One DPA-GRPO step — its rollout sampling and its train step — in JAX (this project) and PyTorch.

  python -m benchmarks.rl_bench            # 4 layers × 256, V 8192; 8 pairs × 256 tokens; 7 trials
  python -m benchmarks.rl_bench --quick    # a tiny model and batch, 3 trials: seconds (a test runs it)
  python -m benchmarks.rl_bench --dtypes=bfloat16   # one dtype only (default: float32,bfloat16)

The same interleaved harness as `benchmarks.sampler_bench` (`benchmarks.harness`): each side in its
own worker process (`benchmarks.rl_workers`), one per side and dtype, started one at a time, then
trials in which every side of every dtype runs once, in an order that rotates from trial to trial
(all sides × dtypes interleaved together, so a slow moment of the machine falls on both dtypes
alike and bfloat16 ÷ float32 is also taken within a trial). Both load the same random float32 Qwen3
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
  `torch` projects every position, as a plain PyTorch loss would. `jax_shared` is the trainer's
  step with `loss.share_prompts`: each pair one row, its prompt computed once (the same loss and
  gradient; `jax_shared ÷ torch_window` printed per dtype); every other side scores two rows a pair.

What "bfloat16" means, on both sides: float32 master weights, gradients and AdamW state; the matrix
products on bfloat16 operands. JAX: `lm.load_hf(path, dtype="float32", compute_dtype="bfloat16")`
— each weight cast to bfloat16 where a product reads it; every product of the forward and the
backward pass (`lm.model.einsum`) on bfloat16 operands, accumulated in float32 and rounded once
(the gradient products' cotangents cast to bfloat16 first); and (`lm.model`'s dtype policy) the
activations between products in bfloat16 too, with RMSNorm statistics, RoPE angles, the attention
softmax and the logits in float32; the sampler's KV cache in bfloat16. PyTorch:
`torch.autocast("cpu", dtype=torch.bfloat16)` around every forward pass (the reference's, the
policy's and `generate`'s), the backward outside it as autocast prescribes: linear layers and
attention in bfloat16, the residual stream and RMSNorm in float32 (autocast casts only its listed
ops' inputs), logits as bfloat16 products cast to float32 for the log-softmax. So the two differ
in where activations are rounded (JAX keeps the residual stream in bfloat16, autocast in float32;
JAX's logits are float32 products) — both "bfloat16 products, float32 master state", not the same
bits.

Agreement, checked before any trial is timed, JAX against each PyTorch side of the same dtype:
greedy tokens over the first 16 steps (reported; in bfloat16 an early near-tie can flip a token
and the rows then diverge), and the first train step's loss and gradient global norm (both sides
start from the same weights) within that dtype's TOLERANCES. Also reported per side: its bfloat16
step's first loss and gradient norm against its own float32 step (the rounding each side's
bfloat16 adds, what the bfloat16 tolerances are set against). Reported per side and dtype, median
[min–max] over the trials: rollout tokens/s, train tokens/s (non-pad tokens of the batch a second),
the whole step's seconds; and JAX ÷ PyTorch of each, computed within every trial; load and warm-up
(compilation) time. Roofline, per dtype: each side's train step as counted FLOPs a second over a
matmul peak measured in this process for that dtype (`harness.measure_peak_flops`: [n, n] products
of that dtype's operands accumulated in float32), its rollout against the decode bound (weights and
KV cache read once a step at the measured read bandwidth, 4 bytes an entry in float32, 2 in
bfloat16).
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
# `jax_xla_attention`: `jax` with the train step's attention in XLA's ops, not lm.cpu_gemm's kernel
# (asked for by --sides: the kernel's share of the step in the same interleaved run).
# `jax_shared`: `jax` with the trainer's `loss.share_prompts` (each pair one row, its prompt once).
SIDES = ("jax", "jax_xla_attention", "jax_shared", "torch", "torch_window")
DEFAULT_SIDES = ("jax", "jax_shared", "torch", "torch_window")
DTYPES = harness.DTYPES
AGREEMENT_STEPS = 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tolerance:
  """How far JAX's first train step may be from PyTorch's in one dtype: |Δloss| ≤ loss_rtol ·
  max(1, |loss|), and the gradient global norms' relative difference ≤ norm_rtol."""

  loss_rtol: float
  norm_rtol: float


TOLERANCES = {
  # Different kernels and summation order, the same float32 products.
  "float32": Tolerance(loss_rtol=1e-4, norm_rtol=1e-3),
  # bfloat16 operands (8 significant bits), rounded at different places on each side (the module
  # docstring). Set from measurements (2026-12-04, 2-core Xeon): at the default setup JAX's and
  # PyTorch's bfloat16 first steps differed by |Δloss| 2.3e-3–2.8e-3 and a grad-norm relative
  # difference 2.7e-4–7.2e-4, while each side's bfloat16 step was itself 3.4e-4–8.2e-4 (JAX) and
  # 1.9e-3 (PyTorch) in loss and up to 6.6e-4 in norm from its own float32 step; at --quick, 3.8e-4
  # and 1.6e-3 (JAX's own gap 1.5e-3 in norm). The bounds leave 3.5× and 6× room above the largest.
  "bfloat16": Tolerance(loss_rtol=1e-2, norm_rtol=1e-2),
}
LOSS_RTOL = TOLERANCES["float32"].loss_rtol
NORM_RTOL = TOLERANCES["float32"].norm_rtol
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

  def train_flops(self, scored_per_row: int, shared_width: int = 0) -> float:
    """A train step's counted FLOPs: the policy's forward and backward (3 forwards) and the
    reference's forward over 2P rows of `length` tokens (full masked attention: `length` keys a
    query), the output projection at `scored_per_row` positions a row (rematerialisation not
    counted). With `shared_width`, what the step computes with `loss.share_prompts`: P rows of
    that width, the output projection at 2·`scored_per_row` positions a pair."""
    rows = 2 * self.pairs
    if shared_width:
      return 4 * self.dims.forward_flops(self.pairs * shared_width, shared_width, rows * scored_per_row)
    return 4 * self.dims.forward_flops(rows * self.length, self.length, rows * scored_per_row)

  def rollout_bound(self, bandwidth_gb_s: float, itemsize: int = 4) -> float:
    """Decode tokens/s if every step only read the weights and the KV cache (`itemsize` bytes an
    entry) at the measured bandwidth (prompts of `length` - 16 tokens, `new_tokens` more; prefill
    not counted)."""
    rows = self.pairs * self.samples
    step = self.dims.decode_bytes(rows, self.length - 16 + self.new_tokens / 2, itemsize)
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


def write_inputs(setup: Setup, path: pathlib.Path) -> tuple[int, int, int]:
  """The checkpoint, `batch.npz` and `rollout.json` every side reads; returns the batch's non-pad
  tokens (the train step's token count), its completion window (positions scored a row) and the
  width of its rows with the prompt shared (`jax_shared`'s)."""
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
  shared_width = tsb.shared_batch(batch)["tokens"].shape[1]
  return int(batch["attention_mask"].sum()), batch["completion_positions"].shape[1], shared_width


def agreement(results: dict[str, SideResult], theirs: str, tolerance: Tolerance) -> dict:
  """Greedy tokens and the first step's loss and gradient norm, JAX against a PyTorch side (one
  dtype's results)."""
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
    "first_greedy": sum(
      ra[0] == rb[0] for ra, rb in zip(ours.greedy_tokens, theirs.greedy_tokens, strict=True)
    )
    / len(ours.greedy_tokens),
    "distinct_greedy_ids": len({t for row in ours.greedy_tokens for t in row}),
    "loss_abs_diff": loss_diff,
    "grad_norm_rel_diff": norm_rel,
    "loss_rtol": tolerance.loss_rtol,
    "norm_rtol": tolerance.norm_rtol,
    "within_tolerance": loss_diff <= tolerance.loss_rtol * max(1.0, abs(theirs.first_loss))
    and norm_rel <= tolerance.norm_rtol,
  }


def dtype_gap(low: SideResult, full: SideResult) -> dict:
  """One side's bfloat16 first step against its own float32 one: the rounding bfloat16 adds."""
  return {
    "loss_abs_diff": abs(low.first_loss - full.first_loss),
    "grad_norm_rel_diff": abs(low.first_grad_norm - full.first_grad_norm)
    / max(abs(full.first_grad_norm), 1e-12),
    "greedy": statistics.mean(
      a == b
      for ra, rb in zip(low.greedy_tokens, full.greedy_tokens, strict=True)
      for a, b in zip(ra[:AGREEMENT_STEPS], rb[:AGREEMENT_STEPS], strict=True)
    ),
  }


def run(
  setup: Setup, sides: list[str], dtypes: list[str], trials: int, threads: int, workdir: pathlib.Path
) -> dict:
  """Every side in every dtype, trials interleaved across all of them; the measurements (by dtype,
  then side), agreement (JAX against each PyTorch side of the same dtype), each side's bfloat16 ÷
  float32 gap and failures (by worker, "side:dtype")."""
  checkpoint = workdir / "checkpoint"
  tokens, window, shared_width = write_inputs(setup, checkpoint)
  env = {
    k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "PYTHONPATH", "XLA_FLAGS")
  }
  env.update(JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS=str(threads))

  def maker(side: str, dtype: str):
    argv = [sys.executable, "-m", "benchmarks.rl_workers", side, str(checkpoint), dtype]
    return lambda: harness.Worker(f"{side}:{dtype}", argv, workdir / f"{side}-{dtype}.log", env, ROOT)

  def warm_up(worker: harness.Worker) -> dict:
    greedy = worker.call(cmd="greedy", new=AGREEMENT_STEPS)
    return {"greedy": greedy, "rollout": worker.call(cmd="rollout"), "train": worker.call(cmd="train")}

  def measure(name: str, worker: harness.Worker) -> StepTrial:
    rollout = worker.call(cmd="rollout")
    train = worker.call(cmd="train")
    return StepTrial(rollout_s=rollout["seconds"], train_s=train["seconds"], rollout_tokens=rollout["tokens"])

  makers = {f"{side}:{dtype}": maker(side, dtype) for dtype in dtypes for side in sides}
  info, first, failures, timed = harness.run(makers, warm_up, trials, measure)
  expected = setup.pairs * setup.samples * setup.new_tokens
  results = {dtype: {} for dtype in dtypes}
  for name, runs in timed.items():
    side, dtype = name.split(":")
    if any(r.rollout_tokens != expected for r in runs):
      raise RuntimeError(f"{name} rollouts gave {[r.rollout_tokens for r in runs]} tokens, not {expected}")
    warm = first[name]
    results[dtype][side] = SideResult(
      side=side,
      version=info[name]["version"],
      threads=info[name]["threads"],
      load_s=info[name]["load_s"],
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
  agree = {
    dtype: {s: agreement(by_side, s, TOLERANCES[dtype]) for s in by_side if s != "jax" and "jax" in by_side}
    for dtype, by_side in results.items()
  }
  gaps = {}
  if "float32" in results and "bfloat16" in results:
    gaps = {
      s: dtype_gap(results["bfloat16"][s], results["float32"][s])
      for s in results["bfloat16"]
      if s in results["float32"]
    }
  windowed = ("jax", "jax_xla_attention", "jax_shared", "torch_window")
  scored = {s: window if s in windowed else setup.length - 1 for s in sides}
  width = {s: shared_width if s == "jax_shared" else 0 for s in sides}
  return {
    "results": results,
    "agreement": agree,
    "bfloat16_gap": gaps,
    "failures": failures,
    "train_tokens": tokens,
    "train_flops": {s: setup.train_flops(k, width[s]) for s, k in scored.items()},
  }


def roofline(setup: Setup, measured: dict, bandwidth_gb_s: float, peaks_gflop_s: dict[str, float]) -> dict:
  """Each side's fraction of its dtype's bounds: its train step's counted FLOPs a second over the
  matmul peak measured for that dtype; its rollout tokens/s over the decode bound at the measured
  bandwidth, with that dtype's bytes a weight and KV entry."""
  out = {}
  for dtype, by_side in measured["results"].items():
    bound = setup.rollout_bound(bandwidth_gb_s, itemsize=harness.ITEMSIZE[dtype])
    out[dtype] = {}
    for side, r in by_side.items():
      flops = measured["train_flops"][side]
      out[dtype][side] = {
        "train_gflop": flops / 1e9,
        "peak_gflop_s": peaks_gflop_s[dtype],
        "train_of_peak": [flops / t.train_s / (peaks_gflop_s[dtype] * 1e9) for t in r.trials],
        "rollout_bound_tok_s": bound,
        "rollout_of_bound": [x / bound for x in r.rollout_tok_s],
      }
  return out


def print_table(setup: Setup, measured: dict, fractions: dict) -> None:
  n = max((len(r.trials) for by_side in measured["results"].values() for r in by_side.values()), default=0)
  print(
    f"\nDPA-GRPO step: Qwen3 {setup.layers} layers × {setup.hidden}, heads {setup.heads}/{setup.kv_heads}, "
    f"V {setup.vocab}; rollout {setup.pairs} prompts × {setup.samples} samples × {setup.new_tokens} "
    f"tokens; train {2 * setup.pairs} rows × {setup.length} ({measured['train_tokens']} tokens); "
    f"medians [min–max] over {n} interleaved trials; ratios JAX ÷ PyTorch within each trial "
    f"(for step s, below 1 means JAX is faster); torch_window: PyTorch with logits only at the "
    f"completion window, as JAX scores"
  )
  for dtype, results in measured["results"].items():
    print_dtype(dtype, results, measured["agreement"][dtype], fractions.get(dtype, {}))
  for side, g in measured["bfloat16_gap"].items():
    low, full = measured["results"]["bfloat16"][side], measured["results"]["float32"][side]
    train = fmt(harness.ratios(low.train_tok_s, full.train_tok_s), 2)
    rollout = fmt(harness.ratios(low.rollout_tok_s, full.rollout_tok_s), 2)
    print(
      f"bfloat16 against float32, {side}: train tok/s {train}×, rollout tok/s {rollout}× (within a trial); "
      f"first step |Δloss| {g['loss_abs_diff']:.2e}, grad-norm relative difference "
      f"{g['grad_norm_rel_diff']:.2e}, greedy {g['greedy']:.2f} the same"
    )
  for name, why in measured["failures"].items():
    print(f"{name}: FAILED — {why}")


def print_dtype(dtype: str, results: dict[str, SideResult], agree: dict, fractions: dict) -> None:
  """One dtype's table, agreement and roofline lines."""
  print(f"\n{dtype}:")
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
  shared = results.get("jax_shared")
  for side, r in results.items():
    if shared is not None and side.startswith("torch"):  # the prompt once a pair, against PyTorch's rows
      train = fmt(harness.ratios(shared.train_tok_s, r.train_tok_s), 2)
      print(f"jax_shared ÷ {side} ({dtype}): train tok/s {train}× (within a trial; the same batch's tokens)")
  for side, a in agree.items():
    print(
      f"agreement with {side} ({dtype}): greedy {a['greedy']:.2f} over {AGREEMENT_STEPS} steps, first "
      f"token {a['first_greedy']:.2f} (JAX emitted {a['distinct_greedy_ids']} distinct ids); first step "
      f"|Δloss| {a['loss_abs_diff']:.2e}, grad-norm relative difference {a['grad_norm_rel_diff']:.2e} "
      f"(tolerances {a['loss_rtol']:g} relative to max(1, |loss|), {a['norm_rtol']:g}): "
      f"{'held' if a['within_tolerance'] else 'FAILED'}"
    )
  for side, f in fractions.items():
    print(
      f"roofline, {side} ({dtype}): train {fmt([100 * x for x in f['train_of_peak']])}% of the measured "
      f"{dtype} matmul peak ({f['peak_gflop_s']:.0f} GFLOP/s; {f['train_gflop']:.1f} GFLOP counted a step); "
      f"rollout {fmt([100 * x for x in f['rollout_of_bound']])}% of the decode bandwidth bound "
      f"({f['rollout_bound_tok_s']:.0f} tok/s, prefill not counted)"
    )


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
  parser.add_argument(
    "--sides", default=",".join(DEFAULT_SIDES), help=f"comma-separated, of {','.join(SIDES)}"
  )
  parser.add_argument("--dtypes", default=",".join(DTYPES), help=f"comma-separated, of {','.join(DTYPES)}")
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
  dtypes = args.dtypes.split(",")
  if not dtypes or not set(dtypes) <= set(DTYPES) or len(set(dtypes)) != len(dtypes):
    parser.error(f"--dtypes must name distinct dtypes of {DTYPES}, got {args.dtypes!r}")
  machine = harness.describe_machine(threads, args.quick)  # its peaks: one per dtype
  peaks = {d: machine["peaks_gflop_s"][d] for d in dtypes}
  record = {
    **machine,
    "peak_gflop_s_by_dtype": peaks,
    "dtypes": dtypes,
    "setup": dataclasses.asdict(setup),
    "threads": threads,
    "command": sys.argv,
  }
  workdir = pathlib.Path(tempfile.mkdtemp(prefix="rl_bench_"))
  measured, fractions = {"failures": {"harness": "did not finish"}}, {}
  try:
    measured = run(setup, sides, dtypes, trials, threads, workdir)
    fractions = roofline(setup, measured, machine["bandwidth_gb_s"], peaks)
    print_table(setup, measured, fractions)
  finally:
    if measured["failures"]:
      print(f"(worker logs kept in {workdir})")
    else:
      shutil.rmtree(workdir, ignore_errors=True)
  record.update(
    results={
      d: {s: dataclasses.asdict(r) for s, r in by_side.items()}
      for d, by_side in measured.get("results", {}).items()
    },
    agreement=measured.get("agreement"),
    bfloat16_gap=measured.get("bfloat16_gap"),
    tolerances={d: dataclasses.asdict(TOLERANCES[d]) for d in dtypes},
    failures=measured["failures"],
    train_tokens=measured.get("train_tokens"),
    roofline=fractions,
    load_after=harness.end_load(),
  )
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(record, indent=2))
  agree = [a for by_side in (measured.get("agreement") or {}).values() for a in by_side.values()]
  if measured["failures"] or not agree or not all(a["within_tolerance"] for a in agree):
    sys.exit(1)


if __name__ == "__main__":
  main()
