"""Testbed v3's arms and how they are solved: the light tree, the scripted-reader solver, the gates.

Why: the registration (docs/kace_v3.md) puts each scripted reader's verdict beside each prediction
before any trained arm runs. That needs every arm's tree as that reader would get it, at the budgets
registered for the trained arms, without a model. This module declares the arms (`ARMS`: blocks,
ADD's acceptance, REFINE's variant, inference), solves a problem under a tree with a scripted reader
or the trained v3 solver (`kace.v3_reader.ModelReader`) (`Solver`, voting with `kace.tiers` itself,
so the tiers, the exits and the pool are the real ones; `Solver.prefetch` draws many problems'
stages in one `reader.answers` call, one generator call for a model) and measures the gates;
`kace.v3_learn` builds each arm's tree with the programmatic teacher.
Samples are seeded by (build, reader, problem, stage) only, so two trees that show a problem the
same cards give it the same samples (common random numbers, as `kace.learn` relies on). Every number
is labelled "scripted reader, programmatic teacher" wherever it appears.

Budgets (equal in every arm; `Budget`): `teacher_calls` calls of the teacher in all (ADD's teacher,
ACE's reflector and curator, GEPA's reflection, REFINE's curator all count), `card_tokens` card
tokens in the whole tree (a keyed card is one token), split evenly over an arm's blocks, and at most
`shown_failures` failures shown per call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Mapping, Sequence

from kace import readers, testbed, testbed_v3, tiers

Card = tuple[str, testbed.Convention]  # (kind word, rule)
Block = tuple[str, str]  # (tier or "*", domain or "*")
UNIVERSAL: Block = ("universal", "universal")
READING = (tiers.MS, tiers.HS)


@dataclasses.dataclass(frozen=True)
class Layout:
  """Which axes split the tree: kace's (tier, domain) blocks, or the axes pooled."""

  by_tier: bool = True
  by_domain: bool = True

  def block(self, tier: str, domain: str) -> Block:
    return (tier if self.by_tier else "*", domain if self.by_domain else "*")

  def blocks(self) -> list[Block]:
    return sorted({self.block(t, d) for t in READING for d in testbed_v3.DOMAINS})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Budget:
  teacher_calls: int = 12
  card_tokens: int = 12
  shown_failures: int = 4
  refine_calls: int = 2  # of `teacher_calls`, the curator's in an arm with REFINE
  top_k: int = 2  # embedding retrieval's cards per stage


@dataclasses.dataclass(frozen=True, kw_only=True)
class Arm:
  """How an arm builds its cards and reads them.

  Attributes:
    builder: "none" (no cards), "add" (ADD, then REFINE when `refine`), "ace" (ACE's reflector and
      curator appending to a playbook) or "gepa" (GEPA's reflection mutating one prompt, a mutation
      kept when it raises validation accuracy).
    layout: the tree's blocks.
    accept: ADD's rule: "gain" (kept when acceptance accuracy rises by >= 1 problem) or "all".
    refine: None, "credit" (REFINE as registered), "shuffled" (credit permuted over the cards) or
      "no_rollback" (operations kept even when acceptance accuracy drops).
    cell_rule: which block a teaching failure is taught in (`kace.v3_learn.cell_tier`).
    inference: "tiered" (the block of the stage's tier), "playbook" (5 samples, plurality, every
      sample reading the whole playbook: ACE's and GEPA's own inference) or "top_k" (tiered, each
      stage reading the `Budget.top_k` cards nearest the question: kind word first).
    teacher: None (the run's teacher, `kace.v3_learn.run`) or a name in `kace.v3_learn.ARM_TEACHERS`
      ("programmatic": the labelled upper-bound arm).
    seed_name: the arm whose build randomness this one shares ("": its own name), so two arms that
      differ only in their teacher are shown the same failures while their trees agree.
  """

  name: str
  builder: str = "add"
  layout: Layout = Layout()
  accept: str = "gain"
  refine: str | None = "credit"
  inference: str = "tiered"
  cell_rule: str = "first_missing"
  teacher: str | None = None
  seed_name: str = ""


