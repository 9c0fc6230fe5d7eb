"""Knowledge cards and the Epistemic Tree that stores them by (tier, domain) block.

A card is a typed natural-language item (lemma, invariant, decomposition pattern, verification
rule, ... — the type set is open) learned from failed training traces. The tree keeps cards in
blocks keyed by (difficulty tier, coarse maths domain), plus universal cards that every projection
reads. Auditability is one of the paper's claims, so every card carries its provenance (which
problems and traces it came from), usage counters, and a history of every operation applied to
it; deleted and merged-away cards are retired, not forgotten.

The tree is immutable: every operation returns a new tree, so a learner can try a block update,
measure it, and keep or drop it (ADD's block-coordinate step) without undo logic.

Ablations are layouts, not special cases: `domains=(ANY,)` is the tier-only tree, `tiers=(ANY,)`
and `domains=(ANY,)` the single monolithic block (also an ACE-style playbook); a lookup on a
collapsed axis lands in its one block. The JSON format is documented in docs/kace.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kace.tiers import ES, HS, MS
from lm import rundir

ANY = "*"  # the single value of a collapsed axis (ablations without a tier or domain axis)
DEFAULT_TIERS = (ES, MS, HS)
DEFAULT_DOMAINS = ("algebra", "geometry", "combinatorics", "number_theory")
KNOWN_TYPES = ("lemma", "invariant", "decomposition", "verification_rule")  # open: others allowed
OPS = ("add", "edit", "relocate", "demote", "delete", "merge")
FORMAT = "kace-epistemic-tree"
VERSION = 1

TokenCounter = Callable[[str], int]


def estimate_tokens(text: str) -> int:
  """About one token per 4 characters (the usual BPE rule of thumb for English; LaTeX-heavy text
  runs somewhat higher). Pass a real tokenizer's count function where budgets must be exact."""
  return math.ceil(len(text) / 4)


@dataclasses.dataclass(frozen=True)
class Provenance:
  """Where a card came from: training problem ids, trace ids, and the producing step or role."""

  problems: tuple[str, ...] = ()
  traces: tuple[str, ...] = ()
  origin: str = ""  # e.g. "add:teacher", "refine:curator", "manual"

  def union(self, other: Provenance) -> Provenance:
    unique = lambda a, b: tuple(dict.fromkeys(a + b))
    origin = (
      self.origin if self.origin == other.origin else "+".join(filter(None, (self.origin, other.origin)))
    )
    return Provenance(unique(self.problems, other.problems), unique(self.traces, other.traces), origin)


@dataclasses.dataclass(frozen=True)
class Counters:
  """How often a card was in context, and how often that solve was right or wrong (REFINE)."""

  uses: int = 0
  helpful: int = 0
  harmful: int = 0

  def __add__(self, other: Counters) -> Counters:
    return Counters(self.uses + other.uses, self.helpful + other.helpful, self.harmful + other.harmful)


@dataclasses.dataclass(frozen=True)
class Edit:
  """One operation in a card's history; `before`/`after` are the changed text or location."""

  op: str
  time: str
  before: str | None
  after: str | None
  reason: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Card:
  """A typed knowledge item; `tier` and `domain` are both None for a universal card."""

  id: str
  type: str
  text: str
  tier: str | None
  domain: str | None
  provenance: Provenance = Provenance()
  counters: Counters = Counters()
  history: tuple[Edit, ...] = ()

  @property
  def universal(self) -> bool:
    return self.tier is None

  @property
  def location(self) -> str:
    """ "tier/domain" or "universal" (the form history entries record)."""
    return "universal" if self.universal else f"{self.tier}/{self.domain}"


def render_card(card: Card) -> str:
  """The card as one prompt line; budgets count tokens of exactly this text."""
  return f"- [{card.type}] {card.text}"


def fit_cards(
  cards: Iterable[Card], budget: int, count_tokens: TokenCounter = estimate_tokens
) -> tuple[Card, ...]:
  """The cards that fit in `budget` tokens, in order, skipping any that would overflow it.

  Skipping rather than stopping lets a long card give way to shorter later ones. A projection
  records exactly these cards as "in context" (REFINE attributes outcomes to them).
  """
  kept, used = [], 0
  for card in cards:
    cost = count_tokens(render_card(card) + "\n")
    if used + cost <= budget:
      kept.append(card)
      used += cost
  return tuple(kept)


