"""Testbed v3's arms, built and solved in-process with a scripted reader and the programmatic teacher.

Why: the registration (docs/kace_v3.md) puts each scripted reader's verdict beside each prediction
before any trained arm runs. That needs every arm's tree as that reader would get it, at the budgets
registered for the trained arms, without a model: this module is that stand-in, labelled "scripted
reader, programmatic teacher" wherever its numbers appear. It follows `kace.learn`'s procedure
(teaching failures -> one teacher call per block -> each card kept by a test on the acceptance half;
REFINE's credit = right with a card - right without it on the teaching half, each curator operation
kept unless acceptance accuracy drops) on a light tree (`Tree`: block -> cards), and votes with
`kace.tiers` itself, so the tiers, the exits and the pool are the real ones. Samples are seeded by
(build, reader, problem, stage) only, so two trees that show a problem the same cards give it the
same samples (common random numbers, as `kace.learn` relies on).

Budgets (equal in every arm; `Budget`): `teacher_calls` calls of the teacher in all (ADD's teacher,
ACE's reflector and curator, GEPA's reflection, REFINE's curator all count), `card_tokens` card
tokens in the whole tree (a keyed card is one token), split evenly over an arm's blocks, and at most
`shown_failures` failures shown per call.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import random
from collections.abc import Callable, Mapping, Sequence

from kace import readers as readers_lib
from kace import testbed, testbed_v3, tiers

Card = tuple[str, testbed.Convention]  # (kind word, rule)
Block = tuple[str, str]  # (tier or "*", domain or "*")
UNIVERSAL: Block = ("universal", "universal")
READING = (tiers.MS, tiers.HS)
OPERATIONS = ("delete", "relocate", "demote", "edit", "merge")


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
    cell_rule: which block a teaching failure is taught in (`cell_tier`).
    inference: "tiered" (the block of the stage's tier), "playbook" (5 samples, plurality, every
      sample reading the whole playbook: ACE's and GEPA's own inference) or "top_k" (tiered, each
      stage reading the `Budget.top_k` cards nearest the question: kind word first).
  """

  name: str
  builder: str = "add"
  layout: Layout = Layout()
  accept: str = "gain"
  refine: str | None = "credit"
  inference: str = "tiered"
  cell_rule: str = "first_missing"


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
  # exploratory, in no prediction: kace with the paper's cell rule (`cell_tier`), to show why v3
  # registers "first_missing"
  Arm(name="kace_exit_cells", cell_rule="exit"),
)
ARM_NAMES = tuple(a.name for a in ARMS)
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


def _seed(*parts) -> int:
  return int(hashlib.sha256("\n".join(map(str, parts)).encode()).hexdigest()[:16], 16)


@dataclasses.dataclass(frozen=True)
class Outcome:
  correct: bool
  exit_tier: str
  calls: int
  reading: tuple[str, ...]  # the card-reading tiers its stages read, in order (POOL reads HS)


class Solver:
  """One reader on one build: solves problems under a tree with an arm's inference, memoised on the
  cards each stage shows (with common random numbers the cards shown decide the outcome)."""

  def __init__(self, reader: readers_lib.Reader, build: int, budget: Budget):
    self.reader, self.build, self.budget = reader, build, budget
    self._cache: dict = {}

  def shown(self, tree: Tree | None, arm: Arm, tier: str | None, problem: testbed_v3.Problem) -> tuple:
    if tree is None or tier is None:
      return ()
    if arm.inference != "top_k":
      return tree.shown(tier, problem.domain)
    pool = [c for _, _, c in tree.cards()]
    ranked = sorted(range(len(pool)), key=lambda i: (pool[i][0] != problem.kind, i))
    return tuple(pool[i] for i in ranked[: self.budget.top_k])

  def solve(self, tree: Tree | None, arm: Arm, problem: testbed_v3.Problem) -> Outcome:
    schedule = PLAYBOOK_SCHEDULE if arm.inference == "playbook" else tiers.Schedule()
    stages = (*READING, None) if arm.inference != "playbook" else (tiers.HS,)
    key = (problem.id, arm.inference, tuple(self.shown(tree, arm, t, problem) for t in stages))
    if key not in self._cache:

      def draw(request: tiers.Request) -> list[tiers.Sample]:
        rng = random.Random(_seed(self.build, self.reader.name, problem.id, request.stage))
        shown = self.shown(tree, arm, request.cards_tier, problem)
        return [tiers.Sample(self.reader.answer(problem, shown, rng)) for _ in range(request.n)]

      decision, rounds = tiers.run_problem(draw, schedule, str.__eq__)
      right = decision.answer == problem.problem.answer
      reading = tuple(dict.fromkeys(t for t in (_reads(r.stage, schedule) for r in rounds) if t))
      self._cache[key] = Outcome(right, decision.exit_tier, decision.calls, reading)
    return self._cache[key]

  def correct(self, tree: Tree | None, arm: Arm, problems: Sequence[testbed_v3.Problem]) -> int:
    return sum(self.solve(tree, arm, p).correct for p in problems)


