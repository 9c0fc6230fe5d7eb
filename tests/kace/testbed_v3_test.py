"""Testbed v3: the generator (one cue, rules by block and hidden class, a control family, separate
splits), the scripted readers, the programmatic arms' curator operations and cell rule, and the
tested / not-tested label of a prediction."""

import random

import pytest

from kace import readers, testbed, testbed_v3, v3_arms, v3_learn, v3_verdicts


def test_one_cue_needs_different_rules_by_domain_and_class_and_the_control_ignores_the_class():
  world = testbed_v3.WorldConfig(seed=3)
  rules = world.rules()
  main = [rules[(d, "main", s)] for d in testbed_v3.DOMAINS for s in testbed_v3.CLASSES]
  assert len(set(main)) == 6  # the one word "total" means six rules
  for d in testbed_v3.DOMAINS:
    assert rules[(d, "control", "small")] == rules[(d, "control", "large")]
  assert len({rules[(d, "control", "small")] for d in testbed_v3.DOMAINS}) == 3
  problems = world.problems()
  assert len({p.problem.question for p in problems}) == len(problems)  # no question in two splits
  sizes = dict(world.per_split)
  for split in testbed_v3.SPLITS:
    part = world.split(split)
    assert len(part) == sizes[split] * 3 * 2 * 2
  for p in problems:
    kind, base = testbed.parse_question(p.problem.question)
    assert kind == p.kind and base == p.base  # the class is not written in the question
    assert p.problem.answer == str(rules[(p.domain, p.family, p.size)].apply(base))
    (lo, hi), _ = testbed_v3.OPERANDS[(p.domain, p.size)]
    assert lo <= int(p.problem.question.split(": ")[1].split(" ")[0]) <= hi
  assert world.rules() != testbed_v3.WorldConfig(seed=4).rules()


def _problem(size="large", family="main"):
  world = testbed_v3.WorldConfig(seed=0)
  return next(p for p in world.split("test") if p.size == size and p.family == family), world.rules()


def test_readers_first_card_scope_and_mix_over_conflicting_cards():
  p, rules = _problem()
  right, wrong = rules[(p.domain, "main", "large")], rules[(p.domain, "main", "small")]
  shown = [("tally", right), (p.kind, wrong), (p.kind, right)]
  rng = random.Random(0)
  first, scope, mix = (readers.Reader(name=n, policy=n, large_error=0.0) for n in ("first", "scope", "mix"))
  assert all(first.rule(p, shown, rng) == wrong for _ in range(20))
  assert all(scope.rule(p, shown, rng) == right for _ in range(20))
  assert {mix.rule(p, shown, rng) for _ in range(50)} == {right, wrong}
  assert len({first.rule(p, [("tally", right)], rng) for _ in range(50)}) > 5  # no card of its word
  assert {scope.answer(p, [(p.kind, right)], rng) for _ in range(20)} == {p.problem.answer}  # exact
  noisy = readers.Reader(name="n", policy="scope", large_error=0.6)
  answers = [noisy.answer(p, [(p.kind, right)], rng) for _ in range(200)]
  assert 0.25 < answers.count(p.problem.answer) / 200 < 0.55  # large-class arithmetic partly right
  small, _ = _problem(size="small")
  card = (small.kind, rules[(small.domain, "main", "small")])
  assert {noisy.answer(small, [card], rng) for _ in range(20)} == {small.problem.answer}
  with pytest.raises(ValueError, match="policy"):
    readers.Reader(name="x", policy="last", large_error=0.0)


def test_curator_operations_apply_each_as_stated():
  add3, add6, mul2 = testbed.Convention("add", 3), testbed.Convention("add", 6), testbed.Convention("mul", 2)
  layout = v3_arms.Layout()
  ms, hs = ("MS", "algebra"), ("HS", "algebra")
  tree = v3_arms.Tree(layout, 2, {ms: [("total", add3), ("total", add6)]})
  moved = v3_learn.apply_operation(tree, ("relocate", (ms, ("total", add6), hs)))
  assert moved.blocks[ms] == (("total", add3),) and moved.blocks[hs] == (("total", add6),)
  assert v3_learn.apply_operation(tree, ("delete", (ms, ("total", add3)))).blocks[ms] == (("total", add6),)
  edited = v3_learn.apply_operation(tree, ("edit", (ms, ("total", add3), mul2)))
  assert edited.blocks[ms] == (("total", mul2), ("total", add6))
  every = v3_arms.Tree(layout, 2, {("MS", d): [("tally", mul2)] for d in testbed_v3.DOMAINS})
  demoted = v3_learn.apply_operation(every, ("demote", ("MS", ("tally", mul2))))
  assert demoted.blocks[v3_arms.UNIVERSAL] == (("tally", mul2),)
  assert all(demoted.blocks[("MS", d)] == () for d in testbed_v3.DOMAINS)
  ops = v3_learn.curator_operations(tree, {(ms, 0): -1, (ms, 1): 0})
  assert ("relocate", (ms, ("total", add3), hs)) in ops and ("merge", (ms, ("total", add6))) in ops
  assert ("demote", ("MS", ("tally", mul2))) in v3_learn.curator_operations(every, {})
  with pytest.raises(ValueError, match="at most 2 cards"):
    tree.with_cards(ms, [("total", add3), ("total", add6), ("tally", mul2)])


