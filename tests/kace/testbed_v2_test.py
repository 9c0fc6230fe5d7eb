"""Testbed v2 (docs/kace.md, "Testbed v2"): the scripted solver (kace.scripted, a program, labelled
"scripted"), the conflict variant (one kind word per level shared by every domain, a different rule
in each), plausible wrong cards, ADD's strict rule (a neutral card is rejected, a helpful one kept)
and the retrieval k chosen on the validation split."""

import dataclasses

import pytest

import configs.kace
from kace import cards, learn, oracle, pipeline, predictions, scripted, testbed, tiers
from kace import config as kace_config
from lm import generators
from tests.kace import learn_helpers

PARAMS = generators.GenerationParams(max_tokens=24, temperature=0.7, seed=3)


def _ask(question, notes=(), n=4, seed=3):
  prompt = learn_helpers._text(
    [{"role": "user", "content": "\n".join(f"- [convention] {c}" for c in notes) + f"\nProblem: {question}"}]
  )
  gens = scripted.ScriptedSolver().generate([prompt], n=n, params=dataclasses.replace(PARAMS, seed=seed))[0]
  return [g.text for g in gens]


def test_scripted_solver_applies_the_first_card_of_its_kind_else_guesses():
  add3, add6 = testbed.Convention("add", 3), testbed.Convention("add", 6)
  card = lambda kind, rule: testbed.card_text(kind, rule, "keyed")
  # its kind's card among others: applied literally, in the keyed completion
  assert (
    _ask("total: 3 + 4", [card("rest", add6), card("total", add3)])
    == ["=totaladdthree: 7 + 3 -> \\boxed{10}"] * 4
  )
  # two cards of its kind (a flat playbook under conflict): the first shown wins
  assert set(_ask("total: 3 + 4", [card("total", add6), card("total", add3)])) == {
    "=totaladdsix: 7 + 6 -> \\boxed{13}"
  }
  # no card: a level-1 kind keeps the base; another kind guesses, seeded (same seed, same samples)
  assert set(_ask("sum: 3 + 4", n=8)) == {"=sumasis: 7 -> \\boxed{7}"}
  guesses = _ask("total: 3 + 4", n=16)
  assert len(set(guesses)) > 2 and guesses == _ask("total: 3 + 4", n=16)
  assert _ask("not a testbed question") == ["(no testbed question)"] * 4


def test_scripted_solver_is_the_solver_of_the_whole_comparison_when_selected():
  c = configs.kace.get_config("testbed")
  c.testbed.solver_kind = "scripted"
  config = pipeline.evaluate.resolve(kace_config.KaceConfig.from_dict(c))
  assert (config.roles.solver.kind, config.roles.solver.model) == ("scripted", scripted.MODEL)
  assert isinstance(generators.make_generator(config.roles.solver), scripted.ScriptedSolver)
  assert pipeline.SOLVER_LABEL["scripted"].startswith("scripted")
  with pytest.raises(ValueError, match="testbed.solver_kind"):
    c.testbed.solver_kind = "oracle"
    kace_config.KaceConfig.from_dict(c)


