"""The oracle (programmatic) teacher and curator: they read only the prompts the learner sends, fit
the declared hypothesis set to the shown failures (abstaining below two agreeing), add noise when
asked, and — with a scripted solver that applies a card for its question's kind — ADD learns the
testbed's true conventions and nothing else. The solver here is scripted (a rule, not a model)."""

import json

import pytest

from kace import cards, embed, learn, oracle, solve, testbed, tiers
from lm import generators
from tests.kace import learn_helpers, testbed_helpers

PARAMS = generators.GenerationParams(max_tokens=8, temperature=1.0)


def _solution(problem, answers):
  samples = tuple(
    solve.SampleRecord(
      text=f"\\boxed{{{a}}}", answer=str(a), correct=False, completion_tokens=3, finish_reason="stop"
    )
    for a in answers
  )
  stage = solve.StageRecord(stage="MS", cards_tier="MS", cards=(), prompt_tokens=10, samples=samples)
  return solve.Solution(
    id=problem.id, domain=problem.domain, gold=problem.answer, answer=str(answers[0]), correct=False,
    exit_tier="MS", votes=1, calls=len(answers), num_samples=len(answers), rounds=1, completion_tokens=9,
    prompt_tokens=30, stages=(stage,),
  )  # fmt: skip


def _prompt(problems, existing=None):
  shown = [_solution(p, [-1, -2]) for p in problems]
  return learn.teacher_prompt(
    existing or cards.EpistemicTree(),
    ("MS", "algebra"),
    shown,
    {p.id: p for p in problems},
    learn.LearnConfig(attempt_tokens=64),
  )


@pytest.fixture(scope="module")
def bench():
  config = testbed.TestbedConfig(seed=7)
  return config, config.conventions(), *config.problems()


def _of(problems, domain, level):
  return [p for p in problems if (p.domain, p.level) == (domain, level)]


def test_teacher_fits_each_shown_kind_from_the_prompt_alone(bench):
  _, rules, train, _ = bench
  shown = _of(train, "algebra", 2)[:3] + _of(train, "algebra", 3)[:2] + _of(train, "number_theory", 2)[:1]
  reply = oracle.OracleTeacher().generate([_prompt(shown)])[0][0].text
  got = {testbed.parse_card(text) for _, text in learn.parse_cards(reply, max_cards=5)}
  # two kinds with >= 2 failures get their block's rule; "rest" (one failure) is abstained on
  assert got == {("total", rules[("algebra", 2)]), ("tally", rules[("algebra", 3)])}


def test_teacher_abstains_below_two_agreeing_failures_and_skips_held_cards(bench):
  _, rules, train, _ = bench
  teacher = oracle.OracleTeacher()
  reply = teacher.generate([_prompt(_of(train, "algebra", 2)[:1])])[0][0].text
  with pytest.raises(learn.ReplyError):
    learn.parse_cards(reply, max_cards=3)
  tree, _ = cards.EpistemicTree().add(
    testbed.card_text("total", rules[("algebra", 2)]),
    "convention",
    "MS",
    "algebra",
    cards.Provenance(),
    reason="t",
  )
  reply = teacher.generate([_prompt(_of(train, "algebra", 2)[:3], tree)])[0][0].text
  assert json.loads(reply)["cards"] == []  # already held: nothing new
  assert teacher.calls == 2


def test_teacher_noise_gives_a_wrong_member_of_h(bench):
  _, rules, train, _ = bench
  prompt = _prompt(_of(train, "combinatorics", 2)[:4])
  reply = oracle.OracleTeacher(noise=1.0, seed=1).generate([prompt], n=2)[0]
  assert reply[0].text == reply[1].text
  ((_, text),) = learn.parse_cards(reply[0].text, max_cards=3)
  kind, rule = testbed.parse_card(text)
  assert kind == "count" and rule in testbed.H and rule != rules[("combinatorics", 2)]
  with pytest.raises(ValueError, match="noise"):
    oracle.OracleTeacher(noise=1.5)


def test_curator_deletes_negative_credit_and_the_weaker_of_two_rules_for_a_kind():
  tree = cards.EpistemicTree()
  texts = [
    testbed.card_text("total", testbed.Convention("add", 3)),
    testbed.card_text("total", testbed.Convention("mul", 3)),
    testbed.card_text("rest", testbed.Convention("add", 6)),
    testbed.card_text("tally", testbed.Convention("add", 9)),
  ]
  ids = []
  for text in texts:
    tree, card = tree.add(text, "convention", "MS", "algebra", cards.Provenance(), reason="t")
    ids.append(card.id)
  credits = [
    learn.Credit(card=ids[0], readers=4, with_card=3, without_card=0, examples=[]),
    learn.Credit(card=ids[1], readers=4, with_card=1, without_card=0, examples=[]),
    learn.Credit(card=ids[2], readers=4, with_card=0, without_card=1, examples=[]),
    learn.Credit(card=ids[3], readers=4, with_card=2, without_card=0, examples=[]),
  ]
  prompt = learn.curator_prompt(tree, credits, [], {}, learn.LearnConfig(), ("MS", "HS"))
  reply = oracle.OracleCurator().generate([prompt])[0][0].text
  ops = learn.parse_operations(reply)
  assert {(op.op, op.ids) for op in ops} == {("delete", (ids[2],)), ("delete", (ids[1],))}


