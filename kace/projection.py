"""Projection: which cards a problem reads at a tier, and the solver prompt that carries them.

KACE reads knowledge conditionally: a problem at tier t in domain d sees the cards of block (t, d)
plus the universal cards, and nothing else. This module decides the domain (the dataset's label
when it has one, else a classifier prompt through any generator role, one batched call), picks the
cards that fit each block's token budget, and renders the solver prompt. The cards actually
rendered are returned with the prompt, so a solve record can say which cards were in context
(REFINE attributes outcomes to them). Defaults and the fallback rule: docs/kace.md ("Projection").
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Sequence
from typing import Protocol

from kace import cards as cards_lib
from kace import data
from lm import generators
from lm import text as text_lib

# The solver prompt: `{notes}` is empty without cards, else NOTES_TEMPLATE filled with the card lines.
SOLVER_TEMPLATE = (
  "Solve the following math problem. Put the final answer in \\boxed{{}}.\n{notes}\nProblem: {question}"
)
NOTES_TEMPLATE = "\nNotes that may help:\n{cards}\n"

CLASSIFIER_TEMPLATE = (
  "Which area of mathematics does this problem belong to? Reply with exactly one of: {choices}.\n\n"
  "Problem: {question}"
)

# Greedy and short: the reply should be a domain name.
CLASSIFIER_PARAMS = generators.GenerationParams(max_tokens=16, temperature=0.0)

LABEL, CLASSIFIER, FALLBACK, COLLAPSED = "label", "classifier", "fallback", "collapsed"


@dataclasses.dataclass(frozen=True)
class Projection:
  """The cards one (tier, domain) lookup puts into a prompt, and their rendered lines."""

  cards: tuple[cards_lib.Card, ...] = ()
  notes: str = ""  # the rendered card lines ("" without cards)

  @property
  def card_ids(self) -> tuple[str, ...]:
    return tuple(c.id for c in self.cards)


NO_CARDS = Projection()


def project(tree: cards_lib.EpistemicTree | None, tier: str | None, domain: str) -> Projection:
  """The cards of block (tier, domain), then the universal cards, each group within the tree's budget.

  `tier=None` (a stage that reads no cards, e.g. ES) or no tree gives `NO_CARDS`. Cards that do not
  fit are skipped (`cards.fit_cards`); with the tree's own token counter everything fits, since
  operations keep blocks within budget.
  """
  if tree is None or tier is None:
    return NO_CARDS
  fit = lambda group: cards_lib.fit_cards(group, tree.budget_tokens, tree.count_tokens)
  chosen = fit(tree.block(tier, domain)) + fit(tree.universal())
  return Projection(chosen, "\n".join(cards_lib.render_card(c) for c in chosen))


class Context(Protocol):
  """What the solver reads at a stage, for a batch of problems (one call per stage, so a context
  that itself asks a model — an LLM router — can batch too)."""

  def project(self, problems: Sequence[data.Problem], domains: Sequence[str], tier: str) -> list[Projection]:
    """The projection of each problem at `tier` (a stage that reads cards)."""
    ...


@dataclasses.dataclass(frozen=True)
class NoCards:
  """The context of methods without knowledge (best-of-N, tiered voting)."""

  def project(self, problems: Sequence[data.Problem], domains: Sequence[str], tier: str) -> list[Projection]:
    return [NO_CARDS] * len(problems)


NO_CONTEXT = NoCards()


@dataclasses.dataclass(frozen=True)
class TreeContext:
  """KACE's context: block (tier, domain) of an Epistemic Tree plus its universal cards."""

  tree: cards_lib.EpistemicTree

  def project(self, problems: Sequence[data.Problem], domains: Sequence[str], tier: str) -> list[Projection]:
    return [project(self.tree, tier, d) for d in domains]


def solver_prompt(question: str, notes: str = "", template: str = SOLVER_TEMPLATE) -> str:
  """The solver's user message: `template` with the question and, when there are cards, the notes."""
  return template.format(question=question, notes=NOTES_TEMPLATE.format(cards=notes) if notes else "")


def check_template(template: str, fields: Sequence[str]) -> str:
  """Raises ValueError naming the missing placeholder when `template` lacks one of `fields`."""
  missing = [f for f in fields if "{" + f + "}" not in template]
  if missing:
    raise ValueError(f"prompt template lacks placeholder(s) {missing}: {template!r}")
  return template


