"""The device check's generic parts (lm/device_check.py): the judgement fails when prediction and
measurement disagree beyond the stated tolerances, the measurement reads a program's own peak (not
the process's), and parity fails on a reference that does not match."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lm import device_check
from lm import plan as plan_lib
from lm.config import ModelConfig


def test_judge_passes_within_the_tolerances_and_fails_outside():
  agree = dict(predicted_bytes=100e9, measured_bytes=105e9, predicted_seconds=2.0, measured_seconds=3.5)
  assert device_check.judge(**agree)["ok"]
  memory_off = device_check.judge(**{**agree, "measured_bytes": 115e9})  # 15% > 10%
  assert not memory_off["ok"] and memory_off["memory"]["ok"] is False
  slow = device_check.judge(**{**agree, "measured_seconds": 4.5})  # 2.25x the roofline > 2x
  assert not slow["ok"] and slow["time"]["ok"] is False
  fast = device_check.judge(
    **{**agree, "measured_seconds": 0.9}
  )  # faster than half the roofline: wrong model
  assert not fast["ok"]
  unmeasured = device_check.judge(**{**agree, "measured_bytes": None})  # a required figure not compared
  assert not unmeasured["ok"] and unmeasured["memory"]["why"] == "not measured"
  assert device_check.judge(**{**agree, "measured_bytes": None}, require=("time",))["ok"]


def _device(extra: int):
  """A device's `memory_stats`: nothing in use before the call, then a peak `extra` bytes above it."""
  readings = iter([{"bytes_in_use": 0, "peak_bytes_in_use": 0}])
  return lambda: next(readings, {"bytes_in_use": 0, "peak_bytes_in_use": extra})


def test_measure_reads_the_programs_own_peak_and_a_planted_mismatch_fails():
  x = jnp.ones((256, 256), jnp.float32)
  compiled = jax.jit(lambda a: jnp.tanh(a @ a) @ a).lower(x).compile()
  mem = compiled.memory_analysis()
  predicted = mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
  predicted += mem.temp_size_in_bytes
  beyond_arguments = predicted - mem.argument_size_in_bytes

  def verdict(device):
    m = device_check.measure(compiled, lambda: (x,), trials=1, memory_stats=device)
    assert m["argument_bytes"] == x.nbytes
    return device_check.judge(
      predicted_bytes=predicted, measured_bytes=m["peak_bytes"], predicted_seconds=None,
      measured_seconds=m["seconds"], require=("memory",),
    )  # fmt: skip

  assert verdict(_device(beyond_arguments))["ok"]  # the device agrees with the compile
  assert not verdict(_device(2 * beyond_arguments + x.nbytes))["ok"]  # twice the prediction
  # A device whose peak was set before the program ran: not observable, so not judged right.
  earlier = iter([{"bytes_in_use": 0, "peak_bytes_in_use": 10**12}])
  m = device_check.measure(compiled, lambda: (x,), trials=1, memory_stats=lambda: next(earlier, {
    "bytes_in_use": 0, "peak_bytes_in_use": 10**12}))  # fmt: skip
  assert m["peak_bytes"] is None and "not observable" in m["peak_note"]


def test_parity_fails_on_a_reference_that_does_not_match(tmp_path):
  import shutil

  inputs = tmp_path / "inputs"
  shutil.copytree(device_check.PARITY_INPUTS, inputs)
  assert device_check._parity(str(inputs))["ok"]  # the committed inputs agree
  ref = np.load(inputs / "parity_reference.npz")
  np.savez(inputs / "parity_reference.npz", tokens=ref["tokens"], logits=ref["logits"][:, :, ::-1])
  assert not device_check._parity(str(inputs))["ok"]


@pytest.mark.parametrize(
  "kind, devices, name",
  [("NVIDIA H200", 1, "h200x1"), ("NVIDIA H100 80GB HBM3", 8, "h100x8"), ("TPU v5", 4, "v5p-8"),
   ("TPU v5 lite", 8, "v5e-8"), ("TPU v6 lite", 8, "v6e-8"), ("NVIDIA H100 PCIe", 1, "")],
)  # fmt: skip
def test_device_kinds_are_the_runtimes_own_strings(kind, devices, name):
  assert plan_lib.kind_target(kind, devices) == name
  assert not name or name in plan_lib.TARGETS


def test_decode_roofline_is_bytes_over_bandwidth():
  config = ModelConfig.tiny_qwen3()
  kv_per_slot = config.num_layers * 2 * config.num_kv_heads * config.head_dim * 2
  bound = device_check.decode_roofline(config, rows=4, context=100, dtype_bytes=2, bandwidth=1e9)
  np.testing.assert_allclose(bound, 4 * 1e9 / (config.num_params * 2 + 4 * 100 * kv_per_slot))


def test_check_without_parity_inputs_names_the_folder(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    device_check.main(["check", "--cpu", f"--inputs={tmp_path}"])
  assert e.value.code == 2 and "parity_reference.npz" in capsys.readouterr().err


def test_a_check_of_some_parts_runs_those_and_passes_the_row_options(tmp_path):
  seen = []

  def rows(cpu, **options):
    seen.append((cpu, options))
    disagrees = lambda: {"judgement": {"ok": False}}  # a row that disagrees with its plan
    return {"row": lambda: device_check.CompiledRow(own_bytes=1, run=disagrees)}

  out = str(tmp_path / "check.json")
  memory_only = device_check.check("unused", out, cpu=True, rows=rows, parts=("memory",))
  assert memory_only["ok"] and memory_only["parts"] == ["memory"] and "memory" in memory_only
  assert not seen and "rows" not in memory_only and "parity" not in memory_only
  options = {"attention_impl": "cudnn"}
  with_row = device_check.check("unused", out, cpu=True, rows=rows, parts=("rows",), row_options=options)
  assert seen == [(True, options)] and with_row["row_options"] == options
  assert not with_row["ok"]  # the planted disagreement fails the check
  with pytest.raises(ValueError, match="parts must be some of"):
    device_check.check("unused", out, cpu=True, rows=rows, parts=("rows", "speed"))


def test_the_rows_are_compiled_first_and_run_in_ascending_order_of_their_own_peaks(tmp_path):
  events = []

  def row(name, peak, error=False):
    def make():
      events.append(f"compile {name}")
      if error:
        raise RuntimeError("the compiler refused it")
      return device_check.CompiledRow(own_bytes=peak, run=lambda: events.append(f"run {name}") or {})

    return make

  def rows(cpu):
    return {"big": row("big", 3), "broken": row("broken", 0, error=True), "small": row("small", 1)}

  record = device_check.check("unused", str(tmp_path / "c.json"), cpu=True, rows=rows, parts=("rows",))
  assert events == ["compile big", "compile broken", "compile small", "run small", "run big"]
  assert record["row_order"] == ["small", "big"] and "compile_seconds" in record["rows"]["big"]
  assert "RuntimeError" in record["rows"]["broken"]["error"] and not record["ok"]
