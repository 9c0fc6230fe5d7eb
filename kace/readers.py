"""Scripted readers of testbed v3: programs, no model, each a fixed way of using the cards shown.

Why (issue 47, item 6): a testbed claim counts as tested only where a scripted stand-in could give
another verdict than the trained solver. These readers are registered, with their verdicts beside
each prediction, before any trained arm runs; a prediction counts as *tested* only where they
disagree (if every fixed reader gives the same verdict, the construction gives it, whatever a
trained model does). Every number they produce is labelled "scripted".

A reader answers one sample of one problem given the cards shown (kind word, rule), in order:

- **card use** (`policy`):
  - "first": the first shown card of its question's kind word, literally (v1/v2's scripted solver);
  - "scope": a perfect scope reader: the shown card of its kind word whose rule is the problem's own
    rule, if one is shown (an oracle of which card is in scope), else the first of its kind word;
  - "mix": a reader that mixes over conflicts: a shown card of its kind word drawn uniformly per
    sample, so conflicting cards split its samples;
  with no card of its kind word, every reader guesses a rule uniformly (seeded per sample).
- **arithmetic** (`large_error`): the share of samples whose base answer on a large-class problem is
  off by a small offset (small-class arithmetic is exact); 0 is exact arithmetic. The v3 solver is
  trained to have large-class arithmetic only partly learned, so the noisy readers stand for it.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from kace import testbed, testbed_v3

LABEL = "scripted"
POLICIES = ("first", "scope", "mix")
OFFSETS = (-3, -2, -1, 1, 2, 3)

Shown = Sequence[tuple[str, testbed.Convention]]  # (kind word, rule) of each card in the prompt


@dataclasses.dataclass(frozen=True)
class Ask:
  """`n` samples of one problem given the cards `shown`, drawn from `rng` (`Reader.answers`)."""

  problem: testbed_v3.Problem
  shown: Shown
  n: int
  rng: random.Random


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reader:
  """One scripted reader (module docstring): `policy` of card use and large-class arithmetic error."""

  name: str
  policy: str
  large_error: float

  def __post_init__(self):
    if self.policy not in POLICIES:
      raise ValueError(f"reader policy must be one of {POLICIES}, got {self.policy!r}")
    if not 0 <= self.large_error < 1:
      raise ValueError(f"reader large_error must be in [0, 1), got {self.large_error}")

  def rule(self, problem: testbed_v3.Problem, shown: Shown, rng: random.Random) -> testbed.Convention:
    """The rule this sample applies."""
    own = [rule for kind, rule in shown if kind == problem.kind]
    if not own:
      return rng.choice(testbed_v3.RULES)
    if self.policy == "first":
      return own[0]
    if self.policy == "mix":
      return rng.choice(own)
    gold = int(problem.problem.answer)
    return next((r for r in own if r.apply(problem.base) == gold), own[0])

  def answer(self, problem: testbed_v3.Problem, shown: Shown, rng: random.Random) -> str:
    """One sample's final answer."""
    rule = self.rule(problem, shown, rng)
    base = problem.base
    if problem.size == "large" and rng.random() < self.large_error:
      base += rng.choice(OFFSETS)
    return str(rule.apply(base))

  def answers(self, asks: Sequence[Ask]) -> list[list[str]]:
    """Each ask's samples, `answer` after `answer` from its rng, the asks in order (asks that share
    one rng draw from it in turn). A model reader (`kace.v3_reader`) answers every ask in one
    generator call."""
    return [[self.answer(a.problem, a.shown, a.rng) for _ in range(a.n)] for a in asks]


# The registered readers: the three the issue names, with arithmetic as the v3 solver is meant to
# have it (noisy on the large class), plus the scope reader with noisy arithmetic (what a perfectly
# trained v3 solver would be).
READERS = (
  Reader(name="first_card", policy="first", large_error=0.6),
  Reader(name="scope_exact", policy="scope", large_error=0.0),
  Reader(name="mix", policy="mix", large_error=0.6),
  Reader(name="scope_noisy", policy="scope", large_error=0.6),
)
