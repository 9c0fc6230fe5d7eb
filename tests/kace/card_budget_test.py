"""A saved tree whose card is far over its block budget is refused on load, naming the card."""

import json
import logging

import pytest

from kace.cards import EpistemicTree, TreeFormatError

WORDS = lambda text: len(text.split())  # noqa: E731


def _saved_tree(tmp_path):
  tree = EpistemicTree(budget_tokens=10, count_tokens=WORDS)
  tree, _ = tree.add("one two three", "lemma", "MS", "algebra")
  tree, _ = tree.add("four five", "lemma", "MS", "algebra")
  path = tmp_path / "tree.json"
  tree.save(path)
  return path


def test_a_card_far_over_its_block_budget_is_refused_naming_it(tmp_path):
  path = _saved_tree(tmp_path)
  assert len(EpistemicTree.load(path, WORDS).cards) == 2
  obj = json.loads(path.read_text())
  obj["cards"][1]["text"] = "word " * 500  # edited by hand, or written by another tool
  path.write_text(json.dumps(obj))
  with pytest.raises(
    TreeFormatError, match=r"card card-0002 in MS/algebra alone costs 502 tokens.*budget of 10"
  ):
    EpistemicTree.load(path, WORDS)


def test_a_block_over_budget_only_in_total_loads_with_a_warning_naming_it(tmp_path, caplog):
  path = _saved_tree(tmp_path)
  double = lambda text: 2 * WORDS(text) - 3  # another tokenizer: each card still fits alone  # noqa: E731
  with caplog.at_level(logging.WARNING):
    tree = EpistemicTree.load(path, double)
  assert tree.over_budget() == ["MS/algebra"]
  assert any("MS/algebra" in r.getMessage() and "exceed the budget" in r.getMessage() for r in caplog.records)
