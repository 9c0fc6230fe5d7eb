"""configs/kace.py:testbed typed and round-tripped; its defaults are the library records' own; the
testbed's problems come through the same loader as every benchmark; the oracle roles replace the
teacher and curator only when the config says so."""

import dataclasses
import json

import pytest

import configs.kace
from kace import config as kace_config
from kace import evaluate, oracle, pipeline, synthetic, testbed


def test_testbed_preset_types_and_round_trips():
  raw = configs.kace.get_config("testbed")
  typed = kace_config.KaceConfig.from_dict(raw)
  assert json.dumps(typed.to_dict()) == json.dumps(raw.to_dict())
  assert kace_config.KaceConfig.from_dict(typed.to_dict()) == typed
  assert typed.data.name == "testbed" and typed.testbed.build_solver and not typed.synthetic.build_solver
  assert typed.testbed.oracle_teacher and typed.testbed.oracle_curator
  assert set(typed.methods) == set(typed.table.methods) and typed.table.benchmarks == ("testbed",)


def test_testbed_defaults_are_the_library_defaults():
  c = configs.kace.get_config("qwen3_4b")
  assert c.testbed.solver.to_dict() == dataclasses.asdict(synthetic.TestbedSolverConfig())
  section = kace_config.KaceConfig.from_dict(c).testbed
  assert section.testbed() == testbed.TestbedConfig()
  # the testbed's surface form is its solver's (the solver is trained on the questions and cards it reads)
  c.testbed.solver.form = "long"
  assert kace_config.KaceConfig.from_dict(c).testbed.testbed().form == "long"
  with pytest.raises(ValueError, match="control"):
    kace_config.KaceConfig.from_dict({**c.to_dict(), "testbed": {**c.testbed.to_dict(), "control": "x"}})
  with pytest.raises(ValueError, match="oracle_noise"):
    kace_config.KaceConfig.from_dict({**c.to_dict(), "testbed": {**c.testbed.to_dict(), "oracle_noise": 2.0}})
  for field, bad in (("workers", -1), ("seeds", (0, 0)), ("seeds", ())):
    with pytest.raises(ValueError, match=f"testbed.{field}"):
      kace_config.KaceConfig.from_dict({**c.to_dict(), "testbed": {**c.testbed.to_dict(), field: bad}})


def test_testbed_problems_load_like_a_benchmark(grader):
  typed = kace_config.KaceConfig.from_dict(configs.kace.get_config("testbed"))
  test = evaluate.load_problems(typed.data, typed.generated(), grader)
  train = evaluate.load_problems(typed.data, typed.generated(), grader, half="train")
  assert (train, test) == typed.testbed.testbed().problems()
  assert len(test) == 9 * typed.testbed.test_per_cell


def test_learner_plays_the_oracle_roles_only_when_configured(grader, tiny_checkpoint):
  raw = configs.kace.get_config("testbed")
  raw.roles.solver.checkpoint = tiny_checkpoint
  raw.testbed.oracle_noise = 0.25
  learner = pipeline.learner(kace_config.KaceConfig.from_dict(raw), grader, embedder=None)
  assert isinstance(learner.teacher, oracle.OracleTeacher) and learner.teacher.noise == 0.25
  assert learner.teacher.form == raw.testbed.solver.form == "keyed"
  assert isinstance(learner.curator, oracle.OracleCurator) and learner.teacher.label == oracle.LABEL
  raw.testbed.update(oracle_teacher=False, oracle_curator=False)
  learner = pipeline.learner(kace_config.KaceConfig.from_dict(raw), grader, embedder=None)
  assert not isinstance(learner.teacher, oracle.OracleTeacher)
  assert not isinstance(learner.curator, oracle.OracleCurator)
