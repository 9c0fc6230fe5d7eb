"""Learning an Epistemic Tree offline: ADD (teacher cards per block) and REFINE (curator operations).

ADD is block-local, the paper's block-coordinate step: the training split is solved with the
current tree; the problems whose exit stage read block b are b's own problems; a teacher distils
what its failed traces were missing into typed cards; the cards are kept only if accuracy on b's
own problems does not drop when they are re-solved with them. REFINE re-solves the training split
with the provisional tree (the distribution the updated policy induces), attributes each stage's
outcome to the cards that were in its prompt, and lets a curator EDIT, RELOCATE, DEMOTE, DELETE or
MERGE cards; a MERGE must join cards a sentence embedder finds near-duplicate.

Model replies are untrusted: every reply is parsed against a schema, a malformed one is asked
again (`LearnConfig.retries` times, with fresh seeds), then recorded and skipped. Nothing a teacher
or curator writes can crash a build. `build` runs both phases into a run directory, saving the
tree and the list of finished blocks in one atomic file after every block, so a killed build
resumes where it stopped. Prompts, defaults and the attribution rule: docs/kace.md ("Learning").
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tqdm

from kace import answers, cards, data, embed, projection, solve, tiers
from lm import generators, rundir, seeding
from lm import text as text_lib

TEACHER_TEMPLATE = """You are building a knowledge base for a maths solver. The solver got the problems \
below wrong; they belong to {block}.

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
(tier, domain): tiers {tiers} from easiest to hardest, domains {domains}; a universal card is read at every \
tier. A card is read by problems that reach its tier in its domain.

Cards, with their use on training problems (uses: stages that read it; helpful / harmful: those stages \
mostly right / mostly wrong):
{cards}

Near-duplicates found by a sentence embedder (only such cards may be merged):
{duplicates}

