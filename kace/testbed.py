"""A latent-convention maths testbed: problems whose gold answer depends on knowledge only a card gives.

The CPU-scale synthetic benchmark (kace.synthetic) has answers that never depend on the prompt's
notes, so a solver trained on it ignores cards and learned trees cannot change accuracy. Here every
(domain, level >= 2) block has a hidden *convention* from a declared hypothesis set H ("add k to the
result", "multiply the result by k", "report the result as is") that turns an easy base answer into
the gold answer. A convention can be inferred from (problem, gold) pairs: the base answer is a
one-step computation written in the question, so gold = h(base) singles out the members of H that
agree. Level 1 has no convention (the identity), so those problems are solved without context.

Every question names its *kind* word and a card states the convention of one kind word. Three surface
forms (`FORMS`): "short" (question "total: 3 + 4", card "total: add 3"), "long" (question "total:
What is 3 + 4?", card "total problems: add 3 to the result.") and "keyed" (the default; question as
"short", card "addthree=total"). In the keyed form each card is one token of the solver's vocabulary
and its completion starts with two more, the key "=total" and the rule "addthree" (`single_tokens`):
having written its question's key, the solver looks up the card token whose kind is that key's and
writes its rule, one lookup in one attention layer. The trained solver
(`kace.synthetic.ensure_testbed_solver`) applies the card whose kind matches its question and ignores
the others; with no card it guesses a convention (level-1 kinds: the identity), so samples disagree
and problems climb the tiers. `kace.scripted` is a program that does exactly this (the "scripted"
solver), for telling which results a mechanism produces and which the construction does.

Variants (`TestbedConfig.variant`):
- "v1" (the default, the registered comparison): one kind word per (domain, level) (`KINDS`), so a
  card names its block and a card in the wrong block is a distractor, not a poison.
- "conflict" (testbed v2): at each level >= 2 the three domains share one kind word
  (`CONFLICT_KINDS`) and hold different rules for it, so only the domain axis says which card is
  right and a pooled playbook holds conflicting cards; a share `null_fraction` of the level >= 2
  problems follow a rule of their own that no card states (null problems); and the oracle teacher's
  noise writes another block's rule for the same kind word (`rules_of_kinds`), a plausible wrong card.
  Conflicts are made across domains only: the tier a card is read at is a problem's empirical exit
  tier (where its samples first agree), not a property of the problem, so no hidden rule can differ by
  tier in a way a problem's text could carry.

Evaluated blocks draw their conventions from `TEST_H`. A solver trained on `TRAIN_H` only would have
to read constants it never saw (held-out constants); the tiny solver cannot, so by default it is
trained on all of H with each kind's rule drawn at random per example: no kind has a rule it could
know without a card, but it has seen the evaluated rules' wording (docs/kace.md).

Controls (`TestbedConfig.control`): "identity" (every convention is the identity; registered to show
`kace` > `tiered` all the same, since the solver guesses without a card and an "as is" card is
knowledge it lacks), "shared" (a domain's level-3 kind has its level-2 convention) and "level1"
(v1 only: level-1 kinds have a convention too; those problems mostly exit at ES, which reads no card,
exposing that ES exits are never learned from). See docs/kace.md ("The latent-convention testbed").
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Mapping, Sequence

from kace import data

DOMAINS = ("algebra", "number_theory", "combinatorics")
LEVELS = (1, 2, 3)
SUBJECT = {"algebra": "Algebra", "number_theory": "Number Theory", "combinatorics": "Counting & Probability"}

# One kind word per (domain, level), written at the start of every question.
KINDS: dict[tuple[str, int], str] = {
  ("algebra", 1): "sum",
  ("algebra", 2): "total",
  ("algebra", 3): "tally",
  ("number_theory", 1): "mod",
  ("number_theory", 2): "rest",
  ("number_theory", 3): "residue",
  ("combinatorics", 1): "product",
  ("combinatorics", 2): "count",
  ("combinatorics", 3): "ways",
}
KIND_OF_WORD = {word: cell for cell, word in KINDS.items()}
# Testbed v2 ("conflict"): one kind word per level, the same in every domain, each domain with its own
# rule for it, so a card's kind word does not say which block it is right in (docs/kace.md,
# "Testbed v2"). The words are v1's algebra words, so every card stays one of the solver's tokens.
CONFLICT_KINDS: dict[tuple[str, int], str] = {
  (domain, level): KINDS[(domain, 1)] if level == 1 else KINDS[("algebra", level)]
  for domain in DOMAINS
  for level in LEVELS
}
VARIANTS = ("v1", "conflict")

CONTROLS = ("none", "identity", "shared", "level1")
CARD_TYPE = "convention"
FORMS = ("short", "long", "keyed")
COMPLETIONS = ("rule_first", "working", "card_first")
NUMBER_WORDS = {
  1: "one",
  2: "two",
  3: "three",
  4: "four",
  5: "five",
  6: "six",
  7: "seven",
  8: "eight",
  9: "nine",
}


def check_form(form: str) -> str:
  if form not in FORMS:
    raise ValueError(f"testbed form must be one of {FORMS}, got {form!r}")
  return form


@dataclasses.dataclass(frozen=True, order=True)
class Convention:
  """A member of H: `op` "id" (the identity), "add" (x + k) or "mul" (x * k)."""

  op: str
  k: int = 0

  def __post_init__(self):
    if self.op not in ("id", "add", "mul"):
      raise ValueError(f"convention op must be id, add or mul, got {self.op!r}")

  def apply(self, x: int) -> int:
    return x if self.op == "id" else x + self.k if self.op == "add" else x * self.k

  def working(self, x: int) -> str:
    """The solver's completion for base answer `x`: the convention written out, then the boxed
    answer, so the last step is a one-operator computation on numbers already in the text."""
    step = f"{x}" if self.op == "id" else f"{x} {'+' if self.op == 'add' else '*'} {self.k}"
    return f"{step} -> \\boxed{{{self.apply(x)}}}"

  def completion(self, x: int, style: str, form: str = "short", kind: str | None = None) -> str:
    """The solver's training completion for base answer `x`: `working`; with style "rule_first"
    the rule as the card states it first ("add 3: 7 + 3 -> \\boxed{10}"), so the lookup of the
    card is its own step, a copy, before any arithmetic; with "card_first" the whole card of the
    question's `kind` first; in the keyed form its key, then its rule ("=totaladdthree: 7 + 3 ->
    \\boxed{10}"), the rule read from the card token of the key's kind."""
    if style not in COMPLETIONS:
      raise ValueError(f"completion style must be one of {COMPLETIONS}, got {style!r}")
    if style == "card_first":
      if kind is None:
        raise ValueError("a card_first completion needs the question's kind")
      card = f"{card_key(kind)}{self.describe(form)}" if form == "keyed" else card_text(kind, self, form)
      return f"{card}: {self.working(x)}"
    return f"{self.describe(form)}: {self.working(x)}" if style == "rule_first" else self.working(x)

  def describe(self, form: str = "short") -> str:
    if check_form(form) == "short":
      return "as is" if self.op == "id" else f"add {self.k}" if self.op == "add" else f"times {self.k}"
    if form == "keyed":
      return "asis" if self.op == "id" else f"{'add' if self.op == 'add' else 'times'}{NUMBER_WORDS[self.k]}"
    if self.op == "id":
      return "report the result as is"
    return f"add {self.k} to the result" if self.op == "add" else f"multiply the result by {self.k}"