MONOLITHIC = Layout(by_tier=False, by_domain=False)
ARMS = (
  Arm(name="tiered", builder="none", refine=None),
  Arm(name="kace"),
  Arm(name="tiers_pooled", layout=Layout(by_tier=False)),
  Arm(name="domains_pooled", layout=Layout(by_domain=False)),
  Arm(name="monolithic", layout=MONOLITHIC),
  Arm(name="ace_playbook", builder="ace", layout=MONOLITHIC, refine=None, inference="playbook"),
  Arm(name="gepa", builder="gepa", layout=MONOLITHIC, refine=None, inference="playbook"),
  Arm(name="embedding_top_k", layout=MONOLITHIC, inference="top_k"),
  Arm(name="add_accept_all", accept="all"),
  Arm(name="add_no_refine", refine=None),
  Arm(name="refine_shuffled_credit", refine="shuffled"),
  Arm(name="refine_no_rollback", refine="no_rollback"),
  # exploratory, in no prediction: kace with the paper's cell rule (`kace.v3_learn.cell_tier`), to
  # show why v3 registers "first_missing"
  Arm(name="kace_exit_cells", cell_rule="exit"),
)
ARM_NAMES = tuple(a.name for a in ARMS)
# The trained arms' list (docs/kace_v3.md, section 4, "Teacher"): every arm of `ARMS` with the run's
# teacher (the learned one), and one extra arm in no registered prediction, labelled upper bound:
# kace with the programmatic ("oracle") teacher, built with kace's randomness. Kept out of `ARMS` so
# the scripted readers' registered run is unchanged.
ORACLE_TEACHER_ARM = Arm(name="kace_oracle_teacher", teacher="programmatic", seed_name="kace")
TRAINED_ARMS = (*ARMS, ORACLE_TEACHER_ARM)
PLAYBOOK_SCHEDULE = tiers.Schedule(tiers=(), pool_size=5, pool_reuse=False, pool_reads=tiers.HS)


class Tree:
  """Cards per block (an ordered list each) and the universal cards; a light stand-in for
  `kace.cards.EpistemicTree` (one token a card)."""

  def __init__(self, layout: Layout, capacity: int, blocks: Mapping[Block, Sequence[Card]] | None = None):
    self.layout, self.capacity = layout, capacity
    given = blocks or {}
    self.blocks: dict[Block, tuple[Card, ...]] = {b: tuple(given.get(b, ())) for b in layout.blocks()}
    self.blocks[UNIVERSAL] = tuple(given.get(UNIVERSAL, ()))

  def with_cards(self, block: Block, cards: Sequence[Card]) -> Tree:
    if len(cards) > self.capacity:
      raise ValueError(f"block {block} holds at most {self.capacity} cards, got {len(cards)}")
    return Tree(self.layout, self.capacity, {**self.blocks, block: tuple(cards)})

  def shown(self, tier: str | None, domain: str) -> tuple[Card, ...]:
    if tier is None:
      return ()
    return self.blocks[self.layout.block(tier, domain)] + self.blocks[UNIVERSAL]

  def cards(self) -> list[tuple[Block, int, Card]]:
    return [(b, i, c) for b, cards in sorted(self.blocks.items()) for i, c in enumerate(cards)]

  def size(self) -> int:
    return sum(len(c) for c in self.blocks.values())


def _reads(stage: str, schedule: tiers.Schedule) -> str | None:
  """The block tier a stage's prompt reads (None: no cards)."""
  if stage == tiers.POOL:
    return schedule.pool_reads
  return next((t.name for t in schedule.tiers if t.name == stage and t.reads_cards), None)


def seed_of(*parts) -> int:
  """A 64-bit seed from `parts` (build, reader, problem, stage...): the common random numbers."""
  return int(hashlib.sha256("\n".join(map(str, parts)).encode()).hexdigest()[:16], 16)


@dataclasses.dataclass(frozen=True)
class Outcome:
  correct: bool
  exit_tier: str
  calls: int
  reading: tuple[str, ...]  # the card-reading tiers its stages read, in order (POOL reads HS)


