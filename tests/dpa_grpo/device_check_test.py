"""The device check with DPA-GRPO's planned row (`launch.device_check`, `dpa_grpo.device_check`) at
toy sizes on the CPU: every part runs and the record holds the row's prediction beside its
measurement; a device whose memory agrees with the plan passes, one that disagrees fails."""

import json
import re

import pytest

from dpa_grpo import device_check as dpa_device_check
from launch import device_check as launcher


def _device(extra: int):
  readings = iter([{"bytes_in_use": 0, "peak_bytes_in_use": 0}])
  return lambda: next(readings, {"bytes_in_use": 0, "peak_bytes_in_use": int(extra)})


@pytest.mark.slow
def test_the_cpu_check_runs_the_planned_row_and_a_planted_mismatch_fails(tmp_path):
  out = tmp_path / "record.json"
  assert launcher.main(["check", "--cpu", f"--out={out}"]) == 0
  record = json.loads(out.read_text())
  assert record["mode"] == "cpu" and record["ok"] and record["parity"]["ok"]
  row = record["rows"]["dpa_grpo accumulate"]
  assert re.match(r"verifier, \d+ rows x 64 tokens", row["program"]) and row["measured"]["seconds"] > 0
  assert row["measured"]["peak_bytes"] is None  # a CPU reports no memory in use: measured, not judged
  predicted, arguments = row["predicted"]["peak_bytes"], row["measured"]["argument_bytes"]
  assert predicted > arguments > 0

  agrees = dpa_device_check.accumulate_row(cpu=True, memory_stats=_device(predicted - arguments), trials=1)
  assert agrees["judgement"]["ok"], agrees["judgement"]
  planted = dpa_device_check.accumulate_row(cpu=True, memory_stats=_device(2 * predicted), trials=1)
  assert not planted["judgement"]["ok"] and planted["judgement"]["memory"]["ok"] is False
