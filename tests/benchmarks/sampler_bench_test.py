"""The sampler benchmark's harness: its quick setting end to end, and the parts that decide ratios."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks import sampler_bench as bench

ROOT = pathlib.Path(__file__).parents[2]


@pytest.mark.slow
@pytest.mark.integration
def test_quick_run_measures_ours_transformers_and_a_baseline_commit_in_both_dtypes(tmp_path):
  # The README's commands at the quick shape: every engine in its own process, interleaved trials,
  # `ours@HEAD` from `git archive` of the last commit; float32 and bfloat16 blocks.
  out = tmp_path / "bench.json"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # not the tests' 8 fake devices
  # One thread an engine: the suite's other xdist worker holds the other core (tests/benchmarks/
  # rl_bench_test.py; this test 61 -> 29 s, one run each on a loaded 2-core machine).
  command = [
    sys.executable, "-m", "benchmarks.sampler_bench", "--quick", "--baseline=HEAD", "--threads=1",
    "--dtypes=float32,bfloat16", f"--out={out}",
  ]  # fmt: skip
  proc = subprocess.run(
    command,
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads(out.read_text())
  quick, half = record["shapes"]["quick"]["float32"], record["shapes"]["quick"]["bfloat16"]
  assert quick["failures"] == {} and half["failures"] == {}
  assert quick["dtype"] == "float32" and half["dtype"] == "bfloat16"
  results = quick["results"]
  assert set(results) == {"ours", "transformers", "ours@HEAD"}
  for name, r in results.items():
    assert len(r["trials"]) == 3, name
    assert all(t["t_new"] > 0 and t["t1"] > 0 for t in r["trials"]), name
    assert r["load_s"] > 0 and r["version"], name
    # Greedy float32 on the same weights: the same 16 tokens as ours, on a model that does not
    # emit one token over and over (std-0.1 weights).
    assert r["agreement"] == 1.0, name
  assert results["ours"]["distinct_tokens"] > 4
  assert set(half["results"]) == {"ours", "transformers", "ours@HEAD"}
  # bfloat16 on both sides: the same code at HEAD agrees exactly; transformers' bf16 kernels round
  # differently, so its agreement is a measured fraction.
  assert half["results"]["ours@HEAD"]["agreement"] == 1.0
  assert 0.0 <= half["results"]["transformers"]["agreement"] <= 1.0
  for line in ("ours ", "transformers ", "ours@HEAD "):
    assert any(row.startswith(line) for row in proc.stdout.splitlines()), (line, proc.stdout)
  assert "measured read bandwidth" in proc.stdout and "load average" in proc.stdout
  # Roofline fractions of every engine against the bounds this run measured.
  assert record["peak_gflop_s"] > 0 and record["bandwidth_gb_s"] > 0
  assert set(record["peaks_gflop_s"]) == {"float32", "bfloat16"}
  for name, f in quick["roofline"].items():
    # decode tok/s of the quick shape's 32 steps can come out negative on a loaded machine (t1 > t_new)
    assert len(f["decode_of_bound"]) == 3 and all(math.isfinite(x) for x in f["decode_of_bound"]), name
    assert f["decode_bound_tok_s"] > 0, name
    assert len(f["t1_of_peak"]) == 3 and all(0 < x for x in f["t1_of_peak"]), name
  assert "roofline, ours: decode" in proc.stdout
  # Each dtype's bound at its own bytes: a bf16 step reads half the bytes, so its bound is twice
  # float32's; its t1 is measured against the bf16 peak.
  for name in results:
    f32, bf16 = quick["roofline"][name], half["roofline"][name]
    assert bf16["decode_bound_tok_s"] == pytest.approx(2 * f32["decode_bound_tok_s"])
    assert (f32["peak_gflop_s"], bf16["peak_gflop_s"]) == (
      record["peaks_gflop_s"]["float32"],
      record["peaks_gflop_s"]["bfloat16"],
    )
  assert "\ntiny, bfloat16:" in proc.stdout


def test_an_engine_without_its_venv_is_skipped_with_a_line_saying_so():
  run, skipped = bench.available(["ours", "no-such-engine"])
  assert run == ["ours"]
  assert skipped == [
    "no-such-engine: not installed (.bench/no-such-engine/bin/python missing; "
    "`bash benchmarks/setup_engines.sh no-such-engine`), skipped"
  ]


def _result(engine, decode):
  trials = [bench.Trial(t1=0.1, t_new=1.0) for _ in decode]
  return bench.EngineResult(
    engine=engine,
    version="v",
    threads=2,
    load_s=1.0,
    warmup_s=0.0,
    trials=trials,
    decode_tok_s=decode,
    e2e_tok_s=decode,
    t1_ms=[100.0 for _ in decode],
    agreement=1.0,
    distinct_tokens=3,
  )


def test_ratios_pair_measurements_within_a_trial():
  # A slow moment of the machine (trial 2) slows both engines; the per-trial ratio ignores it,
  # a ratio of medians taken separately would not.
  results = {"ours": _result("ours", [100.0, 50.0, 100.0]), "x": _result("x", [50.0, 25.0, 40.0])}
  assert bench.ratios(results, "x", "decode_tok_s") == [2.0, 2.0, 2.5]
  assert bench.fmt([2.0, 2.0, 2.5], 2) == "2.00 [2.00–2.50]"


def test_extract_ref_gives_the_committed_lm_without_touching_the_repository(tmp_path):
  tree = bench.extract_ref("HEAD", tmp_path / "ref")
  assert (tree / "lm" / "sampler.py").read_text() == subprocess.run(
    ["git", "show", "HEAD:lm/sampler.py"], cwd=ROOT, capture_output=True, text=True, check=True
  ).stdout
  assert not (tree / ".git").exists()
