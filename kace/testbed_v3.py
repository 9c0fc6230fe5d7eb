"""Testbed v3's problems: one surface cue whose rule only the (tier, domain) block resolves.

Why (issue 47, items 1 and 7): in v1 and v2 a problem's level was tied to its kind word, so a
block's MS and HS cards were the same card and the difficulty axis could not matter. Here a problem
has a *hidden size class* ("small" or "large": its operands' magnitude, never named in its text or
in any card) and two families of kind words:

- **main** ("total"): the rule depends on the domain *and* the class: rule(d, small) != rule(d, large),
  and no two of the six (domain, class) rules are equal. A solver that does small-class arithmetic
  reliably and large-class arithmetic only partly (the v3 solver's design, item 2) agrees with itself
  on small problems and disagrees on large ones, so small problems tend to exit tiered
  self-consistency at MS and large ones at HS: the exit tier carries the class, and an MS card that
  helps small problems hurts a large problem that stops at MS. Whether it does depends on the solver
  (a reader with exact arithmetic exits every problem at MS), which is what lets the difficulty
  claims come out either way.
- **control** ("tally"): the rule depends on the domain only, the same for both classes, so the
  difficulty axis should make no difference (the registered no-effect control).

Splits, per build seed: train (teaching and acceptance halves, for ADD and REFINE), calibration
(gates and any k or threshold chosen) and test (touched only by the registered comparison).
Questions and cards use the keyed form of `kace.testbed` ("total: 23 + 41", card "addthree=total").
"""

from __future__ import annotations

import dataclasses
import functools
import random

from kace import data, testbed

DOMAINS = testbed.DOMAINS
CLASSES = ("small", "large")
FAMILIES = {"main": "total", "control": "tally"}  # family -> its kind word, shared by every domain
SPLITS = ("teach", "accept", "calibration", "test")
# Operand ranges per (domain, class): small ones are the v1/v2 testbed's (learned almost always by
# the tiny solvers); large ones are two- and three-digit, where a tiny solver's arithmetic is only
# partly learned.
OPERANDS = {
  ("algebra", "small"): ((0, 9), (0, 9)),
  ("algebra", "large"): ((10, 49), (10, 49)),
  ("number_theory", "small"): ((1, 20), (2, 5)),
  ("number_theory", "large"): ((50, 199), (6, 12)),
  ("combinatorics", "small"): ((2, 9), (2, 6)),
  ("combinatorics", "large"): ((10, 30), (6, 9)),
}
# Rules are drawn from H without the identity (a card always changes the answer).
RULES = tuple(h for h in testbed.H if h.op != "id")


@dataclasses.dataclass(frozen=True)
class Problem:
  """A v3 problem: the `kace.data.Problem` the solver sees, and what the testbed hides from it."""

  problem: data.Problem
  family: str  # "main" or "control"
  size: str  # "small" or "large"
  base: int  # the base answer (the question's arithmetic, exact)
  split: str

  @property
  def id(self) -> str:
    return self.problem.id

  @property
  def domain(self) -> str:
    return self.problem.domain

  @property
  def kind(self) -> str:
    return FAMILIES[self.family]


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorldConfig:
  """One build's testbed: its rules (by `seed`) and its problems.

  Attributes:
    seed: the rules and the problems (one tree build per seed).
    per_split: problems per (domain, family, class) cell in each split of `SPLITS`.
  """

  seed: int = 0
  per_split: tuple[tuple[str, int], ...] = (("teach", 8), ("accept", 8), ("calibration", 6), ("test", 12))

  def __post_init__(self):
    if tuple(name for name, _ in self.per_split) != SPLITS or min(n for _, n in self.per_split) < 1:
      raise ValueError(f"WorldConfig.per_split must give >= 1 problems to each of {SPLITS}: {self.per_split}")

  def rules(self) -> dict[tuple[str, str, str], testbed.Convention]:
    """{(domain, family, size): rule}: the main family's six rules all distinct; the control
    family's rule the same for both sizes of a domain, and distinct across domains."""
    rng = random.Random(f"testbed-v3-rules-{self.seed}")
    drawn = rng.sample(RULES, 2 * len(DOMAINS) + len(DOMAINS))
    out = {}
    for i, domain in enumerate(DOMAINS):
      out[(domain, "main", "small")] = drawn[2 * i]
      out[(domain, "main", "large")] = drawn[2 * i + 1]
      for size in CLASSES:
        out[(domain, "control", size)] = drawn[2 * len(DOMAINS) + i]
    return out

  def problems(self) -> list[Problem]:
    """Every problem of every split, distinct questions, sorted by id (deterministic by seed)."""
    return list(_problems(self))

  def split(self, name: str) -> list[Problem]:
    if name not in SPLITS:
      raise ValueError(f"testbed v3 split must be one of {SPLITS}, got {name!r}")
    return [p for p in _problems(self) if p.split == name]


@functools.cache
def _problems(config: WorldConfig) -> tuple[Problem, ...]:
  """`WorldConfig.problems`, computed once per config."""
  rng = random.Random(f"testbed-v3-problems-{config.seed}")
  rules, total = config.rules(), sum(n for _, n in config.per_split)
  out = []
  for domain in DOMAINS:
    for family, kind in FAMILIES.items():
      for size in CLASSES:
        seen: dict[str, int] = {}
        (lo_a, hi_a), (lo_b, hi_b) = OPERANDS[(domain, size)]
        op = testbed.OP_OF_DOMAIN[domain]
        for _ in range(100 * total):
          if len(seen) == total:
            break
          a, b = rng.randint(lo_a, hi_a), rng.randint(lo_b, hi_b)
          seen.setdefault(testbed.question(kind, a, op, b, "keyed"), testbed.OPS[op](a, b))
        if len(seen) < total:
          raise ValueError(f"testbed v3: only {len(seen)} distinct questions for {(domain, family, size)}")
        items = list(seen.items())
        rng.shuffle(items)
        splits = [name for name, n in config.per_split for _ in range(n)]
        for n, ((q, base), split) in enumerate(zip(items, splits, strict=True)):
          rule = rules[(domain, family, size)]
          problem = data.Problem(
            id=f"v3/{domain}/{family}/{size}/{n}",
            question=q,
            answer=str(rule.apply(base)),
            source="testbed_v3",
            subject=testbed.SUBJECT[domain],
            domain=domain,
            level=2 if family == "main" else 3,
          )
          out.append(Problem(problem=problem, family=family, size=size, base=base, split=split))
  return tuple(sorted(out, key=lambda p: p.id))


def card(kind: str, rule: testbed.Convention) -> str:
  """A v3 card's text: the keyed form's ("addthree=total"), one token of a keyed solver."""
  return testbed.card_text(kind, rule, "keyed")