def render_cards(cards: Iterable[Card], budget: int, count_tokens: TokenCounter = estimate_tokens) -> str:
  """Cards as prompt lines: those `fit_cards` keeps within `budget` tokens, in order."""
  return "\n".join(render_card(c) for c in fit_cards(cards, budget, count_tokens))


class BudgetError(ValueError):
  """An operation would push a block over its token budget."""


class TreeFormatError(ValueError):
  """A tree file does not match the schema; the message names the offending field."""


def _now() -> str:
  return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@dataclasses.dataclass(frozen=True)
class EpistemicTree:
  """Cards in (tier, domain) blocks plus universal cards, each block within `budget_tokens`.

  The universal cards have their own budget of `budget_tokens`, so a projection renders at most
  twice that. `count_tokens` (not saved) measures budgets; the default is `estimate_tokens`.
  """

  tiers: tuple[str, ...] = DEFAULT_TIERS
  domains: tuple[str, ...] = DEFAULT_DOMAINS
  budget_tokens: int = 1024
  cards: tuple[Card, ...] = ()
  retired: tuple[Card, ...] = ()
  next_id: int = 1
  count_tokens: TokenCounter = dataclasses.field(default=estimate_tokens, compare=False, repr=False)

  def __post_init__(self):
    for axis in ("tiers", "domains"):
      values = getattr(self, axis)
      if not values or len(set(values)) != len(values) or (ANY in values and len(values) > 1):
        raise ValueError(f"EpistemicTree.{axis} must be distinct names, or ({ANY!r},) alone: {values}")
    ids = [c.id for c in self.cards + self.retired]
    if len(set(ids)) != len(ids):
      raise ValueError(f"duplicate card ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    for card in self.cards:
      self._check_location(card.tier, card.domain, f"card {card.id}")

  # ---- reading --------------------------------------------------------------------------------

  def resolve(self, tier: str, domain: str) -> tuple[str, str]:
    """The stored block for a (tier, domain) lookup; collapsed axes map every value to ANY."""
    key = (ANY if self.tiers == (ANY,) else tier, ANY if self.domains == (ANY,) else domain)
    self._check_location(*key, f"block {tier}/{domain}")
    return key

  def blocks(self) -> list[tuple[str, str]]:
    """Every (tier, domain) block key, tiers outermost."""
    return [(t, d) for t in self.tiers for d in self.domains]

  def block(self, tier: str, domain: str) -> tuple[Card, ...]:
    key = self.resolve(tier, domain)
    return tuple(c for c in self.cards if (c.tier, c.domain) == key)

  def universal(self) -> tuple[Card, ...]:
    return tuple(c for c in self.cards if c.universal)

  def cards_for(self, tier: str, domain: str) -> tuple[Card, ...]:
    """What a (tier, domain) projection reads: the block's cards, then the universal cards."""
    return self.block(tier, domain) + self.universal()

  def card(self, card_id: str) -> Card:
    for c in self.cards:
      if c.id == card_id:
        return c
    raise KeyError(f"no live card {card_id!r} in the tree")

  def tokens(self, cards: Iterable[Card]) -> int:
    """Budget cost of cards, as `render_cards` would spend it."""
    return sum(self.count_tokens(render_card(c) + "\n") for c in cards)

  def over_budget(self) -> list[str]:
    """Locations ("tier/domain" or "universal") whose cards exceed the budget (e.g. after loading
    with a different token counter)."""
    groups = [(f"{t}/{d}", self.block(t, d)) for t, d in self.blocks()] + [("universal", self.universal())]
    return [name for name, cards in groups if self.tokens(cards) > self.budget_tokens]

  # ---- operations (each returns a new tree) ---------------------------------------------------

  def add(
    self,
    text: str,
    type: str,
    tier: str | None = None,
    domain: str | None = None,
    provenance: Provenance = Provenance(),
    reason: str = "",
  ) -> tuple[EpistemicTree, Card]:
    """Adds a card to block (tier, domain), or to the universal cards when both are None."""
    tier, domain = self._place(tier, domain)
    card_id, next_id = self._new_id()
    card = Card(
      id=card_id,
      type=_check_type(type),
      text=_check_text(text),
      tier=tier,
      domain=domain,
      provenance=provenance,
    )
    card = _record(card, "add", None, card.text, reason)
    tree = dataclasses.replace(self, cards=self.cards + (card,), next_id=next_id)
    return tree._within_budget(card), card

  def edit(self, card_id: str, text: str, reason: str = "") -> EpistemicTree:
    """Rewrites a card's text (EDIT)."""
    old = self.card(card_id)
    new = _record(dataclasses.replace(old, text=_check_text(text)), "edit", old.text, text.strip(), reason)
    return self._swap(old, new)._within_budget(new)

  def relocate(self, card_id: str, tier: str | None, domain: str | None, reason: str = "") -> EpistemicTree:
    """Moves a card to another block, or to the universal cards when tier and domain are None."""
    old = self.card(card_id)
    tier, domain = self._place(tier, domain)
    moved = dataclasses.replace(old, tier=tier, domain=domain)
    new = _record(moved, "relocate", old.location, moved.location, reason)
    return self._swap(old, new)._within_budget(new)

  def demote(self, card_id: str, reason: str = "") -> EpistemicTree:
    """Moves a card one tier down (HS → MS → ES), same domain (DEMOTE)."""
    old = self.card(card_id)
    if old.universal or self.tiers.index(old.tier) == 0:
      raise ValueError(f"card {card_id} at {old.location} has no lower tier to demote to")
    moved = dataclasses.replace(old, tier=self.tiers[self.tiers.index(old.tier) - 1])
    new = _record(moved, "demote", old.location, moved.location, reason)
    return self._swap(old, new)._within_budget(new)

  def delete(self, card_id: str, reason: str = "") -> EpistemicTree:
    """Retires a card (DELETE); it stays in `retired` with its history for the audit."""
    old = self.card(card_id)
    gone = _record(old, "delete", old.location, None, reason)
    return dataclasses.replace(
      self, cards=tuple(c for c in self.cards if c is not old), retired=self.retired + (gone,)
    )

  def merge(
    self,
    card_ids: Sequence[str],
    text: str,
    type: str | None = None,
    tier: str | None = None,
    domain: str | None = None,
    reason: str = "",
  ) -> tuple[EpistemicTree, Card]:
    """Replaces near-duplicate cards by one (MERGE), placed at the first card's location unless
    (tier, domain) is given; provenance is the union, counters the sum, sources are retired."""
    card_ids = list(dict.fromkeys(card_ids))
    if len(card_ids) < 2:
      raise ValueError(f"merge needs at least two distinct cards, got {card_ids}")
    sources = [self.card(i) for i in card_ids]
    first = sources[0]
    if tier is None and domain is None:
      tier, domain = first.tier, first.domain
    tier, domain = self._place(tier, domain)
    card_id, next_id = self._new_id()
    provenance, counters = first.provenance, first.counters
    for s in sources[1:]:
      provenance, counters = provenance.union(s.provenance), counters + s.counters
    merged = Card(
      id=card_id,
      type=_check_type(type or first.type),
      text=_check_text(text),
      tier=tier,
      domain=domain,
      provenance=provenance,
      counters=counters,
    )
    merged = _record(merged, "merge", " + ".join(card_ids), merged.text, reason)
    retired = tuple(_record(s, "merge", s.location, f"merged into {card_id}", reason) for s in sources)
    kept = tuple(c for c in self.cards if c.id not in card_ids)
    tree = dataclasses.replace(self, cards=kept + (merged,), retired=self.retired + retired, next_id=next_id)
    return tree._within_budget(merged), merged

  def count(self, card_id: str, uses: int = 0, helpful: int = 0, harmful: int = 0) -> EpistemicTree:
    """Adds to a card's usage counters (REFINE's attribution); counters are not history."""
    old = self.card(card_id)
    return self._swap(old, dataclasses.replace(old, counters=old.counters + Counters(uses, helpful, harmful)))

  # ---- helpers ---------------------------------------------------------------------------------

  def _check_location(self, tier: str | None, domain: str | None, what: str) -> None:
    if (tier is None) != (domain is None):
      raise ValueError(f"{what}: tier and domain must both be set, or both None (universal)")
    if tier is not None and (tier not in self.tiers or domain not in self.domains):
      raise ValueError(
        f"{what}: ({tier}, {domain}) is not a block of tiers {self.tiers} × domains {self.domains}"
      )

  def _place(self, tier: str | None, domain: str | None) -> tuple[str | None, str | None]:
    if tier is None and domain is None:
      return None, None
    if tier is None or domain is None:
      raise ValueError("tier and domain must both be given, or both be None for a universal card")
    return self.resolve(tier, domain)

  def _new_id(self) -> tuple[str, int]:
    used = {c.id for c in self.cards + self.retired}
    n = self.next_id
    while f"card-{n:04d}" in used:
      n += 1
    return f"card-{n:04d}", n + 1

  def _swap(self, old: Card, new: Card) -> EpistemicTree:
    return dataclasses.replace(self, cards=tuple(new if c is old else c for c in self.cards))

  def _within_budget(self, card: Card) -> EpistemicTree:
    cards = self.universal() if card.universal else self.block(card.tier, card.domain)
    used = self.tokens(cards)
    if used > self.budget_tokens:
      raise BudgetError(
        f"{card.location} would hold {used} tokens with card {card.id}; budget {self.budget_tokens}"
      )
    return self

  # ---- persistence -----------------------------------------------------------------------------

  def to_json(self) -> dict[str, Any]:
    """The tree as plain JSON values (lists, not tuples): what `save` writes, `from_json` reads."""
    as_lists = lambda cs: json.loads(json.dumps([dataclasses.asdict(c) for c in cs], ensure_ascii=False))
    return {
      "format": FORMAT,
      "version": VERSION,
      "tiers": list(self.tiers),
      "domains": list(self.domains),
      "budget_tokens": self.budget_tokens,
      "next_id": self.next_id,
      "cards": as_lists(self.cards),
      "retired": as_lists(self.retired),
    }

  @classmethod
  def from_json(
    cls, obj: Any, count_tokens: TokenCounter = estimate_tokens, where: str = "tree"
  ) -> EpistemicTree:
    """Validates `obj` against the schema and builds the tree; TreeFormatError names the bad field."""
    top = _fields(obj, where, _TREE_SCHEMA)
    if top["format"] != FORMAT or top["version"] != VERSION:
      raise TreeFormatError(
        f"{where}: expected format {FORMAT!r} version {VERSION}, got {top['format']!r} {top['version']}"
      )
    cards = tuple(_card(c, f"{where}.cards[{i}]") for i, c in enumerate(top["cards"]))
    retired = tuple(_card(c, f"{where}.retired[{i}]") for i, c in enumerate(top["retired"]))
    try:
      return cls(
        tiers=tuple(top["tiers"]),
        domains=tuple(top["domains"]),
        budget_tokens=top["budget_tokens"],
        cards=cards,
        retired=retired,
        next_id=top["next_id"],
        count_tokens=count_tokens,
      )
    except ValueError as e:  # layout, duplicate ids, a card outside the blocks
      raise TreeFormatError(f"{where}: {e}") from None

  def save(self, path: str | os.PathLike) -> None:
    """Writes the tree atomically: a crash mid-write leaves the previous file intact."""
    rundir.write_json(path, self.to_json())

  @classmethod
  def load(cls, path: str | os.PathLike, count_tokens: TokenCounter = estimate_tokens) -> EpistemicTree:
    """Reads a saved tree, checked against its budget with `count_tokens`.

    A card that alone costs more than a block's budget could never be rendered (`fit_cards` skips
    it), so such a tree is refused, naming the card; blocks over budget only in total (e.g. loaded
    with another token counter) are a warning naming them, since rendering drops their last cards.
    """
    try:
      obj = rundir.read_json(path)
    except ValueError as e:
      raise TreeFormatError(f"{path}: not valid JSON ({e})") from None
    tree = cls.from_json(obj, count_tokens, where=os.fspath(path))
    for card in tree.cards:
      cost = tree.tokens([card])
      if cost > tree.budget_tokens:
        raise TreeFormatError(
          f"{path}: card {card.id} in {card.location} alone costs {cost} tokens, over the block budget "
          f"of {tree.budget_tokens}: it could never be shown to the solver"
        )
    over = tree.over_budget()
    if over:
      logging.warning(
        "%s: blocks %s exceed the budget of %d tokens with this token counter; their last cards will "
        "not be rendered",
        path,
        ", ".join(over),
        tree.budget_tokens,
      )
    return tree

  def to_markdown(self) -> str:
    """A readable audit: per block its cards with provenance, counters and history."""
    out = [
      f"# Epistemic tree\n\n{len(self.cards)} live cards, {len(self.retired)} retired; "
      f"budget {self.budget_tokens} tokens per block.\n",
      "| block | cards | tokens |",
      "|---|---|---|",
    ]
    groups = [(f"{t} / {d}", self.block(t, d)) for t, d in self.blocks()] + [("universal", self.universal())]
    out += [f"| {name} | {len(cards)} | {self.tokens(cards)} |" for name, cards in groups]
    for name, cards in groups + [("retired", self.retired)]:
      if cards:
        out.append(f"\n## {name}\n")
        out += [_card_markdown(c) for c in cards]
    return "\n".join(out) + "\n"

  def save_markdown(self, path: str | os.PathLike) -> None:
    rundir.atomic_write_text(path, self.to_markdown())


def _record(card: Card, op: str, before: str | None, after: str | None, reason: str) -> Card:
  return dataclasses.replace(card, history=card.history + (Edit(op, _now(), before, after, reason),))


def _check_text(text: str) -> str:
  if not isinstance(text, str) or not text.strip():
    raise ValueError("card text must be a non-empty string")
  return text.strip()


def _check_type(card_type: str) -> str:
  if not isinstance(card_type, str) or not card_type.strip():
    raise ValueError(f"card type must be a non-empty string (e.g. one of {KNOWN_TYPES})")
  return card_type.strip()


def _card_markdown(card: Card) -> str:
  p, c = card.provenance, card.counters
  lines = [
    f"### {card.id} · {card.type}\n",
    card.text + "\n",
    f"- provenance: origin `{p.origin or '-'}`; problems {', '.join(p.problems) or '-'}; "
    f"traces {', '.join(p.traces) or '-'}",
    f"- counters: uses {c.uses}, helpful {c.helpful}, harmful {c.harmful}",
    "- history:",
  ]
  for e in card.history:
    reason = f" — {e.reason}" if e.reason else ""
    lines.append(f"  - {e.time} **{e.op}**: {e.before or '∅'} → {e.after or '∅'}{reason}")
  return "\n".join(lines) + "\n"


# ---- schema ----------------------------------------------------------------------------------------


def _fields(obj: Any, where: str, spec: dict[str, Callable[[Any, str], Any]]) -> dict[str, Any]:
  """Checks that `obj` is an object with exactly the keys of `spec` and each value passes its check."""
  if not isinstance(obj, dict):
    raise TreeFormatError(f"{where}: expected an object, got {type(obj).__name__}")
  for key in spec:
    if key not in obj:
      raise TreeFormatError(f"{where}.{key}: missing")
  for key in obj:
    if key not in spec:
      raise TreeFormatError(f"{where}.{key}: unknown field")
  return {key: check(obj[key], f"{where}.{key}") for key, check in spec.items()}


def _kind(pred: Callable[[Any], bool], expected: str) -> Callable[[Any, str], Any]:
  def check(value: Any, where: str) -> Any:
    if not pred(value):
      raise TreeFormatError(f"{where}: expected {expected}, got {value!r:.80}")
    return value

  return check


_str = _kind(lambda v: isinstance(v, str), "a string")
_opt_str = _kind(lambda v: v is None or isinstance(v, str), "a string or null")
_count = _kind(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a non-negative integer")
_positive = _kind(lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0, "a positive integer")
_op = _kind(lambda v: v in OPS, f"one of {OPS}")


def _list(item: Callable[[Any, str], Any]) -> Callable[[Any, str], list]:
  def check(value: Any, where: str) -> list:
    if not isinstance(value, list):
      raise TreeFormatError(f"{where}: expected a list, got {type(value).__name__}")
    return [item(v, f"{where}[{i}]") for i, v in enumerate(value)]

  return check


_EDIT_SCHEMA = {"op": _op, "time": _str, "before": _opt_str, "after": _opt_str, "reason": _str}
_CARD_SCHEMA = {
  "id": _str,
  "type": _str,
  "text": _str,
  "tier": _opt_str,
  "domain": _opt_str,
  "provenance": lambda v, w: _provenance(v, w),
  "counters": lambda v, w: Counters(**_fields(v, w, {"uses": _count, "helpful": _count, "harmful": _count})),
  "history": lambda v, w: tuple(_list(lambda e, we: Edit(**_fields(e, we, _EDIT_SCHEMA)))(v, w)),
}
_TREE_SCHEMA = {
  "format": _str,
  "version": _count,
  "tiers": _list(_str),
  "domains": _list(_str),
  "budget_tokens": _positive,
  "next_id": _positive,
  "cards": _list(lambda v, w: v),  # checked one by one in `_card`, which knows their path
  "retired": _list(lambda v, w: v),
}


def _provenance(obj: Any, where: str) -> Provenance:
  fields = _fields(obj, where, {"problems": _list(_str), "traces": _list(_str), "origin": _str})
  return Provenance(tuple(fields["problems"]), tuple(fields["traces"]), fields["origin"])


def _card(obj: Any, where: str) -> Card:
  fields = _fields(obj, where, _CARD_SCHEMA)
  for key in ("id", "type", "text"):
    if not fields[key].strip():
      raise TreeFormatError(f"{where}.{key}: must be non-empty")
  return Card(**fields)
