"""Epistemic Tree: projection reads, every operation's history, budgets, JSON round trip, schema
errors, crash-safe saves and the audit export."""

import json
import os

import pytest

from kace import cards
from kace.cards import ANY, BudgetError, EpistemicTree, Provenance, TreeFormatError

PROV = Provenance(problems=("p1", "p2"), traces=("t1",), origin="add:teacher")


@pytest.fixture
def tree():
  t = EpistemicTree()
  t, _ = t.add("AM-GM bounds symmetric sums.", "lemma", "HS", "algebra", PROV, reason="failed p1")
  t, _ = t.add("Parity is invariant under swaps.", "invariant", "MS", "combinatorics", PROV)
  t, _ = t.add("Substitute the answer back.", "verification_rule", reason="universal check")
  return t


def ops(card):
  return [e.op for e in card.history]


def test_cards_for_reads_the_block_then_universal(tree):
  assert [c.id for c in tree.cards_for("HS", "algebra")] == ["card-0001", "card-0003"]
  assert [c.id for c in tree.cards_for("MS", "combinatorics")] == ["card-0002", "card-0003"]
  assert [c.id for c in tree.cards_for("HS", "geometry")] == ["card-0003"]
  with pytest.raises(ValueError, match="not a block"):
    tree.cards_for("XS", "algebra")


def test_add_records_provenance_and_history(tree):
  card = tree.card("card-0001")
  assert (card.type, card.tier, card.domain, card.provenance) == ("lemma", "HS", "algebra", PROV)
  (entry,) = card.history
  assert (entry.op, entry.before, entry.after, entry.reason) == ("add", None, card.text, "failed p1")
  assert entry.time.endswith("+00:00")
  assert tree.card("card-0003").universal


def test_operations_return_new_trees(tree):
  edited = tree.edit("card-0001", "AM-GM, with the equality case.")
  assert tree.card("card-0001").text == "AM-GM bounds symmetric sums."
  assert edited.card("card-0001").text == "AM-GM, with the equality case."


def test_edit(tree):
  card = tree.edit("card-0001", "  AM-GM, with the equality case. ", reason="vague").card("card-0001")
  assert ops(card) == ["add", "edit"]
  e = card.history[-1]
  assert (e.before, e.after, e.reason) == (
    "AM-GM bounds symmetric sums.",
    "AM-GM, with the equality case.",
    "vague",
  )


def test_relocate_to_another_block_and_to_universal(tree):
  moved = tree.relocate("card-0001", "HS", "number_theory", reason="about divisibility")
  card = moved.card("card-0001")
  assert (card.tier, card.domain, ops(card)) == ("HS", "number_theory", ["add", "relocate"])
  assert (card.history[-1].before, card.history[-1].after) == ("HS/algebra", "HS/number_theory")
  assert moved.block("HS", "algebra") == ()
  universal = moved.relocate("card-0001", None, None).card("card-0001")
  assert universal.universal and universal.history[-1].after == "universal"
  with pytest.raises(ValueError, match="both"):
    tree.relocate("card-0001", "HS", None)


def test_demote(tree):
  once = tree.demote("card-0001", reason="helps medium problems")
  assert once.card("card-0001").tier == "MS"
  twice = once.demote("card-0001")
  card = twice.card("card-0001")
  assert (card.tier, ops(card)) == ("ES", ["add", "demote", "demote"])
  assert [(e.before, e.after) for e in card.history[1:]] == [
    ("HS/algebra", "MS/algebra"),
    ("MS/algebra", "ES/algebra"),
  ]
  with pytest.raises(ValueError, match="no lower tier"):
    twice.demote("card-0001")
  with pytest.raises(ValueError, match="no lower tier"):
    tree.demote("card-0003")


def test_delete_retires_the_card_with_its_history(tree):
  gone = tree.delete("card-0002", reason="harmful 5/6")
  with pytest.raises(KeyError, match="card-0002"):
    gone.card("card-0002")
  (retired,) = gone.retired
  assert (retired.id, ops(retired), retired.history[-1].reason) == (
    "card-0002",
    ["add", "delete"],
    "harmful 5/6",
  )
  assert gone.cards_for("MS", "combinatorics") == gone.universal()


