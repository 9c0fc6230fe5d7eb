"""The learned teacher (a tiny trained model, kace.learned_teacher): it reads the ADD prompt through
`oracle.shown_failures`, answers in the teacher schema with cards of the testbed's form, is trained
deterministically under a seed, never receives the hidden convention, and is what
`testbed.teacher="learned"` selects. The models here are trained for a few steps at tiny shapes:
these tests check the plumbing, not the teacher's accuracy (docs/kace.md, "The learned teacher")."""

import dataclasses
import json
import os
import re

import filelock
import numpy as np
import pytest
from safetensors.numpy import load_file

import configs.kace
from kace import cards, learned_teacher, oracle, pipeline, testbed
from kace import config as kace_config
from tests.kace import oracle_test

TINY = learned_teacher.LearnedTeacherConfig(
  examples=64, vocab_size=512, hidden_size=16, intermediate_size=32, num_heads=2, num_kv_heads=2, head_dim=8,
  steps=3, batch_size=8, warmup_steps=1,
)  # fmt: skip


@pytest.fixture(scope="module")
def tiny_teacher(tmp_path_factory, worker_id):
  """The teacher, trained once a session: xdist may hand this module's tests to both workers, which
  then share one cache through a lock in the session's temporary root (the second reads it back)."""
  root = tmp_path_factory.getbasetemp()
  root = root if worker_id == "master" else root.parent  # gw0's and gw1's common parent
  cache = root / "kace_learned_teacher_cache"
  with filelock.FileLock(str(root / "kace_learned_teacher.lock")):
    cache.mkdir(exist_ok=True)
    return str(cache), learned_teacher.ensure_learned_teacher(str(cache), TINY)


def _bench_prompt(seed=0, control="none"):
  """An ADD prompt (learn.teacher_prompt) showing 3 algebra level-2 and 2 level-3 problems and one
  number-theory level-2 problem of the testbed with `seed` / `control`, and that testbed's rules."""
  bed = testbed.TestbedConfig(seed=seed, control=control)
  train, _ = bed.problems()
  of = lambda d, level: [p for p in train if (p.domain, p.level) == (d, level)]
  shown = of("algebra", 2)[:3] + of("algebra", 3)[:2] + of("number_theory", 2)[:1]
  return oracle_test._prompt(shown), bed.conventions(), shown


def test_model_inputs_read_the_shown_pairs_of_each_kind_with_two_or_more():
  prompt, _, shown = _bench_prompt()
  pairs = {}
  for p in shown:
    kind, base = testbed.parse_question(p.question)
    pairs.setdefault(kind, []).append((base, int(p.answer)))
  # "rest" has one shown failure: no input for it (the teacher abstains there)
  assert learned_teacher.model_inputs(prompt) == [
    ("tally", learned_teacher.model_input(pairs["tally"])),
    ("total", learned_teacher.model_input(pairs["total"])),
  ]
  assert learned_teacher.model_input([(7, 10), (3, 6)]) == "<7><10><3><6>"
  assert set(learned_teacher.numbers()) >= {0, 405}  # 9 * 5, multiplied by 9


def test_training_examples_draw_a_rule_of_h_per_example_and_their_pairs_follow_it():
  examples = learned_teacher.training_examples(dataclasses.replace(TINY, examples=400))
  seen = set()
  for chat, word in examples:
    rule = learned_teacher.RULE_OF_WORD[word]
    tokens = chat[0]["content"][1:-1].split("><")
    pairs = list(zip(map(int, tokens[::2]), map(int, tokens[1::2]), strict=True))
    assert TINY.min_pairs <= len(pairs) <= TINY.max_pairs and all(rule.apply(b) == g for b, g in pairs)
    seen.add(rule)
  assert seen == set(testbed.H)
  held = learned_teacher.training_examples(dataclasses.replace(TINY, examples=400, hold_out=True))
  assert {learned_teacher.RULE_OF_WORD[w] for _, w in held} == set(testbed.TRAIN_H)


@pytest.mark.parametrize("variant", ["v1", "conflict"])
def test_accuracy_prompts_show_held_out_problems_of_one_block_and_carry_its_rule(variant):
  items = learned_teacher.accuracy_prompts(seeds=(1,), shown=(2, 8), draws=1, variant=variant)
  bed = testbed.TestbedConfig(seed=1, variant=variant)
  test_questions = {p.question for p in bed.problems()[1] if p.id not in bed.null_ids()}
  assert len(items) == 6 * 2 and {i["shown"] for i in items} == {2, 8}
  for item in items:
    shown = oracle.shown_failures(item["prompt"])
    # as many as asked, or every held-out problem of a block with fewer (null problems left out)
    assert 2 <= len(shown) <= item["shown"] and {kind for kind, _, _ in shown} == {item["kind"]}
    assert all(item["rule"].apply(base) == gold for _, base, gold in shown)
    assert all(q in test_questions for q in re.findall(r"### Problem \d+\n([^\n]*)", item["prompt"]))
  # the oracle at noise 0 is right on every one (the prompts carry what the teacher needs)
  assert learned_teacher.card_accuracy(oracle.OracleTeacher(form="keyed"), items)["all"]["accuracy"] == 1.0


