"""Domains from labels or one batched classifier call (with the fallback), cards within budgets."""

import pytest

from kace import cards, data, projection
from lm import generators
from tests.kace.generator_helpers import CountingGenerator


def _problem(pid, subject=None):
  return data.Problem(
    id=pid,
    question=f"question {pid}",
    answer="1",
    source="test",
    subject=subject,
    domain=data.domain_of(subject),
  )


@pytest.mark.parametrize(
  "reply, expected",
  [
    ("geometry", "geometry"),
    ("Number Theory.", "number_theory"),
    ("number_theory", "number_theory"),
    ("<think>maybe algebra</think>\nCounting & Probability", "combinatorics"),
    ("It is an Intermediate Algebra problem", "algebra"),
    ("algebra or geometry", None),  # two domains: unusable
    ("topology", None),
    ("", None),
    ("geometrically", None),  # whole words only
  ],
)
def test_parse_domain(reply, expected):
  assert projection.parse_domain(reply, cards.DEFAULT_DOMAINS) == expected


def test_labels_first_then_one_classifier_call_with_counted_fallback(tiny_generator):
  labelled = [_problem("a", "Geometry"), _problem("b", "Number Theory")]
  unlabelled = [_problem("c"), _problem("d"), _problem("e", "Basket weaving")]
  solver = CountingGenerator(tiny_generator)
  params = generators.GenerationParams(max_tokens=4, temperature=0.0)
  result = projection.assign_domains(
    labelled + unlabelled, cards.DEFAULT_DOMAINS, solver, params, fallback="combinatorics"
  )
  assert solver.calls == [(3, 1)]  # one call for all unlabelled problems
  assert result.of["a"] == "geometry" and result.of["b"] == "number_theory"
  assert {result.source[p] for p in "ab"} == {projection.LABEL}
  assert set(result.replies) == {"c", "d", "e"}
  # A random tiny model cannot name a domain: every reply is unusable and gets the fallback.
  for pid in "cde":
    expected = projection.parse_domain(result.replies[pid], cards.DEFAULT_DOMAINS)
    assert result.of[pid] == (expected or "combinatorics")
  assert result.counts()[projection.LABEL] == 2 and sum(result.counts().values()) == 5

  only_labels = CountingGenerator(solver.inner)
  assert projection.assign_domains(labelled, cards.DEFAULT_DOMAINS, only_labels).source == {
    "a": "label",
    "b": "label",
  }
  assert only_labels.calls == []
  with pytest.raises(ValueError, match="no domain label"):
    projection.assign_domains(unlabelled, cards.DEFAULT_DOMAINS, None)
  collapsed = projection.assign_domains(unlabelled, (cards.ANY,), None)
  assert set(collapsed.of.values()) == {cards.ANY}


def _tree():
  tree = cards.EpistemicTree(budget_tokens=12)
  tree, ms = tree.add("ms algebra card", "lemma", "MS", "algebra")
  tree, hs = tree.add("hs algebra card", "lemma", "HS", "algebra")
  tree, uni = tree.add("universal card", "verification_rule", None, None)
  return tree, ms, hs, uni


def test_projection_reads_its_block_and_the_universal_cards_within_budget():
  tree, ms, hs, uni = _tree()
  view = projection.project(tree, "MS", "algebra")
  assert view.card_ids == (ms.id, uni.id)
  assert view.notes == "- [lemma] ms algebra card\n- [verification_rule] universal card"
  assert projection.project(tree, "HS", "geometry").card_ids == (uni.id,)
  assert projection.project(tree, None, "algebra") == projection.NO_CARDS
  assert projection.project(None, "MS", "algebra") == projection.NO_CARDS
  # A stricter token counter than the tree's: cards that no longer fit are left out, and not recorded.
  strict = cards.EpistemicTree(
    tree.tiers, tree.domains, tree.budget_tokens, tree.cards, count_tokens=lambda s: 4 * len(s.split())
  )
  assert projection.project(strict, "MS", "algebra").card_ids == ()
  contexts = projection.TreeContext(tree).project(
    [_problem("x"), _problem("y")], ["algebra", "geometry"], "HS"
  )
  assert [c.card_ids for c in contexts] == [(hs.id, uni.id), (uni.id,)]


def test_solver_prompt_carries_notes_only_when_there_are_cards():
  bare = projection.solver_prompt("What is 1 + 1?")
  assert bare.endswith("Problem: What is 1 + 1?") and "\\boxed{}" in bare and "Notes" not in bare
  with_notes = projection.solver_prompt("What is 1 + 1?", "- [lemma] x")
  assert "Notes that may help:\n- [lemma] x\n" in with_notes
  with pytest.raises(ValueError, match="notes"):
    projection.check_template("{question}", ("question", "notes"))