IDENTITY = Convention("id")
# The declared hypothesis set H, and its split into training and evaluated conventions. Constants
# are held out per operation: the evaluated "add 3 / 6 / 9" are not in TRAIN_H, while 3, 6 and 9
# occur there as multipliers. A 2-layer solver trained on TRAIN_H alone does not read an unseen
# constant from a card (it answers with the nearest seen one; measured in docs/kace.md), so the
# default solver trains on all of H (kace.synthetic.TestbedSolverConfig.hold_out).
TRAIN_H = (
  IDENTITY,
  *(Convention("add", k) for k in (1, 2, 4, 5, 7, 8)),
  *(Convention("mul", k) for k in (2, 3, 4, 6, 9)),
)
TEST_H = tuple(Convention("add", k) for k in (3, 6, 9))
H = tuple(sorted(set(TRAIN_H) | set(TEST_H)))


def card_text(kind: str, convention: Convention, form: str = "short") -> str:
  """The card stating `convention` for problems of `kind` (what the oracle writes and the solver reads)."""
  if check_form(form) == "short":
    return f"{kind}: {convention.describe(form)}"
  if form == "keyed":
    return f"{convention.describe(form)}{card_key(kind)}"
  return f"{kind} problems: {convention.describe(form)}."


def card_key(kind: str) -> str:
  """The keyed form's key of `kind`'s card ("=total"): one token, not the question's kind word."""
  return f"={kind}"