def test_merge_unions_provenance_sums_counters_and_retires_sources(tree):
  other = Provenance(problems=("p2", "p9"), traces=("t7",), origin="refine:curator")
  t, extra = tree.add("AM-GM again.", "lemma", "HS", "algebra", other)
  t = t.count("card-0001", uses=3, helpful=2).count(extra.id, uses=1, harmful=1)
  t, merged = t.merge(
    ["card-0001", extra.id, "card-0001"], "AM-GM for symmetric sums.", reason="near-duplicates"
  )
  assert merged.id == "card-0005" and (merged.tier, merged.domain, merged.type) == ("HS", "algebra", "lemma")
  assert merged.provenance == Provenance(("p1", "p2", "p9"), ("t1", "t7"), "add:teacher+refine:curator")
  assert merged.counters == cards.Counters(uses=4, helpful=2, harmful=1)
  assert (ops(merged), merged.history[-1].before) == (["merge"], "card-0001 + card-0004")
  assert [c.id for c in t.block("HS", "algebra")] == ["card-0005"]
  assert {c.id: ops(c) for c in t.retired} == {"card-0001": ["add", "merge"], "card-0004": ["add", "merge"]}
  assert t.retired[0].history[-1].after == "merged into card-0005"
  with pytest.raises(ValueError, match="two distinct"):
    t.merge(["card-0005"], "x")


def test_count_updates_counters_without_history(tree):
  card = tree.count("card-0002", uses=2, helpful=1).count("card-0002", uses=1, harmful=1).card("card-0002")
  assert card.counters == cards.Counters(uses=3, helpful=1, harmful=1)
  assert ops(card) == ["add"]


def test_ids_are_never_reused(tree):
  t, card = tree.delete("card-0003").add("New.", "lemma")
  assert card.id == "card-0004"


def test_budget_is_enforced_per_block_with_a_pluggable_counter():
  words = lambda text: len(text.split())
  t = EpistemicTree(budget_tokens=8, count_tokens=words)
  t, _ = t.add("one two three", "lemma", "MS", "algebra")  # "- [lemma] one two three" = 5 words
  t, _ = t.add("four five six", "lemma", "MS", "geometry")  # another block: its own budget
  with pytest.raises(BudgetError, match=r"MS/algebra would hold 10 tokens .* budget 8"):
    t.add("four five six", "lemma", "MS", "algebra")
  with pytest.raises(BudgetError, match="MS/algebra"):
    t.relocate("card-0002", "MS", "algebra")
  with pytest.raises(BudgetError, match="MS/algebra"):
    t.edit("card-0001", "one two three four five six seven")
  assert t.over_budget() == []


def test_render_cards_skips_cards_that_do_not_fit():
  words = lambda text: len(text.split())
  t = EpistemicTree(count_tokens=words)
  t, _ = t.add("a b", "lemma")
  t, _ = t.add("c d e f g h", "lemma")
  t, _ = t.add("i", "invariant")
  assert cards.render_cards(t.cards, budget=8, count_tokens=words) == "- [lemma] a b\n- [invariant] i"
  assert cards.estimate_tokens("abcdefgh") == 2 and cards.estimate_tokens("abcdefghi") == 3


def test_collapsed_axes_model_the_ablations():
  tier_only = EpistemicTree(domains=(ANY,))
  tier_only, card = tier_only.add("x", "lemma", "MS", "geometry")
  assert (card.tier, card.domain) == ("MS", ANY)
  assert tier_only.cards_for("MS", "algebra") == (card,)
  assert tier_only.cards_for("HS", "algebra") == ()
  mono = EpistemicTree(tiers=(ANY,), domains=(ANY,))
  mono, card = mono.add("y", "lemma", "HS", "algebra")
  assert mono.cards_for("MS", "geometry") == (card,) and mono.blocks() == [(ANY, ANY)]
  with pytest.raises(ValueError, match="alone"):
    EpistemicTree(tiers=(ANY, "MS"))