class Solver:
  """One reader on one build: solves problems under a tree with an arm's inference, memoised on the
  cards each stage shows (with common random numbers the cards shown decide the outcome).

  A stage's samples are seeded by (build, reader, problem, stage) and kept per (problem, stage, cards
  shown), so two trees that show a stage the same cards reuse its samples. `prefetch` draws, for
  every problem not yet solved under a tree, the samples of every stage it could reach, in one
  `reader.answers` call (one generator call for a model reader, `kace.v3_reader`); `correct`
  prefetches first. A scripted reader's samples are the same whether prefetched or drawn one stage
  at a time (each stage has its own rng)."""

  def __init__(self, reader: readers.Reader, build: int, budget: Budget):
    self.reader, self.build, self.budget = reader, build, budget
    self._cache: dict = {}
    self._samples: dict = {}

  def shown(self, tree: Tree | None, arm: Arm, tier: str | None, problem: testbed_v3.Problem) -> tuple:
    if tree is None or tier is None:
      return ()
    if arm.inference != "top_k":
      return tree.shown(tier, problem.domain)
    pool = [c for _, _, c in tree.cards()]
    ranked = sorted(range(len(pool)), key=lambda i: (pool[i][0] != problem.kind, i))
    return tuple(pool[i] for i in ranked[: self.budget.top_k])

  @staticmethod
  def schedule(arm: Arm) -> tiers.Schedule:
    return PLAYBOOK_SCHEDULE if arm.inference == "playbook" else tiers.Schedule()

  def _key(self, tree: Tree | None, arm: Arm, problem: testbed_v3.Problem) -> tuple:
    stages = (*READING, None) if arm.inference != "playbook" else (tiers.HS,)
    return (problem.id, arm.inference, tuple(self.shown(tree, arm, t, problem) for t in stages))

  def _ask(self, tree, arm: Arm, problem: testbed_v3.Problem, request: tiers.Request) -> tuple:
    """(sample key, `readers.Ask`) of one stage's request."""
    shown = self.shown(tree, arm, request.cards_tier, problem)
    rng = random.Random(seed_of(self.build, self.reader.name, problem.id, request.stage))
    return (problem.id, request.stage, request.n, shown), readers.Ask(problem, shown, request.n, rng)

  def prefetch(self, tree: Tree | None, arm: Arm, problems: Sequence[testbed_v3.Problem]) -> None:
    """Draws, in one `reader.answers` call, every stage's samples that solving `problems` under
    `tree` could need and that are not drawn yet."""
    schedule, todo = self.schedule(arm), {}
    for p in problems:
      if self._key(tree, arm, p) in self._cache:
        continue
      for request in _requests(schedule):
        key, ask = self._ask(tree, arm, p, request)
        if key not in self._samples:
          todo.setdefault(key, ask)
    if todo:
      for key, answers in zip(todo, self.reader.answers(list(todo.values())), strict=True):
        self._samples[key] = tuple(answers)

  def solve(self, tree: Tree | None, arm: Arm, problem: testbed_v3.Problem) -> Outcome:
    schedule, key = self.schedule(arm), self._key(tree, arm, problem)
    if key not in self._cache:

      def draw(request: tiers.Request) -> list[tiers.Sample]:
        sample_key, ask = self._ask(tree, arm, problem, request)
        if sample_key not in self._samples:
          self._samples[sample_key] = tuple(self.reader.answers([ask])[0])
        return [tiers.Sample(a) for a in self._samples[sample_key]]

      decision, rounds = tiers.run_problem(draw, schedule, str.__eq__)
      right = decision.answer == problem.problem.answer
      reading = tuple(dict.fromkeys(t for t in (_reads(r.stage, schedule) for r in rounds) if t))
      self._cache[key] = Outcome(right, decision.exit_tier, decision.calls, reading)
    return self._cache[key]

  def correct(self, tree: Tree | None, arm: Arm, problems: Sequence[testbed_v3.Problem]) -> int:
    self.prefetch(tree, arm, problems)
    return sum(self.solve(tree, arm, p).correct for p in problems)