def test_add_with_the_oracle_teacher_learns_the_true_conventions(grader, tmp_path, bench):
  _, rules, train, _ = bench
  bert = embed.MiniLM(learn_helpers.tiny_bert(str(tmp_path / "bert")))
  teacher, curator = oracle.OracleTeacher(), oracle.OracleCurator()
  learner = learn.Learner(
    solver=testbed_helpers.ConventionSolver(), teacher=teacher, curator=curator, grader=grader, embedder=bert,
    schedule=tiers.Schedule(), params=PARAMS, role_params=PARAMS,
    config=learn.LearnConfig(failures_per_prompt=6, max_cards=3, universal=False),
    domains=testbed.DOMAINS,
  )  # fmt: skip
  teach = [p for p in train if p.level > 1 or p.id.endswith("/0")]
  accept_ids = {p.id for i, p in enumerate(sorted(teach, key=lambda p: p.id)) if i % 2}
  teach, accept = [p for p in teach if p.id not in accept_ids], [p for p in teach if p.id in accept_ids]
  start = cards.EpistemicTree(domains=testbed.DOMAINS)
  tree = learn.learn_tree(learner, teach, accept, {p.id: p.domain for p in train}, start, {}, None)
  learned = {testbed.parse_card(c.text) for c in tree.cards}
  true = {(testbed.KINDS[cell], rule) for cell, rule in rules.items() if cell[1] > 1}
  assert learned <= true  # nothing wrong is kept
  level_2 = {(testbed.KINDS[(d, 2)], rules[(d, 2)]) for d in testbed.DOMAINS}
  assert level_2 <= learned  # every level-2 block's rule is learned at the tier its problems reach
  assert teacher.calls > 0 and curator.calls > 0


def test_ace_reflector_and_curator_give_evidence_tags_and_a_non_empty_delta():
  """ACE's roles played by the oracle (issue 47, item 4): the reflector states each reviewed
  problem's (base, gold) and tags the playbook's cards of its kind; the curator fits H to the batch's
  evidence and adds the cards the playbook lacks, which `baselines.parse_delta` accepts."""
  from kace import baselines

  add3 = testbed.Convention("add", 3)
  playbook = "[card-0001] " + testbed.card_text("total", add3, "keyed") + "\n[card-0002] timestwo=sum"
  reflections = []
  for a, b, rule in ((3, 4, add3), (2, 2, add3), (1, 5, testbed.Convention("mul", 2))):
    prompt = baselines.REFLECTOR_TEMPLATE.format(
      playbook=playbook, question=testbed.question("total", a, "+", b, "keyed"), answer="0",
      verdict="wrong", gold=rule.apply(a + b), response="=totaladdthree: 7",
    )  # fmt: skip
    text, tags = baselines.parse_reflection(oracle.OracleTeacher().reply(prompt))
    assert text == f"evidence total: {a + b} -> {rule.apply(a + b)}"
    assert dict(tags) == {"card-0001": "helpful" if rule == add3 else "harmful", "card-0002": "neutral"}
    reflections.append(f"- {text}")
  curator = oracle.OracleCurator(form="keyed")
  ask = lambda book: baselines.ACE_CURATOR_TEMPLATE.format(
    playbook=book, reflections="\n".join(reflections), max_cards=3
  )
  assert baselines.parse_delta(curator.reply(ask("(empty)")), 3, 600) == (("convention", "addthree=total"),)
  assert baselines.parse_delta(curator.reply(ask(playbook)), 3, 600) == ()  # already in the playbook


def test_gepa_reflection_puts_the_fitted_rule_into_the_instruction():
  """GEPA's reflection LM played by the oracle: from the library's own prompt (its default instruction
  proposal over `SolverAdapter`'s feedback rows) it returns the instruction with the rule fitted to
  the examples' correct answers, replacing an earlier card of that kind word; GEPA's extractor reads it."""
  from gepa.strategies.instruction_proposal import InstructionProposalSignature as Sig

  add3 = testbed.Convention("add", 3)
  rows = [
    {"Inputs": testbed.question("total", a, "+", b, "keyed"), "Generated Outputs": "=totaltimestwo: 7",
     "Feedback": f"Wrong: answered 1, the correct answer is {add3.apply(a + b)}."}
    for a, b in ((3, 4), (2, 2), (1, 1))
  ] + [{"Inputs": "sum: 1 + 1", "Generated Outputs": "2", "Feedback": "Correct."}]  # fmt: skip
  current = "Solve it.\n- [convention] timestwo=total"

  def propose(shown):
    prompt = Sig.prompt_renderer(
      {"current_instruction_doc": current, "dataset_with_feedback": shown, "prompt_template": None}
    )
    return Sig.output_extractor(oracle.OracleTeacher(form="keyed").reply(prompt))["new_instruction"]

  assert propose(rows) == "Solve it.\n- [convention] addthree=total"
  assert propose(rows[:1]) == current  # one agreeing example: the oracle abstains
