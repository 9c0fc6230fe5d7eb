"""The `<preset>@<target>` tables of configs/dpa_grpo.py and configs/kace.py, which read
configs/plan_targets.json: that file is what `launch.plan --render` writes from the plan's own
records (docs/results/plan.jsonl), every entry parses into its typed config through the config flag
with the values the plan chose, and every program of a fitting plan is within its budget
(`lm.plan.budget`) by the record's figures."""

import functools
import json
import pathlib

import pytest
from absl import flags
from ml_collections import config_flags

from configs import dpa_grpo as dpa_configs
from configs import kace as kace_configs
from configs import plan_targets
from dpa_grpo import config as config_lib
from kace.config import KaceConfig
from launch import plan_records
from lm import plan as plan_lib

ROOT = pathlib.Path(__file__).parents[2]
GiB = 2**30
JOBS = {"dpa_grpo": dpa_configs, "kace": kace_configs}


@functools.cache
def _records() -> tuple[dict, ...]:
  lines = (ROOT / "docs/results/plan.jsonl").read_text().splitlines()
  return tuple(json.loads(line) for line in lines if line.strip())


def _newest() -> dict[tuple[str, str], dict]:
  return {(r["preset"], r["target"]): r for r in _records()}


def _parsed(job: str, preset: str):
  argv = ["prog", f"--config={ROOT}/configs/{job}.py:{preset}"]
  holder = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=holder, lock_config=True, sys_argv=argv)
  holder(argv)
  return holder.config


def _get(config: dict, dotted: str):
  for part in dotted.split("."):
    config = config[part]
  return config


def test_the_targets_file_is_what_the_plan_renders_from_its_records():
  """Written by `launch.plan --render`, never by hand: rendered again from the records, it is equal."""
  assert json.loads(pathlib.Path(plan_targets.PATH).read_text()) == plan_records.targets_table(
    list(_records())
  )


_ENTRIES = [(job, target) for job, module in JOBS.items() for target in sorted(module.TARGETS["qwen3_4b"])]


@pytest.mark.parametrize(("job", "target"), _ENTRIES)
def test_each_target_preset_parses_with_the_plans_values_and_fits_by_its_figures(job, target):
  parsed = _parsed(job, f"qwen3_4b@{target}")
  typed = (config_lib.ExperimentConfig if job == "dpa_grpo" else KaceConfig).from_dict(parsed.to_dict())
  assert typed is not None
  record = _newest()[(f"configs/{job}.py:qwen3_4b", target)]
  entry = plan_targets.planned(f"configs/{job}.py:qwen3_4b")[target]
  for key, value in entry["overrides"].items():
    assert _get(parsed.to_dict(), key) == value == record["overrides"][key], key
  budget = plan_lib.record_budget(record) * GiB
  if job == "dpa_grpo":  # GPUs train with cuDNN's attention (docs/results/2026-12-04-attention-choice.md)
    assert typed.model.attention_impl == ("cudnn" if record["platform"] == "cuda" else "blockwise")
  judged = record["programs"] if entry["fits"] else [p for p in record["programs"] if p["name"] == "sample"]
  assert judged and all(p["peak"] <= budget for p in judged), (
    target,
    [(p["name"], p["peak"]) for p in judged],
  )


def test_a_target_that_does_not_fit_says_why_and_is_not_a_preset():
  for target, entry in plan_targets.planned("configs/dpa_grpo.py:qwen3_4b").items():
    if not entry["fits"]:
      assert target not in dpa_configs.TARGETS["qwen3_4b"] and dpa_configs.UNPLANNED[("qwen3_4b", target)]


def test_h100x1_carries_a_micro_batch_that_fits_one_h100():
  config = dpa_configs.get_config("qwen3_4b@h100x1")
  assert config.train.pairs_per_chunk < dpa_configs.get_config("qwen3_4b").train.pairs_per_chunk


def test_an_unknown_target_names_the_known_ones():
  with pytest.raises(ValueError, match="unknown target 'h100x9'.*h100x1"):
    dpa_configs.get_config("qwen3_4b@h100x9")
  with pytest.raises(ValueError, match="unknown target 'h100x9'.*h100x1"):
    kace_configs.get_config("qwen3_4b@h100x9")
