"""The device check at toy sizes on the CPU (what `bash scripts/device_check.sh --cpu` runs)."""

import json
import re

import numpy as np
import pytest

from lm import device_check
from lm.config import ModelConfig


@pytest.mark.slow
def test_device_check_runs_every_part_and_parity_holds(tmp_path):
  inputs, out = tmp_path / "inputs", tmp_path / "record.json"
  assert device_check.main(["prepare", f"--inputs={inputs}"]) == 0
  assert device_check.main(["check", "--cpu", f"--inputs={inputs}", f"--out={out}"]) == 0
  record = json.loads(out.read_text())
  assert record["mode"] == "cpu" and record["ok"]
  assert record["parity"]["float32"]["max_abs_err"] < 1e-3
  assert record["parity"]["bfloat16"]["argmax_agreement"] >= 0.9
  assert record["memory"]["bytes_per_s"] > 0
  decode = record["decode"]
  assert decode["decode_tokens_per_s"] > 0 and 0 < decode["fraction_of_roofline"]
  step = record["step"]  # the plan's accumulate, compiled and run: prediction beside measurement
  assert "error" not in step and "skipped" not in step, step
  assert re.fullmatch(r"verifier, \d+ rows x 64 tokens, remat \w+", step["program"]), step["program"]
  assert step["predicted_peak_bytes"] > 0 and step["predicted_seconds"] > 0
  assert step["measured_seconds"] > 0 and len(step["measured_seconds_all"]) == 3

  # A reference that does not match (another model's logits) fails the check: it can fail.
  ref = np.load(inputs / "parity_reference.npz")
  np.savez(inputs / "parity_reference.npz", tokens=ref["tokens"], logits=ref["logits"][:, :, ::-1])
  assert device_check.main(["check", "--cpu", f"--inputs={inputs}", f"--out={out}"]) == 1
  assert not json.loads(out.read_text())["parity"]["ok"]


def test_decode_roofline_is_bytes_over_bandwidth():
  config = ModelConfig.tiny_qwen3()
  kv_per_slot = config.num_layers * 2 * config.num_kv_heads * config.head_dim * 2
  bound = device_check.decode_roofline(config, rows=4, context=100, dtype_bytes=2, bandwidth=1e9)
  np.testing.assert_allclose(bound, 4 * 1e9 / (config.num_params * 2 + 4 * 100 * kv_per_slot))


def test_check_without_prepared_inputs_names_the_folder(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    device_check.main(["check", "--cpu", f"--inputs={tmp_path}"])
  assert e.value.code == 2 and "parity_reference.npz" in capsys.readouterr().err
