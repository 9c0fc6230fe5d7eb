"""The batched solver: one generator call per stage, per-problem accounting equal to the schedule's,
cards in context recorded per stage, samples independent of the batch."""

import collections

import pytest

from kace import cards, data, projection, solve, synthetic, tiers
from lm import generators
from tests.kace.generator_helpers import CountingGenerator

PARAMS = generators.GenerationParams(max_tokens=8, temperature=1.0)


@pytest.fixture(scope="module")
def problems():
  return synthetic.generate(per_cell=1, seed=0)[:6]


def _expected_cost(schedule: tiers.Schedule, exit_tier: str) -> list[tuple[str, int]]:
  """The (stage, samples) a problem exiting at `exit_tier` must have drawn, from the schedule alone."""
  stages = []
  for tier in schedule.tiers:
    stages.append((tier.name, tier.samples))
    if tier.name == exit_tier:
      return stages
  drawn = sum(n for _, n in stages)
  fresh = max(0, schedule.pool_size - drawn) if schedule.pool_reuse else schedule.pool_size
  return stages + ([(tiers.POOL, fresh)] if fresh else [])


@pytest.mark.parametrize(
  "schedule",
  [tiers.Schedule(), tiers.Schedule.best_of_n(5)],
  ids=["paper", "best_of_5"],
)
def test_each_stage_is_one_call_and_costs_follow_the_schedule(tiny_generator, grader, problems, schedule):
  counting = CountingGenerator(tiny_generator)
  domains = {p.id: p.domain for p in problems}
  sampler_calls = tiny_generator.sampler_calls
  solutions = solve.solve(
    problems, domains, generator=counting, grader=grader, schedule=schedule, params=PARAMS
  )
  assert [s.id for s in solutions] == [p.id for p in problems]
  # Calls: one per stage, holding every problem still open at that stage, each with the stage's n.
  open_at = collections.Counter(st.stage for s in solutions for st in s.stages)
  n_at = {st.stage: len(st.samples) for s in solutions for st in s.stages}
  assert counting.calls == [(open_at[stage], n_at[stage]) for stage in solve.STAGE_ORDER if stage in open_at]
  assert tiny_generator.sampler_calls - sampler_calls == len(counting.calls)  # one device call each
  for s in solutions:
    drawn = [(st.stage, len(st.samples)) for st in s.stages]
    assert drawn == _expected_cost(schedule, s.exit_tier)
    assert s.calls == s.num_samples == sum(n for _, n in drawn)
    assert s.rounds == len(drawn)
    assert s.completion_tokens == sum(x.completion_tokens for st in s.stages for x in st.samples)
    assert s.prompt_tokens == sum(st.prompt_tokens * len(st.samples) for st in s.stages) > 0
    assert all(x.answer is None or x.answer.strip() for st in s.stages for x in st.samples)


def test_cards_in_context_are_recorded_per_stage_and_samples_do_not_depend_on_the_batch(
  tiny_generator, grader, problems
):
  tree = synthetic.demo_tree()
  domains = {p.id: p.domain for p in problems}
  # pool_size 15 forces fresh pool samples for problems that reach the pool (they read HS cards).
  schedule = tiers.Schedule(pool_size=15)
  kwargs = dict(generator=tiny_generator, grader=grader, schedule=schedule, params=PARAMS, seed=3)
  batched = solve.solve(problems, domains, context=projection.TreeContext(tree), **kwargs)
  for p, s in zip(problems, batched, strict=True):
    for st in s.stages:
      expected = () if st.cards_tier is None else projection.project(tree, st.cards_tier, p.domain).card_ids
      assert st.cards == expected
      assert st.cards_tier == {"ES": None, "MS": "MS", "HS": "HS", "POOL": "HS"}[st.stage]
    assert all(tree.card(c) for st in s.stages for c in st.cards)
  alone = solve.solve(problems[2:3], domains, context=projection.TreeContext(tree), **kwargs)
  assert alone[0] == batched[2]
  unseeded = solve.solve(
    problems[2:3], domains, context=projection.TreeContext(tree), **{**kwargs, "seed": 4}
  )
  assert [x.text for st in unseeded[0].stages for x in st.samples] != [
    x.text for st in alone[0].stages for x in st.samples
  ]


def test_solve_rates_are_one_call_of_k_samples(tiny_generator, grader, problems):
  counting = CountingGenerator(tiny_generator)
  rates = solve.solve_rates(problems, generator=counting, grader=grader, k=4, params=PARAMS)
  assert counting.calls == [(len(problems), 4)]
  assert [r.id for r in rates] == [p.id for p in problems]
  assert all(r.k == 4 and len(r.answers) == 4 and 0 <= r.correct <= 4 for r in rates)


def test_demo_tree_cards_are_valid():
  tree = synthetic.demo_tree()
  assert not tree.over_budget() and len(tree.universal()) == 1
  assert all(projection.project(tree, t, d).cards for t in ("MS", "HS") for d in ("algebra", "combinatorics"))
  assert cards.EpistemicTree.from_json(tree.to_json()) == tree


class _CutOff:
  """A scripted solver (a stand-in, not a model): every sample is a chain of thought cut off by
  max_tokens that ends on the gold answer's number, as a real 38,912-token budget can leave it."""

  def generate(self, prompts, n=1, params=None):
    text = "Let me think. Trying k = 3 gives 9 * 22 + 6 = 204"
    return [[generators.Generation(text, None, None, "length", 10, 38912)] * n for _ in prompts]


def test_truncated_samples_are_unanswered_and_their_finish_reason_is_recorded(grader):
  problem = data.Problem(
    id="aime2025-1", question="Find k.", answer="204", source="aime2025", domain="algebra"
  )
  [solution] = solve.solve(
    [problem], {problem.id: "algebra"}, generator=_CutOff(), grader=grader, schedule=tiers.Schedule(),
    params=generators.GenerationParams(max_tokens=38912),
  )  # fmt: skip
  samples = [s for st in solution.stages for s in st.samples]
  assert len(samples) == 10 and solution.exit_tier == tiers.POOL  # no answer ever exits a tier
  assert all(s.finish_reason == "length" and s.answer is None and not s.correct for s in samples)
  assert solution.answer is None and not solution.correct