def test_json_round_trip(tree, tmp_path):
  t = tree.edit("card-0001", "edited").count("card-0002", uses=4, helpful=1).delete("card-0003")
  t, _ = t.add("Second algebra card.", "decomposition", "HS", "algebra")
  t, _ = t.merge(["card-0001", "card-0004"], "Merged.", reason="dup")
  path = tmp_path / "tree.json"
  t.save(path)
  loaded = EpistemicTree.load(path)
  assert loaded == t
  assert loaded.to_json() == json.loads(path.read_text())


def corrupt(tree, tmp_path, mutate):
  obj = tree.to_json()
  mutate(obj)
  path = tmp_path / "bad.json"
  path.write_text(json.dumps(obj))
  return path


@pytest.mark.parametrize(
  "mutate, message",
  [
    (lambda o: o.pop("tiers"), r"bad.json.tiers: missing"),
    (lambda o: o.update(colour="red"), r"bad.json.colour: unknown field"),
    (lambda o: o.update(format="other"), r"expected format 'kace-epistemic-tree'"),
    (lambda o: o.update(budget_tokens=0), r"bad.json.budget_tokens: expected a positive integer"),
    (
      lambda o: o["cards"][1]["counters"].update(helpful=-1),
      r"cards\[1\].counters.helpful: expected a non-negative",
    ),
    (
      lambda o: o["cards"][0]["provenance"].update(problems="p1"),
      r"cards\[0\].provenance.problems: expected a list",
    ),
    (
      lambda o: o["cards"][0]["history"][0].update(op="rename"),
      r"cards\[0\].history\[0\].op: expected one of",
    ),
    (lambda o: o["cards"][2].update(text="  "), r"cards\[2\].text: must be non-empty"),
    (lambda o: o["cards"][0].update(domain="topology"), r"card card-0001: \(HS, topology\) is not a block"),
    (lambda o: o["cards"][0].update(domain=None), r"card card-0001: tier and domain must both be set"),
    (lambda o: o["cards"][1].update(id="card-0001"), r"duplicate card ids: \['card-0001'\]"),
    (lambda o: o.update(cards={}), r"bad.json.cards: expected a list"),
  ],
)
def test_schema_errors_name_the_field(tree, tmp_path, mutate, message):
  with pytest.raises(TreeFormatError, match=message):
    EpistemicTree.load(corrupt(tree, tmp_path, mutate))


def test_invalid_json_is_a_format_error(tmp_path):
  path = tmp_path / "torn.json"
  path.write_text('{"format": "kace-epi')
  with pytest.raises(TreeFormatError, match="torn.json: not valid JSON"):
    EpistemicTree.load(path)


def test_a_crash_during_save_leaves_the_old_tree(tree, tmp_path, monkeypatch):
  path = tmp_path / "tree.json"
  tree.save(path)
  newer, _ = tree.add("Never saved.", "lemma")

  def crash(src, dst):
    raise OSError("simulated crash before the rename")

  monkeypatch.setattr(os, "replace", crash)
  with pytest.raises(OSError, match="simulated crash"):
    newer.save(path)
  monkeypatch.undo()
  assert EpistemicTree.load(path) == tree
  assert os.listdir(tmp_path) == ["tree.json"]  # the temporary file is cleaned up


def test_markdown_audit_shows_blocks_cards_provenance_counters_and_history(tree, tmp_path):
  t = tree.count("card-0001", uses=5, helpful=4, harmful=1).delete("card-0002", reason="harmful")
  path = tmp_path / "tree.md"
  t.save_markdown(path)
  text = path.read_text()
  for expected in [
    "| HS / algebra | 1 |",
    "## HS / algebra",
    "### card-0001 · lemma",
    "AM-GM bounds symmetric sums.",
    "origin `add:teacher`; problems p1, p2; traces t1",
    "uses 5, helpful 4, harmful 1",
    "**add**: ∅ → AM-GM bounds symmetric sums. — failed p1",
    "## universal",
    "## retired",
    "**delete**: MS/combinatorics → ∅ — harmful",
  ]:
    assert expected in text, expected
