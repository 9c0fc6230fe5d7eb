"""Learning an Epistemic Tree offline: ADD (teacher cards, kept by a held-out test) and REFINE (curator
operations guided by counterfactual credit, each kept only if it does not cost accuracy).

Why the acceptance set is "every problem whose path reads the block": a card in block (t, d) is in
the prompt of every stage at tier t of every domain-d problem that reaches t, and an earlier tier's
cards decide whether a problem reaches a later tier at all (an MS card can make HS problems stop at
a wrong MS majority). With seeds that depend only on (seed, problem, stage), a problem whose path
never reads the changed block draws exactly the same samples with or without the change, so
re-solving only the readers and comparing their accuracy is the same as comparing the accuracy of
the whole split, at a fraction of the cost.

The training problems are split once (seeded) into a *teaching* part, whose failures the teacher
and curator see, and an *acceptance* part they never see, on which every change is judged:

- ADD sweeps the cells (reading tier x domain, then "universal") up to `max_sweeps` times. The
  cells visited are fixed once, from the start tree: those with teaching failures then. Per cell,
  one teacher call proposes cards for the block the cell lands in; each card is
  tried alone, kept when the acceptance problems that read its block gain at least `min_gain`
  correct answers (0: do not drop), and after a kept card the solutions of every problem that
  read the block are replaced by their re-solved ones, so the next comparison starts from the
  current tree. A sweep that keeps nothing ends ADD; full blocks refuse cards (`BudgetError`).
- REFINE credits each card counterfactually: the teaching problems whose prompts held it are
  re-solved without it (same seeds); credit = right with it - right without it. The curator sees
  the worst cards with example problems, the samples' answers with and without the card, and the
  gold; each of its operations is applied alone, judged on the acceptance readers of every block it
  touches, and rolled back when their accuracy drops.

Model replies are untrusted: every reply is parsed against a schema, a malformed one is asked
again (`LearnConfig.retries` times, with fresh seeds), then recorded and skipped. `build` runs both
phases into a run directory, saving the tree and its progress in one atomic file after every cell
and REFINE round, so a killed build resumes where it stopped. Prompts, defaults and every choice the
paper leaves open: docs/kace.md ("Learning").
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tqdm

from kace import answers, cards, data, embed, projection, solve, tiers
from lm import generators, rundir, seeding
from lm import text as text_lib

TEACHER_TEMPLATE = """You are building a knowledge base for a maths solver. The solver got the problems \
below wrong (those marked "now solved" it gets right only with the current cards); the cards you \
write are read by problems of {block}.

{failures}

Cards this part of the knowledge base already holds:
{existing}

Write at most {max_cards} new cards: short, general, reusable knowledge (a lemma, an invariant, a \
decomposition pattern, a verification rule) that would have led to the correct answers. Do not restate \
a problem or its answer.
Reply with JSON only: {{"cards": [{{"type": "lemma", "text": "..."}}]}}"""

REFLECTION_TEMPLATE = """You answered the maths problem below and were wrong.

Problem: {question}
Your answer: {answer}
Correct answer: {gold}
Your attempt:
{attempt}

In one or two sentences, what should you remember to get problems like this right?"""

CURATOR_TEMPLATE = """You curate a knowledge base of cards read by a maths solver. Cards are stored by \
(tier, domain): tiers {tiers} from easiest to hardest, domains {domains}; tiers that read cards: \
{reading}; a universal card is read at every tier that reads cards. A card is read by problems that \
reach its tier in its domain.

Each card's credit was measured on training problems that read it: solved with and without the card \
(same random seeds); credit = problems right with it minus problems right without it.

The cards with the lowest credit, with examples:
{worst}

All cards (id | location | type | read by | credit | text):
{cards}

Near-duplicates found by a sentence embedder (only such cards may be merged):
{duplicates}

