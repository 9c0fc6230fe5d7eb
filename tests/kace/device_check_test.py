"""KACE's planned row of the device check (`kace.device_check`) at toy sizes on the CPU: the planned
program runs truncated to a few decode steps, its roofline is that of the steps it ran (the plan's
own model, proportional to them), a device whose memory agrees with the plan passes and one that
disagrees fails; the plan's records are read for the rows and mesh the row runs, or not at all."""

import json

import numpy as np
import pytest

from configs import kace as presets
from kace import device_check as kace_device_check
from lm import plan as plan_lib
from lm.config import ModelConfig


def _device(extra: float):
  readings = iter([{"bytes_in_use": 0, "peak_bytes_in_use": 0}])
  return lambda: next(readings, {"bytes_in_use": 0, "peak_bytes_in_use": int(extra)})


@pytest.mark.slow
def test_the_cpu_row_runs_the_planned_program_truncated_and_a_planted_mismatch_fails():
  compiled = kace_device_check.solver_row(cpu=True, steps=16)
  row = compiled.run()
  assert row["program"].startswith("8 prompts x n=1 compiled (8 rows asked), prompt 32, 128 new tokens")
  predicted, truncation = row["predicted"], row["predicted"]["truncation"]
  assert compiled.own_bytes == predicted["this_compile_peak_bytes"] == predicted["peak_bytes"]
  assert 0 < truncation["steps_run"] <= 16 and truncation["planned_steps"] == 128  # not the 128 compiled
  assert row["measured"]["seconds"] > 0 and row["measured"]["peak_bytes"] is None  # measured, not judged
  assert row["judgement"]["ok"] and row["judgement"]["time"]["ok"] is None

  # The truncated model is the full program's (the same function) at the steps run: its bytes and its
  # decode FLOPs in proportion, the prefill's FLOPs whole; on this target the bytes bound the time.
  share = truncation["steps_run"] / truncation["planned_steps"]
  full = predicted["full_program_model"]
  prefill = plan_lib.forward_flops(ModelConfig.tiny_qwen3(), 8, 32) / 8  # 8 prompts of 32, 8 devices
  assert truncation["model_bytes"] == pytest.approx(share * full["bytes"], rel=1e-12)
  assert truncation["model_flops"] - prefill == pytest.approx(share * (full["flops"] - prefill), rel=1e-12)
  assert predicted["roofline_seconds"] == pytest.approx(share * predicted["full_program_roofline_seconds"])

  arguments = row["measured"]["argument_bytes"]
  agrees = kace_device_check.solver_row(cpu=True, memory_stats=_device(predicted["peak_bytes"] - arguments))
  judged = agrees.run()["judgement"]
  assert judged["ok"] and judged["memory"]["ok"] is True, judged
  planted = kace_device_check.solver_row(cpu=True, memory_stats=_device(1.2 * predicted["peak_bytes"]))
  judged = planted.run()["judgement"]
  assert judged["memory"]["ok"] is False and not judged["ok"]


def test_steps_run_is_the_longest_rows_tokens_with_its_eos():
  tokens = np.array([[5, 6, -1, -1], [7, -1, -1, -1]])
  assert kace_device_check.steps_run(tokens, np.array([False, True])) == 2  # 2 kept; 1 kept + EOS
  assert kace_device_check.steps_run(tokens, np.array([True, False])) == 3  # 2 kept + EOS
  assert kace_device_check.steps_run(np.full((2, 4), 3), np.array([False, False])) == 4


def _config(rows: int, data: int = -1) -> dict:
  c = presets.get_config("qwen3_4b@h200x1")
  c.roles.solver.sampler.max_rows = rows
  c.roles.solver.mesh.data = data
  return c.to_dict()


def test_the_plan_record_is_read_for_the_rows_and_mesh_the_row_runs(tmp_path):
  records, gib = tmp_path / "plan.jsonl", plan_lib.GiB
  mesh = {"roles.solver.mesh.data": -1, "roles.solver.mesh.fsdp": 1, "roles.solver.mesh.tp": 1}
  record = {
    "preset": "configs/kace.py:qwen3_4b", "target": "h200x1",
    "programs": [{"name": "sample", "peak": 60 * gib, "resident": 0}],
    "overrides": {"roles.solver.sampler.max_rows": 8, **mesh},
    "tried": ["32 rows, mesh data=1 fsdp=2 tp=1: peak 1.0 GiB", "32 rows: refused (RESOURCE_EXHAUSTED)",
              "16 rows: peak 105.8 GiB", "4 rows, mesh data=1 fsdp=1 tp=1: peak 33.3 GiB"],
  }  # fmt: skip
  stale = {**record, "programs": [{"name": "sample", "peak": 1, "resident": 0}]}  # older: not read
  other = {**record, "preset": "configs/kace.py:cpu"}
  records.write_text("\n".join(json.dumps(r) for r in (stale, record, other)) + "\n")

  def peak(config, target="h200x1"):
    return kace_device_check.recorded_peak(config, target, 1, path=str(records))

  assert peak(_config(8)) == 60 * gib  # the chosen program
  assert peak(_config(16)) == 105.8 * gib  # a tried one, on the record's mesh
  assert peak(_config(4)) == 33.3 * gib  # a tried one naming its mesh
  assert peak(_config(32)) is None  # tried on another mesh, or refused: never compiled at this one
  assert peak(_config(2)) is None and peak(_config(8), target="h100x1") is None
  assert peak(_config(16, data=1)) is None  # another mesh than the record's: not its figures


@pytest.mark.parametrize("target", sorted(presets.TARGETS["qwen3_4b"]))
def test_every_planned_target_has_the_plans_figure_for_the_row(target):
  config = presets.get_config(f"qwen3_4b@{target}").to_dict()
  assert kace_device_check.recorded_peak(config, target, plan_lib.TARGETS[target].devices) > 0
