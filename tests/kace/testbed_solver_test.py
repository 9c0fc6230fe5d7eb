"""The testbed solver's training data and gates, without training a model: training cards use only
training conventions (with `hold_out`, the evaluated constants are held out), the true card is of
the problem's kind, level-1 targets are the base answer, and the gates pass a solver that uses
cards and fail one that ignores them (scripted solvers)."""

import collections
import dataclasses
import os

import pytest

from kace import synthetic, testbed
from lm import generators, rundir
from lm.tokenizer import load_tokenizer
from tests.kace import testbed_helpers

PARAMS = generators.GenerationParams(max_tokens=16, temperature=0.7, seed=3)


SOLVERS = [
  (True, "short", "rule_first"),
  (False, "short", "rule_first"),
  (False, "long", "working"),
  (False, "keyed", "card_first"),
]


@pytest.mark.parametrize("hold_out,form,style", SOLVERS)
def test_training_cards_hold_only_training_conventions_and_targets_follow_the_true_card(
  hold_out, form, style
):
  config = synthetic.TestbedSolverConfig(examples=3000, hold_out=hold_out, form=form, completion=style)
  examples = synthetic.testbed_examples(config)
  allowed = testbed.TRAIN_H if hold_out else testbed.H
  seen, with_card = set(), collections.Counter()
  for chat, completion in examples:
    text = chat[0]["content"]
    notes, question = text.rsplit("Problem: ", 1)
    kind, base = testbed.parse_question(question)
    assert question == testbed.question(kind, *_operands(question), form)
    held = [testbed.parse_card(line) for line in notes.splitlines() if line.startswith("- [convention]")]
    assert all(rule in allowed for _, rule in held)
    seen |= {rule for _, rule in held}
    assert len({k for k, _ in held}) == len(held)  # one card per kind
    answer = int(completion.rsplit("{", 1)[1].rstrip("}"))
    level = testbed.KIND_OF_WORD[kind][1]
    rule = dict(held).get(kind)
    if level == 1:
      assert answer == base
    elif rule is not None:
      assert answer == rule.apply(base) and completion == rule.completion(base, style, form, kind)
      assert notes.count(testbed.card_text(kind, rule, form) + "\n") == 1
    with_card[level, rule is not None] += 1
  share = with_card[2, True] / (with_card[2, True] + with_card[2, False])
  assert 0.6 < share < 0.8  # card_fraction 0.7
  assert seen == set(allowed)


def _operands(question):
  a, op, b = question.split(": ", 1)[1].removeprefix("What is ").rstrip("?").split(" ")
  return int(a), op, int(b)


def test_solver_config_key_changes_with_every_field():
  base = synthetic.TestbedSolverConfig()
  assert base.key() == synthetic.TestbedSolverConfig().key()
  assert base.key() != synthetic.TestbedSolverConfig(steps=base.steps + 1).key()
  assert base.key() != synthetic.TestbedSolverConfig(form="long").key()
  assert base.key() != synthetic.TestbedSolverConfig(completion="working").key()
  assert base.key() != synthetic.TestbedSolverConfig(bucket_by_length=False).key()
  assert base.key() != synthetic.TinySolverConfig().key()


def test_conflict_variant_trains_on_shared_kind_words():
  """`variant="conflict"` (testbed v2): every operator's level >= 2 questions carry the level's one
  shared word, the target follows that word's card (its own cache key: tests/lm/code_digest_test.py)."""
  with pytest.raises(ValueError, match="testbed.solver.variant"):
    synthetic.TestbedSolverConfig(variant="v2")
  config = synthetic.TestbedSolverConfig(examples=600, variant="conflict")
  ops, followed = collections.defaultdict(set), 0
  for chat, completion in synthetic.testbed_examples(config):
    notes, question = chat[0]["content"].rsplit("Problem: ", 1)
    kind, base = testbed.parse_question(question)
    ops[kind].add(_operands(question)[1])
    rule = dict(testbed.parse_card(line) for line in notes.splitlines() if line.startswith("- [")).get(kind)
    if rule is not None and testbed.KIND_OF_WORD[kind][1] > 1:
      assert completion == rule.completion(base, config.completion, config.form, kind)
      followed += 1
  shared = {testbed.CONFLICT_KINDS[("algebra", level)] for level in (2, 3)}
  assert set(ops) == set(testbed.CONFLICT_KINDS.values())
  assert all(ops[word] == set(testbed.OPS) for word in shared) and followed > 100


class CardBlind:
  """Answers the base (the identity) whatever the notes say."""

  def generate(self, prompts, n=1, params=None):
    out = []
    for prompt in prompts:
      _, base = testbed.parse_question(prompt[0]["content"].rsplit("Problem: ", 1)[1])
      out.append([generators.Generation(f"\\boxed{{{base}}}", None, None, "stop", 10, 4)] * n)
    return out


