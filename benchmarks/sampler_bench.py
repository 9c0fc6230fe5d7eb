"""Greedy decoding: lm.Sampler against the engines a user would pick instead, in one interleaved run.

  python -m benchmarks.sampler_bench                 # shapes (a) and (b), every installed engine
  python -m benchmarks.sampler_bench --shapes=a      # the small Qwen3 only
  python -m benchmarks.sampler_bench --dtypes=bfloat16   # bfloat16 only (default: float32 and bfloat16)
  python -m benchmarks.sampler_bench --quick         # a tiny shape, ours and transformers, seconds
  python -m benchmarks.sampler_bench --shapes=a --engines=ours --baseline=HEAD~1   # a change's ratio

Engines: `ours` (`lm.Sampler`), `transformers` (`generate`, PyTorch), `vllm` (vLLM's CPU build) and
`tunix` (tunix's `Sampler`); the last two live in their own virtual environments, made by
`bash benchmarks/setup_engines.sh` (`.bench/vllm`, `.bench/tunix`); one that is not installed is
skipped with a line saying so. Every engine runs in its own process (`benchmarks.engines`, a worker
driven over a pipe), loads the same random-weight float32 Qwen3 checkpoint (written here with
transformers' `save_pretrained`, no network) and greedily continues the same prompts, EOS ignored,
with the same thread count. Each worker loads one at a time, then warms up; then every trial runs
each engine once — 1 new token (t1: prefill and the first step), then `new_tokens` — in an order
that rotates from trial to trial, so machine load falls on every engine alike.

`--baseline=REF` adds the engine `ours@REF`: `lm` as committed at REF (extracted with `git archive`),
so a change to the sampler is measured against its parent in the same interleaved run.
`--variant=NAME:FIELD=VALUE[,FIELD=VALUE]` (repeatable) adds the engine `ours[NAME]`: this tree's
sampler with those `SamplerConfig` fields (e.g. `--variant=xla:cpu_gemm_threads=0`).

Reported per engine, as median [min–max] over the trials: decode tok/s = B·(new − 1) / (t_new − t1)
(prefill not counted), end-to-end tok/s = B·new / t_new, t1 (the time to the first token), and the
ratios ours ÷ engine computed within each trial (so a slow moment of the machine cancels); load
time (checkpoint to ready) and warm-up (first calls minus the median steady calls: compilation
for the JIT engines); greedy agreement with ours over the first 16 new tokens. Also printed: the
CPU, its SIMD flags, the measured read bandwidth and matmul peak per dtype, the load average before
and after, and each engine's roofline fractions: decode tok/s over the bound at the measured
bandwidth (each step reads the weights and the rows' KV cache once, at the dtype's bytes), t1 as
the prefill's counted FLOPs a second over the measured peak of the dtype.

`--dtypes=float32,bfloat16` (the default; `--quick`: float32): every engine runs in each dtype,
float32 against float32 and bfloat16 against bfloat16 — the float32 checkpoint converted as each
engine loads it (ours: `lm.load_hf(dtype=)`, weights, activations and KV cache in that dtype;
transformers: `from_pretrained(dtype=)`; vLLM: `LLM(dtype=)`; tunix: its loader's dtype). One
interleaved block of trials per shape and dtype, in one run; ratios are within a dtype's trials.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

from benchmarks import harness
from benchmarks.harness import fmt

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENGINES = ("ours", "transformers", "vllm", "tunix")
AGREEMENT_STEPS = 16

_SHAPES = flags.DEFINE_list(
  "shapes", ["a", "b"], "Shapes to run: a (small Qwen3), b (Qwen3-0.6B), long ((a) with 1024 new tokens)."
)
_ENGINES = flags.DEFINE_list("engines", list(ENGINES), "Engines to run (where installed).")
_TRIALS = flags.DEFINE_integer("trials", 7, "Interleaved trials per shape.")
_QUICK = flags.DEFINE_bool("quick", False, "A tiny shape, ours and transformers, 3 trials: seconds.")
_OUT = flags.DEFINE_string("out", "", "Also write every measurement to this JSON file.")
_THREADS = flags.DEFINE_integer("threads", 0, "Threads per engine (0: every core of the machine).")
_DTYPES = flags.DEFINE_list(
  "dtypes", list(harness.DTYPES), "Dtypes every engine runs in, a block of trials each (--quick: float32)."
)
_BASELINE = flags.DEFINE_string("baseline", "", "A git ref: also run `ours@REF`, this project's lm at REF.")
_VARIANTS = flags.DEFINE_multi_string(
  "variant", [], "NAME:FIELD=VALUE[,FIELD=VALUE]: also run `ours[NAME]`, with those SamplerConfig fields."
)


def parse_variant(text: str) -> tuple[str, dict]:
  """ "NAME:FIELD=VALUE,..." -> ("ours[NAME]", {FIELD: value}); values are Python literals."""
  name, sep, fields = text.partition(":")
  if not name or not sep:
    raise ValueError(f"--variant={text!r}: expected NAME:FIELD=VALUE[,FIELD=VALUE]")
  overrides = {}
  for item in filter(None, fields.split(",")):
    field, eq, value = item.partition("=")
    if not eq:
      raise ValueError(f"--variant={text!r}: {item!r} is not FIELD=VALUE")
    overrides[field.strip()] = ast.literal_eval(value.strip())
  return f"ours[{name}]", overrides


@dataclasses.dataclass(frozen=True)
class Shape:
  name: str
  layers: int
  hidden: int
  intermediate: int
  heads: int
  kv_heads: int
  head_dim: int
  vocab: int
  batch: int
  prompt_len: int
  new_tokens: int
  # transformers at (b) takes ~2 minutes a trial (~0.9 s a step), so it runs at (a) only.
  engines: tuple[str, ...] = ENGINES

  @property
  def dims(self) -> harness.Dims:
    return harness.Dims(**{f.name: getattr(self, f.name) for f in dataclasses.fields(harness.Dims)})

  def roofline(self, r: EngineResult, machine: dict, dtype: str = "float32") -> dict:
    """An engine's fractions of the bounds of its dtype, trial by trial: decode tok/s over the
    bandwidth bound (weights and KV cache at the dtype's bytes, the mean cache fill: prompt + new / 2
    slots), t1 as the prefill's counted FLOPs (every prompt position, its full masked attention,
    the head at the last) a second over the dtype's measured matmul peak."""
    step = self.dims.decode_bytes(self.batch, self.prompt_len + self.new_tokens / 2, harness.ITEMSIZE[dtype])
    bound = self.batch * machine["bandwidth_gb_s"] * 1e9 / step
    prefill = self.dims.forward_flops(self.batch * self.prompt_len, self.prompt_len, self.batch)
    peak = machine["peaks_gflop_s"][dtype]
    return {
      "dtype": dtype,
      "peak_gflop_s": peak,
      "decode_bound_tok_s": bound,
      "decode_of_bound": [x / bound for x in r.decode_tok_s],
      "prefill_gflop": prefill / 1e9,
      "t1_of_peak": [prefill / (t / 1e3) / (peak * 1e9) for t in r.t1_ms],
    }


