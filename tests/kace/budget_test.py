"""The dry run's counts (kace.budget) against the tier ladder itself (kace.tiers.run_problem)."""

import random

import numpy as np
import pytest

import configs.kace
from kace import budget, data, evaluate, tiers
from kace import config as config_lib


def _simulate(schedule: tiers.Schedule, p: float, problems: int, seed: int = 0):
  """Exit tiers and samples of `problems` problems solved by the real ladder, each sample right with
  probability p and every wrong answer distinct (the plan's assumption, drawn)."""
  rng = random.Random(seed)
  wrong = iter(range(10**9))
  draw = lambda request: [
    tiers.Sample("right" if rng.random() < p else f"wrong{next(wrong)}") for _ in range(request.n)
  ]
  return [tiers.run_problem(draw, schedule, lambda a, b: a == b)[0] for _ in range(problems)]


@pytest.mark.parametrize(
  "schedule",
  [tiers.Schedule(), tiers.Schedule(pool_reuse=False), tiers.Schedule(carry_over=True, tie="earliest")],
  ids=["paper", "fresh_pool", "carry_over"],
)
@pytest.mark.parametrize("p", [0.2, 0.6])
def test_exit_distribution_and_expected_samples_match_the_ladder(schedule, p):
  decisions = _simulate(schedule, p, 4000)
  exits = budget.exit_distribution(schedule, p)
  assert sum(exits.values()) == pytest.approx(1.0)
  for tier, prob in exits.items():
    assert np.mean([d.exit_tier == tier for d in decisions]) == pytest.approx(prob, abs=0.03)
  expected = sum(budget.expected_stage_samples(schedule, p).values())
  assert np.mean([d.samples for d in decisions]) == pytest.approx(expected, rel=0.03)
  # given the exit tier, the samples drawn are exact, and never more than the worst case
  worst = sum(budget.stage_samples(schedule).values())
  assert all(d.samples == budget.samples_given_exit(schedule, d.exit_tier) <= worst for d in decisions)


def test_worst_case_of_the_paper_ladder_is_ten_samples_with_pool_reuse_and_twenty_without():
  assert sum(budget.stage_samples(tiers.Schedule()).values()) == 10  # 2 + 3 + 5, the pool reuses them
  assert sum(budget.stage_samples(tiers.Schedule(pool_reuse=False)).values()) == 20


def test_plan_of_the_openai_preset_counts_every_method():
  c = config_lib.KaceConfig.from_dict(configs.kace.get_config("openai"))
  problems = [
    data.Problem(id=f"p{i}", question="Find x. " * 20, answer="1", source="aime2025") for i in range(30)
  ]
  plan = budget.plan(c, problems, train_problems=None)
  lines = {line["what"]: line for line in plan["lines"]}
  assert lines["classify domains"]["requests"] == 30  # AIME has no subject labels
  assert lines["solve rates"]["samples_worst"] == 30 * 10
  assert lines["method best_of_n"]["samples_worst"] == lines["method best_of_n"]["samples_expected"] == 150
  assert lines["method tiered"]["samples_worst"] == 300
  assert lines["method tiered"]["samples_expected"] == pytest.approx(30 * (2 + 0.75 * 3 + 0.375 * 5))
  assert plan["totals"]["completion_tokens_worst"] == 30 * 32 + (300 + 150 + 300 + 300 + 300) * 38912
  assert "cost_usd" not in plan and "hours" not in plan  # no price, no rate: no line
  text = budget.format_plan(plan)
  assert "no generation call" in text and "| total |" in text


def test_learning_on_another_benchmark_without_its_files_names_train_source(grader):
  c = config_lib.KaceConfig.from_dict(configs.kace.get_config("openai"))  # train_name="math", no source
  with pytest.raises(data.DataSourceError, match=r"config\.data\.train_source is empty"):
    evaluate.load_problems(c.data, c.generated(), grader, half="train")
