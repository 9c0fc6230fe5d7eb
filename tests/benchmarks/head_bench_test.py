"""The logits-product benchmark's quick setting: every variant computes the product and is timed."""

import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks import head_bench

ROOT = pathlib.Path(__file__).parents[2]


@pytest.mark.slow
def test_quick_run_times_every_variant_against_the_samplers_choice():
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  proc = subprocess.run(
    [sys.executable, "-m", "benchmarks.head_bench", "--quick"],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = {
    line[:24].strip(): line[24:]
    for line in proc.stdout.splitlines()
    if line[:24].strip() in head_bench.VARIANTS
  }
  assert set(rows) == set(head_bench.VARIANTS)
  # The reference's ratio to itself is exactly 1 in every repeat; every row has a time and a ratio.
  assert rows[head_bench.REFERENCE].split()[-2:] == ["1.00", "[1.00–1.00]"]
  assert all(row.count("[") == 2 for row in rows.values())


def test_the_reference_is_the_samplers_decode_options():
  layout, options = head_bench.VARIANTS[head_bench.REFERENCE]
  assert layout == "dv" and options == head_bench.sampler_lib._CPU_DECODE_OPTIONS