def single_tokens(form: str) -> tuple[str, ...]:
  """Strings the solver's tokenizer must hold as single tokens for `form`: the keyed form's rules, card
  keys and cards (each kind with each member of H); none for the other forms.

  Why (docs/kace.md, builds 9-12): with a card as two or more tokens, the key's and the rule's, the
  solver must attend to the rule *because of* its neighbour, a composition of two attention layers;
  the 2-layer solvers did not learn it and copied the rule most cards hold. With every card one
  token whose embedding holds both its kind and its rule, finding the card of the key's kind and
  reading its rule is one attention lookup. The completion writes key and rule as two tokens of
  their own, so the solver outputs one of 9 keys, then one of 21 rules, not one of 189 cards (a
  build whose completion copied the card token itself copied none)."""
  if check_form(form) != "keyed":
    return ()
  return (
    *(h.describe(form) for h in H),
    *(card_key(kind) for kind in KINDS.values()),
    *(card_text(kind, h, form) for kind in KINDS.values() for h in H),
  )


_CARD_RE = re.compile(
  r"(\w+) problems: (report the result as is|add (\d+) to the result|multiply the result by (\d+))"
)
_SHORT_CARD_RE = re.compile(r"(\w+): (as is|add (\d+)|times (\d+))\b")
_WORD_NUMBERS = {word: k for k, word in NUMBER_WORDS.items()}
_KEYED_CARD_RE = re.compile(
  rf"\b(asis|add({'|'.join(_WORD_NUMBERS)})|times({'|'.join(_WORD_NUMBERS)}))=(\w+)"
)


def parse_card(text: str) -> tuple[str, Convention] | None:
  """(kind, convention) of a card in any of `card_text`'s forms, else None."""
  found = cards_in(text)
  return found[0] if found else None


def cards_in(text: str) -> list[tuple[str, Convention]]:
  """(kind, convention) of every card in `text`, in the order written; a text in the long or short
  form is read in that form only (the keyed form's cards when it holds neither)."""
  matches = [(m, 1, 3, 4) for m in _CARD_RE.finditer(text)] or [
    (m, 1, 3, 4) for m in _SHORT_CARD_RE.finditer(text)
  ]
  matches = matches or [(m, 4, 2, 3) for m in _KEYED_CARD_RE.finditer(text)]
  number = lambda s: int(s) if s.isdigit() else _WORD_NUMBERS[s]
  out = []
  for m, k, a, x in matches:
    add, mul = m.group(a), m.group(x)
    rule = Convention("add", number(add)) if add else Convention("mul", number(mul)) if mul else IDENTITY
    out.append((m.group(k), rule))
  return out


# ---- base problems ----------------------------------------------------------------------------------

# Base computations a tiny model learns almost always (kace.synthetic's level-2 families): one-digit
# sums, small remainders, small products. The operator written in the question says which.
OPS = {"+": lambda a, b: a + b, "mod": lambda a, b: a % b, "*": lambda a, b: a * b}
OP_OF_DOMAIN = {"algebra": "+", "number_theory": "mod", "combinatorics": "*"}
OPERANDS = {
  "algebra": ((0, 9), (0, 9)),
  "number_theory": ((1, 20), (2, 5)),
  "combinatorics": ((2, 9), (2, 5)),
}

_QUESTION_RE = re.compile(r"(\w+): (?:What is )?(\d+) (\+|mod|\*) (\d+)")