SHAPES = {
  "a": Shape("(a) small Qwen3", 4, 512, 1536, 8, 4, 64, 32_000, 8, 64, 128),
  "b": Shape(
    "(b) Qwen3-0.6B shape", 28, 1024, 3072, 16, 8, 128, 151_936, 4, 64, 128, ("ours", "vllm", "tunix")
  ),
  # (a) generating 1024 tokens: attention over a long cache, as in RL rollouts, weighs more here.
  "long": Shape(
    "(a) long generation", 4, 512, 1536, 8, 4, 64, 32_000, 8, 64, 1024, ("ours", "vllm", "tunix")
  ),
  "quick": Shape("tiny", 2, 64, 128, 4, 2, 16, 512, 2, 8, 32, ("ours", "transformers")),
}


@dataclasses.dataclass(frozen=True)
class Trial:
  """One engine's timed calls in one trial."""

  t1: float  # seconds for 1 new token: prefill and the first step
  t_new: float  # seconds for shape.new_tokens new tokens


@dataclasses.dataclass(frozen=True)
class EngineResult:
  engine: str
  version: str
  threads: int
  load_s: float
  warmup_s: float
  trials: list[Trial]
  decode_tok_s: list[float]
  e2e_tok_s: list[float]
  t1_ms: list[float]  # time to the first token
  agreement: float  # fraction of the first AGREEMENT_STEPS greedy tokens equal to ours
  distinct_tokens: int  # distinct ids among those tokens (a degenerate model repeats one)


