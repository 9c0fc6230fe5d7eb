"""The teacher of testbed v3 (kace.v3_learn.Teacher): the programmatic one unchanged, the learned one
(kace.v3_teacher) covering v3's numbers, reading only what a teacher prompt shows, and the labelled
upper-bound arm. A fake generator stands in for the model except in one tiny build (plumbing, not
accuracy: docs/results/2026-12-04-kace-v3-learned-teacher.md has the trained teacher's)."""

import dataclasses
import hashlib
import json
import random

import pytest

from kace import learned_teacher, readers, testbed, testbed_v3, v3_arms, v3_learn, v3_teacher
from lm import code_digest, generators


class FakeGenerator:
  """A generator that answers each model input with a rule word fixed by the input's hash, and
  records every prompt it is sent."""

  def __init__(self):
    self.prompts: list = []
    self.words = sorted(learned_teacher.RULE_OF_WORD)

  def generate(self, prompts, n=1, params=None):
    self.prompts.extend(prompts)
    out = []
    for chat in prompts:
      digest = int(hashlib.sha256(chat[0]["content"].encode()).hexdigest(), 16)
      word = self.words[digest % len(self.words)]
      out.append([generators.Generation(word, (), None, "stop", 0, 1)])
    return out


def test_numbers_cover_every_v3_base_and_every_rule_of_it():
  numbers = set(v3_teacher.numbers())
  for (domain, _), ((lo_a, hi_a), (lo_b, hi_b)) in testbed_v3.OPERANDS.items():
    op = testbed.OPS[testbed.OP_OF_DOMAIN[domain]]
    for base in {op(a, b) for a in range(lo_a, hi_a + 1) for b in range(lo_b, hi_b + 1)}:
      assert {base, *(h.apply(base) for h in testbed.H)} <= numbers
  for seed in range(10):
    for p in testbed_v3.WorldConfig(seed=seed).problems():
      assert p.base in numbers and int(p.problem.answer) in numbers
  assert max(numbers) == 270 * 9 and set(learned_teacher.numbers()) <= numbers


def test_the_v1_v2_default_config_and_its_cache_key_are_unchanged():
  # The key is this JSON plus the digest of kace.learned_teacher's import closure; the v3 teacher is a
  # module outside that closure, so neither changes (at 0bbc0b3 the key was 6eaeb38e819d, before and
  # after the v3 teacher was added). A literal key would also change with any unrelated edit of a
  # module in the closure (kace.learn, lm.sampler...), so the JSON is the literal compared.
  default = learned_teacher.LearnedTeacherConfig()
  config_json = json.dumps(dataclasses.asdict(default), sort_keys=True)
  assert config_json == (
    '{"batch_size": 64, "examples": 30000, "head_dim": 16, "hidden_size": 64, "hold_out": false, '
    '"intermediate_size": 192, "learning_rate": 0.003, "max_pairs": 8, "min_pairs": 2, "num_heads": 4, '
    '"num_kv_heads": 4, "num_layers": 2, "rope_theta": 1000000.0, "seed": 0, "steps": 1500, '
    '"vocab_size": 512, "warmup_steps": 50}'
  )
  assert default.key() == code_digest.cache_key(config_json, ("kace.learned_teacher",))
  closure = code_digest.import_closure(learned_teacher.BUILD_MODULES)
  assert not {"kace.v3_teacher", "kace.testbed_v3", "kace.v3_learn", "kace.v3_arms"} & set(closure)
  assert v3_teacher.V3TeacherConfig().key() != default.key()
  assert "kace.learned_teacher" in code_digest.import_closure(v3_teacher.BUILD_MODULES)


def test_training_examples_follow_their_rule_with_at_most_one_pair_of_another():
  config = v3_teacher.V3TeacherConfig(examples=2000)
  seen, mixed = set(), 0
  for chat, word in v3_teacher.training_examples(config):
    rule = learned_teacher.RULE_OF_WORD[word]
    tokens = chat[0]["content"][1:-1].split("><")
    pairs = list(zip(map(int, tokens[::2]), map(int, tokens[1::2]), strict=True))
    off = sum(rule.apply(b) != g for b, g in pairs)
    assert 1 <= len(pairs) <= 4 and off <= (1 if len(pairs) >= 3 else 0)
    seen.add(rule)
    mixed += off > 0
  assert seen == set(testbed_v3.RULES) and 0 < mixed < 2000 * config.mixed


def _failures(seed=0):
  return [p for p in testbed_v3.WorldConfig(seed=seed).split("teach") if p.domain == "combinatorics"][:6]


