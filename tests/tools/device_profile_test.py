"""tools/device_profile.py: the trace summary keeps a device's events and sums them by name and by
kind, and the CPU run of the planned row writes its record and the program's HLO."""

import gzip
import json
import re

import pytest

from tools import device_profile

# its compiles kept out of JAX's persistent cache, whose read crashed a worker in a full run (2026-12-05)
pytestmark = pytest.mark.usefixtures("no_persistent_cache")


def test_summary_keeps_the_device_processes_and_sums_kinds():
  events = [
    {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
    {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
    {"ph": "X", "pid": 1, "name": "PjitFunction(f)", "dur": 500.0},  # host: left out
    {"ph": "X", "pid": 2, "name": "loop_transpose_fusion.6", "dur": 30.0, "args": {"hlo_op": "a"}},
    {"ph": "X", "pid": 2, "name": "loop_transpose_fusion.7", "dur": 20.0},
    {"ph": "X", "pid": 2, "name": "nvjet_gemm", "dur": 50.0},
    {"ph": "X", "pid": 2, "name": "$profiler.py:1 trace", "dur": 99.0},  # Python frames: left out
  ]
  s = device_profile.summarize(events)
  assert s["device_processes"] == ["/device:GPU:0"] and s["events"] == 3 and s["total_us"] == 100.0
  assert s["top_names"][0] == {"name": "nvjet_gemm", "us": 50.0, "share": 0.5, "args": {}}
  assert s["top_kinds"][0]["kind"] in ("loop_transpose_fusion", "nvjet_gemm")
  assert {k["kind"]: k["us"] for k in s["top_kinds"]}["loop_transpose_fusion"] == 50.0


def test_the_cpu_run_profiles_the_planned_row(tmp_path):
  argv = [
    f"--out={tmp_path}",
    "--pairs=1",
    "--cpu",
    "--skip_deviceless",
    "--attention=blockwise,xla:bfloat16",  # (xla in float32 equals blockwise: tests/lm/attention_test.py)
  ]
  assert device_profile.main(argv) == 0
  record = json.loads((tmp_path / "profile.json").read_text())
  blockwise = record["profile"]["blockwise"]
  assert re.match(r"verifier, \d+ rows x 64 tokens", blockwise["program"]) and blockwise["seconds_traced"] > 0
  assert blockwise["summary"]["events"] > 0 and blockwise["summary"]["top_names"]
  assert blockwise["grad_norm"] > 0
  # 64-token rows are longer than the tiny model's attention block, so "xla" runs the fused path;
  # a dtype variant reads the same weights (rounded to the preset's dtype, then cast): bfloat16
  # arithmetic moves the gradient measurably, not wholly
  low = record["profile"]["xla:bfloat16"]
  assert low["dtype"] == "bfloat16" and blockwise["dtype"] == "float32"
  assert 1e-4 < low["relative_grad_difference_from_blockwise"] < 0.5
  assert low["grad_cosine_with_blockwise"] > 0.95
  with gzip.open(tmp_path / "accumulate.hlo.txt.gz", "rt") as f:
    assert "ENTRY" in f.read()
