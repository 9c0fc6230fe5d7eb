"""The RL benchmark's quick setting end to end: every side ran, agreed, and the table is complete."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks import rl_bench

ROOT = pathlib.Path(__file__).parents[2]


@pytest.mark.slow
@pytest.mark.integration
def test_quick_run_measures_both_sides_of_a_dpa_grpo_step_in_both_dtypes_and_they_agree(tmp_path):
  out = tmp_path / "rl.json"
  # The default sides but `torch` (`torch_window` is the same worker with one setting changed; 40 s).
  sides = "jax,jax_shared,torch_window"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # not the tests' 8 fake devices
  # One thread a side: the suite's other xdist worker holds the other core, and PyTorch's two OpenMP
  # threads, one waiting on a busy core, made each torch step 3.3 s instead of 0.07 s (this test
  # 72 -> 46 s, one run each on a loaded 2-core machine).
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "benchmarks.rl_bench",
      "--quick",
      "--threads=1",
      f"--out={out}",
      f"--sides={sides}",
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  record = json.loads(out.read_text())
  assert record["failures"] == {}
  assert record["dtypes"] == ["float32", "bfloat16"]
  setup = record["setup"]
  for dtype in record["dtypes"]:
    results = record["results"][dtype]
    assert set(results) == set(sides.split(",")), dtype
    for side, r in results.items():
      assert len(r["trials"]) == 3, (dtype, side)
      assert all(t["rollout_s"] > 0 and t["train_s"] > 0 for t in r["trials"]), (dtype, side)
      # Every rollout generated P prompts × samples × new tokens (EOS ignored).
      assert all(
        t["rollout_tokens"] == setup["pairs"] * setup["samples"] * setup["new_tokens"] for t in r["trials"]
      )
      assert r["load_s"] > 0 and r["version"], (dtype, side)
    # Same weights, same loss (scored at every position or at the completion window only): the first
    # step's loss and gradient norm within the dtype's stated tolerances; in float32 the same greedy
    # tokens on a model whose rows do not repeat one token, in bfloat16 at least the first token of
    # every row (a later near-tie may flip, and the row then diverges).
    tolerance = rl_bench.TOLERANCES[dtype]
    assert record["tolerances"][dtype] == {"loss_rtol": tolerance.loss_rtol, "norm_rtol": tolerance.norm_rtol}
    # jax_shared (each pair one row, the prompt once) against jax: the same loss, another layout.
    assert set(record["agreement"][dtype]) == {"jax_shared", "torch_window"}
    for side, agree in record["agreement"][dtype].items():
      assert agree["within_tolerance"], (dtype, side, agree)
      assert agree["loss_abs_diff"] <= tolerance.loss_rtol * max(1.0, abs(results[side]["first_loss"]))
      assert agree["grad_norm_rel_diff"] <= tolerance.norm_rtol
      assert agree["distinct_greedy_ids"] > 4
      if dtype == "float32":
        assert agree["greedy"] == 1.0, (side, agree)
      else:
        assert agree["first_greedy"] == 1.0, (side, agree)
    # The roofline: counted FLOPs, fractions of this dtype's measured peak and bandwidth bound, fewer
    # FLOPs where each pair's prompt is computed once.
    assert record["peak_gflop_s_by_dtype"][dtype] > 0
    roof = record["roofline"][dtype]
    gflop = {side: roof[side]["train_gflop"] for side in roof}
    assert gflop["jax_shared"] < gflop["jax"] == gflop["torch_window"]
    for side, f in roof.items():
      assert f["peak_gflop_s"] == record["peak_gflop_s_by_dtype"][dtype]
      assert len(f["train_of_peak"]) == 3 and all(x > 0 for x in f["train_of_peak"]), (dtype, side)
      assert f["rollout_bound_tok_s"] > 0 and all(x > 0 for x in f["rollout_of_bound"]), (dtype, side)
  # bfloat16 reads 2 bytes a weight and KV entry: twice float32's decode bound.
  bounds = {d: record["roofline"][d]["jax"]["rollout_bound_tok_s"] for d in record["dtypes"]}
  assert bounds["bfloat16"] == pytest.approx(2 * bounds["float32"])
  # Each side's bfloat16 step against its own float32 one: a rounding gap, within the bfloat16
  # tolerance too.
  assert set(record["bfloat16_gap"]) == set(sides.split(","))
  for side, gap in record["bfloat16_gap"].items():
    assert 0 <= gap["grad_norm_rel_diff"] <= rl_bench.TOLERANCES["bfloat16"].norm_rtol, (side, gap)
  assert record["peak_gflop_s"] > 0 and record["bandwidth_gb_s"] > 0
  lines = proc.stdout.splitlines()
  header = next(line for line in lines if line.startswith("side "))
  for column in rl_bench.COLUMNS:
    assert column in header, (column, header)
  assert [line for line in lines if line in ("float32:", "bfloat16:")] == ["float32:", "bfloat16:"]
  jax_rows = [line for line in lines if line.startswith("jax ")]
  other_rows = [line for line in lines if line.split(" ")[0] in ("torch_window", "jax_shared")]
  other_rows = [line for line in other_rows if "÷" not in line]  # the table's rows, not the ratio lines
  assert len(jax_rows) == 2 and len(other_rows) == 4
  assert all(len(row.split("[")) - 1 == 6 for row in other_rows)  # three measurements, three ratios
  shared = [line for line in lines if line.startswith("jax_shared ÷ ")]
  assert len(shared) == 2 and all(line.count("[") == 1 for line in shared)  # ÷ torch_window, per dtype
  assert all(row.count("[") == 3 for row in jax_rows)
  for dtype in ("float32", "bfloat16"):
    assert f"agreement with torch_window ({dtype}):" in proc.stdout
    assert f"roofline, jax ({dtype}): train" in proc.stdout and f"measured {dtype} matmul peak" in proc.stdout
  assert "FAILED" not in proc.stdout
  assert "bfloat16 against float32, jax:" in proc.stdout
  assert "measured read bandwidth" in proc.stdout and "load average" in proc.stdout


def test_agreement_fails_when_the_gradient_norms_differ():
  def side(name, norm):
    return rl_bench.SideResult(
      side=name,
      version="v",
      threads=2,
      load_s=1.0,
      warmup_s=0.0,
      trials=[],
      rollout_tok_s=[],
      train_tok_s=[],
      step_s=[],
      first_loss=0.5,
      first_grad_norm=norm,
      greedy_tokens=[[1, 2, 3], [4, 5, 6]],
    )

  f32, bf16 = rl_bench.TOLERANCES["float32"], rl_bench.TOLERANCES["bfloat16"]
  assert rl_bench.agreement({"jax": side("jax", 2.0), "torch": side("torch", 2.0)}, "torch", f32)[
    "within_tolerance"
  ]
  off = rl_bench.agreement({"jax": side("jax", 2.01), "torch": side("torch", 2.0)}, "torch", f32)
  assert not off["within_tolerance"] and off["grad_norm_rel_diff"] == pytest.approx(0.005)
  # The same 0.5% is within bfloat16's tolerance, 5% is not.
  assert rl_bench.agreement({"jax": side("jax", 2.01), "torch": side("torch", 2.0)}, "torch", bf16)[
    "within_tolerance"
  ]
  far = rl_bench.agreement({"jax": side("jax", 2.1), "torch": side("torch", 2.0)}, "torch", bf16)
  assert not far["within_tolerance"]