def _requests(schedule: tiers.Schedule) -> list[tiers.Request]:
  """Every request `schedule` can make of a problem (each tier's, then the pool's fresh samples)."""
  out = [tiers.Request(t.name, t.samples, t.name if t.reads_cards else None) for t in schedule.tiers]
  drawn = sum(t.samples for t in schedule.tiers)
  fresh = max(0, schedule.pool_size - drawn) if schedule.pool_reuse else schedule.pool_size
  return out + ([tiers.Request(tiers.POOL, fresh, schedule.pool_reads)] if fresh else [])


# The gates a v3 solver must pass on the calibration split before any arm runs (docs/kace_v3.md):
# name -> (statistic, op, bound). None selects a literal card reader: conflicting cards are measured,
# not gated.
GATES = {
  "small_true_card": (">=", 0.8),  # small class, the true card alone: per-sample solve rate
  "no_card": ("<=", 0.3),  # no card: per-sample solve rate
  "large_true_card": ("between", (0.25, 0.75)),  # large class, true card alone: partly learned
  "exit_separation": (">=", 0.3),  # share exiting after MS, large minus small, under the true tree
}


def true_tree(world: testbed_v3.WorldConfig) -> Tree:
  """The tree the testbed is built to reward: each domain's MS block holds its small-class rules,
  its HS block its large-class rules (both families)."""
  rules, blocks = world.rules(), {}
  for d in testbed_v3.DOMAINS:
    for tier, size in ((tiers.MS, "small"), (tiers.HS, "large")):
      blocks[(tier, d)] = [(kind, rules[(d, family, size)]) for family, kind in testbed_v3.FAMILIES.items()]
  return Tree(Layout(), 2, blocks)


def gates(solver: Solver, world: testbed_v3.WorldConfig, samples: int = 8) -> dict:
  """`GATES` measured for `solver`'s reader on the calibration split: {"rates": ..., "passed": ...}.
  The card-rate samples are drawn in one `reader.answers` call, from one rng in a fixed order; the
  true tree's problems in one `Solver.prefetch`."""
  rules, part = world.rules(), world.split("calibration")
  rng = random.Random(seed_of("gates", world.seed, solver.reader.name))
  small = [p for p in part if p.size == "small"]
  large = [p for p in part if p.size == "large"]
  conditions = {"small_true_card": (small, True), "no_card": (part, False), "large_true_card": (large, True)}
  asks, rows = [], []
  for name, (problems, with_card) in conditions.items():
    for p in problems:
      shown = [(p.kind, rules[(p.domain, p.family, p.size)])] if with_card else []
      asks.append(readers.Ask(p, shown, samples, rng))
      rows.append(name)
  right = dict.fromkeys(conditions, 0)
  for name, ask, answers in zip(rows, asks, solver.reader.answers(asks), strict=True):
    right[name] += sum(a == ask.problem.problem.answer for a in answers)
  rates = {name: right[name] / (samples * len(problems)) for name, (problems, _) in conditions.items()}
  tree, arm = true_tree(world), Arm(name="true_tree")
  solver.prefetch(tree, arm, part)
  late = lambda ps: sum(solver.solve(tree, arm, p).exit_tier in (tiers.HS, tiers.POOL) for p in ps) / len(ps)
  rates["exit_separation"] = late(large) - late(small)
  return judge_gates(rates)


def judge_gates(rates: Mapping[str, float]) -> dict:
  """`GATES` applied to measured `rates`: {"rates", "passed", "all_passed"} (one build's, or the
  mean over builds: `pooled_gates`)."""
  passed = {}
  for name, (op, bound) in GATES.items():
    x = rates[name]
    passed[name] = bound[0] <= x <= bound[1] if op == "between" else x >= bound if op == ">=" else x <= bound
  return {"rates": dict(rates), "passed": passed, "all_passed": all(passed.values())}


def pooled_gates(per_build: Sequence[Mapping]) -> dict:
  """The gates on every build's calibration split together: each rate the mean over builds (every
  build has the same calibration problems per cell, so the mean is the pooled share). The reading of
  section 3 that `kace.v3_run` applies (docs/kace_v3.md, section 9)."""
  names = per_build[0]["rates"]
  return judge_gates({n: sum(g["rates"][n] for g in per_build) / len(per_build) for n in names})