def engine_python(engine: str) -> pathlib.Path:
  """The interpreter an engine runs under: the project's own, or its venv's under .bench/."""
  if engine in ("transformers",) or engine.startswith("ours"):
    return ROOT / ".venv" / "bin" / "python"
  return ROOT / ".bench" / engine / "bin" / "python"


def extract_ref(ref: str, into: pathlib.Path) -> pathlib.Path:
  """`lm/` as committed at `ref`, extracted under `into` (no worktree, no change to the repository)."""
  into.mkdir(parents=True)
  archive = subprocess.run(["git", "archive", ref, "lm"], cwd=ROOT, check=True, capture_output=True).stdout
  subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
  return into


def write_checkpoint(shape: Shape, path: pathlib.Path) -> None:
  """A random float32 Qwen3 checkpoint and prompts.json, built locally.

  Weights are drawn with std 0.1 (not Qwen's 0.02): at 0.02 a random model's greedy rows repeat
  one token, and agreement between engines would say nothing. RoPE base 1e6 because tunix uses
  1e6 whatever the config says; `rope_theta` is written at the top level as well, for readers of
  config.json older than transformers 5 (vLLM's own transformers).
  """
  import numpy as np
  import torch
  import transformers

  torch.manual_seed(0)
  config = transformers.Qwen3Config(
    vocab_size=shape.vocab,
    hidden_size=shape.hidden,
    intermediate_size=shape.intermediate,
    num_hidden_layers=shape.layers,
    num_attention_heads=shape.heads,
    num_key_value_heads=shape.kv_heads,
    head_dim=shape.head_dim,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
    rope_theta=1_000_000.0,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=1,
    pad_token_id=0,
  )
  transformers.Qwen3ForCausalLM(config).save_pretrained(path)
  config_file = path / "config.json"
  written = json.loads(config_file.read_text())
  written["rope_theta"] = 1_000_000.0
  config_file.write_text(json.dumps(written, indent=2))
  prompts = np.random.RandomState(0).randint(10, shape.vocab, (shape.batch, shape.prompt_len))
  (path / "prompts.json").write_text(json.dumps(prompts.tolist()))


def worker_env(shape: Shape, threads: int, workdir: pathlib.Path, dtype: str = "float32") -> dict[str, str]:
  """Every engine's environment: same threads, same dtype, offline, compilation caches cold (none
  persists)."""
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "PYTHONPATH")}
  env.update(
    JAX_PLATFORMS="cpu",
    HF_HUB_OFFLINE="1",
    TRANSFORMERS_OFFLINE="1",
    OMP_NUM_THREADS=str(threads),
    # vLLM in this process (its engine core would otherwise be a second process) with a KV-cache
    # reservation that fits next to the other engines.
    VLLM_ENABLE_V1_MULTIPROCESSING="0",
    VLLM_CPU_KVCACHE_SPACE="1",
    VLLM_CACHE_ROOT=str(workdir / "vllm_cache"),
    BENCH_MAX_NEW=str(shape.new_tokens),
    BENCH_DTYPE=dtype,
  )
  return env


def available(engines: list[str]) -> tuple[list[str], list[str]]:
  """(engines to run, lines about the ones skipped)."""
  run, skipped = [], []
  for engine in engines:
    if engine_python(engine).exists():
      run.append(engine)
    else:
      skipped.append(
        f"{engine}: not installed ({engine_python(engine).relative_to(ROOT)} missing; "
        f"`bash benchmarks/setup_engines.sh {engine}`), skipped"
      )
  return run, skipped