def test_the_learned_teacher_reads_only_the_question_and_gold():
  fake = FakeGenerator()
  teacher = v3_teacher.LearnedV3Teacher(fake)
  failures = _failures()
  cards = teacher.cards(failures, 4, random.Random(3))
  # every hidden field corrupted: the same cards, from the same model inputs
  corrupt = [dataclasses.replace(p, base=p.base + 1000, size="?", family="?", split="?") for p in failures]
  fake2 = FakeGenerator()
  assert v3_teacher.LearnedV3Teacher(fake2).cards(corrupt, 4, random.Random(3)) == cards
  assert fake2.prompts == fake.prompts and cards
  # what it was sent: (base, gold) pairs of the shown questions, the base read from the question text
  shown = random.Random(3).sample(failures, 4)
  sent = {chat[0]["content"] for chat in fake.prompts}
  for kind in {p.kind for p in shown}:
    pairs = [
      (testbed.parse_question(p.problem.question)[1], int(p.problem.answer)) for p in shown if p.kind == kind
    ]
    assert learned_teacher.model_input(pairs) in sent
  assert teacher.calls == 1 and teacher.decoded == len(sent)


def test_the_programmatic_teacher_is_unchanged_and_the_default():
  failures, rng = _failures(), random.Random(5)
  assert v3_learn.PROGRAMMATIC.cards(failures, 4, random.Random(5)) == v3_learn.teacher(failures, 4, rng)
  assert v3_learn.PROGRAMMATIC.name == "programmatic teacher"
  result = v3_learn.run(readers.READERS[:2], [0, 1])
  o, c = result["outcomes"], result["counts"]
  # computed with the code before the teacher became a choice (commit 0bbc0b3)
  outcomes = repr(sorted((r, a, k, v) for r in o for a in o[r] for k, v in o[r][a].items()))
  counts = repr(sorted((r, a, repr(v)) for r in c for a, v in c[r].items()))
  assert hashlib.sha256(outcomes.encode()).hexdigest()[:16] == "7c793c688c10b617"
  assert hashlib.sha256(counts.encode()).hexdigest()[:16] == "2886b03ffccd67e2"
  assert set(result["teachers"].values()) == {None, "programmatic teacher"}


def test_every_teacher_role_calls_the_chosen_teacher_and_the_oracle_arm_keeps_its_own():
  class Counting:
    name = "counting teacher"

    def __init__(self):
      self.calls = 0

    def cards(self, failures, shown_failures, rng):
      self.calls += 1
      return v3_learn.teacher(failures, shown_failures, rng)

  reader, world = readers.READERS[0], testbed_v3.WorldConfig(seed=0)
  arms = {a.name: a for a in v3_arms.TRAINED_ARMS}
  for name in ("kace", "ace_playbook", "gepa", "kace_oracle_teacher"):
    solver = v3_arms.Solver(reader, 0, v3_arms.Budget())
    counting = Counting()
    tree, counts = v3_learn.build(solver, arms[name], world, counting)
    if name == "kace_oracle_teacher":
      assert counting.calls == 0  # its own (programmatic) teacher, with kace's randomness
      kace, _ = v3_learn.build(solver, arms["kace"], world)
      assert tree.blocks == kace.blocks
    else:
      # ACE's reflector and curator are one call of the teacher, counted as two
      assert 0 < counting.calls * (2 if name == "ace_playbook" else 1) <= counts.teacher_calls
  assert "kace_oracle_teacher" not in v3_arms.ARM_NAMES and v3_arms.TRAINED_ARMS[:-1] == v3_arms.ARMS
  with pytest.raises(ValueError, match="unknown teacher"):
    v3_learn.arm_teacher(v3_arms.Arm(name="x", teacher="nobody"), v3_learn.PROGRAMMATIC)


def test_card_accuracy_groups_and_scores():
  groups = v3_teacher.accuracy_groups(builds=[0])
  assert {g["group"] for g in groups} == {"block", "mixed"} and all(
    1 <= len(g["problems"]) <= 4 for g in groups
  )
  for g in groups:
    if g["group"] == "block":
      assert len({(p.domain, p.family, p.size) for p in g["problems"]}) == 1 and len(g["rules"]) == 1
  result = v3_teacher.card_accuracy(v3_learn.PROGRAMMATIC, groups)
  assert result["block"]["groups"] == 24 and result["mixed"]["groups"] == 24
  assert 0.5 < result["block"]["right"]["mean"] <= 1.0 and result["all"]["abstained"] == 0


def test_a_tiny_build_answers_with_cards_of_v3_words(tmp_path):
  config = v3_teacher.V3TeacherConfig(
    examples=64, vocab_size=1024, hidden_size=16, intermediate_size=32, num_heads=2, num_kv_heads=2,
    head_dim=8, steps=2, batch_size=8, warmup_steps=1,
  )  # fmt: skip
  teacher = v3_teacher.LearnedV3Teacher.build(str(tmp_path), config)
  cards = teacher.cards(_failures(), 4, random.Random(0))
  assert all(kind in testbed_v3.FAMILIES.values() and rule in testbed.H for kind, rule in cards)
  assert teacher.name == "learned teacher (tiny model)"