@pytest.mark.slow
def test_reply_is_a_well_formed_card_of_the_testbed_form_for_each_kind(tiny_teacher):
  _, path = tiny_teacher
  prompt, _, _ = _bench_prompt()
  teacher = learned_teacher.LearnedTeacher(path, form="keyed")
  (gen,), (again,) = teacher.generate([prompt, prompt])
  reply = json.loads(gen.text)
  assert reply["by"] == learned_teacher.LABEL == teacher.label and gen.text == again.text
  # one answer per kind shown at least twice ("total" 3, "tally" 2; "rest" once): a card of the keyed
  # form stating a member of H, or the decoded word reported as unreadable
  parsed = [testbed.parse_card(c["text"]) for c in reply["cards"]]
  assert all(c is not None and c[1] in testbed.H for c in parsed)
  assert all(c["text"] == testbed.card_text(*testbed.parse_card(c["text"]), "keyed") for c in reply["cards"])
  assert len(parsed) + len(reply.get("unreadable", [])) == 2 and {k for k, _ in parsed} <= {"total", "tally"}
  # a prompt showing no kind twice gets an abstention in the same schema
  lone = oracle_test._prompt(_bench_prompt()[2][-1:])
  assert json.loads(teacher.reply(lone)) == {
    "cards": [], "by": learned_teacher.LABEL, "note": "no kind with 2 shown failures"
  }  # fmt: skip


def test_a_card_the_block_holds_is_not_proposed_again_and_unknown_words_are_no_card(tiny_checkpoint):
  prompt, _, shown = _bench_prompt()
  teacher = learned_teacher.LearnedTeacher(tiny_checkpoint)  # any model: no generation call here
  # what the model decoded for each kind -> the reply (no model call: the decoding is given)
  decoded = {"total": "addthree", "tally": "timesnine"}
  assert [c["text"] for c in json.loads(teacher._reply(prompt, decoded))["cards"]] == [
    "addthree=total",
    "timesnine=tally",
  ]
  tree, _ = cards.EpistemicTree().add(
    "addthree=total", testbed.CARD_TYPE, "MS", "algebra", cards.Provenance(origin="t")
  )
  held = oracle_test._prompt(shown, existing=tree)
  reply = json.loads(teacher._reply(held, {**decoded, "tally": "=tally"}))
  assert reply == {"cards": [], "by": learned_teacher.LABEL, "unreadable": ["=tally"]}


@pytest.mark.slow
def test_training_is_deterministic_under_a_seed(tmp_path, tiny_teacher):
  _, first = tiny_teacher
  second = learned_teacher.ensure_learned_teacher(str(tmp_path), TINY)
  other = learned_teacher.ensure_learned_teacher(str(tmp_path), dataclasses.replace(TINY, seed=1))
  assert first != second and os.path.basename(first) == os.path.basename(second)
  a, b, c = (load_file(os.path.join(p, "model.safetensors")) for p in (first, second, other))
  assert a.keys() == b.keys()
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  assert any(not np.array_equal(a[name], c[name]) for name in a if a[name].shape == c[name].shape)
  prompt, _, _ = _bench_prompt()
  assert learned_teacher.LearnedTeacher(first).reply(prompt) == learned_teacher.LearnedTeacher(second).reply(
    prompt
  )


def _config(cache, tiny_checkpoint, **testbed_fields):
  raw = configs.kace.get_config("testbed")
  raw.roles.solver.checkpoint = tiny_checkpoint
  raw.synthetic.cache_dir = cache
  raw.testbed.update({"teacher": "learned", "learned_teacher": dataclasses.asdict(TINY), **testbed_fields})
  return kace_config.KaceConfig.from_dict(raw)


@pytest.mark.slow
def test_the_config_selects_it_and_it_never_receives_the_hidden_convention(
  grader, tiny_teacher, tiny_checkpoint
):
  cache, path = tiny_teacher
  # two testbeds with different hidden conventions: the teachers built for them are the same model,
  # built from nothing of the testbed, and their inputs and replies for one prompt are equal
  a = pipeline.learner(_config(cache, tiny_checkpoint, seed=0), grader, embedder=None).teacher
  b = pipeline.learner(
    _config(cache, tiny_checkpoint, seed=1, control="identity"), grader, embedder=None
  ).teacher
  assert isinstance(a, learned_teacher.LearnedTeacher) and a.label == learned_teacher.LABEL
  assert a.path == b.path == path
  assert (
    testbed.TestbedConfig(seed=0).conventions()
    != testbed.TestbedConfig(seed=1, control="identity").conventions()
  )
  prompt, rules, _ = _bench_prompt(seed=0)
  assert a.inputs(prompt) == b.inputs(prompt) == learned_teacher.model_inputs(prompt)
  assert a.reply(prompt) == b.reply(prompt)
  # nothing the teacher holds is a convention of H or a testbed's config
  held = [v for v in vars(a).values() if not isinstance(v, learned_teacher.generators.JaxGenerator)]
  assert not any(isinstance(v, (testbed.Convention, testbed.TestbedConfig, dict)) for v in held)
  # the default is the oracle, and the learned teacher takes no oracle noise
  raw = configs.kace.get_config("testbed")
  assert raw.testbed.teacher == "oracle"
  assert raw.testbed.learned_teacher.to_dict() == dataclasses.asdict(learned_teacher.LearnedTeacherConfig())
  with pytest.raises(ValueError, match="testbed.teacher"):
    _config(cache, tiny_checkpoint, oracle_noise=0.3)
  with pytest.raises(ValueError, match="testbed.teacher"):
    _config(cache, tiny_checkpoint, teacher="model")
