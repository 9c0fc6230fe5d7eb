"""The device check with DPA-GRPO's planned rows (`launch.device_check`, `dpa_grpo.device_check`) at
toy sizes on the CPU: every part runs and the record holds each row's prediction beside its
measurement, the rows (KACE's too) run in ascending order of their peaks; a device whose memory
agrees with the plan passes, one that disagrees fails; the plan's records are read for the
configuration the row runs, or not at all."""

import json
import re

import pytest

from dpa_grpo import device_check as dpa_device_check
from launch import device_check as launcher
from lm import device_check
from lm import plan as plan_lib


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

  compiled = dpa_device_check.accumulate_row(cpu=True, memory_stats=_device(predicted - arguments), trials=1)
  agrees = compiled.run()
  assert agrees["judgement"]["ok"], agrees["judgement"]
  planted = dpa_device_check.accumulate_row(cpu=True, memory_stats=_device(2 * predicted), trials=1).run()
  assert not planted["judgement"]["ok"] and planted["judgement"]["memory"]["ok"] is False

  # both papers' rows, run in ascending order of their own peaks (this compile's)
  assert sorted(record["rows"]) == ["dpa_grpo accumulate", "dpa_grpo sampler", "kace sampler"]
  own = [record["rows"][name]["predicted"]["this_compile_peak_bytes"] for name in record["row_order"]]
  assert sorted(record["row_order"]) == sorted(record["rows"]) and own == sorted(own)
  assert compiled.own_bytes == row["predicted"]["this_compile_peak_bytes"]
  sampler = record["rows"]["dpa_grpo sampler"]
  assert re.match(r"8 prompts x n=1 compiled \(8 rows asked\), prompt 64, \d+ new tokens", sampler["program"])
  assert sampler["measured"]["seconds"] > 0 and sampler["measured"]["argument_bytes"] > 0
  predicted, arguments = sampler["predicted"]["peak_bytes"], sampler["measured"]["argument_bytes"]
  agrees = dpa_device_check.sample_row(cpu=True, memory_stats=_device(predicted - arguments)).run()
  assert agrees["judgement"]["ok"], agrees["judgement"]
  planted = dpa_device_check.sample_row(cpu=True, memory_stats=_device(1.2 * predicted)).run()
  assert planted["judgement"]["memory"]["ok"] is False and not planted["judgement"]["ok"]


def test_the_plan_record_is_read_for_the_configuration_the_row_runs(tmp_path):
  records = tmp_path / "plan.jsonl"
  gib = plan_lib.GiB
  programs = [
    {"name": "accumulate", "peak": 100 * gib, "resident": 2 * gib},
    {"name": "sample", "peak": 70 * gib, "resident": 1 * gib},
  ]
  record = {
    "preset": "configs/dpa_grpo.py:qwen3_4b", "target": "h200x1", "programs": programs,
    "overrides": {"train.pairs_per_chunk": 16, "loss.remat": "full", "sampler.max_rows": 64},
    "tried": ["remat full, 32 pairs: peak 180.5 GiB", "sampler at 128 rows: peak 121.7 GiB"],
  }  # fmt: skip
  stale = {**record, "programs": [{**p, "peak": 1} for p in programs]}  # an older line: not read
  records.write_text(json.dumps(stale) + "\n" + json.dumps(record) + "\n")

  def peak(program, overrides, tried, target="h200x1"):
    return device_check.recorded_peak(
      "configs/dpa_grpo.py:qwen3_4b", target, program, overrides, tried,
      fixed=dpa_device_check.PLANNED_ATTENTION, path=str(records),
    )  # fmt: skip

  acc = r"remat full, (?:16|32) pairs: peak ([\d.]+) GiB"
  assert peak("accumulate", {"train.pairs_per_chunk": 16, "loss.remat": "full"}, acc) == 98 * gib
  assert peak("accumulate", {"train.pairs_per_chunk": 32, "loss.remat": "full"}, acc) == 180.5 * gib - 2 * gib
  assert peak("sample", {"sampler.max_rows": 64}, r"sampler at 64 rows: peak ([\d.]+) GiB") == 69 * gib
  at_128 = peak("sample", {"sampler.max_rows": 128}, r"sampler at 128 rows: peak ([\d.]+) GiB")
  assert at_128 == 121.7 * gib - gib
  assert peak("sample", {"sampler.max_rows": 32}, r"sampler at 32 rows: peak ([\d.]+) GiB") is None
  assert peak("sample", {}, "x", target="h100x1") is None
  # the record planned the preset's attention (blockwise): a row run with cuDNN's has no plan figure
  assert (
    peak("accumulate", {"train.pairs_per_chunk": 16, "model.attention_impl": "blockwise"}, acc) == 98 * gib
  )
  assert peak("accumulate", {"train.pairs_per_chunk": 16, "model.attention_impl": "cudnn"}, acc) is None