def run_shape(
  shape: Shape,
  engines: list[str],
  trials: int,
  threads: int,
  workdir: pathlib.Path,
  sources: dict[str, pathlib.Path],
  variants: dict[str, dict] | None = None,
  dtype: str = "float32",
) -> dict:
  """Every engine at one shape in one dtype, trials interleaved; returns the measurements and
  failures.

  `sources` maps an `ours@REF` engine to its extracted tree (every other engine runs from ROOT);
  `variants` maps an `ours[NAME]` engine to its `SamplerConfig` fields.
  """
  variants = variants or {}
  checkpoint = workdir / "checkpoint"
  if not checkpoint.exists():  # one checkpoint for every dtype of the shape
    write_checkpoint(shape, checkpoint)
  env = worker_env(shape, threads, workdir, dtype)

  def maker(engine: str):
    kind = "ours" if engine.startswith("ours") else engine
    argv = [str(engine_python(engine)), str(ROOT / "benchmarks" / "engines.py"), kind, str(checkpoint)]
    own_env = {**env, "BENCH_SAMPLER_CONFIG": json.dumps(variants.get(engine, {}))}
    log = workdir / f"{engine}.{dtype}.log"
    return lambda: harness.Worker(engine, argv, log, own_env, sources.get(engine, ROOT))

  def warm_up(worker: harness.Worker) -> tuple[float, float]:
    return (
      worker.call(cmd="generate", new=1)["seconds"],
      worker.call(cmd="generate", new=shape.new_tokens)["seconds"],
    )

  def measure(engine: str, worker: harness.Worker) -> tuple[Trial, list[list[int]]]:
    t1 = worker.call(cmd="generate", new=1)["seconds"]
    reply = worker.call(cmd="generate", new=shape.new_tokens)
    got = reply["tokens"]
    if len(got) != shape.batch or any(len(row) != shape.new_tokens for row in got):
      raise RuntimeError(f"{engine} returned {[len(r) for r in got]} tokens, not {shape.new_tokens} a row")
    return Trial(t1=t1, t_new=reply["seconds"]), got

  info, first, failures, measured = harness.run({e: maker(e) for e in engines}, warm_up, trials, measure)
  timed = {e: [trial for trial, _ in runs] for e, runs in measured.items()}
  tokens = {e: runs[0][1] for e, runs in measured.items() if runs}
  results = {}
  reference = [row[:AGREEMENT_STEPS] for row in tokens.get("ours", [])]
  for engine, runs in timed.items():
    t1s, tnews = [r.t1 for r in runs], [r.t_new for r in runs]
    mine = [row[:AGREEMENT_STEPS] for row in tokens[engine]]
    same = [a == b for ra, rb in zip(mine, reference, strict=False) for a, b in zip(ra, rb, strict=True)]
    results[engine] = EngineResult(
      engine=engine,
      version=info[engine]["version"],
      threads=info[engine]["threads"],
      load_s=info[engine]["load_s"],
      warmup_s=sum(first[engine]) - statistics.median(t1s) - statistics.median(tnews),
      trials=runs,
      decode_tok_s=[shape.batch * (shape.new_tokens - 1) / (r.t_new - r.t1) for r in runs],
      e2e_tok_s=[shape.batch * shape.new_tokens / r.t_new for r in runs],
      t1_ms=[1e3 * r.t1 for r in runs],
      agreement=sum(same) / len(same) if reference else float("nan"),
      distinct_tokens=len({t for row in mine for t in row}),
    )
  return {"shape": dataclasses.asdict(shape), "dtype": dtype, "results": results, "failures": failures}


def ratios(results: dict[str, EngineResult], engine: str, field: str) -> list[float]:
  """ours ÷ engine of a per-trial measurement, trial by trial (for t1: < 1 means ours is faster)."""
  return harness.ratios(getattr(results["ours"], field), getattr(results[engine], field))


