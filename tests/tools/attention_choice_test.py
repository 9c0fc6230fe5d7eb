"""tools/attention_choice.py: the registered rule chooses the fused attention only within its factor
of ours, and the headroom part compiles the planned row at each swept chunk size."""

import json
import re

import pytest

from tools import attention_choice


def _precision(fused: float, ours: float) -> dict:
  key = "relative_grad_difference_from_xla:float32"
  distances = {"blockwise:float32": 1e-6, "blockwise": ours, "cudnn": fused, "xla": 0.05}
  return {"xla:float32": {"loss": 1.0}, **{v: {key: d} for v, d in distances.items()}}


@pytest.mark.parametrize(
  ("fused", "ours", "chosen"), [(0.024, 0.025, True), (0.031, 0.025, True), (0.032, 0.025, False)]
)
def test_the_rule_chooses_the_fused_attention_only_within_its_factor(fused, ours, chosen):
  decision = attention_choice.decide(_precision(fused, ours))
  assert decision["choose_fused"] is chosen and decision["ratio"] == pytest.approx(fused / ours)
  assert decision["distance_from_reference"]["control"] == 1e-6


def test_the_headroom_part_compiles_each_chunk_size(tmp_path):
  argv = [f"--out={tmp_path}", "--cpu", "--parts=headroom", "--sweep=1,8"]
  assert attention_choice.main(argv) == 0
  record = json.loads((tmp_path / "attention_choice.json").read_text())["headroom"]
  one, two = record["1"], record["8"]
  rows = [int(re.match(r"verifier, (\d+) rows", r["program"]).group(1)) for r in (one, two)]
  assert rows[0] < rows[1]  # 1 pair's rows are padded to the host's device count, 8 pairs' are not
  assert 0 < one["own_peak_gib"] < two["own_peak_gib"] and "not a run" in record["source"]
  with pytest.raises(SystemExit):
    attention_choice.main([f"--out={tmp_path}", "--cpu", "--parts=speed"])
