"""Tiered self-consistency: every voting rule, ties, samples without answers, call/token accounting."""

import dataclasses
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kace import tiers
from kace.tiers import ES, HS, MS, POOL, Decision, Request, Round, Sample, Schedule

same = lambda a, b: a == b


def rounds_of(*stages):
  """Rounds from (stage, answers) pairs; every sample costs 10 tokens."""
  return tuple(Round(stage, tuple(Sample(a, 10) for a in answers)) for stage, answers in stages)


PAPER = Schedule()


def decide(schedule=PAPER, equivalent=same, **stages):
  """Runs a problem whose stages return the given answers, checking each request on the way."""
  script = dict(stages)

  def draw(request):
    answers = script.pop(request.stage)
    assert len(answers) == request.n
    return [Sample(a, 10) for a in answers]

  decision, _ = tiers.run_problem(draw, schedule, equivalent)
  assert not script, f"stages never requested: {sorted(script)}"
  return decision


def test_requests_follow_the_paper_schedule():
  s = Schedule()
  assert tiers.next_step((), s, same) == Request(ES, 2, None)
  assert tiers.next_step(rounds_of((ES, "ab")), s, same) == Request(MS, 3, MS)
  assert tiers.next_step(rounds_of((ES, "ab"), (MS, "abc")), s, same) == Request(HS, 5, HS)


def test_es_exits_on_two_of_two():
  expected = Decision(exit_tier=ES, answer="7", votes=2, calls=2, samples=2, rounds=1, tokens=20)
  assert decide(ES=["7", "7"]) == expected


def test_ms_exits_on_two_of_three():
  d = decide(ES=["7", "8"], MS=["9", "8", "9"])
  assert (d.exit_tier, d.answer, d.votes, d.calls, d.tokens) == (MS, "9", 2, 5, 50)


def test_hs_exits_on_plurality_of_two():
  d = decide(ES=["1", "2"], MS=["3", "4", "5"], HS=["6", "7", "6", "8", "9"])
  assert (d.exit_tier, d.answer, d.votes, d.calls) == (HS, "6", 2, 10)


def test_hs_tie_continues_by_default_and_pool_reuses_the_ten_samples():
  # 2-2-1 at HS: no unique plurality, so the pool (the 10 samples drawn) decides by plurality.
  d = decide(ES=["a", "b"], MS=["c", "d", "e"], HS=["f", "g", "g", "f", "h"])
  assert (d.exit_tier, d.answer, d.votes, d.calls, d.rounds) == (POOL, "g", 2, 10, 3)


def test_hs_tie_earliest_exits_with_the_answer_that_reached_the_top_first():
  s = Schedule(tie="earliest")
  d = decide(s, ES=["a", "b"], MS=["c", "d", "e"], HS=["f", "g", "g", "f", "h"])
  assert (d.exit_tier, d.answer, d.votes) == (HS, "g", 2)  # g reached 2 votes at sample 3, f at 4


def test_pool_breaks_ties_in_favour_of_the_earliest_to_reach_the_top_count():
  d = decide(ES=["a", "b"], MS=["b", "c", "d"], HS=["a", "e", "f", "g", "h"])  # a: 0,5; b: 1,2
  assert (d.exit_tier, d.answer, d.votes) == (POOL, "b", 2)


def test_fresh_pool_draws_ten_more_samples_reading_hs_cards():
  s = Schedule(pool_reuse=False)
  rounds = rounds_of((ES, "ab"), (MS, "cde"), (HS, "fghij"))
  assert tiers.next_step(rounds, s, same) == Request(POOL, 10, HS)
  d = decide(s, ES="ab", MS="cde", HS="fghij", POOL=list("kkkllmnopq"))
  assert (d.exit_tier, d.answer, d.votes, d.calls, d.rounds, d.tokens) == (POOL, "k", 3, 20, 4, 200)


def test_pool_tops_up_when_earlier_samples_are_fewer_than_the_pool():
  s = Schedule(pool_size=12)
  assert tiers.next_step(rounds_of((ES, "ab"), (MS, "cde"), (HS, "fghij")), s, same) == Request(POOL, 2, HS)


def test_samples_without_answers_never_win():
  assert tiers.next_step(rounds_of((ES, [None, None])), Schedule(), same) == Request(MS, 3, MS)
  assert tiers.next_step(rounds_of((ES, [None, ""])), Schedule(), same) == Request(MS, 3, MS)
  d = decide(ES=[None, "x"], MS=[None, None, "y"], HS=[None, None, None, "z", "y"])
  assert (d.exit_tier, d.answer, d.votes) == (POOL, "y", 2)
  d = decide(ES=[None, None], MS=[None] * 3, HS=[None] * 5)
  assert (d.exit_tier, d.answer, d.votes, d.calls) == (POOL, None, 0, 10)