def test_cell_rule_exit_or_first_tier_missing_the_kind():
  p, rules = _problem()
  outcome = v3_arms.Outcome(correct=False, exit_tier="POOL", calls=10, reading=("MS", "HS"))
  empty = v3_arms.Tree(v3_arms.Layout(), 2)
  assert v3_learn.cell_tier(empty, outcome, p, "exit") == "HS"
  assert v3_learn.cell_tier(empty, outcome, p, "first_missing") == "MS"
  held = empty.with_cards(("MS", p.domain), [(p.kind, rules[(p.domain, "main", "small")])])
  assert v3_learn.cell_tier(held, outcome, p, "first_missing") == "HS"
  es = v3_arms.Outcome(correct=False, exit_tier="ES", calls=2, reading=())
  assert v3_learn.cell_tier(empty, es, p, "first_missing") is None


def test_one_build_of_every_arm_within_budget_with_a_non_empty_playbook():
  reader = readers.READERS[0]
  result = v3_learn.run([reader], [0])
  counts = result["counts"][reader.name]
  budget = v3_arms.Budget()
  assert set(counts) == set(v3_arms.ARM_NAMES)
  for arm, (c,) in counts.items():
    assert c["teacher_calls"] <= budget.teacher_calls and c["cards"] <= budget.card_tokens, arm
  assert counts["tiered"][0]["cards"] == 0 and counts["ace_playbook"][0]["ace_add"] >= 1
  assert counts["gepa"][0].get("gepa_accepted", 0) + counts["gepa"][0].get("gepa_rejected", 0) >= 1
  test = testbed_v3.WorldConfig(seed=0).split("test")
  assert all(len(by) == len(test) for by in result["outcomes"][reader.name].values())


def test_a_prediction_is_tested_only_where_the_readers_disagree():
  keys = [(f"build{b}", f"v3/algebra/main/small/{i}") for b in range(4) for i in range(20)]
  win = {k: (2, True) for k in keys}
  lose = {k: (2, False) for k in keys}
  counts = {"kace": [{"build": b} for b in range(4)]}
  agree = {"outcomes": {"r1": {"kace": win, "tiered": lose}, "r2": {"kace": win, "tiered": lose}}}
  disagree = {"outcomes": {"r1": {"kace": win, "tiered": lose}, "r2": {"kace": lose, "tiered": win}}}
  for result, tested in ((agree, False), (disagree, True)):
    result["counts"] = {"r1": counts, "r2": counts}
    row = v3_verdicts.verdicts(result, bootstrap=200)[0]
    assert row["prediction"] == "v3-1" and row["tested"] is tested
  refine = {"kace": [{"build": b, "edit_applied": int(b < 2)} for b in range(4)]}
  arms = {a: win if a == "kace" else lose for a in ("kace", "add_no_refine")}
  rows = v3_verdicts.verdicts({"outcomes": {"r1": arms}, "counts": {"r1": refine}}, bootstrap=200)
  row = next(r for r in rows if r["prediction"] == "v3-9")["readers"]["r1"]
  assert row["problems"] == 40 and row["refine_applied"] == [1, 1, 0, 0]  # builds 2, 3 made none


def test_the_trained_solvers_rows_carry_the_readers_verdicts_and_labels():
  keys = [(f"build{b}", f"v3/algebra/main/small/{i}") for b in range(4) for i in range(20)]
  win, lose = {k: (2, True) for k in keys}, {k: (2, False) for k in keys}
  counts = {"kace": [{"build": b} for b in range(4)]}
  scripted = {
    "outcomes": {"r1": {"kace": win, "tiered": lose}, "r2": {"kace": lose, "tiered": win}},
    "counts": {"r1": counts, "r2": counts},
  }
  trained = {"outcomes": {"model": {"kace": win, "tiered": lose}}, "counts": {"model": counts}}
  gate = lambda ok: [{"all_passed": ok, "rates": {"g": 1.0}} for _ in range(4)]  # noqa: E731
  passing = {"r1": gate(True), "r2": gate(False)}
  rows = v3_verdicts.labelled(
    v3_verdicts.verdicts(trained, bootstrap=200), v3_verdicts.verdicts(scripted, bootstrap=200), passing
  )
  first = rows[0]
  assert first["readers"]["model"]["verdict"] == "held" and first["scripted"] == {
    "r1": "held",
    "r2": "not held",
  }
  assert first["tested"] and first["held_against_not_held"]
  assert first["gate_passing_readers"] == ["r1"] and not first["tested_gate_passing"]  # r2 fails its gates
  table = v3_verdicts.trained_markdown(rows, {**trained, "gates": {"model": gate(True)}})
  assert "| v3-1 |" in table and "**tested**" in table and "Accuracy on the test split" in table
  with pytest.raises(ValueError, match="out of order"):
    v3_verdicts.labelled(rows[1:2], v3_verdicts.verdicts(scripted, bootstrap=200)[:1], passing)