def question(kind: str, a: int, op: str, b: int, form: str = "short") -> str:
  """The question text; the keyed form's questions are the short form's."""
  return f"{kind}: What is {a} {op} {b}?" if check_form(form) == "long" else f"{kind}: {a} {op} {b}"


def parse_question(text: str) -> tuple[str, int] | None:
  """(kind, base answer) of a testbed question (either form) found in `text`, computed
  symbolically; else None."""
  m = _QUESTION_RE.search(text)
  if not m:
    return None
  a, op, b = int(m.group(2)), m.group(3), int(m.group(4))
  return m.group(1), OPS[op](a, b)


def draw_base(domain: str, rng: random.Random) -> tuple[int, str, int]:
  (lo_a, hi_a), (lo_b, hi_b) = OPERANDS[domain]
  return rng.randint(lo_a, hi_a), OP_OF_DOMAIN[domain], rng.randint(lo_b, hi_b)


# ---- the testbed -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class TestbedConfig:
  """Which testbed: its conventions (by seed and control) and its problems.

  Attributes:
    seed: the blocks' conventions and the problems.
    per_cell: distinct problems drawn per (domain, level) before the split.
    test_per_cell: of those, evaluated per (domain, level); the rest are training problems.
    control: "none" (a domain's level-2 and level-3 conventions differ), "identity", "shared" or "level1"
      (the module docstring).
    form: the questions' and cards' surface form (`FORMS`); the solver must be
      trained on the same one (kace.config takes it from the solver's config).
  """

  seed: int = 0
  per_cell: int = 40
  test_per_cell: int = 12
  control: str = "none"
  form: str = "keyed"
  variant: str = "v1"
  null_fraction: float = 0.25

  def __post_init__(self):
    check_form(self.form)
    if self.control not in CONTROLS:
      raise ValueError(f"testbed.control must be one of {CONTROLS}, got {self.control!r}")
    if self.variant not in VARIANTS:
      raise ValueError(f"testbed.variant must be one of {VARIANTS}, got {self.variant!r}")
    if self.variant == "conflict" and self.control == "level1":
      raise ValueError("testbed.control='level1' is not defined for testbed.variant='conflict'")
    if not 0 <= self.null_fraction < 1:
      raise ValueError(f"testbed.null_fraction must be in [0, 1), got {self.null_fraction}")
    if not 0 < self.test_per_cell < self.per_cell:
      raise ValueError(f"testbed needs 0 < test_per_cell < per_cell, got {self}")

  def conventions(self) -> dict[tuple[str, int], Convention]:
    """The hidden convention of every (domain, level), from `TEST_H` (held-out constants)."""
    return conventions(self.seed, self.control, self.variant)

  def kinds(self) -> dict[tuple[str, int], str]:
    """The kind word of every (domain, level): `KINDS` (v1) or `CONFLICT_KINDS`."""
    return CONFLICT_KINDS if self.variant == "conflict" else KINDS

  def rules_of_kinds(self) -> dict[str, tuple[Convention, ...]]:
    """{kind word: the distinct rules its blocks hold} for a variant whose kind words are shared
    (the oracle teacher's plausible wrong cards); {} for v1, whose noise draws from H."""
    if self.variant != "conflict":
      return {}
    out: dict[str, set[Convention]] = {}
    for cell, rule in self.conventions().items():
      out.setdefault(self.kinds()[cell], set()).add(rule)
    return {kind: tuple(sorted(rules)) for kind, rules in out.items()}

  def null_ids(self) -> set[str]:
    """Ids of the null problems (variant "conflict"): level >= 2 problems whose gold follows a rule of
    their own, not their block's, so no card helps them more than a lucky guess."""
    return {p.id for p, null in _draw(self) if null}

  def problems(self) -> tuple[list[data.Problem], list[data.Problem]]:
    """(train, test); no test question occurs in train."""
    return generate(self)


