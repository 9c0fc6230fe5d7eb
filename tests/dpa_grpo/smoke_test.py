"""The README's qwen3_4b smoke command, run as the README writes it (its workdir swapped): the paper
preset's code path — per-case updates, the revise group, shaped and case-weighted decision rewards
with the balance bonus, LoRA dropout in the losses, the reference scoring and model selection —
exercised on CPU, not only read. The tiny random model's replies never parse, so the command turns
off the three skips of updates built on unparsable replies (each is tested on hand-built units in
`fidelity_test.py`); everything else is the preset's."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _readme_command() -> list[str]:
  text = open(os.path.join(ROOT, "README.md")).read()
  joined = re.sub(r"\\\n\s*", " ", text)
  (line,) = [x for x in joined.splitlines() if "dpa_grpo.py:qwen3_4b " in x and "tiny_qwen3" in x]
  return shlex.split(line.split("  #")[0])


def test_qwen3_4b_preset_code_path_runs_two_steps_on_cpu(tmp_path):
  args = [a if not a.startswith("--workdir=") else f"--workdir={tmp_path}" for a in _readme_command()]
  assert args[:3] == ["python", "-m", "launch.dpa_grpo"] and "--config=configs/dpa_grpo.py:qwen3_4b" in args
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  done = subprocess.run(
    [sys.executable, *args[1:], "--verbosity=-1"],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  config = json.loads((tmp_path / "dpa_grpo" / "config.json").read_text())
  assert config["train"]["update_every"] == "case" and config["loss"]["decision_rewards"] == "shaped"
  assert config["baseline"]["mode"] == "reference" and config["rollout"]["context"] == "draft"
  assert config["lora"]["dropout"] == 0.05 and config["loss"]["balance_strength"] == 1.5
  assert config["loss"]["case_weight_by"] == "case_id" and config["loss"]["aggregate"] == "sum"
  overrides = {a.split("=")[0] for a in args if a.startswith("--config.loss.")}
  assert overrides == {
    "--config.loss.skip_verifier_on_invalid_draft",
    "--config.loss.skip_decision_on_invalid_revision",
    "--config.loss.revision_filter",
  }
  rows = [json.loads(x) for x in (tmp_path / "dpa_grpo" / "metrics.jsonl").read_text().splitlines()]
  steps = [r for r in rows if "eval" not in r]
  assert [r["step"] for r in steps] == [1, 2] and all(r["updates"] == 2 for r in steps)
  assert all("generator/revision/loss" in r for r in steps)  # the revise turn was trained
  assert all("verifier/loss" in r and "generator/decision/pg" in r for r in steps)
  assert all(r["grad_norm"] > 0 for r in steps)  # the losses (with dropout) moved the adapters
  evals = [r["eval"] for r in rows if "eval" in r]
  assert all("all_cases" in e and "accuracy_missing_as_zero" in e for e in evals)
  assert (tmp_path / "report.md").read_text().startswith("# DPA-GRPO experiment report")