def teacher(failures: Sequence[testbed_v3.Problem], shown_failures: int, rng: random.Random) -> list[Card]:
  """The programmatic teacher (oracle-like: it sees base answers exactly): shown at most
  `shown_failures` failed problems, it writes one card per kind word among them, the rule of
  `testbed_v3.RULES` that agrees with the most of their (base, gold) pairs."""
  shown = rng.sample(list(failures), min(shown_failures, len(failures)))
  out = []
  for kind in sorted({p.kind for p in shown}):
    pairs = [(p.base, int(p.problem.answer)) for p in shown if p.kind == kind]
    out.append((kind, testbed.fit(pairs, testbed_v3.RULES)[0]))
  return out


@dataclasses.dataclass
class Counts:
  """What a build did, per operation: counted per seed in the report."""

  teacher_calls: int = 0
  ops: dict[str, int] = dataclasses.field(default_factory=dict)

  def add(self, name: str, n: int = 1) -> None:
    self.ops[name] = self.ops.get(name, 0) + n


CELL_RULES = ("exit", "first_missing")


def cell_tier(tree: Tree, outcome: Outcome, problem: testbed_v3.Problem, rule: str) -> str | None:
  """The tier whose block a failure is taught in: "exit" (the paper's, `kace.learn.cell_of`): the
  reading tier of its exit stage; "first_missing" (v3's registered rule): the first tier on its
  path whose block holds no card of its kind word, else its exit stage's. None: it read no cards.

  Why v3 registers "first_missing": with no cards a reader's guesses disagree, so every problem
  climbs to the pool and, under "exit", every first failure is taught in an HS block; MS blocks get
  cards only from rare lucky MS exits, and the tier split the testbed is built to reward cannot
  form (measured: docs/kace_v3.md, "ADD's cell rule")."""
  if not outcome.reading:
    return None
  if rule == "first_missing":
    for tier in outcome.reading:
      if all(k != problem.kind for k, _ in tree.shown(tier, problem.domain)):
        return tier
  return outcome.reading[-1]


def _failures_by_block(solver: Solver, tree: Tree, arm: Arm, problems) -> dict[Block, list]:
  """Failed problems by the block they are taught in (`cell_tier`)."""
  out: dict[Block, list] = {}
  for p in problems:
    o = solver.solve(tree, arm, p)
    tier = None if o.correct else cell_tier(tree, o, p, arm.cell_rule)
    if tier is not None:
      out.setdefault(tree.layout.block(tier, p.domain), []).append(p)
  return out


