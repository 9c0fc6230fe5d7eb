"""configs/kace.py typed once (kace.config): every preset round-trips to the same resolved dict, an
unknown key or a bad value fails by name, and the defaults written out in the config files are the
library records' own."""

import dataclasses
import json
import subprocess
import sys

import pytest

import configs.generators
import configs.kace
import configs.serve
from kace import cards, learn, projection, synthetic
from kace import config as kace_config
from lm import generators


@pytest.mark.parametrize("preset", ["cpu", "qwen3_4b", "openai"])
def test_every_preset_types_and_round_trips_to_the_same_config_json(preset):
  raw = configs.kace.get_config(preset)
  typed = kace_config.KaceConfig.from_dict(raw)
  assert json.dumps(typed.to_dict()) == json.dumps(raw.to_dict())  # same keys, order and values
  assert kace_config.KaceConfig.from_dict(typed.to_dict()) == typed


def test_unknown_keys_and_bad_values_fail_naming_the_key():
  raw = configs.kace.get_config().to_dict()
  with pytest.raises(ValueError, match=r"config\.eval\.batchsize"):
    kace_config.KaceConfig.from_dict({**raw, "eval": {**raw["eval"], "batchsize": 3}})
  with pytest.raises(ValueError, match=r"config\.roles\.solver: .*'dtyp'"):
    solver = {**raw["roles"]["solver"], "dtyp": "float32"}
    kace_config.KaceConfig.from_dict({**raw, "roles": {**raw["roles"], "solver": solver}})
  with pytest.raises(ValueError, match=r"benchmarks\.math\.level"):
    kace_config.KaceConfig.from_dict({**raw, "benchmarks": {"math": {"level": 5}}})
  with pytest.raises(ValueError, match="data.name"):
    kace_config.KaceConfig.from_dict({**raw, "data": {**raw["data"], "name": "gsm8k"}})
  with pytest.raises(ValueError, match="temperature"):
    kace_config.KaceConfig.from_dict({**raw, "sampling": {**raw["sampling"], "temperature": -1.0}})


def test_a_benchmark_overrides_data_and_runs_the_table_methods():
  typed = kace_config.KaceConfig.from_dict(configs.kace.get_config())
  olym = typed.benchmark("olymmath")
  assert olym.data.name == "olymmath" and olym.data.verifiable_only and olym.data.test_fraction == 0.5
  assert olym.methods == typed.table.methods and olym.data.levels == typed.data.levels
  with pytest.raises(ValueError, match="not in config.benchmarks"):
    typed.benchmark("gsm8k")


def test_config_file_defaults_are_the_library_defaults():
  c = configs.kace.get_config("qwen3_4b")  # learn and synthetic at their defaults
  assert {k: c.learn[k] for k in learn.LearnConfig.__dataclass_fields__} == dataclasses.asdict(
    learn.LearnConfig()
  )
  tiny = dataclasses.asdict(synthetic.TinySolverConfig())
  assert {k: c.synthetic[k] for k in tiny} == tiny
  assert tuple(c.domains) == cards.DEFAULT_DOMAINS and c.prompt.solver == projection.SOLVER_TEMPLATE
  assert configs.generators.generator_config().to_dict() == generators.GeneratorConfig().to_dict()
  assert kace_config.KaceConfig().schedule.schedule() == kace_config.ScheduleConfig().schedule()
  fields = lambda cls: {f.name for f in dataclasses.fields(cls)}
  assert fields(learn.LearnConfig) < fields(kace_config.LearnSection)
  assert fields(synthetic.TinySolverConfig) < fields(kace_config.SyntheticConfig)
  typed = kace_config.KaceConfig.from_dict(c)  # the sections inherit the library records' fields
  assert typed.synthetic.key() == synthetic.TinySolverConfig().key()  # build_solver, cache_dir: not in it
  assert typed.learn.learn_config("reflection") == learn.LearnConfig(distill="reflection")
  with pytest.raises(ValueError, match="learn.accept_fraction"):  # the library record's own check
    kace_config.KaceConfig.from_dict({**c.to_dict(), "learn": {**c.learn.to_dict(), "accept_fraction": 1.5}})
  serve = configs.serve.get_config("tiny").model
  assert generators.GeneratorConfig.from_dict(serve).preset == "tiny_qwen3"


@pytest.mark.integration
def test_config_files_import_no_library_module():
  code = (
    "import sys, configs.kace, configs.serve; "
    "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'kace', 'lm', 'dpa_grpo'}))"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"


def test_generator_config_rejects_unknown_keys_and_kinds():
  with pytest.raises(ValueError, match="kind must be"):
    generators.GeneratorConfig(kind="vllm")
  with pytest.raises(ValueError, match="sampler key"):
    generators.GeneratorConfig(sampler=dict(max_row=3))
  with pytest.raises(ValueError, match="mesh key"):
    generators.GeneratorConfig.from_dict(dict(mesh=dict(dp=2)))
  config = generators.GeneratorConfig.from_dict(configs.generators.generator_config(checkpoint="/x"))
  assert config.checkpoint == "/x" and config.sampler_config().max_rows == 256


@pytest.mark.parametrize("preset", ["qwen3_4b", "openai"])
def test_real_model_presets_think_long_and_teach_with_a_separate_model(preset):
  typed = kace_config.KaceConfig.from_dict(configs.kace.get_config(preset))
  s = typed.sampling
  assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.enable_thinking) == (38912, 0.6, 0.95, 20, True)
  for role in ("teacher", "curator"):
    assert typed.roles.get(role) is not typed.roles.solver and typed.roles.get(role) != typed.roles.solver
  assert typed.role_sampling.enable_thinking and typed.learn.attempt_tokens == 6144
  assert typed.benchmark("aime2025").data.test_fraction == 0.0  # all 30 evaluated
  assert typed.benchmark("aime2025").data.train_name == "math"