# ---- domains --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Domains:
  """Each problem's domain and where it came from.

  Attributes:
    of: problem id -> domain (always one of the tree's domains).
    source: problem id -> LABEL (dataset label), CLASSIFIER (a usable reply), FALLBACK (an
      unusable reply: the fallback domain), or COLLAPSED (a tree without a domain axis).
    replies: problem id -> the classifier's raw reply, for classified problems.
  """

  of: dict[str, str]
  source: dict[str, str]
  replies: dict[str, str] = dataclasses.field(default_factory=dict)

  def counts(self) -> dict[str, int]:
    return dict(collections.Counter(self.source.values()))


def _aliases(domains: Sequence[str]) -> dict[str, str]:
  """Lower-case phrases naming each domain: its name (underscores as spaces) and the dataset subject
  labels that map onto it (data.DOMAIN_OF_SUBJECT), e.g. "counting & probability" -> combinatorics."""
  names = {d.replace("_", " "): d for d in domains}
  subjects = {s: d for s, d in data.DOMAIN_OF_SUBJECT.items() if d in domains}
  return {**subjects, **names}


def parse_domain(reply: str, domains: Sequence[str]) -> str | None:
  """The domain a classifier reply names, or None when the reply is unusable.

  Only text after the last `</think>` is read. The reply is usable when it names exactly one of
  the domains (by name, with spaces or underscores, or by a dataset subject label that maps to
  it, as whole words, any case); a reply naming none, or two different ones, is unusable.
  """
  text = text_lib.after_think(reply).lower().replace("_", " ")
  named = {
    domain
    for phrase, domain in _aliases(domains).items()
    if re.search(r"(?<![a-z])" + re.escape(phrase) + r"(?![a-z])", text)
  }
  return named.pop() if len(named) == 1 else None


def classifier_prompt(question: str, domains: Sequence[str], template: str = CLASSIFIER_TEMPLATE) -> str:
  return template.format(question=question, choices=", ".join(domains))


def assign_domains(
  problems: Sequence[data.Problem],
  domains: Sequence[str],
  classifier: generators.TextGenerator | None,
  params: generators.GenerationParams = CLASSIFIER_PARAMS,
  *,
  fallback: str | None = None,
  template: str = CLASSIFIER_TEMPLATE,
) -> Domains:
  """Domains for `problems`: labels where present, one batched classifier call for the rest.

  A problem's label counts when it maps onto one of `domains` (`Problem.domain`, set by the
  loaders through data.DOMAIN_OF_SUBJECT). The others are classified in ONE generator call (one
  sample each, with `params`). An unusable reply (see `parse_domain`) gives `fallback` (default:
  the first domain) and is counted as FALLBACK. A tree without a domain axis (`domains == (ANY,)`)
  needs no domain: every problem gets ANY.

  Raises:
    ValueError: unlabelled problems but no classifier, or a fallback outside `domains`.
  """
  domains = tuple(domains)
  if domains == (cards_lib.ANY,):
    return Domains({p.id: cards_lib.ANY for p in problems}, {p.id: COLLAPSED for p in problems})
  fallback = fallback or domains[0]
  if fallback not in domains:
    raise ValueError(f"fallback domain {fallback!r} is not one of {domains}")
  of = {p.id: p.domain for p in problems if p.domain in domains}
  source = dict.fromkeys(of, LABEL)
  todo = [p for p in problems if p.id not in of]
  replies = {}
  if todo:
    if classifier is None:
      raise ValueError(
        f"{len(todo)} problems have no domain label (e.g. {todo[0].id}) and no classifier is set"
      )
    prompts = [text_lib.user_chat(classifier_prompt(p.question, domains, template)) for p in todo]
    for p, (generation,) in zip(todo, classifier.generate(prompts, n=1, params=params), strict=True):
      replies[p.id] = generation.text
      parsed = parse_domain(generation.text, domains)
      of[p.id], source[p.id] = (parsed, CLASSIFIER) if parsed else (fallback, FALLBACK)
  return Domains({p.id: of[p.id] for p in problems}, {p.id: source[p.id] for p in problems}, replies)