Propose operations that repair harmful cards and keep the cards useful and non-redundant, each with a \
short reason:
{{"op": "edit", "id": "card-0001", "text": "..."}}, {{"op": "relocate", "id": "...", "tier": "HS", "domain": \
"algebra"}} (tier and domain null: universal), {{"op": "demote", "id": "..."}} (one card-reading tier \
easier; a card at the easiest such tier cannot be demoted), {{"op": "delete", "id": "..."}}, \
{{"op": "merge", "ids": ["...", "..."], "text": "..."}}.
Each operation is tested on problems you have not seen and undone if it lowers accuracy.
Reply with JSON only: {{"operations": [...]}} (an empty list if nothing should change)."""

UNIVERSAL = "universal"  # the cell (and log name) of universal cards


class ReplyError(ValueError):
  """A model reply that does not match the schema its prompt asked for."""


ACCEPT_RULES = ("min_gain", "strict")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnConfig:
  """ADD / REFINE options (config section `learn`; defaults and reasons in docs/kace.md).

  Attributes:
    distill: "teacher" (typed cards from the teacher role) or "reflection" (the solver's own
      reflection on one failed attempt becomes a card verbatim: the `raw_reflections` ablation).
    accept_fraction: share of the training problems held out as the acceptance split (seeded by
      the learner's seed); the teacher and curator never see them.
    max_sweeps: ADD passes over every cell; ADD stops earlier after a sweep that keeps no card.
    accept_rule: how ADD judges a card on the acceptance problems that read its block (it needs at
      least one): "min_gain" (the default) keeps it when they gain at least `min_gain` correct
      answers (0: accuracy does not drop, so a neutral card stays); "strict" (testbed v2) keeps it
      only on a strictly positive gain beyond chance — the exact one-sided sign test on the readers
      whose outcome it changed (wins: wrong -> right, losses: right -> wrong) rejects "no effect"
      at `accept_alpha`, i.e. the lower Clopper-Pearson bound of P(win | changed) exceeds 1/2 —
      and when its losses are at most `max_regression` of its readers (`accepts`).
    min_gain: "min_gain" rule's bound (see `accept_rule`).
    accept_alpha: "strict" rule's one-sided level (5 wins and no loss is the least it keeps at 0.05).
    max_regression: "strict" rule's bound on readers turned from right to wrong, as a share.
    universal: whether each sweep ends with one teacher call for universal cards.
    failures_per_prompt: failed problems shown to the teacher per call.
    max_cards: cards a teacher reply may propose.
    attempt_tokens: token budget of a failed attempt shown to the teacher or reflector (the whole
      trace when it fits, else its beginning and end).
    retries: extra asks after a malformed reply, before it is recorded and skipped.
    refine_rounds: REFINE rounds (each: credit, one curator call, operations tried one by one).
    credit_max_problems: > 0: a card's credit uses at most this many of its readers (seeded).
    curator_cards: lowest-credit cards the curator sees with examples.
    curator_examples: example problems shown per such card.
    duplicate_threshold: cosine similarity at which two cards count as near-duplicates.
    max_card_chars: longer card texts are rejected by the parser.
  """

  distill: str = "teacher"
  accept_fraction: float = 0.5
  max_sweeps: int = 3
  accept_rule: str = "min_gain"
  min_gain: int = 0
  accept_alpha: float = 0.05
  max_regression: float = 0.1
  universal: bool = True
  failures_per_prompt: int = 4
  max_cards: int = 3
  attempt_tokens: int = 6144
  retries: int = 2
  refine_rounds: int = 1
  credit_max_problems: int = 0
  curator_cards: int = 8
  curator_examples: int = 2
  duplicate_threshold: float = 0.85
  max_card_chars: int = 600

  def __post_init__(self):
    if self.distill not in ("teacher", "reflection"):
      raise ValueError(f"learn.distill must be 'teacher' or 'reflection', got {self.distill!r}")
    if not 0 < self.accept_fraction < 1:
      raise ValueError(f"learn.accept_fraction must be in (0, 1), got {self.accept_fraction}")
    if self.accept_rule not in ACCEPT_RULES:
      raise ValueError(f"learn.accept_rule must be one of {ACCEPT_RULES}, got {self.accept_rule!r}")
    if not 0 < self.accept_alpha < 1:
      raise ValueError(f"learn.accept_alpha must be in (0, 1), got {self.accept_alpha}")
    if not 0 <= self.max_regression <= 1:
      raise ValueError(f"learn.max_regression must be in [0, 1], got {self.max_regression}")
    counts = ("max_sweeps", "failures_per_prompt", "max_cards", "attempt_tokens", "max_card_chars")
    for name in counts:
      if getattr(self, name) < 1:
        raise ValueError(f"learn.{name} must be >= 1, got {getattr(self, name)}")
    for name in ("min_gain", "retries", "refine_rounds", "credit_max_problems", "curator_cards"):
      if getattr(self, name) < 0:
        raise ValueError(f"learn.{name} must be >= 0, got {getattr(self, name)}")


# ---- parsing untrusted replies ----------------------------------------------------------------------


def json_object(reply: str) -> dict:
  """The JSON object in a reply (`lm.text.json_object`); ReplyError when there is none."""
  obj = text_lib.json_object(reply)
  if obj is None:
    raise ReplyError("no JSON object in the reply")
  return obj


def string_field(obj: Mapping, key: str, where: str, max_chars: int = 10_000) -> str:
  """`obj[key]` stripped, if it is a non-empty string of at most `max_chars`; else ReplyError."""
  value = obj.get(key)
  if not isinstance(value, str) or not value.strip():
    raise ReplyError(f"{where}.{key}: expected a non-empty string")
  if len(value) > max_chars:
    raise ReplyError(f"{where}.{key}: longer than {max_chars} characters")
  return value.strip()


def parse_cards(reply: str, max_cards: int, max_chars: int = 600) -> tuple[tuple[str, str], ...]:
  """(type, text) of the cards in a teacher reply `{"cards": [{"type", "text"}]}`, at most
  `max_cards`; raises ReplyError on anything else."""
  items = json_object(reply).get("cards")
  if not isinstance(items, list) or not items:
    raise ReplyError("cards: expected a non-empty list")
  out = []
  for i, item in enumerate(items[:max_cards]):
    if not isinstance(item, dict):
      raise ReplyError(f"cards[{i}]: expected an object")
    out.append(
      (string_field(item, "type", f"cards[{i}]", 40), string_field(item, "text", f"cards[{i}]", max_chars))
    )
  return tuple(out)


def parse_reflection(reply: str, max_chars: int = 600) -> tuple[tuple[str, str], ...]:
  """A raw solver reflection as one card of type "reflection" (the text after `</think>`)."""
  text = text_lib.after_think(reply).strip()
  if not text:
    raise ReplyError("empty reflection")
  return (("reflection", text[:max_chars]),)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Operation:
  """One curator operation. `ids` has one card except for MERGE; `tier`/`domain` for RELOCATE."""

  op: str
  ids: tuple[str, ...]
  text: str | None = None
  tier: str | None = None
  domain: str | None = None
  reason: str = ""


CURATOR_OPS = ("edit", "relocate", "demote", "delete", "merge")


def _opt_name(obj: Mapping, key: str, where: str) -> str | None:
  value = obj.get(key)
  if value is not None and not isinstance(value, str):
    raise ReplyError(f"{where}.{key}: expected a string or null")
  return value


def parse_operations(reply: str, max_chars: int = 600) -> tuple[Operation, ...]:
  """Curator operations from `{"operations": [...]}`; raises ReplyError when the shape is wrong.
  Whether an operation fits the tree (ids exist, block exists, budget) is checked when applied."""
  items = json_object(reply).get("operations")
  if not isinstance(items, list):
    raise ReplyError("operations: expected a list")
  ops = []
  for i, item in enumerate(items):
    where = f"operations[{i}]"
    if not isinstance(item, dict) or item.get("op") not in CURATOR_OPS:
      raise ReplyError(f"{where}.op: expected one of {CURATOR_OPS}")
    op, reason = item["op"], item.get("reason") if isinstance(item.get("reason"), str) else ""
    if op == "merge":
      ids = item.get("ids")
      if not isinstance(ids, list) or len(ids) < 2 or not all(isinstance(x, str) for x in ids):
        raise ReplyError(f"{where}.ids: expected a list of at least two card ids")
      text = string_field(item, "text", where, max_chars)
      ops.append(Operation(op=op, ids=tuple(ids), text=text, reason=reason))
      continue
    card_id = string_field(item, "id", where, 100)
    text = string_field(item, "text", where, max_chars) if op == "edit" else None
    tier, domain = (
      (_opt_name(item, "tier", where), _opt_name(item, "domain", where)) if op == "relocate" else (None, None)
    )
    ops.append(Operation(op=op, ids=(card_id,), text=text, tier=tier, domain=domain, reason=reason))
  return tuple(ops)


def reading_tiers(schedule: tiers.Schedule) -> tuple[str, ...]:
  """The tiers whose prompts carry cards under `schedule`, easiest first (the paper's: MS, HS)."""
  names = [t.name for t in schedule.tiers if t.reads_cards]
  if schedule.pool_reads and schedule.pool_reads not in names:
    names.append(schedule.pool_reads)
  return tuple(names)


def apply(
  tree: cards.EpistemicTree,
  op: Operation,
  similar: Callable[[Sequence[str]], bool],
  reading: Sequence[str] = (tiers.MS, tiers.HS),
) -> cards.EpistemicTree:
  """The tree after `op` (history records the curator's reason). Raises KeyError / ValueError
  (including BudgetError) when the operation does not fit the tree; `similar(ids)` must accept a
  MERGE's cards as near-duplicates.

  `reading` are the tiers whose prompts carry cards. No operation may move a card to a tier outside
  them (ES reads no cards: a card there would be silently disabled), so DEMOTE moves a card to the
  next easier *reading* tier and refuses a card already at the easiest one (MS by default); the
  curator can relocate it to the universal cards instead.
  """
  reason = f"curator: {op.reason}".strip()
  card_id = op.ids[0]
  if op.op == "edit":
    return tree.edit(card_id, op.text, reason)
  if op.op == "relocate":
    if op.tier is not None and tree.tiers != (cards.ANY,) and op.tier not in reading:
      raise ValueError(f"relocate {card_id} to tier {op.tier}: that tier reads no cards ({list(reading)} do)")
    return tree.relocate(card_id, op.tier, op.domain, reason)
  if op.op == "demote":
    card = tree.card(card_id)
    if card.universal or card.tier not in reading or reading.index(card.tier) == 0:
      raise ValueError(
        f"demote {card_id} at {card.location}: no easier tier reads cards (tiers that do: "
        f"{list(reading)}); relocate it to universal (tier and domain null) instead"
      )
    lower = reading[reading.index(card.tier) - 1]
    if tree.tiers.index(lower) == tree.tiers.index(card.tier) - 1:
      return tree.demote(card_id, reason)
    return tree.relocate(card_id, lower, card.domain, reason)
  if op.op == "delete":
    return tree.delete(card_id, reason)
  for i in op.ids:
    tree.card(i)  # unknown ids fail before the similarity check
  if not similar(op.ids):
    raise ValueError(f"merge of {list(op.ids)}: the embedder does not find them near-duplicates")
  return tree.merge(op.ids, op.text, reason=reason)[0]


@dataclasses.dataclass(frozen=True)
class Asked:
  """The parsed value of a prompt's reply (None when every attempt was malformed) and every reply."""

  value: Any
  replies: tuple[str, ...]
  errors: tuple[str, ...]


def ask(
  generator: generators.TextGenerator,
  prompts: Sequence[str],
  parse: Callable[[str], Any],
  params: generators.GenerationParams,
  *,
  retries: int,
  seed: int,
) -> list[Asked]:
  """Asks every prompt (one batched call per attempt) and re-asks those whose reply `parse`
  rejects, with a fresh seed, up to `retries` more times. Never raises on a reply."""
  replies: list[list[str]] = [[] for _ in prompts]
  errors: list[list[str]] = [[] for _ in prompts]
  values: dict[int, Any] = {}
  for attempt in range(retries + 1):
    todo = [i for i in range(len(prompts)) if i not in values]
    if not todo:
      break
    chats = [text_lib.user_chat(prompts[i]) for i in todo]
    per = [dataclasses.replace(params, seed=seeding.derive_seed(seed, str(i), f"ask{attempt}")) for i in todo]
    for i, (generation,) in zip(todo, generator.generate(chats, n=1, params=per), strict=True):
      replies[i].append(generation.text)
      try:
        values[i] = parse(generation.text)
      except ReplyError as e:
        errors[i].append(str(e))
  return [Asked(values.get(i), tuple(replies[i]), tuple(errors[i])) for i in range(len(prompts))]


# ---- the learner ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Learner:
  """Everything ADD and REFINE call: the roles, the grader, and how the solver is run.

  `domains` are the cells' domains (the configured ones; a collapsed tree still visits one cell
  per (tier, domain), so every layout makes the same teacher calls). `universal_budget` caps the
  universal cards' tokens (None: the tree's block budget), so a layout with bigger blocks keeps the
  same universal capacity.
  """

  solver: generators.TextGenerator
  teacher: generators.TextGenerator
  curator: generators.TextGenerator
  grader: answers.Grader
  embedder: embed.Embedder
  schedule: tiers.Schedule
  params: generators.GenerationParams  # solver sampling
  role_params: generators.GenerationParams  # teacher, curator (and reflections)
  config: LearnConfig = LearnConfig()
  template: str = projection.SOLVER_TEMPLATE
  seed: int = 0
  domains: tuple[str, ...] = cards.DEFAULT_DOMAINS
  universal_budget: int | None = None

  def solve(self, problems: Sequence[data.Problem], domains: Mapping[str, str], tree, desc: str = ""):
    """The solver's solutions reading `tree` (one batched call per stage); a bar when `desc` is set."""
    if not problems:
      return []
    progress = solve.Progress(len(problems), desc) if desc else None
    out = solve.solve(
      problems,
      domains,
      generator=self.solver,
      grader=self.grader,
      schedule=self.schedule,
      params=self.params,
      context=projection.TreeContext(tree),
      template=self.template,
      seed=self.seed,
      progress=progress,
    )
    if progress:
      progress.close()
    return out

  @property
  def reading(self) -> tuple[str, ...]:
    return reading_tiers(self.schedule)

  def cells(self) -> list[str]:
    """One ADD sweep's cells, in order: "tier/domain" for every reading tier and domain, then
    universal when enabled."""
    out = [f"{t}/{d}" for t in self.reading for d in self.domains]
    return out + ([UNIVERSAL] if self.config.universal else [])

  def check_universal(self, tree: cards.EpistemicTree) -> cards.EpistemicTree:
    """`tree`, or BudgetError when its universal cards exceed `universal_budget`."""
    if self.universal_budget is not None and tree.tokens(tree.universal()) > self.universal_budget:
      raise cards.BudgetError(
        f"universal cards would hold {tree.tokens(tree.universal())} tokens; budget {self.universal_budget}"
      )
    return tree


def split(problems: Sequence[data.Problem], config: LearnConfig, seed: int):
  """(teaching, acceptance) parts of the training problems: a seeded split, each part in id order."""
  teach, accept = data.train_test_split(problems, config.accept_fraction, seed)
  if not teach or not accept:
    raise ValueError(
      f"learn.accept_fraction={config.accept_fraction} of {len(problems)} training problems leaves an "
      "empty teaching or acceptance split"
    )
  return teach, accept


Location = tuple[str, str] | None  # a resolved block key, or None for the universal cards


def reads(tree: cards.EpistemicTree, solution: solve.Solution, location: Location) -> bool:
  """Whether any stage of the solution's path read `location` (any card-reading stage reads the
  universal cards)."""
  for st in solution.stages:
    if st.cards_tier is not None and (
      location is None or tree.resolve(st.cards_tier, solution.domain) == location
    ):
      return True
  return False


def cell_of(solution: solve.Solution) -> str | None:
  """The cell of a solved problem: its exit stage's reading tier and its domain (None for an exit at
  a stage without cards, e.g. ES: no card can change such a problem)."""
  tier = solution.stages[-1].cards_tier if solution.stages else None
  return None if tier is None else f"{tier}/{solution.domain}"


def _location(tree: cards.EpistemicTree, cell: str) -> Location:
  return None if cell == UNIVERSAL else tree.resolve(*cell.split("/"))


def _location_name(location: Location) -> str:
  return UNIVERSAL if location is None else "/".join(location)


def _block_name(location: Location) -> str:
  if location is None:
    return "every tier and every domain (universal cards)"
  tier = "every tier" if location[0] == cards.ANY else f"difficulty tier {location[0]}"
  domain = "every domain" if location[1] == cards.ANY else f"the domain {location[1].replace('_', ' ')}"
  return f"{tier} in {domain}"


def excerpt(text: str, max_tokens: int) -> str:
  """`text` whole when it fits `max_tokens` (`cards.estimate_tokens`), else its beginning and end
  (the setup and the answer) around a marker saying how much was left out."""
  if cards.estimate_tokens(text) <= max_tokens:
    return text
  keep = 4 * max_tokens
  head, tail = keep // 3, keep - keep // 3
  return f"{text[:head]}\n[... {len(text) - head - tail} characters left out ...]\n{text[-tail:]}"


def _attempt(solution: solve.Solution) -> solve.SampleRecord:
  """The solution's last wrong sample (its last sample when none is wrong)."""
  wrong = [s for st in solution.stages for s in st.samples if not s.correct]
  return wrong[-1] if wrong else solution.stages[-1].samples[-1]


def _answers_seen(solution: solve.Solution) -> str:
  return ", ".join(str(x.answer) for st in solution.stages for x in st.samples)


def teacher_prompt(tree, location: Location, shown, problems: Mapping[str, data.Problem], config) -> str:
  """The teacher's prompt for the block at `location`, showing the failed solutions `shown`."""
  parts = []
  for i, s in enumerate(shown):
    solved = " (now solved with the current cards)" if s.correct else ""
    parts.append(
      f"### Problem {i + 1}{solved}\n{problems[s.id].question}\nCorrect answer: {s.gold}\n"
      f"Solver's answers (every sample): {_answers_seen(s)}\n"
      f"One wrong attempt:\n{excerpt(_attempt(s).text, config.attempt_tokens)}"
    )
  held = tree.universal() if location is None else tree.block(*location)
  existing = "\n".join(cards.render_card(c) for c in held) or "(none)"
  return TEACHER_TEMPLATE.format(
    block=_block_name(location), failures="\n\n".join(parts), existing=existing, max_cards=config.max_cards
  )


def reflection_prompt(solution: solve.Solution, problem: data.Problem, config: LearnConfig) -> str:
  sample = _attempt(solution)
  return REFLECTION_TEMPLATE.format(
    question=problem.question,
    answer=sample.answer,
    gold=solution.gold,
    attempt=excerpt(sample.text, config.attempt_tokens),
  )


def distill(
  learner: Learner, tree, location: Location, failed, problems, salt: str = ""
) -> tuple[list, list, list, int]:
  """Candidate cards for `location` from failed solutions.

  Returns ([(type, text, source solutions)], replies, errors, calls): a teacher's cards come from
  every failure its one prompt showed; a raw reflection from the one failure it reflects on (one
  solver call each, at most `max_cards`).
  """
  cfg = learner.config
  if cfg.distill == "teacher":
    groups = [list(failed[: cfg.failures_per_prompt])]
    prompts = [teacher_prompt(tree, location, groups[0], problems, cfg)]
    parse = lambda r: parse_cards(r, cfg.max_cards, cfg.max_card_chars)
    role = learner.teacher
  else:
    groups = [[s] for s in failed[: cfg.max_cards]]
    prompts = [reflection_prompt(s, problems[s.id], cfg) for (s,) in groups]
    parse = lambda r: parse_reflection(r, cfg.max_card_chars)
    role = learner.solver
  seed = seeding.derive_seed(learner.seed, _location_name(location), f"distill{salt}")
  asked = ask(role, prompts, parse, learner.role_params, retries=cfg.retries, seed=seed)
  proposed = [(t, text, group) for a, group in zip(asked, groups, strict=True) for t, text in a.value or ()]
  return proposed, [r for a in asked for r in a.replies], [e for a in asked for e in a.errors], len(prompts)


# ---- the current solutions and trials -------------------------------------------------------------


@dataclasses.dataclass
class State:
  """The tree and every training problem's solution under it (kept current after each change)."""

  tree: cards.EpistemicTree
  solutions: dict[str, solve.Solution]
  teach: list[data.Problem]
  accept: list[data.Problem]
  domains: Mapping[str, str]

  def readers(self, locations: Sequence[Location], part: Sequence[data.Problem]) -> list[data.Problem]:
    """The problems of `part` whose path under the current tree reads any of `locations`."""
    return [p for p in part if any(reads(self.tree, self.solutions[p.id], loc) for loc in locations)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Trial:
  """A candidate tree judged on the acceptance problems that read what it changed."""

  problems: list[str]  # acceptance problems reading the changed locations
  before: int  # of them, right under the current tree
  after: int  # right under the candidate
  solutions: list  # their solutions under the candidate
  wins: int = 0  # of them, wrong under the current tree and right under the candidate
  losses: int = 0  # right under the current tree and wrong under the candidate


def trial(learner: Learner, state: State, candidate, locations: Sequence[Location]) -> Trial:
  """Re-solves the acceptance readers of `locations` with `candidate` (same seeds) and counts."""
  readers = state.readers(locations, state.accept)
  solved = learner.solve(readers, state.domains, candidate)
  was = [state.solutions[p.id].correct for p in readers]
  return Trial(
    problems=[p.id for p in readers],
    before=sum(was),
    after=sum(s.correct for s in solved),
    solutions=solved,
    wins=sum(s.correct and not w for s, w in zip(solved, was, strict=True)),
    losses=sum(w and not s.correct for s, w in zip(solved, was, strict=True)),
  )


def sign_test(wins: int, losses: int) -> float:
  """One-sided exact p-value of `wins` or more among `wins + losses` changed outcomes when a change
  is as likely a win as a loss (McNemar's exact test; 1.0 when nothing changed)."""
  n = wins + losses
  return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n if n else 1.0


def accepts(config: LearnConfig, tried: Trial) -> bool:
  """Whether ADD keeps a card with this trial (`LearnConfig.accept_rule`)."""
  if not tried.problems:
    return False
  if config.accept_rule == "min_gain":
    return tried.after - tried.before >= config.min_gain
  return (
    tried.losses <= config.max_regression * len(tried.problems)
    and sign_test(tried.wins, tried.losses) < config.accept_alpha
  )


def commit_change(
  learner: Learner, state: State, candidate, locations: Sequence[Location], tried: Trial
) -> None:
  """Makes `candidate` the current tree: its acceptance readers' solutions come from the trial, its
  teaching readers are re-solved, so every later comparison starts from the tree as it now is."""
  teach = state.readers(locations, state.teach)
  for s in tried.solutions + learner.solve(teach, state.domains, candidate):
    state.solutions[s.id] = s
  state.tree = candidate


def _accuracy(state: State, part: Sequence[data.Problem]) -> float:
  return sum(state.solutions[p.id].correct for p in part) / len(part) if part else 0.0


# ---- ADD --------------------------------------------------------------------------------------------


def cell_failures(state: State, cell: str) -> list[str]:
  """Ids of the teaching problems that fail in `cell` now (universal: every failure with a cell)."""
  return [
    p.id
    for p in state.teach
    if not state.solutions[p.id].correct and (cell_of(state.solutions[p.id]) is not None)
    and (cell == UNIVERSAL or cell_of(state.solutions[p.id]) == cell)
  ]  # fmt: skip


def add_cell(
  learner: Learner,
  state: State,
  cell: str,
  planned: Sequence[str],
  shown_counts: dict[str, int],
  sweep: int = 0,
) -> dict:
  """ADD for one cell: one teacher call on its failures (the least shown first; when none is left,
  the failures it was planned for, as they are now solved), then each proposed card tried alone and
  kept by `min_gain`. Updates `state` and `shown_counts`; returns the log line."""
  cfg = learner.config
  location = _location(state.tree, cell)
  failed = [state.solutions[i] for i in cell_failures(state, cell) or planned]
  log = {
    "phase": "add",
    "cell": cell,
    "block": _location_name(location),
    "failed": len(cell_failures(state, cell)),
  }
  if not failed:
    return {**log, "teacher_calls": 0, "cards": []}
  failed.sort(key=lambda s: (shown_counts.get(s.id, 0), s.id))
  by_id = {p.id: p for p in state.teach}
  proposed, replies, errors, calls = distill(learner, state.tree, location, failed, by_id, str(sweep))
  shown = failed[: cfg.failures_per_prompt] if cfg.distill == "teacher" else failed[: cfg.max_cards]
  for s in shown:
    shown_counts[s.id] = shown_counts.get(s.id, 0) + 1
  results = []
  for card_type, text, sources in proposed:
    provenance = cards.Provenance(
      tuple(s.id for s in sources),
      tuple(f"{s.id}#{s.stages[-1].stage}" for s in sources),
      f"add:{cfg.distill}",
    )
    tier, domain = location if location is not None else (None, None)
    entry = {"type": card_type, "text": text}
    try:
      candidate, card = state.tree.add(text, card_type, tier, domain, provenance, reason=f"ADD {cell}")
      learner.check_universal(candidate)
    except ValueError as e:  # BudgetError, or a text the tree refuses
      results.append({**entry, "accepted": False, "error": str(e)})
      continue
    tried = trial(learner, state, candidate, [location])
    accepted = accepts(cfg, tried)
    results.append(
      {**entry, "id": card.id, "readers": len(tried.problems), "before": tried.before, "after": tried.after,
       "wins": tried.wins, "losses": tried.losses, "accepted": accepted}
    )  # fmt: skip
    if accepted:
      commit_change(learner, state, candidate, [location], tried)
  return {**log, "teacher_calls": calls, "shown": [s.id for s in shown], "cards": results,
          "replies": replies, "errors": errors}  # fmt: skip


# ---- REFINE ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Credit:
  """A card's counterfactual credit on the teaching problems that read it."""

  card: str
  readers: int
  with_card: int  # right with the card
  without_card: int  # right without it (same seeds)
  examples: list  # (problem id, gold, answers with, answers without, right with, right without)

  @property
  def credit(self) -> int:
    return self.with_card - self.without_card


def credit(learner: Learner, state: State) -> list[Credit]:
  """Per live card: its teaching readers (the problems whose prompts held it) solved with and
  without it, same seeds. Examples list the problems where the card changed the outcome first."""
  cfg, tree = learner.config, state.tree
  out = []
  for card in tree.cards:
    readers = [p for p in state.teach if any(card.id in st.cards for st in state.solutions[p.id].stages)]
    if cfg.credit_max_problems and len(readers) > cfg.credit_max_problems:
      rng = random.Random(seeding.derive_seed(learner.seed, card.id, "credit"))
      readers = sorted(rng.sample(readers, cfg.credit_max_problems), key=lambda p: p.id)
    without = learner.solve(readers, state.domains, tree.delete(card.id))
    examples = []
    for p, s0 in zip(readers, without, strict=True):
      s1 = state.solutions[p.id]
      examples.append((p.id, p.answer, _answers_seen(s1), _answers_seen(s0), s1.correct, s0.correct))
    examples.sort(key=lambda e: (e[4] == e[5], e[4], e[0]))  # harmful flips, helpful flips, then failures
    out.append(
      Credit(
        card=card.id,
        readers=len(readers),
        with_card=sum(e[4] for e in examples),
        without_card=sum(e[5] for e in examples),
        examples=examples,
      )
    )
  return out


def curator_prompt(
  tree: cards.EpistemicTree,
  credits: Sequence[Credit],
  duplicates: Sequence[tuple[str, str, float]],
  problems: Mapping[str, data.Problem],
  config: LearnConfig,
  reading: Sequence[str],
) -> str:
  by_card = {c.card: c for c in credits}
  worst = sorted(credits, key=lambda c: (c.credit, -c.readers, c.card))[: config.curator_cards]
  blocks = []
  for c in worst:
    card = tree.card(c.card)
    lines = [
      f"{card.id} | {card.location} | {card.type} | credit {c.credit:+d} on {c.readers} problems "
      f"| {card.text}"
    ]
    for pid, gold, with_, without, right_with, right_without in c.examples[: config.curator_examples]:
      verdict = (
        f"{'right' if right_with else 'wrong'} with the card, {'right' if right_without else 'wrong'} without"
      )
      lines.append(
        f"  - Problem: {problems[pid].question}\n    Correct answer: {gold}\n"
        f"    Samples' answers with the card: {with_}\n    Samples' answers without it: {without}\n"
        f"    ({verdict})"
      )
    blocks.append("\n".join(lines))
  listing = [
    f"{c.id} | {c.location} | {c.type} | {by_card[c.id].readers if c.id in by_card else 0} | "
    f"{by_card[c.id].credit if c.id in by_card else 0:+d} | {c.text}"
    for c in tree.cards
  ]
  dups = "\n".join(f"{a} ~ {b} ({sim:.2f})" for a, b, sim in duplicates) or "(none)"
  return CURATOR_TEMPLATE.format(
    tiers=", ".join(tree.tiers),
    domains=", ".join(tree.domains),
    reading=", ".join(reading),
    worst="\n\n".join(blocks) or "(no cards)",
    cards="\n".join(listing) or "(none)",
    duplicates=dups,
  )


def _touched(before: cards.EpistemicTree, after: cards.EpistemicTree, op: Operation) -> list[Location]:
  """The locations an operation changed: those of its cards before, and of its result after."""
  locations = []
  for card_id in op.ids:
    card = before.card(card_id)
    locations.append(None if card.universal else (card.tier, card.domain))
  new_ids = {c.id for c in after.cards} - {c.id for c in before.cards}
  for card in after.cards:
    if card.id in op.ids or card.id in new_ids:
      locations.append(None if card.universal else (card.tier, card.domain))
  return list(dict.fromkeys(locations))


def refine(learner: Learner, state: State, round_: int = 0) -> dict:
  """One REFINE round on `state`: counterfactual credit, one curator call, then each operation tried
  alone on the acceptance split and rolled back if accuracy there drops. Returns the log line."""
  cfg = learner.config
  credits = credit(learner, state)
  tree = state.tree
  for c in credits:
    harmful = sum(e[5] and not e[4] for e in c.examples)
    helpful = sum(e[4] and not e[5] for e in c.examples)
    tree = tree.count(c.card, uses=c.readers, helpful=helpful, harmful=harmful)
  state.tree = tree  # counters only: no outcome changes
  live = list(tree.cards)
  vecs = learner.embedder.embed([c.text for c in live]) if live else None
  index = {c.id: i for i, c in enumerate(live)}
  threshold = cfg.duplicate_threshold
  pairs = (
    [(live[i].id, live[j].id, sim) for i, j, sim in embed.near_duplicates(vecs, threshold)] if live else []
  )

  def similar(ids: Sequence[str]) -> bool:
    if vecs is None or not all(i in index for i in ids):
      return False
    rows = vecs[[index[i] for i in ids]]
    return bool((rows[1:] @ rows[0] >= threshold).all())

  by_id = {p.id: p for p in state.teach}
  prompt = curator_prompt(tree, credits, pairs, by_id, cfg, learner.reading)
  seed = seeding.derive_seed(learner.seed, "curator", f"refine{round_}")
  (asked,) = ask(
    learner.curator,
    [prompt],
    lambda r: parse_operations(r, cfg.max_card_chars),
    learner.role_params,
    retries=cfg.retries,
    seed=seed,
  )
  accuracy_before = _accuracy(state, state.accept)
  kept, rolled_back, refused = [], [], []
  for op in asked.value or ():
    entry = dataclasses.asdict(op)
    try:
      candidate = learner.check_universal(apply(state.tree, op, similar, learner.reading))
      locations = _touched(state.tree, candidate, op)
    except (KeyError, ValueError) as e:
      refused.append({**entry, "error": str(e)})
      continue
    tried = trial(learner, state, candidate, locations)
    entry.update(readers=len(tried.problems), before=tried.before, after=tried.after)
    if tried.after < tried.before:
      rolled_back.append(entry)
      continue
    commit_change(learner, state, candidate, locations, tried)
    kept.append(entry)
  return {
    "phase": "refine",
    "accept_accuracy_before": accuracy_before,
    "accept_accuracy_after": _accuracy(state, state.accept),
    "credit": [
      {"card": c.card, "readers": c.readers, "with": c.with_card, "without": c.without_card} for c in credits
    ],
    "duplicates": pairs,
    "applied": kept,
    "rolled_back": rolled_back,
    "refused": refused,
    "replies": asked.replies,
    "errors": asked.errors,
  }


# ---- the resumable build ----------------------------------------------------------------------------

STATE, TREE, AUDIT, LOG = "build_state.json", "tree.json", "tree.md", "build_log.jsonl"


def learn_tree(
  learner: Learner,
  teach: Sequence[data.Problem],
  accept: Sequence[data.Problem],
  domains: Mapping[str, str],
  start: cards.EpistemicTree,
  progress: dict | None = None,
  commit: Callable[[cards.EpistemicTree, dict, dict], None] | None = None,
) -> cards.EpistemicTree:
  """ADD sweeps then REFINE rounds from `start` on explicit teaching / acceptance splits.

  `progress` (the resumable part of the state: sweep, cells done, failures shown, REFINE rounds)
  is updated in place; `commit(tree, progress, log)` is called after every cell and round.
  """
  progress = progress if progress is not None else {}
  progress.setdefault("sweep", 0)
  progress.setdefault("cells_done", [])
  progress.setdefault("kept_in_sweep", 0)
  progress.setdefault("add_done", False)
  progress.setdefault("shown", {})
  progress.setdefault("refine_done", 0)
  progress.setdefault("teacher_calls", 0)
  commit = commit or (lambda tree, progress, log: None)
  problems = sorted([*teach, *accept], key=lambda p: p.id)
  solved = learner.solve(problems, domains, start, desc="learn: solve")
  state = State(start, {s.id: s for s in solved}, list(teach), list(accept), domains)
  cfg = learner.config
  if "plan" not in progress:  # fixed once, from the start tree: every layout plans the same calls
    plan = {cell: cell_failures(state, cell) for cell in learner.cells()}
    progress["plan"] = {cell: ids for cell, ids in plan.items() if ids}
  while not progress["add_done"]:
    bar = tqdm.tqdm(list(progress["plan"]), desc=f"add: sweep {progress['sweep'] + 1}", unit="cell")
    for cell in bar:
      if cell in progress["cells_done"]:
        continue
      bar.set_postfix_str(cell)
      log = add_cell(learner, state, cell, progress["plan"][cell], progress["shown"], progress["sweep"])
      progress["kept_in_sweep"] += sum(c["accepted"] for c in log["cards"])
      progress["teacher_calls"] += log["teacher_calls"]
      progress["cells_done"].append(cell)
      log.update(sweep=progress["sweep"] + 1, accept_accuracy=_accuracy(state, state.accept))
      commit(state.tree, progress, log)
    progress["sweep"] += 1
    done = progress["kept_in_sweep"] == 0 or progress["sweep"] >= cfg.max_sweeps
    progress.update(cells_done=[], kept_in_sweep=0, add_done=done)
    commit(state.tree, progress, {"phase": "sweep", "sweep": progress["sweep"], "add_done": done})
  while progress["refine_done"] < cfg.refine_rounds:
    log = refine(learner, state, progress["refine_done"])
    progress["refine_done"] += 1
    commit(state.tree, progress, {**log, "round": progress["refine_done"]})
  return state.tree


def build(
  learner: Learner,
  problems: Sequence[data.Problem],
  domains: Mapping[str, str],
  workdir: str,
  start: cards.EpistemicTree,
) -> cards.EpistemicTree:
  """ADD then REFINE on the training `problems` (split by `split`) into `workdir`; resumes from
  `build_state.json`.

  The state file (tree + progress) is the one atomic commit point, written after every cell and
  every REFINE round; `tree.json` and the Markdown audit `tree.md` are exported from it. Every
  cell's, sweep's and round's outcome is appended to `build_log.jsonl`. A resumed build re-solves
  the training problems with the saved tree (same seeds: the same solutions) and continues.
  """
  os.makedirs(workdir, exist_ok=True)
  state_path = os.path.join(workdir, STATE)
  teach, accept = split(problems, learner.config, learner.seed)
  if os.path.exists(state_path):
    saved = rundir.read_json(state_path)
    tree = cards.EpistemicTree.from_json(saved["tree"], start.count_tokens, where=state_path)
    progress = saved["progress"]
  else:
    tree, progress = start, {"teach": [p.id for p in teach], "accept": [p.id for p in accept]}
    rundir.append_jsonl(os.path.join(workdir, LOG), [{"phase": "split", **progress}])

  def commit(tree: cards.EpistemicTree, progress: dict, log: dict) -> None:
    rundir.append_jsonl(os.path.join(workdir, LOG), [log])
    rundir.write_json(state_path, {"progress": progress, "tree": tree.to_json()})
    tree.save(os.path.join(workdir, TREE))
    tree.save_markdown(os.path.join(workdir, AUDIT))

  if not (progress.get("add_done") and progress.get("refine_done", 0) >= learner.config.refine_rounds):
    tree = learn_tree(learner, teach, accept, domains, tree, progress, commit)
  tree.save(os.path.join(workdir, TREE))
  tree.save_markdown(os.path.join(workdir, AUDIT))
  return tree
