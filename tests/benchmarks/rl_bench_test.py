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
def test_quick_run_measures_both_sides_of_a_dpa_grpo_step_and_they_agree(tmp_path):
  out = tmp_path / "rl.json"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # not the tests' 8 fake devices
  # One thread a side: the suite's other xdist worker holds the other core, and PyTorch's two OpenMP
  # threads, one waiting on a busy core, made each torch step 3.3 s instead of 0.07 s (this test
  # 72 -> 46 s, one run each on a loaded 2-core machine).
  proc = subprocess.run(
    [sys.executable, "-m", "benchmarks.rl_bench", "--quick", "--threads=1", f"--out={out}"],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  record = json.loads(out.read_text())
  assert record["failures"] == {}
  results = record["results"]
  assert set(results) == {"jax", "torch", "torch_window"}
  for side, r in results.items():
    assert len(r["trials"]) == 3, side
    assert all(t["rollout_s"] > 0 and t["train_s"] > 0 for t in r["trials"]), side
    # Every rollout generated P prompts × samples × new tokens (EOS ignored).
    setup = record["setup"]
    assert all(
      t["rollout_tokens"] == setup["pairs"] * setup["samples"] * setup["new_tokens"] for t in r["trials"]
    )
    assert r["load_s"] > 0 and r["version"], side
  # Same weights, same loss (scored at every position or at the completion window only): the first
  # step's loss and gradient norm within the stated tolerances, and the same greedy tokens on a
  # model whose rows do not repeat one token.
  assert set(record["agreement"]) == {"torch", "torch_window"}
  for side, agree in record["agreement"].items():
    assert agree["within_tolerance"], (side, agree)
    assert agree["loss_abs_diff"] <= rl_bench.LOSS_RTOL * max(1.0, abs(results[side]["first_loss"]))
    assert agree["grad_norm_rel_diff"] <= rl_bench.NORM_RTOL
    assert agree["greedy"] == 1.0 and agree["distinct_greedy_ids"] > 4
  # The roofline: counted FLOPs, fractions of the measured peak and bandwidth bound, fewer FLOPs
  # where only the completion window is projected.
  assert record["peak_gflop_s"] > 0 and record["bandwidth_gb_s"] > 0
  roof = record["roofline"]
  assert roof["jax"]["train_gflop"] == roof["torch_window"]["train_gflop"] < roof["torch"]["train_gflop"]
  for side, f in roof.items():
    assert len(f["train_of_peak"]) == 3 and all(x > 0 for x in f["train_of_peak"]), side
    assert f["rollout_bound_tok_s"] > 0 and all(x > 0 for x in f["rollout_of_bound"]), side
  lines = proc.stdout.splitlines()
  header = next(line for line in lines if line.startswith("side "))
  for column in rl_bench.COLUMNS:
    assert column in header, (column, header)
  jax_row = next(line for line in lines if line.startswith("jax "))
  torch_row = next(line for line in lines if line.startswith("torch "))
  assert len(torch_row.split("[")) - 1 == 6  # three measurements and their three JAX ÷ PyTorch ratios
  assert jax_row.count("[") == 3
  assert "agreement with torch:" in proc.stdout and "FAILED" not in proc.stdout
  assert "roofline, jax: train" in proc.stdout
  assert "measured read bandwidth" in proc.stdout and "load average" in proc.stdout
  assert "matmul peak" in proc.stdout


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

  assert rl_bench.agreement({"jax": side("jax", 2.0), "torch": side("torch", 2.0)})["within_tolerance"]
  off = rl_bench.agreement({"jax": side("jax", 2.01), "torch": side("torch", 2.0)})
  assert not off["within_tolerance"] and off["grad_norm_rel_diff"] == pytest.approx(0.005)