def test_conflict_variant_gives_one_kind_word_different_rules_across_domains():
  v1, v2 = testbed.TestbedConfig(seed=1), testbed.TestbedConfig(seed=1, variant="conflict")
  assert v1.kinds() == testbed.KINDS and v1.rules_of_kinds() == {} and not v1.null_ids()
  rules, kinds = v2.conventions(), v2.kinds()
  for level in (2, 3):
    words = {kinds[(d, level)] for d in testbed.DOMAINS}
    assert len(words) == 1  # the same surface cue in every domain ...
    assert len({rules[(d, level)] for d in testbed.DOMAINS}) == 3  # ... with a different rule in each
  assert all(rules[(d, 2)] != rules[(d, 3)] for d in testbed.DOMAINS)
  # every card is still one of the solver's single tokens
  assert set(testbed.true_cards(rules, form="keyed", kinds=kinds).values()) <= set(
    testbed.single_tokens("keyed")
  )
  train, test = v2.problems()
  null = v2.null_ids()
  by_id = {p.id: p for p in train + test}
  for p in train + test:
    kind, base = testbed.parse_question(p.question)
    assert kind == kinds[(p.domain, p.level)]
    follows = rules[(p.domain, p.level)].apply(base) == int(p.answer)
    assert follows != (p.id in null)  # a null problem never follows its block's rule
  assert all(by_id[i].level > 1 for i in null) and 0.1 < len(null) / (len(train) + len(test)) < 0.3
  # plausible wrong cards: the noisy oracle draws another block's rule for the same kind word
  plausible = v2.rules_of_kinds()
  assert plausible["total"] == tuple(sorted(rules[(d, 2)] for d in testbed.DOMAINS))
  teacher = oracle.OracleTeacher(noise=1.0, form="keyed", plausible=plausible)
  shown = [p for p in train if (p.domain, p.level) == ("algebra", 2) and p.id not in null][:4]
  prompt = "\n".join(
    f"### Problem {i}\n{p.question}\nCorrect answer: {p.answer}" for i, p in enumerate(shown)
  )
  (card,) = learn.parse_cards(teacher.reply(prompt), max_cards=3)
  kind, rule = testbed.parse_card(card[1])
  assert kind == "total" and rule in plausible["total"] and rule != rules[("algebra", 2)]


def test_strict_add_rule_rejects_a_neutral_card_and_keeps_a_helpful_one(grader):
  config = testbed.TestbedConfig(seed=0, per_cell=24, test_per_cell=2, form="keyed")
  rules, (train, _) = config.conventions(), config.problems()
  strict = learn.LearnConfig(accept_rule="strict")
  learner = learn.Learner(
    solver=scripted.ScriptedSolver(), teacher=None, curator=None, grader=grader, embedder=None,
    schedule=tiers.Schedule(), params=PARAMS, role_params=PARAMS, config=strict, domains=testbed.DOMAINS,
  )  # fmt: skip
  algebra = [p for p in train if p.domain == "algebra"]
  domains = {p.id: p.domain for p in algebra}
  start = cards.EpistemicTree(domains=testbed.DOMAINS)
  state = learn.State(start, {s.id: s for s in learner.solve(algebra, domains, start)}, [], algebra, domains)

  def judge(text):
    candidate, _ = start.add(text, "convention", "MS", "algebra", cards.Provenance(), reason="test")
    return learn.trial(learner, state, candidate, [("MS", "algebra")])

  # a card no reader's kind word matches changes nothing: kept by the old rule, rejected by the strict
  neutral = judge(testbed.card_text("rest", rules[("number_theory", 2)], "keyed"))
  assert neutral.problems and neutral.wins == neutral.losses == 0
  assert learn.accepts(learn.LearnConfig(), neutral) and not learn.accepts(strict, neutral)
  helpful = judge(testbed.card_text("total", rules[("algebra", 2)], "keyed"))
  assert helpful.wins >= 5 and helpful.losses == 0 and learn.accepts(strict, helpful)
  # the bounds: 5 wins and no loss is the least kept at alpha 0.05; regressions over 10% refuse
  assert learn.sign_test(5, 0) < 0.05 <= learn.sign_test(4, 0)
  many = dataclasses.replace(helpful, wins=30, losses=5, problems=["p"] * 40)
  assert not learn.accepts(strict, many)


@pytest.mark.slow  # 6-13 s on the shared 2-core machine (a tiny BERT built, 2 x 57 problems solved)
def test_retrieval_k_is_chosen_on_the_validation_split(grader, tmp_path):
  c = configs.kace.get_config("testbed")
  c.testbed.update(solver_kind="scripted", per_cell=8, test_per_cell=2)
  c.update(methods=("kace", "embedding_retrieval"))
  c.retrieval.update(k_candidates=(1, 9), model_dir=learn_helpers.tiny_bert(str(tmp_path / "bert")))
  config = pipeline.evaluate.resolve(kace_config.KaceConfig.from_dict(c))
  bed = config.testbed.testbed()
  train, test = bed.problems()
  domains = {p.id: p.domain for p in train}
  tree = cards.EpistemicTree(domains=testbed.DOMAINS)
  for (d, level), rule in bed.conventions().items():
    tree, _ = tree.add(testbed.card_text(bed.kinds()[(d, level)], rule, "keyed"), "convention", "MS", d,
                       cards.Provenance(), reason="test")  # fmt: skip
  (tmp_path / "kace").mkdir()
  tree.save(str(tmp_path / "kace" / learn.TREE))
  # every card (k = 9) holds each problem's own; one card chosen by a random tiny embedder rarely does
  assert pipeline.choose_k(config, str(tmp_path), train, domains, grader) == {"embedding_retrieval": 9}
  record = pipeline.rundir.read_json(str(tmp_path / "embedding_retrieval_k.json"))
  assert record["accuracy"]["9"] > record["accuracy"]["1"]
  assert record["validation"] and not set(record["validation"]) & {p.id for p in test}
  assert set(record["validation"]) <= {p.id for p in train}
  assert pipeline.with_chosen_k(config, str(tmp_path)).retrieval.k == 9