def test_tiers_are_locked_unless_carry_over():
  stages = dict(ES=["a", "b"], MS=["a", "c", "d"], HS=list("efghi"))
  assert decide(**stages).exit_tier == POOL
  d = decide(Schedule(carry_over=True), ES=["a", "b"], MS=["a", "c", "d"])
  assert (d.exit_tier, d.answer, d.votes) == (MS, "a", 2)


def test_strict_majority_pool_abstains_without_one():
  s = Schedule(pool_reuse=False, pool_vote="strict_majority")
  base = dict(ES="ab", MS="cde", HS="fghij")
  assert decide(s, **base, POOL=list("kkkkkllmno")).answer is None  # 5 of 10 is not more than half
  assert decide(s, **base, POOL=list("kkkkkklmno")).answer == "k"


def test_calls_can_count_rounds():
  d = decide(Schedule(calls="rounds"), ES=["1", "2"], MS=["3", "3", "4"])
  assert (d.calls, d.samples, d.rounds) == (2, 5, 2)


def test_best_of_n_is_one_fresh_pool_without_cards():
  s = Schedule.best_of_n(5)
  assert tiers.next_step((), s, same) == Request(POOL, 5, None)
  d = decide(s, POOL=["1", "2", "2", None, "3"])
  assert (d.exit_tier, d.answer, d.calls) == (POOL, "2", 5)


def test_votes_cluster_by_equivalence_not_string_equality():
  numeric = lambda a, b: Fraction(a) == Fraction(b)
  assert decide(ES=["1/2", "0.5"], equivalent=numeric).exit_tier == ES
  assert tiers.next_step(rounds_of((ES, ["1/2", "0.5"])), Schedule(), same) == Request(MS, 3, MS)
  assert tiers.cluster(["1/2", "3", "0.5", None, "6/12"], numeric) == [
    tiers.Cluster("1/2", (0, 2, 4)),
    tiers.Cluster("3", (1,)),
  ]


def test_votes_use_the_math_verify_grader(grader):
  d = decide(ES=[r"\frac{1}{2}", "0.5"], equivalent=grader.equivalent)
  assert (d.exit_tier, d.answer) == (ES, r"\frac{1}{2}")
  d = decide(ES=["[7, 47]", "(7, 47)"], MS=["1,234", "1234", "x"], equivalent=grader.equivalent)
  assert (d.exit_tier, d.answer) == (MS, "1,234")


def test_next_step_rejects_rounds_that_do_not_follow_the_schedule():
  with pytest.raises(ValueError, match="expected 2 samples at stage ES"):
    tiers.next_step(rounds_of((ES, "abc")), Schedule(), same)
  with pytest.raises(ValueError, match="stage MS"):
    tiers.next_step(rounds_of((ES, "ab"), (HS, "abc")), Schedule(), same)


@pytest.mark.parametrize(
  "fields, message",
  [
    (dict(tie="coin"), "Schedule.tie"),
    (dict(pool_vote="mean"), "Schedule.pool_vote"),
    (dict(calls="tokens"), "Schedule.calls"),
    (dict(tiers=(tiers.Tier(ES, 2, 3, False),)), r"tiers\[0\] \(ES\)"),
    (dict(tiers=(tiers.Tier(ES, 2, 2, False),) * 2), "distinct"),
    (dict(pool_size=0), "pool_size"),
  ],
)
def test_schedule_validation_names_the_field(fields, message):
  with pytest.raises(ValueError, match=message):
    Schedule(**fields)


def test_schedule_from_config():
  config = dict(tie="earliest", tiers=[dict(name="ES", samples=3, min_votes=3, reads_cards=False)])
  assert Schedule.from_config(config) == Schedule(tie="earliest", tiers=(tiers.Tier(ES, 3, 3, False),))
  with pytest.raises(ValueError, match="unknown schedule config keys"):
    Schedule.from_config(dict(ties="earliest"))


answers_st = st.lists(st.sampled_from(["1", "2", "3", None]), min_size=20, max_size=20)


@settings(max_examples=200, deadline=None)
@given(answers=answers_st, schedule=st.sampled_from([Schedule(), Schedule(tie="earliest", carry_over=True)]))
def test_decisions_are_consistent_with_the_samples(answers, schedule):
  supply = iter(answers)
  decision, rounds = tiers.run_problem(
    lambda r: [Sample(next(supply), 3) for _ in range(r.n)], schedule, same
  )
  drawn = [s.answer for r in rounds for s in r.samples]
  assert (
    decision.calls == decision.samples == len(drawn) == {ES: 2, MS: 5, HS: 10, POOL: 10}[decision.exit_tier]
  )
  assert decision.tokens == 3 * len(drawn)
  if decision.exit_tier != POOL:
    assert decision.votes >= 2 and decision.answer is not None
  assert (decision.answer is None) == all(a is None for a in drawn)
  if decision.answer is not None:
    assert drawn.count(decision.answer) >= decision.votes
  assert dataclasses.asdict(decision)["exit_tier"] == decision.exit_tier  # records serialise
