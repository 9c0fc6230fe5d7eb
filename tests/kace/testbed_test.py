"""The latent-convention testbed: conventions change the gold answer, can be inferred from (problem,
gold) pairs, level 1 has none, tiers differ within a domain, the controls do what they say, and the
solver's training conventions are disjoint from the evaluated ones (held-out constants)."""

import collections

import hypothesis
import pytest
from hypothesis import strategies as st

from kace import testbed


@pytest.fixture(scope="module")
def problems():
  return testbed.TestbedConfig(seed=3).problems()


def _base(p):
  return testbed.parse_question(p.question)[1]


def test_level_1_has_no_convention_and_tiers_differ_within_a_domain():
  for seed in range(20):
    rules = testbed.conventions(seed)
    for domain in testbed.DOMAINS:
      assert rules[(domain, 1)] == testbed.IDENTITY
      assert rules[(domain, 2)] != rules[(domain, 3)]
      assert rules[(domain, 2)] in testbed.TEST_H and rules[(domain, 3)] in testbed.TEST_H


def test_held_out_constants_are_disjoint_from_the_training_conventions():
  assert not set(testbed.TRAIN_H) & set(testbed.TEST_H)
  assert set(testbed.H) == set(testbed.TRAIN_H) | set(testbed.TEST_H)
  # constants are held out per operation: no evaluated (op, k) is trained, every evaluated k is
  # seen with another operation (so the solver can learn to copy it from a card)
  for h in testbed.TEST_H:
    assert h.k not in {t.k for t in testbed.TRAIN_H if t.op == h.op}
    assert h.k in {t.k for t in testbed.TRAIN_H if t.op != h.op}


def test_conventions_change_the_gold_and_are_inferable_from_problem_gold_pairs(problems):
  train, test = problems
  rules = testbed.conventions(3)
  cells = collections.defaultdict(list)
  for p in train + test:
    cells[(p.domain, p.level)].append(p)
  for cell, ps in cells.items():
    assert all(int(p.answer) == rules[cell].apply(_base(p)) for p in ps)
    if cell[1] >= 2:
      assert sum(int(p.answer) != _base(p) for p in ps) >= len(ps) // 2, cell
    fitted, agree = testbed.fit([(_base(p), int(p.answer)) for p in ps])
    assert fitted == rules[cell] and agree == len(ps), cell


def test_split_is_disjoint_and_sized(problems):
  train, test = problems
  assert not {p.question for p in train} & {p.question for p in test}
  counts = collections.Counter((p.domain, p.level) for p in test)
  assert set(counts) == set(testbed.KINDS) and set(counts.values()) == {12}
  assert all(p.question.startswith(testbed.KINDS[(p.domain, p.level)] + ":") for p in train + test)
  assert testbed.TestbedConfig(seed=3).problems() == problems  # deterministic


@pytest.mark.parametrize("control", ["identity", "shared", "level1"])
def test_controls(control):
  rules = testbed.conventions(5, control)
  for domain in testbed.DOMAINS:
    if control == "identity":
      assert all(rules[(domain, lv)] == testbed.IDENTITY for lv in testbed.LEVELS)
    elif control == "shared":
      assert rules[(domain, 2)] == rules[(domain, 3)] != testbed.IDENTITY
    else:
      assert rules[(domain, 1)] != testbed.IDENTITY
      assert len({rules[(domain, lv)] for lv in testbed.LEVELS}) == 3


def test_bad_config_is_rejected():
  with pytest.raises(ValueError, match="control"):
    testbed.TestbedConfig(control="nope")
  with pytest.raises(ValueError, match="test_per_cell"):
    testbed.TestbedConfig(per_cell=4, test_per_cell=4)


@hypothesis.given(
  st.sampled_from(testbed.H), st.sampled_from(sorted(testbed.KIND_OF_WORD)), st.sampled_from(testbed.FORMS)
)
def test_card_text_round_trips(rule, kind, form):
  assert testbed.parse_card(testbed.card_text(kind, rule, form)) == (kind, rule)
  assert testbed.parse_card("- [convention] " + testbed.card_text(kind, rule, form)) == (kind, rule)


def test_forms_differ_and_unknown_forms_are_rejected():
  rule = testbed.Convention("add", 3)
  assert testbed.card_text("total", rule, "short") == "total: add 3"
  assert testbed.card_text("total", rule, "long") == "total problems: add 3 to the result."
  assert testbed.card_text("total", rule, "keyed") == "addthree=total"
  assert testbed.card_text("total", testbed.IDENTITY, "keyed") == "asis=total"
  assert testbed.card_text("total", testbed.Convention("mul", 9), "keyed") == "timesnine=total"
  assert testbed.question("total", 3, "+", 4, "keyed") == "total: 3 + 4"
  assert testbed.parse_question(testbed.card_text("total", rule, "keyed")) is None
  assert testbed.single_tokens("short") == ()
  assert len(set(testbed.single_tokens("keyed"))) == len(testbed.KINDS) * (len(testbed.H) + 1) + len(
    testbed.H
  )
  assert {"=total", "addthree", "addthree=total"} <= set(testbed.single_tokens("keyed"))
  assert testbed.question("total", 3, "+", 4, "short") == "total: 3 + 4"
  assert testbed.question("total", 3, "+", 4, "long") == "total: What is 3 + 4?"
  # a short question is not a card and a short card is not a question
  assert testbed.parse_card(testbed.question("total", 3, "+", 4)) is None
  assert testbed.parse_question(testbed.card_text("total", rule)) is None
  with pytest.raises(ValueError, match="form"):
    testbed.card_text("total", rule, "tiny")
  with pytest.raises(ValueError, match="form"):
    testbed.TestbedConfig(form="tiny")


def test_completion_styles():
  rule = testbed.Convention("mul", 2)
  assert rule.completion(7, "working") == "7 * 2 -> \\boxed{14}"
  assert rule.completion(7, "rule_first") == "times 2: 7 * 2 -> \\boxed{14}"
  assert rule.completion(7, "rule_first", "long") == "multiply the result by 2: 7 * 2 -> \\boxed{14}"
  assert testbed.IDENTITY.completion(5, "rule_first") == "as is: 5 -> \\boxed{5}"
  assert rule.completion(7, "card_first", "keyed", "ways") == "=waystimestwo: 7 * 2 -> \\boxed{14}"
  assert rule.completion(7, "card_first", "short", "ways") == "ways: times 2: 7 * 2 -> \\boxed{14}"
  with pytest.raises(ValueError, match="kind"):
    rule.completion(7, "card_first", "keyed")
  with pytest.raises(ValueError, match="completion"):
    rule.completion(7, "nope")


@hypothesis.given(
  st.integers(0, 99), st.sampled_from(["+", "mod", "*"]), st.integers(1, 99), st.sampled_from(testbed.FORMS)
)
def test_question_base_is_computed_symbolically(a, op, b, form):
  expected = {"+": a + b, "mod": a % b, "*": a * b}[op]
  question = testbed.question("rest", a, op, b, form)
  assert testbed.parse_question("Problem: " + question) == ("rest", expected)
  assert testbed.parse_question("What is 3 + 4?") is None


@pytest.mark.parametrize("form", testbed.FORMS)
def test_problems_use_the_configured_form(form):
  _, test = testbed.TestbedConfig(seed=1, form=form).problems()
  assert all(("What is" in p.question) == (form == "long") for p in test)