def test_card_verdicts_tell_right_misplaced_and_wrong_cards_of_a_shared_kind_word():
  bed = testbed.TestbedConfig(seed=0, variant="conflict")
  rules, kinds = bed.conventions(), bed.kinds()
  algebra, other = rules[("algebra", 2)], rules[("number_theory", 2)]
  tree = cards.EpistemicTree(domains=testbed.DOMAINS)
  for text, tier, domain in (
    (testbed.card_text("total", algebra, "keyed"), "MS", "algebra"),  # its domain's rule: right
    (testbed.card_text("total", other, "keyed"), "MS", "algebra"),  # another domain's: wrong here
    (testbed.card_text("total", other, "keyed"), None, None),  # universal: right in one domain of three
    ("carry the tens digit", None, None),
  ):
    tree, _ = tree.add(text, "convention", tier, domain, cards.Provenance(), reason="test")
  assert predictions.card_verdicts(tree, rules, kinds) == {"right": 1, "misplaced": 1, "wrong": 1, "other": 1}


def test_v2_build_facts_count_refine_operations_and_cards(tmp_path):
  bed = testbed.TestbedConfig(seed=0, variant="conflict")
  rules, kinds = bed.conventions(), bed.kinds()
  tree = cards.EpistemicTree(domains=testbed.DOMAINS)
  text = testbed.card_text("total", rules[("algebra", 2)], "keyed")
  tree, _ = tree.add(text, "convention", "MS", "algebra", cards.Provenance(), reason="test")
  (tmp_path / "kace").mkdir()
  tree.save(str(tmp_path / "kace" / learn.TREE))
  log = [
    {"phase": "add", "cards": [{"accepted": True}, {"accepted": False}]},
    {"phase": "refine", "applied": [{}, {}], "rolled_back": [{}], "refused": []},
  ]
  pipeline.rundir.append_jsonl(str(tmp_path / "kace" / learn.LOG), log)
  facts = predictions.v2_build_facts(str(tmp_path), rules, kinds)["kace"]
  assert facts == {"right": 1, "misplaced": 0, "wrong": 0, "other": 0, "add_kept": 1, "add_rejected": 1,
                   "refine_applied": 2, "refine_rolled_back": 1, "refine_refused": 0}  # fmt: skip


def test_oracle_curator_deletes_idle_cards_only_when_asked():
  tree = cards.EpistemicTree(domains=testbed.DOMAINS)
  ids = []
  for text in ("addthree=total", "addsix=tally"):
    tree, card = tree.add(text, "convention", "MS", "algebra", cards.Provenance(), reason="test")
    ids.append(card.id)
  credits = [
    learn.Credit(card=ids[0], readers=4, with_card=3, without_card=0, examples=[]),
    learn.Credit(card=ids[1], readers=4, with_card=1, without_card=1, examples=[]),  # idle: credit 0
  ]
  prompt = learn.curator_prompt(tree, credits, [], {}, learn.LearnConfig(), ("MS", "HS"))
  ops = lambda curator: [(op.op, op.ids) for op in learn.parse_operations(curator.reply(prompt))]
  assert ops(oracle.OracleCurator()) == []
  assert ops(oracle.OracleCurator(delete_idle=True)) == [("delete", (ids[1],))]
