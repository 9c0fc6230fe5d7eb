"""The config file and its typed form: presets, unknown keys, per-method baseline settings."""

import ast
import dataclasses
import os

import pytest

from configs import dpa_grpo as dpa_config
from configs import theory as theory_config
from dpa_grpo import config as config_lib
from dpa_grpo import game, losses, step
from dpa_grpo.envs import taxcalc
from dpa_grpo.theory_config import TheoryConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize(
  "preset, size, method",
  [
    ("cpu", "cpu", "dpa_grpo"),
    ("tiny", "tiny", "dpa_grpo"),
    ("cpu_grpo", "cpu", "grpo"),
    ("tiny_dapo", "tiny", "dapo"),
    ("qwen3_4b", "qwen3_4b", "dpa_grpo"),
    ("qwen3_8b_gspo", "qwen3_8b", "gspo"),
    ("qwen3_4b_zero_shot", "qwen3_4b", "zero_shot"),
    ("cpu_dpa_grpo", "cpu", "dpa_grpo"),
  ],
)
def test_presets_parse_and_type(preset, size, method):
  assert dpa_config.parse_preset(preset) == (size, method)
  c = config_lib.ExperimentConfig.from_dict(dpa_config.get_config(preset).to_dict())
  assert c.method == method
  assert (c.train.steps == 0) == (method == "zero_shot")
  assert c.model.preset == (size if size.startswith("qwen3") else "tiny_qwen3")


@pytest.mark.parametrize("preset", ["gpu", "cpu_ppo", "qwen3_4b_x", "qwen3", "cpu_"])
def test_unknown_preset_names_the_valid_ones(preset):
  valid = "presets: cpu, tiny, qwen3_4b, qwen3_8b, testbed, testbed_v2, testbed_v3, each also as <size>_<m"
  with pytest.raises(ValueError, match=valid):
    dpa_config.get_config(preset)


def test_config_files_import_only_ml_collections_and_the_standard_library():
  for name in ("dpa_grpo.py", "theory.py", "plan_targets.py"):  # configs.plan_targets: json and os
    tree = ast.parse(open(os.path.join(ROOT, "configs", name)).read())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    allowed = {"ml_collections", "dataclasses", "typing", "__future__", "json", "os", "configs"}
    assert imported <= allowed, (name, imported)


def test_cpu_config_types_to_the_values_of_the_file():
  c = config_lib.ExperimentConfig.from_dict(dpa_config.get_config("cpu").to_dict())
  assert c.rollout.lines == ("1a", "12", "16", "25d", "27", "34", "37") and c.rollout.compact_forms
  assert c.lora.rank == 8 and c.lora.targets == ("q", "k", "v", "o", "gate", "up", "down")
  assert c.optim.lr == 1e-3 and c.compare == ("grpo",) and c.warm_start.steps == 300
  assert c.data.synthetic == config_lib.SyntheticConfig(n=60, seed=0, difficulty=0)
  qwen = config_lib.ExperimentConfig.from_dict(dpa_config.get_config("qwen3_4b").to_dict())
  assert qwen.rollout.lines == taxcalc.LINE_IDS  # lines=() means every line
  assert c.to_dict()["baseline"]["grpo"] == {"beta": 0.04, "eps_low": 0.2, "eps_high": 0.2}


def test_unknown_keys_fail_with_their_name():
  values = dpa_config.get_config("tiny").to_dict()
  values["loss"]["betta"] = 0.1
  with pytest.raises(ValueError, match=r"config.loss: unknown key\(s\) \['betta'\]"):
    config_lib.ExperimentConfig.from_dict(values)
  values = dpa_config.get_config("tiny").to_dict()
  values["baseline"]["grpo"]["eps"] = 0.1
  with pytest.raises(ValueError, match=r"config.baseline.grpo: unknown key\(s\) \['eps'\]"):
    config_lib.ExperimentConfig.from_dict(values)
  with pytest.raises(ValueError, match="loss.kl"):
    config_lib.LossConfig(kl="k2")
  with pytest.raises(ValueError, match="method"):
    config_lib.ExperimentConfig(method="ppo")


def test_the_files_baseline_defaults_are_the_papers():
  c = config_lib.ExperimentConfig.from_dict(dpa_config.get_config("cpu").to_dict())
  for method in losses.BASELINES:
    paper = losses.BaselineConfig.paper(method)
    settings = c.baseline.method(method)
    assert (settings.beta, settings.eps_low, settings.eps_high) == (paper.beta, paper.eps_low, paper.eps_high)
    assert config_lib.BaselineConfig().method(method) == settings


@pytest.mark.parametrize("main", ["dpa_grpo", "grpo"])
def test_a_baseline_override_reaches_the_compared_method(main):
  d = dpa_config.get_config("cpu" if main == "dpa_grpo" else "cpu_grpo")
  d.baseline.grpo.beta = 0.1
  d.compare = ("grpo", "dapo")
  c = config_lib.ExperimentConfig.from_dict(d.to_dict())
  for method, beta in (("grpo", 0.1), ("dapo", 0.0)):
    run = c.for_method(method, checkpoint="/ckpt")
    assert run.method == method and run.model.checkpoint == "/ckpt"
    cfg = step.loss_configs(method, run.loss, run.baseline, max_new_tokens=24)["generator"]
    assert cfg.method == method and cfg.beta == beta
  assert step.loss_configs("dpa_grpo", c.loss, c.baseline, max_new_tokens=24)["verifier"].beta == c.loss.beta
  assert c.for_method("zero_shot").train.steps == 0


def test_losses_are_chosen_by_name():
  assert losses.loss_fn("dpa_grpo") is losses.dpa_loss
  assert all(losses.loss_fn(m) is losses.baseline_loss for m in ("grpo", "dapo", "gspo"))
  with pytest.raises(ValueError, match="registered"):
    losses.loss_fn("ppo")
  assert set(losses.BASELINES) == {"grpo", "dapo", "gspo"}


def test_typed_config_is_frozen():
  c = config_lib.ExperimentConfig()
  with pytest.raises(dataclasses.FrozenInstanceError):
    c.loss.beta = 1.0  # type: ignore[misc]


def test_trained_roles_keep_the_game_order_that_seeds_their_adapters():
  assert config_lib.ExperimentConfig(method="dpa_grpo").roles == game.ROLES
  assert config_lib.ExperimentConfig(method="grpo").roles == ("generator",)


@pytest.mark.parametrize("preset", theory_config.PRESETS)
def test_theory_presets_type(preset):
  c = TheoryConfig.from_dict(theory_config.get_config(preset).to_dict())
  assert c.game.p_z_right == (0.3, 0.9) and c.loss.kl in ("k1", "k3", "exact")
  with pytest.raises(ValueError, match="valid presets: default, paper_theory, k3, smoke"):
    theory_config.get_config("fast")
  values = theory_config.get_config(preset).to_dict()
  values["ode"]["stpes"] = 1
  with pytest.raises(ValueError, match=r"config.ode: unknown key\(s\) \['stpes'\]"):
    TheoryConfig.from_dict(values)