def build_add(solver: Solver, arm: Arm, teach, accept, calls: int, counts: Counts, rng) -> Tree:
  """ADD: sweeps over the blocks with teaching failures, one teacher call per block, each proposed
  card tried alone and kept by `arm.accept`; a sweep that keeps nothing ends it."""
  capacity = max(1, solver.budget.card_tokens // len(arm.layout.blocks()))
  tree = Tree(arm.layout, capacity)
  while counts.teacher_calls < calls:
    kept_any = False
    for block, failed in sorted(_failures_by_block(solver, tree, arm, teach).items()):
      if counts.teacher_calls >= calls:
        break
      counts.teacher_calls += 1
      for card in teacher(failed, solver.budget.shown_failures, rng):
        if card in tree.blocks[block]:
          continue
        if len(tree.blocks[block]) >= capacity:
          counts.add("add_refused_full")
          continue
        trial = tree.with_cards(block, (*tree.blocks[block], card))
        gain = solver.correct(trial, arm, accept) - solver.correct(tree, arm, accept)
        if arm.accept == "all" or gain >= 1:
          tree, kept_any = trial, True
          counts.add("add_kept")
        else:
          counts.add("add_rejected")
    if not kept_any:
      break
  return tree


def credits(solver: Solver, tree: Tree, arm: Arm, teach) -> dict[tuple[Block, int], int]:
  """Counterfactual credit of every card on the teaching half: right with it - right without it."""
  base = solver.correct(tree, arm, teach)
  out = {}
  for block, i, _ in tree.cards():
    without = tree.with_cards(block, tree.blocks[block][:i] + tree.blocks[block][i + 1 :])
    out[(block, i)] = base - solver.correct(without, arm, teach)
  return out


def failing_readers(solver: Solver, tree: Tree, arm: Arm, teach) -> dict[Card, list[tuple[int, int]]]:
  """{card: (base, gold) of the failed teaching problems of its kind word whose path read its block}:
  the examples the curator is shown beside each card's credit."""
  out: dict[Card, list[tuple[int, int]]] = {}
  for p in teach:
    o = solver.solve(tree, arm, p)
    if o.correct:
      continue
    for tier in o.reading:
      for card in tree.shown(tier, p.domain):
        if card[0] == p.kind:
          out.setdefault(card, []).append((p.base, int(p.problem.answer)))
  return out


def curator_operations(
  tree: Tree, credit: Mapping[tuple[Block, int], int], failing: Mapping[Card, Sequence[tuple[int, int]]] = {}
) -> list[tuple[str, tuple]]:
  """The programmatic curator's operations, from the credit and failing examples it is shown:
  - a card whose failing readers (at least 2) agree, at least half of them, on another rule gets
    that rule ("edit");
  - a card of negative credit in a tier's block moves to the other tier's block of its domain when
    that block has room and no card of its kind word ("relocate"), else is deleted ("delete");
  - two cards of one kind word in one block, one of them of credit <= 0: that one is deleted
    ("merge": the block keeps one rule per kind word);
  - a card whose (kind, rule) sits in the same tier's block of every domain becomes one universal
    card ("demote").
  Operations are (name, arguments); `apply_operation` applies one."""
  ops: list[tuple[str, tuple]] = []
  for (block, i), c in sorted(credit.items(), key=lambda kv: (kv[1], kv[0])):
    card = tree.blocks[block][i]
    pairs = failing.get(card, ())
    if len(pairs) >= 2:
      rule, agree = testbed.fit(pairs, testbed_v3.RULES)
      if rule != card[1] and 2 * agree >= len(pairs) and (card[0], rule) not in tree.blocks[block]:
        ops.append(("edit", (block, card, rule)))
        continue
    if c < 0:
      tier, domain = block
      if tree.layout.by_tier and block != UNIVERSAL:
        other = tree.layout.block(tiers.HS if tier == tiers.MS else tiers.MS, domain)
        if len(tree.blocks[other]) < tree.capacity and all(k != card[0] for k, _ in tree.blocks[other]):
          ops.append(("relocate", (block, card, other)))
          continue
      ops.append(("delete", (block, card)))
    elif c == 0 and sum(k == card[0] for k, _ in tree.blocks[block]) > 1:
      ops.append(("merge", (block, card)))
  if tree.layout.by_domain:
    for tier in READING:
      blocks = [tree.layout.block(tier, d) for d in testbed_v3.DOMAINS]
      common = set(tree.blocks[blocks[0]]).intersection(*(tree.blocks[b] for b in blocks[1:]))
      ops.extend(("demote", (tier, card)) for card in sorted(common, key=str))
  return ops


def apply_operation(tree: Tree, op: tuple[str, tuple]) -> Tree:
  """`tree` after one curator operation (`curator_operations`); "edit" replaces a card's rule."""
  name, args = op
  drop = lambda t, block, card: t.with_cards(block, [c for c in t.blocks[block] if c != card])
  if name in ("delete", "merge"):
    block, card = args
    return drop(tree, block, card)
  if name == "relocate":
    block, card, other = args
    return drop(tree, block, card).with_cards(other, (*tree.blocks[other], card))
  if name == "edit":
    block, card, rule = args
    return tree.with_cards(block, [(card[0], rule) if c == card else c for c in tree.blocks[block]])
  if name == "demote":
    tier, card = args
    for d in testbed_v3.DOMAINS:
      tree = drop(tree, tree.layout.block(tier, d), card)
    return Tree(tree.layout, tree.capacity, {**tree.blocks, UNIVERSAL: (*tree.blocks[UNIVERSAL], card)})
  raise ValueError(f"unknown curator operation {name!r}; one of {OPERATIONS}")


def refine(solver: Solver, arm: Arm, tree: Tree, teach, accept, calls: int, counts: Counts, rng) -> Tree:
  """REFINE: per curator call, credit every card on the teaching half (permuted over the cards with
  `arm.refine == "shuffled"`), apply each operation alone, and roll it back when acceptance accuracy
  drops (never with "no_rollback")."""
  while counts.teacher_calls < calls:
    counts.teacher_calls += 1
    credit = credits(solver, tree, arm, teach)
    if arm.refine == "shuffled":
      values = list(credit.values())
      rng.shuffle(values)
      credit = dict(zip(credit, values, strict=True))
    ops = curator_operations(tree, credit, failing_readers(solver, tree, arm, teach))
    if not ops:
      break
    for op in ops:
      try:
        trial = apply_operation(tree, op)
      except (ValueError, KeyError):
        counts.add(f"{op[0]}_refused")
        continue
      dropped = solver.correct(trial, arm, accept) < solver.correct(tree, arm, accept)
      if dropped and arm.refine != "no_rollback":
        counts.add(f"{op[0]}_rolled_back")
        continue
      tree = trial
      counts.add(f"{op[0]}_applied")
  return tree


def build_ace(solver: Solver, arm: Arm, teach, calls: int, counts: Counts, rng) -> Tree:
  """ACE: per step, the reflector (one teacher call) distils the failures of a batch of teaching
  problems into insights and the curator (one more call) appends each as a delta to the playbook,
  with no held-out test (ACE's grow-and-refine; a duplicate is skipped, a full playbook refuses)."""
  tree = Tree(arm.layout, solver.budget.card_tokens)
  block = arm.layout.blocks()[0]
  order = list(teach)
  rng.shuffle(order)
  step = 0
  while counts.teacher_calls + 2 <= calls:
    batch = order[(step * 16) % len(order) :][:16] or order[:16]
    step += 1
    failed = [p for p in batch if not solver.solve(tree, arm, p).correct]
    counts.teacher_calls += 2
    for card in teacher(failed, solver.budget.shown_failures, rng) if failed else []:
      if card in tree.blocks[block]:
        counts.add("ace_skip_duplicate")
      elif len(tree.blocks[block]) >= tree.capacity:
        counts.add("ace_refused_full")
      else:
        tree = tree.with_cards(block, (*tree.blocks[block], card))
        counts.add("ace_add")
  return tree


def build_gepa(solver: Solver, arm: Arm, teach, accept, calls: int, counts: Counts, rng) -> Tree:
  """GEPA: one prompt (a card list); per reflection call on a minibatch's failures, the mutation puts
  the teacher's rule in place of the prompt's card of each kind word it covers; the mutated prompt
  replaces the current one when it solves more of the validation (acceptance) half."""
  tree = Tree(arm.layout, solver.budget.card_tokens)
  block = arm.layout.blocks()[0]
  order = list(teach)
  while counts.teacher_calls < calls:
    rng.shuffle(order)
    failed = [p for p in order[:16] if not solver.solve(tree, arm, p).correct]
    counts.teacher_calls += 1
    proposed = teacher(failed, solver.budget.shown_failures, rng) if failed else []
    if not proposed:
      counts.add("gepa_no_proposal")
      continue
    kinds = {k for k, _ in proposed}
    trial = tree.with_cards(block, [c for c in tree.blocks[block] if c[0] not in kinds] + proposed)
    if solver.correct(trial, arm, accept) > solver.correct(tree, arm, accept):
      tree = trial
      counts.add("gepa_accepted")
    else:
      counts.add("gepa_rejected")
  return tree


def build(solver: Solver, arm: Arm, world: testbed_v3.WorldConfig) -> tuple[Tree | None, Counts]:
  """`arm`'s tree for one build, and what its build did."""
  counts = Counts()
  rng = random.Random(_seed("build", world.seed, solver.reader.name, arm.name))
  teach, accept = world.split("teach"), world.split("accept")
  total = solver.budget.teacher_calls
  if arm.builder == "none":
    return None, counts
  if arm.builder == "ace":
    return build_ace(solver, arm, teach, total, counts, rng), counts
  if arm.builder == "gepa":
    return build_gepa(solver, arm, teach, accept, total, counts, rng), counts
  add_calls = total - (solver.budget.refine_calls if arm.refine else 0)
  tree = build_add(solver, arm, teach, accept, add_calls, counts, rng)
  if arm.refine:
    tree = refine(solver, arm, tree, teach, accept, total, counts, rng)
  return tree, counts


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
  """`GATES` measured for `solver`'s reader on the calibration split: {"rates": ..., "passed": ...}."""
  rules, part = world.rules(), world.split("calibration")
  rng = random.Random(_seed("gates", world.seed, solver.reader.name))

  def rate(problems, with_card: bool) -> float:
    right = 0
    for p in problems:
      shown = [(p.kind, rules[(p.domain, p.family, p.size)])] if with_card else []
      right += sum(solver.reader.answer(p, shown, rng) == p.problem.answer for _ in range(samples))
    return right / (samples * len(problems))

  small = [p for p in part if p.size == "small"]
  large = [p for p in part if p.size == "large"]
  tree, arm = true_tree(world), Arm(name="true_tree")
  late = lambda ps: sum(solver.solve(tree, arm, p).exit_tier in (tiers.HS, tiers.POOL) for p in ps) / len(ps)
  rates = {
    "small_true_card": rate(small, True),
    "no_card": rate(part, False),
    "large_true_card": rate(large, True),
    "exit_separation": late(large) - late(small),
  }
  passed = {}
  for name, (op, bound) in GATES.items():
    x = rates[name]
    passed[name] = bound[0] <= x <= bound[1] if op == "between" else x >= bound if op == ">=" else x <= bound
  return {"rates": rates, "passed": passed, "all_passed": all(passed.values())}


@functools.cache
def _world(seed: int) -> testbed_v3.WorldConfig:
  return testbed_v3.WorldConfig(seed=seed)


def run(
  readers: Sequence[readers_lib.Reader],
  builds: Sequence[int],
  arms: Sequence[Arm] = ARMS,
  budget: Budget = Budget(),
  split: str = "test",
  progress: Callable[[str], None] | None = None,
) -> dict:
  """Every reader x build x arm, solved on `split`: {"outcomes": {reader: {arm: {(build, id): (level,
  correct)}}}, "counts": {reader: {arm: [per build: teacher calls, cards, operations]}}, "gates":
  {reader: [per build: `gates`]}}."""
  outcomes: dict = {}
  counts: dict = {}
  gated: dict = {}
  for reader in readers:
    for b in builds:
      world = _world(b)
      problems = world.split(split)
      solver = Solver(reader, b, budget)
      gated.setdefault(reader.name, []).append(gates(solver, world))
      for arm in arms:
        tree, c = build(solver, arm, world)
        by = outcomes.setdefault(reader.name, {}).setdefault(arm.name, {})
        for p in problems:
          by[(f"build{b}", p.id)] = (p.problem.level, solver.solve(tree, arm, p).correct)
        counts.setdefault(reader.name, {}).setdefault(arm.name, []).append(
          {"build": b, "teacher_calls": c.teacher_calls, "cards": 0 if tree is None else tree.size(), **c.ops}
        )
      if progress:
        progress(f"{reader.name} build {b}")
  return {"outcomes": outcomes, "counts": counts, "gates": gated}
