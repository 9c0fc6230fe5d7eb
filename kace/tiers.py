"""Tiered ("tier-locked") self-consistency as pure functions over sampled answers.

A problem climbs tiers ES → MS → HS. Each tier draws its own samples (MS and HS with that tier's
cards in the prompt) and exits when its vote is decisive; the tier where a problem exits is its
empirical difficulty. If no tier exits, a fallback pool decides. Everything here is a pure function
of the answers drawn so far, so a batched solver drives many problems at once:

    rounds = {pid: () for pid in problems}
    while open problems remain:
      step = next_step(rounds[pid], schedule, equivalent)   # Request or Decision, per problem
      ... one generator call for all problems whose Request is for the same stage ...
      rounds[pid] += (Round(stage, samples),)

The schedule's defaults are the paper's; every choice the paper leaves open is a field of
`Schedule`, documented in docs/kace.md ("Tiered self-consistency").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

ES, MS, HS = "ES", "MS", "HS"
POOL = "POOL"  # the stage name of the fallback pool, and the exit tier of problems it decides

Equivalent = Callable[[str, str], bool]


@dataclasses.dataclass(frozen=True)
class Tier:
  """One rung: draw `samples`, exit when the largest answer cluster has at least `min_votes`.

  `reads_cards`: whether its prompt carries the (tier, domain) block of the tree (ES does not).
  """

  name: str
  samples: int
  min_votes: int
  reads_cards: bool


PAPER_TIERS = (Tier(ES, 2, 2, False), Tier(MS, 3, 2, True), Tier(HS, 5, 2, True))


@dataclasses.dataclass(frozen=True)
class Schedule:
  """The tier ladder and the rules the paper leaves open (defaults: the reading in docs/kace.md).

  Attributes:
    tiers: the rungs, in order.
    carry_over: whether a tier votes over the samples of all tiers so far (True) or only its own
      (False, default: "tier-locked" — MS exits on 2 of its 3 samples, as the paper states).
    tie: when two clusters share the top count at a tier (2-2-1 at HS): "continue" (default — a
      plurality must be unique, so no exit) or "earliest" (exit with the cluster that reached the
      top count first).
    pool_size: size of the fallback pool.
    pool_reuse: whether the pool starts from every sample already drawn (default True: ES + MS +
      HS = 2 + 3 + 5 is exactly the pool of 10, costing no new calls) and is topped up with fresh
      samples to `pool_size`; False draws `pool_size` fresh samples.
    pool_reads: the block tier fresh pool samples read (default HS; None = no cards).
    pool_vote: "plurality" (default: the largest cluster, ties to the one that got there first) or
      "strict_majority" (more than half of the pool's samples, else no answer).
    calls: what `Decision.calls` counts: "samples" (default: every sampled completion is one solver
      call, the unit of the paper's compute budget and of Best-of-N) or "rounds" (batched
      generator requests this problem took part in).
  """

  tiers: tuple[Tier, ...] = PAPER_TIERS
  carry_over: bool = False
  tie: Literal["continue", "earliest"] = "continue"
  pool_size: int = 10
  pool_reuse: bool = True
  pool_reads: str | None = HS
  pool_vote: Literal["plurality", "strict_majority"] = "plurality"
  calls: Literal["samples", "rounds"] = "samples"

  def __post_init__(self):
    choices = {"tie": ("continue", "earliest"), "pool_vote": ("plurality", "strict_majority")}
    choices["calls"] = ("samples", "rounds")
    for name, allowed in choices.items():
      if getattr(self, name) not in allowed:
        raise ValueError(f"Schedule.{name} must be one of {allowed}, got {getattr(self, name)!r}")
    for i, t in enumerate(self.tiers):
      if t.samples < 1 or not 1 <= t.min_votes <= t.samples:
        raise ValueError(f"Schedule.tiers[{i}] ({t.name}): need 1 <= min_votes <= samples, got {t}")
    if len({t.name for t in self.tiers} | {POOL}) != len(self.tiers) + 1:
      raise ValueError(f"Schedule.tiers: names must be distinct and not {POOL!r}")
    if self.pool_size < 1:
      raise ValueError(f"Schedule.pool_size must be >= 1, got {self.pool_size}")

  @classmethod
  def best_of_n(cls, n: int = 5) -> Schedule:
    """Plain self-consistency: no tiers, n fresh samples without cards, plurality vote."""
    return cls(tiers=(), pool_size=n, pool_reuse=False, pool_reads=None)

  @classmethod
  def from_config(cls, config: Mapping[str, Any]) -> Schedule:
    """Builds a schedule from a config mapping (e.g. `ConfigDict.to_dict()`); tiers as dicts."""
    fields = dict(config)
    if "tiers" in fields:
      fields["tiers"] = tuple(Tier(**dict(t)) for t in fields["tiers"])
    unknown = set(fields) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ValueError(f"unknown schedule config keys: {sorted(unknown)}")
    return cls(**fields)


@dataclasses.dataclass(frozen=True)
class Cluster:
  """Answers judged equivalent: `answer` is the first member's text, `members` are sample indices."""

  answer: str
  members: tuple[int, ...]


def cluster(answers: Sequence[str | None], equivalent: Equivalent) -> list[Cluster]:
  """Groups answers by mathematical equivalence, in order of first appearance.

  Each answer joins the first cluster whose first member it is equivalent to (equivalence need not
  be transitive, so comparing against one representative keeps the result order-defined). Samples
  without an answer (None or blank) join no cluster, so they can never win a vote.
  """
  clusters: list[tuple[str, list[int]]] = []
  for i, answer in enumerate(answers):
    if answer is None or not answer.strip():
      continue
    for representative, members in clusters:
      if equivalent(representative, answer):
        members.append(i)
        break
    else:
      clusters.append((answer, [i]))
  return [Cluster(a, tuple(m)) for a, m in clusters]


@dataclasses.dataclass(frozen=True)
class Vote:
  """The top cluster's answer and size; `tied` when another cluster has the same size."""

  answer: str | None
  votes: int
  tied: bool


def vote(answers: Sequence[str | None], equivalent: Equivalent) -> Vote:
  """Plurality vote over equivalence clusters; a tie goes to the cluster that reached the top count
  at the earliest sample (the answer that would have won had sampling stopped there)."""
  clusters = cluster(answers, equivalent)
  if not clusters:
    return Vote(None, 0, False)
  top = max(len(c.members) for c in clusters)
  leaders = [c for c in clusters if len(c.members) == top]
  winner = min(leaders, key=lambda c: c.members[top - 1])
  return Vote(winner.answer, top, len(leaders) > 1)


@dataclasses.dataclass(frozen=True)
class Sample:
  """One sampled completion, reduced to what voting and accounting need."""

  answer: str | None  # the extracted final answer; None when none could be extracted
  tokens: int = 0  # tokens this call cost, as the solver counts them (e.g. prompt + completion)


@dataclasses.dataclass(frozen=True)
class Round:
  """The samples one stage drew for one problem."""

  stage: str
  samples: tuple[Sample, ...]


@dataclasses.dataclass(frozen=True)
class Request:
  """What to draw next for a problem: `n` samples at `stage`, prompting with the cards of block
  (`cards_tier`, problem domain), or with no cards when `cards_tier` is None."""

  stage: str
  n: int
  cards_tier: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
  """A problem's outcome: exit tier (a tier name or POOL), answer (None: no answer) and cost."""

  exit_tier: str
  answer: str | None
  votes: int
  calls: int  # per Schedule.calls
  samples: int
  rounds: int
  tokens: int


def _decide(
  exit_tier: str, answer: str | None, votes: int, rounds: Sequence[Round], schedule: Schedule
) -> Decision:
  samples = sum(len(r.samples) for r in rounds)
  calls = samples if schedule.calls == "samples" else len(rounds)
  tokens = sum(s.tokens for r in rounds for s in r.samples)
  return Decision(
    exit_tier=exit_tier,
    answer=answer,
    votes=votes,
    calls=calls,
    samples=samples,
    rounds=len(rounds),
    tokens=tokens,
  )


def _answers(rounds: Sequence[Round]) -> list[str | None]:
  return [s.answer for r in rounds for s in r.samples]


def _check(round_: Round, stage: str, n: int) -> None:
  if round_.stage != stage or len(round_.samples) != n:
    raise ValueError(f"expected {n} samples at stage {stage}, got {len(round_.samples)} at {round_.stage}")


def next_step(rounds: Sequence[Round], schedule: Schedule, equivalent: Equivalent) -> Request | Decision:
  """The next thing to do for one problem given the rounds drawn so far (pure; replays the votes).

  Returns a `Request` while samples are needed, then the final `Decision`. Raises ValueError if
  `rounds` does not follow the schedule (wrong stage or sample count).
  """
  for i, tier in enumerate(schedule.tiers):
    if i == len(rounds):
      return Request(tier.name, tier.samples, tier.name if tier.reads_cards else None)
    _check(rounds[i], tier.name, tier.samples)
    v = vote(_answers(rounds[: i + 1] if schedule.carry_over else rounds[i : i + 1]), equivalent)
    if v.votes >= tier.min_votes and (not v.tied or schedule.tie == "earliest"):
      return _decide(tier.name, v.answer, v.votes, rounds[: i + 1], schedule)
  k = len(schedule.tiers)
  earlier = rounds[:k]
  drawn = sum(len(r.samples) for r in earlier)
  fresh = max(0, schedule.pool_size - drawn) if schedule.pool_reuse else schedule.pool_size
  if fresh and len(rounds) == k:
    return Request(POOL, fresh, schedule.pool_reads)
  if fresh:
    _check(rounds[k], POOL, fresh)
  pool = (list(earlier) if schedule.pool_reuse else []) + list(rounds[k : k + 1])
  answers = _answers(pool)
  v = vote(answers, equivalent)
  if schedule.pool_vote == "strict_majority" and 2 * v.votes <= len(answers):
    v = Vote(None, v.votes, v.tied)
  return _decide(POOL, v.answer, v.votes, rounds[: k + (1 if fresh else 0)], schedule)


def run_problem(
  draw: Callable[[Request], Sequence[Sample]], schedule: Schedule, equivalent: Equivalent
) -> tuple[Decision, tuple[Round, ...]]:
  """Solves one problem sequentially with `draw(request) -> samples` (tests, one-at-a-time baselines)."""
  rounds: tuple[Round, ...] = ()
  while isinstance(step := next_step(rounds, schedule, equivalent), Request):
    rounds += (Round(step.stage, tuple(draw(step))),)
  return step, rounds