@pytest.mark.parametrize("form", testbed.FORMS)
def test_gates_pass_a_solver_that_uses_cards_and_fail_one_that_ignores_them(form):
  config = testbed.TestbedConfig(seed=1, form=form)
  good = synthetic.testbed_gates(testbed_helpers.ConventionSolver(), config, PARAMS, samples=4)
  assert good["all_passed"], good
  assert good["rates"]["true_card/L2"] == 1.0 and good["rates"]["true_card_and_distractors/L3"] == 1.0
  assert good["rates"]["no_card/L1"] == 1.0
  # unseeded params are seeded by the testbed: the scripted solver's guesses repeat run to run
  unseeded = dataclasses.replace(PARAMS, seed=None)
  solver = testbed_helpers.ConventionSolver()
  first, second = (synthetic.testbed_gates(solver, config, unseeded) for _ in "ab")
  assert first == second
  blind = synthetic.testbed_gates(CardBlind(), config, PARAMS, samples=2)
  assert blind["passed"] == {"true_card": False, "no_card": True, "true_card_and_distractors": False}
  assert blind["rates"]["true_card/L2"] == 0.0 and blind["rates"]["no_card/L1"] == 1.0


def test_keyed_tokenizer_holds_cards_rules_and_keys_as_single_tokens(tmp_path):
  """The keyed form's point: in the solver's tokenizer a card is one token, the key's token is not
  the question's kind token, and a card_first completion starts with [key, rule] tokens."""
  config = synthetic.TestbedSolverConfig(examples=400)
  examples = synthetic.testbed_examples(config)
  corpus = [chat[0]["content"] + " " + completion for chat, completion in examples]
  synthetic.build_tokenizer(str(tmp_path), corpus, config.vocab_size, testbed.single_tokens("keyed"))
  tokenizer = load_tokenizer(str(tmp_path))
  rule = testbed.Convention("add", 3)
  key, word = tokenizer.encode("=total"), tokenizer.encode("addthree")
  assert len(key) == 1 and len(word) == 1
  card = tokenizer.encode(testbed.card_text("total", rule, "keyed"))
  assert len(card) == 1 and card[0] not in key + word
  assert tokenizer.encode("- [convention] " + testbed.card_text("total", rule, "keyed"))[-1:] == card
  question = tokenizer.encode("Problem: " + testbed.question("total", 3, "+", 4, "keyed"))
  assert key[0] not in question
  assert tokenizer.encode(rule.completion(7, "card_first", "keyed", "total"))[:2] == key + word
  tokens = [tokenizer.encode(text) for text in testbed.single_tokens("keyed")]
  assert all(len(t) == 1 for t in tokens) and len({t[0] for t in tokens}) == len(tokens)


@pytest.mark.slow
def test_a_curriculum_build_trains_a_short_prompt_phase_first(tmp_path):
  """`curriculum_steps`: the build's history holds the first phase (on prompts with at most
  `curriculum_distractors` cards besides the true one) before the main phase's steps."""
  # The launcher tests' solver (tests/launch/main_test.py, tests/kace/testbed_pipeline_test.py) with
  # a 2-step curriculum: a length-bucketed build compiles a step per batch width, and this one's
  # widths are theirs (their builds find both of its programs in the compilation cache).
  config = synthetic.TestbedSolverConfig(
    examples=16, steps=1, batch_size=4, hidden_size=32, intermediate_size=64, curriculum_steps=2
  )
  few = dataclasses.replace(config, examples=32, max_distractors=config.curriculum_distractors)
  cards = [chat[0]["content"].count("- [convention]") for chat, _ in synthetic.testbed_examples(few)]
  assert max(cards) <= config.curriculum_distractors + 1
  path = synthetic.ensure_testbed_solver(str(tmp_path), config)
  history = rundir.read_json(os.path.join(path, "build.json"))["sft"]
  phases = [(h.get("phase", "main"), h["step"]) for h in history]
  assert phases == [("curriculum", 1), ("curriculum", 2), ("main", 1)]


@pytest.mark.parametrize("form", testbed.FORMS)
def test_card_map_reads_every_card_of_a_solver_that_uses_cards_and_only_as_is_of_one_that_does_not(form):
  rates = synthetic.card_rates(testbed_helpers.ConventionSolver(), form, PARAMS, per_card=2, samples=2)
  level2 = [kind for (_, level), kind in testbed.KINDS.items() if level > 1]
  assert set(rates) == {f"{kind}/{h.describe('keyed')}" for kind in level2 for h in testbed.H}
  assert set(rates.values()) == {1.0}
  blind = synthetic.card_rates(CardBlind(), form, PARAMS, per_card=6, samples=2)
  # the base is the answer under "as is", and under another rule only where the base is 0 (times k)
  asis = {f"{kind}/asis" for kind in level2}
  assert all(blind[card] == 1.0 for card in asis)
  others = [rate for card, rate in blind.items() if card not in asis]
  assert sum(others) / len(others) < 0.1