def print_shape(shape: Shape, measured: dict, fractions: dict) -> None:
  results = measured["results"]
  print(f"\n{shape.name}, {measured['dtype']}: {shape.layers} layers, D {shape.hidden}, "
        f"F {shape.intermediate}, heads {shape.heads}/{shape.kv_heads}, head_dim {shape.head_dim}, "
        f"V {shape.vocab}; batch {shape.batch}, "
        f"prompt {shape.prompt_len}, {shape.new_tokens} new tokens; medians [min–max] over "
        f"{len(next(iter(results.values())).trials) if results else 0} interleaved trials")  # fmt: skip
  header = (
    f"{'engine':13} {'decode tok/s':>22} {'ours÷ decode':>19} {'end-to-end tok/s':>22} "
    f"{'ours÷ e2e':>19} {'t1 ms':>19} {'ours÷ t1':>19} {'load s':>7} {'warm-up s':>9} {'agree':>5}  version"
  )
  print(header)
  for engine, r in results.items():
    if "ours" in results and engine != "ours":
      decode_ratio, e2e_ratio, t1_ratio = (
        fmt(ratios(results, engine, "decode_tok_s"), 2),
        fmt(ratios(results, engine, "e2e_tok_s"), 2),
        fmt(ratios(results, engine, "t1_ms"), 2),
      )
    else:
      decode_ratio = e2e_ratio = t1_ratio = "1"
    print(
      f"{engine:13} {fmt(r.decode_tok_s):>22} {decode_ratio:>19} {fmt(r.e2e_tok_s):>22} {e2e_ratio:>19} "
      f"{fmt(r.t1_ms, 0):>19} {t1_ratio:>19} {r.load_s:7.1f} {r.warmup_s:9.1f} {r.agreement:5.2f}  "
      f"{r.version}, {r.threads} threads",
      flush=True,
    )  # fmt: skip
  for engine, f in fractions.items():
    print(
      f"roofline, {engine}: decode {fmt([100 * x for x in f['decode_of_bound']])}% of the bandwidth "
      f"bound ({f['decode_bound_tok_s']:.1f} tok/s); t1 {fmt([100 * x for x in f['t1_of_peak']])}% "
      f"of the {f['dtype']} matmul peak ({f['prefill_gflop']:.2f} GFLOP counted at "
      f"{f['peak_gflop_s']:.0f} GFLOP/s)"
    )
  if "ours" in results:
    print(
      f"greedy agreement over {AGREEMENT_STEPS} steps; "
      f"ours emitted {results['ours'].distinct_tokens} distinct ids"
    )
  for engine, why in measured["failures"].items():
    print(f"{engine}: FAILED — {why}")


def main(argv):
  del argv
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  shapes = ["quick"] if _QUICK.value else _SHAPES.value
  trials = 3 if _QUICK.value and _TRIALS.value == _TRIALS.default else _TRIALS.value
  threads = _THREADS.value or os.cpu_count()
  machine = harness.describe_machine(threads, _QUICK.value)
  record = {**machine, "threads": threads, "command": sys.argv, "shapes": {}}
  workdir = pathlib.Path(tempfile.mkdtemp(prefix="sampler_bench_"))
  sources = {}
  if _BASELINE.value:
    sources[f"ours@{_BASELINE.value}"] = extract_ref(_BASELINE.value, workdir / "baseline")
  variants = dict(parse_variant(v) for v in _VARIANTS.value)
  dtypes = ["float32"] if _QUICK.value and not flags.FLAGS["dtypes"].present else _DTYPES.value
  unknown = sorted(set(dtypes) - set(harness.DTYPES))
  if unknown:
    raise app.UsageError(f"--dtypes: {unknown} not among {list(harness.DTYPES)}")
  failed = False
  try:
    for key in shapes:
      shape = SHAPES[key]
      wanted = [e for e in _ENGINES.value if e in shape.engines] + list(sources) + list(variants)
      engines, skipped = available(wanted)
      for line in skipped:
        print(line)
      shape_dir = workdir / key
      shape_dir.mkdir()
      record["shapes"][key] = {}
      for dtype in dtypes:  # float32 against float32, bfloat16 against bfloat16
        measured = run_shape(shape, engines, trials, threads, shape_dir, sources, variants, dtype)
        fractions = {e: shape.roofline(r, machine, dtype) for e, r in measured["results"].items()}
        print_shape(shape, measured, fractions)
        record["shapes"][key][dtype] = {
          **measured,
          "roofline": fractions,
          "results": {e: dataclasses.asdict(r) for e, r in measured["results"].items()},
          "skipped": skipped,
        }
        if measured["failures"]:
          failed = True
          print(f"(worker logs kept in {shape_dir})")
  finally:
    if not failed:
      shutil.rmtree(workdir, ignore_errors=True)
  record["load_after"] = harness.end_load()
  if _OUT.value:
    pathlib.Path(_OUT.value).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
  app.run(main)
