"""The `<preset>@<target>` tables of configs/dpa_grpo.py and configs/kace.py: every entry parses into
its typed config through the config flag, and each override is one the plan's own records
(docs/results/plan.jsonl) show fitting the target's budget (`lm.plan.budget`), the sampler copies
the old records leave out added."""

import json
import pathlib
import re

import pytest
from absl import flags
from ml_collections import config_flags

from configs import dpa_grpo as dpa_configs
from configs import kace as kace_configs
from dpa_grpo import config as config_lib
from kace.config import KaceConfig
from lm import plan as plan_lib
from lm.config import ModelConfig

ROOT = pathlib.Path(__file__).parents[2]
GiB = 2**30


def _records() -> dict[tuple[str, str], dict]:
  """The newest plan record of each (preset file:size, target)."""
  out = {}
  for line in (ROOT / "docs/results/plan.jsonl").read_text().splitlines():
    if line.strip():
      r = json.loads(line)
      out[(r["preset"], r["target"])] = r
  return out


def _parsed(job: str, preset: str):
  argv = ["prog", f"--config={ROOT}/configs/{job}.py:{preset}"]
  holder = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=holder, lock_config=True, sys_argv=argv)
  holder(argv)
  return holder.config


@pytest.mark.parametrize("target", sorted(dpa_configs.TARGETS["qwen3_4b"]))
def test_dpa_target_presets_parse_and_fit_by_the_plans_own_figures(target):
  typed = config_lib.ExperimentConfig.from_dict(_parsed("dpa_grpo", f"qwen3_4b@{target}").to_dict())
  want = dpa_configs.TARGETS["qwen3_4b"][target]
  assert (
    typed.train.pairs_per_chunk == want["train.pairs_per_chunk"] and typed.loss.remat == want["loss.remat"]
  )
  record = _records()[("configs/dpa_grpo.py:qwen3_4b", target)]
  for key in ("mesh.data", "mesh.fsdp", "mesh.tp"):  # past one host: the mesh the plan compiled
    assert key not in want or want[key] == record["overrides"][key] == getattr(typed.mesh, key[5:])
  t = plan_lib.TARGETS[target]
  # GPUs train with cuDNN's attention (docs/results/2026-12-04-attention-choice.md), TPUs blockwise
  assert typed.model.attention_impl == ("cudnn" if t.platform == "cuda" else "blockwise")
  budget = plan_lib.budget(t) / GiB
  # The recorded accumulate peak at these pairs: the chosen program's, or a candidate's in `tried`.
  pairs = want["train.pairs_per_chunk"]
  if record["overrides"]["train.pairs_per_chunk"] == pairs:
    peak = next(p["peak"] for p in record["programs"] if p["name"] == "accumulate") / GiB
  else:
    (peak,) = [
      float(m) for tr in record["tried"] for m in re.findall(rf"full, {pairs} pairs: peak ([\d.]+) GiB", tr)
    ]
  m = ModelConfig.qwen3_4b()
  held = 2 * (m.vocab_size * m.hidden_size * 2 + (m.num_params * 2 / t.devices if t.devices > 1 else 0)) / GiB
  assert peak + held <= budget, (target, peak, held, budget)
  if "sampler.max_rows" in want:  # compiled at these rows and fitting
    assert (
      typed.sampler.max_rows == want["sampler.max_rows"] == record["overrides"].get("sampler.max_rows", 256)
    )
    sample = next(p for p in record["programs"] if p["name"] == "sample")
    assert (sample["peak"] / GiB + held + m.num_params * 2 / t.devices / GiB) <= budget
  else:
    assert ("qwen3_4b", target) in dpa_configs.UNPLANNED


def test_h100x1_carries_a_micro_batch_that_fits_one_h100():
  config = dpa_configs.get_config("qwen3_4b@h100x1")
  assert config.train.pairs_per_chunk == 8 < dpa_configs.get_config("qwen3_4b").train.pairs_per_chunk


@pytest.mark.parametrize("target", sorted(kace_configs.TARGETS["qwen3_4b"]))
def test_kace_target_presets_parse_and_fit_by_the_plans_own_figures(target):
  typed = KaceConfig.from_dict(_parsed("kace", f"qwen3_4b@{target}").to_dict())
  rows = kace_configs.TARGETS["qwen3_4b"][target]["roles.solver.sampler.max_rows"]
  assert typed.roles.solver.sampler["max_rows"] == rows
  record = _records()[("configs/kace.py:qwen3_4b", target)]
  for key, value in kace_configs.TARGETS["qwen3_4b"][target].items():  # the mesh the search chose
    assert not key.startswith("roles.solver.mesh.") or record["overrides"][key] == value
  if record["overrides"]["roles.solver.sampler.max_rows"] == rows:
    peak = record["programs"][0]["peak"] / GiB
  else:
    (peak,) = [
      float(m) for tr in record["tried"] for m in re.findall(rf"^{rows} rows: peak ([\d.]+) GiB", tr)
    ]
  assert peak <= plan_lib.budget(plan_lib.TARGETS[target]) / GiB, (target, peak)


def test_an_unknown_target_names_the_known_ones():
  with pytest.raises(ValueError, match="unknown target 'h100x9'.*h100x1"):
    dpa_configs.get_config("qwen3_4b@h100x9")
  with pytest.raises(ValueError, match="unknown target 'v6e-8'.*h100x1"):  # not planned yet
    kace_configs.get_config("qwen3_4b@v6e-8")