def conventions(seed: int, control: str = "none", variant: str = "v1") -> dict[tuple[str, int], Convention]:
  """Each (domain, level)'s convention: identity at level 1 (except control "level1"), and within a
  domain different conventions at levels 2 and 3 (the same under control "shared"). Variant
  "conflict": at each level >= 2 the three domains share a kind word (`CONFLICT_KINDS`) and hold the
  three rules of `TEST_H`, one each, so every kind word means three different rules."""
  if variant == "conflict":
    rng = random.Random(f"testbed-conflict-conventions-{seed}")
    level2, shift = rng.sample(TEST_H, len(DOMAINS)), rng.choice((1, 2))
    out = {}
    for i, domain in enumerate(DOMAINS):
      out[(domain, 1)] = IDENTITY
      out[(domain, 2)] = level2[i]
      out[(domain, 3)] = level2[i] if control == "shared" else level2[(i + shift) % len(DOMAINS)]
  else:
    rng = random.Random(f"testbed-conventions-{seed}")
    out = {}
    for domain in DOMAINS:
      first, second = rng.sample(TEST_H, 2)
      third = rng.choice([h for h in TEST_H if h not in (first, second)])
      out[(domain, 1)] = third if control == "level1" else IDENTITY
      out[(domain, 2)] = first
      out[(domain, 3)] = first if control == "shared" else second
  if control == "identity":
    return {cell: IDENTITY for cell in out}
  return out


def generate(config: TestbedConfig) -> tuple[list[data.Problem], list[data.Problem]]:
  """(train, test) problems of every (domain, level), deterministic by `config.seed`."""
  train, test = [], []
  for problem, _ in _draw(config):
    (test if int(problem.id.rsplit("/", 1)[1]) < config.test_per_cell else train).append(problem)
  return sorted(train, key=lambda p: p.id), sorted(test, key=lambda p: p.id)


def _draw(config: TestbedConfig) -> list[tuple[data.Problem, bool]]:
  """Every problem, numbered within its (domain, level) (the first `test_per_cell` are evaluated),
  and whether it is a null problem (variant "conflict": a share `null_fraction` of the level >= 2
  problems, each with a rule of H drawn for it alone, never its block's)."""
  rng = random.Random(f"testbed-problems-{config.seed}")
  rules, conflict = config.conventions(), config.variant == "conflict"
  out = []
  for (domain, level), kind in config.kinds().items():
    seen: dict[str, tuple[int, bool]] = {}
    block = rules[(domain, level)]
    for _ in range(50 * config.per_cell):
      if len(seen) == config.per_cell:
        break
      a, op, b = draw_base(domain, rng)
      rule, null = block, False
      if conflict and level > 1 and rng.random() < config.null_fraction:
        rule, null = rng.choice([h for h in H if h != block]), True
      seen.setdefault(question(kind, a, op, b, config.form), (rule.apply(OPS[op](a, b)), null))
    items = sorted(seen.items())
    rng.shuffle(items)
    for n, (q, (answer, null)) in enumerate(items):
      problem = data.Problem(
        id=f"testbed/{domain}/L{level}/{n}",
        question=q,
        answer=str(answer),
        source="testbed",
        subject=SUBJECT[domain],
        domain=domain,
        level=level,
      )
      out.append((problem, null))
  return out


def true_cards(
  rules: Mapping[tuple[str, int], Convention],
  levels: Sequence[int] = (2, 3),
  form: str = "short",
  kinds: Mapping[tuple[str, int], str] = KINDS,
) -> dict:
  """{(domain, level): card text} of the blocks' conventions (the gates' and the controls' cards)."""
  return {
    cell: card_text(kinds[cell], rule, form) for cell, rule in sorted(rules.items()) if cell[1] in levels
  }


def fit(pairs: Sequence[tuple[int, int]], hypotheses: Sequence[Convention] = H) -> tuple[Convention, int]:
  """The member of `hypotheses` that agrees with the most (base, gold) pairs, and how many it agrees
  with; ties go to the earliest member (H is sorted, so the choice is deterministic)."""
  best, best_n = hypotheses[0], -1
  for h in hypotheses:
    n = sum(h.apply(base) == gold for base, gold in pairs)
    if n > best_n:
      best, best_n = h, n
  return best, best_n