Propose operations that keep the cards useful and non-redundant, each with a short reason:
{{"op": "edit", "id": "card-0001", "text": "..."}}, {{"op": "relocate", "id": "...", "tier": "HS", "domain": \
"algebra"}} (tier and domain null: universal), {{"op": "demote", "id": "..."}} (one tier easier), \
{{"op": "delete", "id": "..."}}, {{"op": "merge", "ids": ["...", "..."], "text": "..."}}.
Reply with JSON only: {{"operations": [...]}} (an empty list if nothing should change)."""


class ReplyError(ValueError):
  """A model reply that does not match the schema its prompt asked for."""


@dataclasses.dataclass(frozen=True)
class LearnConfig:
  """ADD / REFINE options (config section `learn`; defaults documented in docs/kace.md).

  Attributes:
    distill: "teacher" (typed cards from the teacher role) or "reflection" (the solver's own
      reflection on one failed attempt becomes a card verbatim: the `raw_reflections` ablation).
    failures_per_prompt: failed problems shown to the teacher per block.
    max_cards: cards a teacher reply may add to a block.
    attempt_chars: characters of a failed attempt shown (its end, where the answer is).
    retries: extra asks after a malformed reply, before it is recorded and skipped.
    refine_rounds: REFINE passes (each: re-solve, attribute, one curator call).
    duplicate_threshold: cosine similarity at which two cards count as near-duplicates.
    helpful_share: a stage is "helpful" to its cards when at least this share of its samples is right.
    max_card_chars: longer card texts are rejected by the parser.
  """

  distill: str = "teacher"
  failures_per_prompt: int = 4
  max_cards: int = 3
  attempt_chars: int = 600
  retries: int = 2
  refine_rounds: int = 1
  duplicate_threshold: float = 0.85
  helpful_share: float = 0.5
  max_card_chars: int = 600

  def __post_init__(self):
    if self.distill not in ("teacher", "reflection"):
      raise ValueError(f"learn.distill must be 'teacher' or 'reflection', got {self.distill!r}")


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


def apply(
  tree: cards.EpistemicTree, op: Operation, similar: Callable[[Sequence[str]], bool]
) -> cards.EpistemicTree:
  """The tree after `op` (history records the curator's reason). Raises KeyError / ValueError
  (including BudgetError) when the operation does not fit the tree; `similar(ids)` must accept a
  MERGE's cards as near-duplicates."""
  reason = f"curator: {op.reason}".strip()
  card_id = op.ids[0]
  if op.op == "edit":
    return tree.edit(card_id, op.text, reason)
  if op.op == "relocate":
    return tree.relocate(card_id, op.tier, op.domain, reason)
  if op.op == "demote":
    return tree.demote(card_id, reason)
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
  """Everything ADD and REFINE call: the roles, the grader, and how the solver is run."""

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

  def solve(self, problems: Sequence[data.Problem], domains: Mapping[str, str], tree, desc: str = ""):
    """The solver's solutions reading `tree` (one batched call per stage); a bar when `desc` is set."""
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


def block_of(tree: cards.EpistemicTree, solution: solve.Solution) -> tuple[str, str] | None:
  """The block a solved problem belongs to: the one its exit stage read (None when that stage read
  no cards, e.g. an ES exit, since no card can reach such a problem)."""
  tier = solution.stages[-1].cards_tier if solution.stages else None
  return None if tier is None else tree.resolve(tier, solution.domain)


def _block_name(tree: cards.EpistemicTree, key: tuple[str, str]) -> str:
  tier = "every tier" if key[0] == cards.ANY else f"difficulty tier {key[0]}"
  domain = "every domain" if key[1] == cards.ANY else f"the domain {key[1].replace('_', ' ')}"
  return f"{tier} in {domain}"


def _attempt(solution: solve.Solution, chars: int) -> tuple[str, str | None]:
  """The text (its last `chars` characters) and answer of the solution's last wrong sample."""
  wrong = [s for st in solution.stages for s in st.samples if not s.correct] or [
    solution.stages[-1].samples[-1]
  ]
  return wrong[-1].text[-chars:], wrong[-1].answer


def teacher_prompt(tree, key, shown, problems: Mapping[str, data.Problem], config: LearnConfig) -> str:
  """The teacher's prompt for block `key`, showing the failed solutions `shown`."""
  parts = []
  for i, s in enumerate(shown):
    text, _ = _attempt(s, config.attempt_chars)
    answers_seen = ", ".join(sorted({str(x.answer) for st in s.stages for x in st.samples}))
    parts.append(
      f"### Problem {i + 1}\n{problems[s.id].question}\nCorrect answer: {s.gold}\n"
      f"Solver's answers: {answers_seen}\nOne attempt:\n{text}"
    )
  existing = "\n".join(cards.render_card(c) for c in tree.block(*key)) or "(none)"
  return TEACHER_TEMPLATE.format(
    block=_block_name(tree, key), failures="\n\n".join(parts), existing=existing, max_cards=config.max_cards
  )


def reflection_prompt(solution: solve.Solution, problem: data.Problem, config: LearnConfig) -> str:
  text, answer = _attempt(solution, config.attempt_chars)
  return REFLECTION_TEMPLATE.format(
    question=problem.question, answer=answer, gold=solution.gold, attempt=text
  )


def _accuracy(solutions: Sequence[solve.Solution]) -> float:
  return float(np.mean([s.correct for s in solutions])) if solutions else 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockResult:
  """What ADD did for one block (one line of the build log)."""

  block: str
  problems: int
  failed: int
  proposed: list
  added: list
  rejected: list  # (card text, error) for cards that did not fit the budget
  accuracy_before: float
  accuracy_after: float | None
  accepted: bool
  replies: list
  errors: list


def distill(learner: Learner, tree, key, own, problems) -> tuple[list, list, list]:
  """Candidate cards for block `key` from its failed solutions.

  Returns ([(type, text, source solutions)], replies, errors): a teacher's cards come from every
  failure its prompt showed; a raw reflection from the one failure it reflects on.
  """
  failed = [s for s in own if not s.correct]
  cfg = learner.config
  if cfg.distill == "teacher":
    groups = [failed[: cfg.failures_per_prompt]]
    prompts = [teacher_prompt(tree, key, groups[0], problems, cfg)]
    parse = lambda r: parse_cards(r, cfg.max_cards, cfg.max_card_chars)
    role = learner.teacher
  else:
    groups = [[s] for s in failed[: cfg.max_cards]]
    prompts = [reflection_prompt(s, problems[s.id], cfg) for (s,) in groups]
    parse = lambda r: parse_reflection(r, cfg.max_card_chars)
    role = learner.solver
  asked = ask(role, prompts, parse, learner.role_params, retries=cfg.retries, seed=learner.seed)
  proposed = [(t, text, group) for a, group in zip(asked, groups, strict=True) for t, text in a.value or ()]
  return proposed, [r for a in asked for r in a.replies], [e for a in asked for e in a.errors]


def add_block(learner: Learner, tree, key, own, problems, domains) -> tuple[cards.EpistemicTree, BlockResult]:
  """ADD for one block: distil its failures into cards, keep them if its own accuracy does not drop."""
  proposed, replies, errors = distill(learner, tree, key, own, problems)
  candidate, added, rejected = tree, [], []
  for card_type, text, sources in proposed:
    provenance = cards.Provenance(
      tuple(s.id for s in sources),
      tuple(f"{s.id}#{s.stages[-1].stage}" for s in sources),
      f"add:{learner.config.distill}",
    )
    try:
      candidate, card = candidate.add(text, card_type, *key, provenance, reason=f"ADD {'/'.join(key)}")
      added.append(card.id)
    except ValueError as e:  # BudgetError, or a text the tree refuses
      rejected.append((text, str(e)))
  before = _accuracy(own)
  after, accepted = None, False
  if added:
    after = _accuracy(learner.solve([problems[s.id] for s in own], domains, candidate))
    accepted = after >= before
  failed = sum(not s.correct for s in own)
  result = BlockResult(
    block="/".join(key),
    problems=len(own),
    failed=failed,
    proposed=[(t, text) for t, text, _ in proposed],
    added=added,
    rejected=rejected,
    accuracy_before=before,
    accuracy_after=after,
    accepted=accepted,
    replies=replies,
    errors=errors,
  )
  return (candidate if accepted else tree), result


# ---- REFINE ---------------------------------------------------------------------------------------


def attribute(tree: cards.EpistemicTree, solutions: Sequence[solve.Solution], helpful_share: float):
  """Counts, per card, the stages whose prompt held it (uses) and whether those stages were mostly
  right (helpful) or mostly wrong (harmful); cards no longer live are ignored."""
  live = {c.id for c in tree.cards}
  for s in solutions:
    for st in s.stages:
      right = np.mean([x.correct for x in st.samples]) >= helpful_share if st.samples else False
      for card_id in st.cards:
        if card_id in live:
          tree = tree.count(card_id, uses=1, helpful=int(right), harmful=int(not right))
  return tree


def curator_prompt(tree: cards.EpistemicTree, duplicates: Sequence[tuple[str, str, float]]) -> str:
  lines = [
    f"{c.id} | {c.location} | {c.type} | uses {c.counters.uses}, helpful {c.counters.helpful}, "
    f"harmful {c.counters.harmful} | {c.text}"
    for c in tree.cards
  ]
  dups = "\n".join(f"{a} ~ {b} ({sim:.2f})" for a, b, sim in duplicates) or "(none)"
  return CURATOR_TEMPLATE.format(
    tiers=", ".join(tree.tiers),
    domains=", ".join(tree.domains),
    cards="\n".join(lines) or "(none)",
    duplicates=dups,
  )


def refine(
  learner: Learner, tree, problems: Sequence[data.Problem], domains
) -> tuple[cards.EpistemicTree, dict]:
  """One REFINE pass: re-solve, attribute, ask the curator, apply the valid operations."""
  solutions = learner.solve(problems, domains, tree, desc="refine: solve")
  tree = attribute(tree, solutions, learner.config.helpful_share)
  live = list(tree.cards)
  vecs = learner.embedder.embed([c.text for c in live]) if live else np.zeros((0, 1))
  index = {c.id: i for i, c in enumerate(live)}
  threshold = learner.config.duplicate_threshold
  pairs = [(live[i].id, live[j].id, sim) for i, j, sim in embed.near_duplicates(vecs, threshold)]

  def similar(ids: Sequence[str]) -> bool:
    if not all(i in index for i in ids):
      return False
    rows = vecs[[index[i] for i in ids]]
    return bool((rows[1:] @ rows[0] >= threshold).all())

  cfg = learner.config
  (asked,) = ask(
    learner.curator,
    [curator_prompt(tree, pairs)],
    lambda r: parse_operations(r, cfg.max_card_chars),
    learner.role_params,
    retries=cfg.retries,
    seed=learner.seed,
  )
  applied, refused = [], []
  for op in asked.value or ():
    try:
      tree = apply(tree, op, similar)
      applied.append(dataclasses.asdict(op))
    except (KeyError, ValueError) as e:
      refused.append({**dataclasses.asdict(op), "error": str(e)})
  log = {
    "accuracy": _accuracy(solutions),
    "duplicates": pairs,
    "applied": applied,
    "refused": refused,
    "replies": asked.replies,
    "errors": asked.errors,
  }
  return tree, log


# ---- the resumable build ----------------------------------------------------------------------------

STATE, TREE, AUDIT, LOG = "build_state.json", "tree.json", "tree.md", "build_log.jsonl"


def build(
  learner: Learner,
  problems: Sequence[data.Problem],
  domains: Mapping[str, str],
  workdir: str,
  start: cards.EpistemicTree,
) -> cards.EpistemicTree:
  """ADD over every block, then REFINE, into `workdir`; resumes from `build_state.json`.

  The state file (tree + finished blocks + phase) is the one atomic commit point, written after
  every block and every REFINE round; `tree.json` and the Markdown audit `tree.md` are exported
  from it. Every block's and round's outcome is appended to `build_log.jsonl`.
  """
  os.makedirs(workdir, exist_ok=True)
  state_path = os.path.join(workdir, STATE)
  if os.path.exists(state_path):
    state = rundir.read_json(state_path)
    tree = cards.EpistemicTree.from_json(state["tree"], start.count_tokens, where=state_path)
  else:
    state, tree = {"blocks_done": [], "refine_done": 0, "add_accuracy": None}, start
  by_id = {p.id: p for p in problems}

  def commit(tree: cards.EpistemicTree, log: dict) -> None:
    rundir.append_jsonl(os.path.join(workdir, LOG), [log])
    rundir.write_json(state_path, {**state, "tree": tree.to_json()})
    tree.save(os.path.join(workdir, TREE))
    tree.save_markdown(os.path.join(workdir, AUDIT))

  if len(state["blocks_done"]) < len(tree.blocks()) and state["refine_done"] == 0:
    solutions = learner.solve(problems, domains, tree, desc="add: solve")
    state["add_accuracy"] = _accuracy(solutions)
    own: dict[tuple[str, str], list] = {}
    for s in solutions:
      key = block_of(tree, s)
      if key is not None:
        own.setdefault(key, []).append(s)
    bar = tqdm.tqdm(tree.blocks(), desc="add: blocks", unit="block")
    for key in bar:
      name = "/".join(key)
      if name in state["blocks_done"]:
        continue
      bar.set_postfix_str(name)
      if any(not s.correct for s in own.get(key, ())):
        tree, result = add_block(learner, tree, key, own[key], by_id, domains)
        log = {"phase": "add", **dataclasses.asdict(result)}
      else:
        log = {"phase": "add", "block": name, "problems": len(own.get(key, ())), "failed": 0}
      state["blocks_done"].append(name)
      commit(tree, log)
  while state["refine_done"] < learner.config.refine_rounds:
    tree, log = refine(learner, tree, problems, domains)
    state["refine_done"] += 1
    commit(tree, {"phase": "refine", "round": state["refine_done"], **log})
  tree.save(os.path.join(workdir, TREE))
  tree.save_markdown(os.path.join(workdir, AUDIT))
  return tree
