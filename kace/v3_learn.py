"""Testbed v3's trees built with the programmatic teacher and curator, per arm (`kace.v3_arms.ARMS`).

It follows `kace.learn`'s procedure on `v3_arms.Tree`: teaching failures -> one teacher call per
block -> each card kept by a test on the acceptance half (ADD); REFINE's credit = right with a card -
right without it on the teaching half, each curator operation kept unless acceptance accuracy drops;
ACE's reflector and curator appending to a playbook; GEPA's reflection mutating one prompt.

The teacher (ADD's, ACE's reflector and curator, GEPA's reflection) is a choice (`Teacher`): the
programmatic one (`PROGRAMMATIC`: it fits H to the shown failures' exact base answers, read from the
testbed), an upper bound labelled "programmatic teacher", which the scripted readers' registered
verdicts use; or the learned teacher (`kace.v3_teacher.LearnedV3Teacher`, "learned teacher (tiny
model)"), which reads only the shown failures' question text and gold answer and which the trained
arms use in every arm. An arm may name its own teacher (`Arm.teacher`: "programmatic" is the
labelled upper-bound arm `kace_oracle_teacher`). REFINE's curator is programmatic in every arm.
`run` solves every reader x build x arm for `kace.v3_verdicts`.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from kace import readers, testbed, testbed_v3, tiers
from kace.v3_arms import (
  ARMS,
  READING,
  UNIVERSAL,
  Arm,
  Block,
  Budget,
  Card,
  Outcome,
  Solver,
  Tree,
  gates,
  seed_of,
)

OPERATIONS = ("delete", "relocate", "demote", "edit", "merge")


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


class Teacher(Protocol):
  """The teacher role of the v3 arms (ADD's teacher, ACE's reflector and curator, GEPA's reflection).

  `cards` is shown at most `shown_failures` of `failures`, drawn with `rng` (`rng.sample`, so every
  teacher shown the same failures and rng state is shown the same ones), and writes at most one card
  per kind word among them. `name` labels it wherever its numbers appear."""

  name: str

  def cards(
    self, failures: Sequence[testbed_v3.Problem], shown_failures: int, rng: random.Random
  ) -> list[Card]: ...


@dataclasses.dataclass(frozen=True)
class ProgrammaticTeacher:
  """`teacher` as a `Teacher`: the upper bound the scripted readers' verdicts use."""

  name: str = "programmatic teacher"

  def cards(
    self, failures: Sequence[testbed_v3.Problem], shown_failures: int, rng: random.Random
  ) -> list[Card]:
    return teacher(failures, shown_failures, rng)


PROGRAMMATIC = ProgrammaticTeacher()
# `Arm.teacher` names: the teacher an arm uses in place of the run's
ARM_TEACHERS: dict[str, Teacher] = {"programmatic": PROGRAMMATIC}


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
  solver.prefetch(tree, arm, problems)  # one batch for a model reader
  for p in problems:
    o = solver.solve(tree, arm, p)
    tier = None if o.correct else cell_tier(tree, o, p, arm.cell_rule)
    if tier is not None:
      out.setdefault(tree.layout.block(tier, p.domain), []).append(p)
  return out


def build_add(
  solver: Solver, arm: Arm, teach, accept, calls: int, counts: Counts, rng, by: Teacher = PROGRAMMATIC
) -> Tree:
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
      for card in by.cards(failed, solver.budget.shown_failures, rng):
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
  solver.prefetch(tree, arm, teach)
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


def build_ace(
  solver: Solver, arm: Arm, teach, calls: int, counts: Counts, rng, by: Teacher = PROGRAMMATIC
) -> Tree:
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
    solver.prefetch(tree, arm, batch)
    failed = [p for p in batch if not solver.solve(tree, arm, p).correct]
    counts.teacher_calls += 2
    for card in by.cards(failed, solver.budget.shown_failures, rng) if failed else []:
      if card in tree.blocks[block]:
        counts.add("ace_skip_duplicate")
      elif len(tree.blocks[block]) >= tree.capacity:
        counts.add("ace_refused_full")
      else:
        tree = tree.with_cards(block, (*tree.blocks[block], card))
        counts.add("ace_add")
  return tree


def build_gepa(
  solver: Solver, arm: Arm, teach, accept, calls: int, counts: Counts, rng, by: Teacher = PROGRAMMATIC
) -> Tree:
  """GEPA: one prompt (a card list); per reflection call on a minibatch's failures, the mutation puts
  the teacher's rule in place of the prompt's card of each kind word it covers; the mutated prompt
  replaces the current one when it solves more of the validation (acceptance) half."""
  tree = Tree(arm.layout, solver.budget.card_tokens)
  block = arm.layout.blocks()[0]
  order = list(teach)
  while counts.teacher_calls < calls:
    rng.shuffle(order)
    solver.prefetch(tree, arm, order[:16])
    failed = [p for p in order[:16] if not solver.solve(tree, arm, p).correct]
    counts.teacher_calls += 1
    proposed = by.cards(failed, solver.budget.shown_failures, rng) if failed else []
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


def arm_teacher(arm: Arm, teacher: Teacher) -> Teacher:
  """The teacher `arm` builds with: its own (`Arm.teacher`, `ARM_TEACHERS`) or the run's `teacher`."""
  if arm.teacher is None:
    return teacher
  if arm.teacher not in ARM_TEACHERS:
    raise ValueError(f"arm {arm.name!r}: unknown teacher {arm.teacher!r}; one of {tuple(ARM_TEACHERS)}")
  return ARM_TEACHERS[arm.teacher]


def build(
  solver: Solver, arm: Arm, world: testbed_v3.WorldConfig, teacher: Teacher = PROGRAMMATIC
) -> tuple[Tree | None, Counts]:
  """`arm`'s tree for one build with `teacher` (unless the arm names its own), and what its build
  did. The build's randomness is `arm.seed_name`'s (its own name by default), so an arm that differs
  from another only in its teacher is shown the same failures while their trees agree."""
  counts = Counts()
  rng = random.Random(seed_of("build", world.seed, solver.reader.name, arm.seed_name or arm.name))
  teach, accept = world.split("teach"), world.split("accept")
  total = solver.budget.teacher_calls
  by = arm_teacher(arm, teacher)
  if arm.builder == "none":
    return None, counts
  if arm.builder == "ace":
    return build_ace(solver, arm, teach, total, counts, rng, by), counts
  if arm.builder == "gepa":
    return build_gepa(solver, arm, teach, accept, total, counts, rng, by), counts
  add_calls = total - (solver.budget.refine_calls if arm.refine else 0)
  tree = build_add(solver, arm, teach, accept, add_calls, counts, rng, by)
  if arm.refine:
    tree = refine(solver, arm, tree, teach, accept, total, counts, rng)
  return tree, counts


@functools.cache
def _world(seed: int) -> testbed_v3.WorldConfig:
  return testbed_v3.WorldConfig(seed=seed)


def run(
  readers: Sequence[readers.Reader],
  builds: Sequence[int],
  arms: Sequence[Arm] = ARMS,
  budget: Budget | None = None,
  split: str = "test",
  progress: Callable[[str], None] | None = None,
  teacher: Teacher = PROGRAMMATIC,
) -> dict:
  """Every reader x build x arm, solved on `split`, trees built with `teacher` (an arm may name its
  own: `Arm.teacher`): {"outcomes": {reader: {arm: {(build, id): (level, correct)}}}, "counts":
  {reader: {arm: [per build: teacher calls, cards, operations]}}, "gates": {reader: [per build:
  `gates`]}, "teachers": {arm: the label of the teacher it built with}}."""
  budget = budget or Budget()
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
        tree, c = build(solver, arm, world, teacher)
        by = outcomes.setdefault(reader.name, {}).setdefault(arm.name, {})
        solver.prefetch(tree, arm, problems)
        for p in problems:
          by[(f"build{b}", p.id)] = (p.problem.level, solver.solve(tree, arm, p).correct)
        counts.setdefault(reader.name, {}).setdefault(arm.name, []).append(
          {"build": b, "teacher_calls": c.teacher_calls, "cards": 0 if tree is None else tree.size(), **c.ops}
        )
      if progress:
        progress(f"{reader.name} build {b}")
  labels = {arm.name: None if arm.builder == "none" else arm_teacher(arm, teacher).name for arm in arms}
  return {"outcomes": outcomes, "counts": counts, "gates": gated, "teachers": labels}
