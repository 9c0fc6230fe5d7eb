"""Copy-and-check cases: what each line copies, the control, the SAC's evidence, determinism, and
the warm start's knobs on this family."""

import collections
import json

import pytest

from configs import dpa_grpo as dpa_config
from dpa_grpo import game, rollout, setup, warm_start
from dpa_grpo.config import ExperimentConfig, rollout_config
from dpa_grpo.envs import copycheck, taxcalc
from lm import tokenizer as tokenizer_lib


def test_copy_lines_copy_their_field_and_the_control_is_not_in_the_input():
  cases = copycheck.generate_cases(200, seed=1)
  controls = collections.Counter()
  for case in cases:
    w2 = case.forms["w2"]
    assert case.gold["1a"] == w2["box1"] and case.gold["25d"] == w2["box2"]
    assert w2["box1"] in copycheck.BOX_POOLS["box1"] and w2["box2"] in copycheck.BOX_POOLS["box2"]
    assert case.forms["desk"] in copycheck.DESKS and copycheck.is_copycheck(case)
    controls[case.gold["12"]] += 1
    # The control amount appears nowhere in what the prompt shows.
    assert str(int(case.gold["12"])) not in json.dumps(case.forms)
    assert set(case.gold) == set(taxcalc.LINE_IDS)
  assert set(controls) == set(map(float, copycheck.CONTROL_AMOUNTS))
  assert min(controls.values()) > 60  # the coin is roughly fair: no role can beat a guess by much
  desks = collections.Counter(c.forms["desk"] for c in cases)
  assert min(desks.values()) > 60


def test_generation_is_deterministic_and_prefix_stable_and_splits_differ():
  a = copycheck.generate_cases(30, seed=2)
  assert a == copycheck.generate_cases(30, seed=2)
  assert a[:10] == copycheck.generate_cases(10, seed=2)
  other = copycheck.generate_cases(30, seed=2, split="validation")
  assert not {c.case_id for c in a} & {c.case_id for c in other}
  assert [c.forms for c in a] != [c.forms for c in other]
  with pytest.raises(ValueError):
    copycheck.generate_cases(0)


def test_confusion_is_a_wrong_well_formed_amount_and_the_sac_quotes_the_field():
  for case in copycheck.generate_cases(50, seed=3):
    for line_id in copycheck.LINES:
      wrong = copycheck.confusion(case, line_id)
      assert wrong != case.gold[line_id] and 100 <= wrong <= 999
    assert copycheck.confusion(case, "1a") in set(copycheck.BOX_POOLS["box1"]) - {case.forms["w2"]["box1"]}
    sac = copycheck.sac(case, "1a")
    assert sac.evidence == f"W-2 box 1 = {case.forms['w2']['box1']}"
    assert copycheck.sac(case, "25d").evidence == f"W-2 box 2 = {case.forms['w2']['box2']}"
    assert copycheck.sac(case, "12").evidence == "none"
    assert copycheck.draft_equals_field(case, "1a", case.gold["1a"]) is True
    assert copycheck.draft_equals_field(case, "25d", case.gold["1a"]) is False
    assert copycheck.draft_equals_field(case, "1a", None) is False
    assert copycheck.draft_equals_field(case, "12", case.gold["12"]) is None
  with pytest.raises(ValueError, match="lines"):
    copycheck.confusion(case, "16")


def test_habit_follows_the_desk_and_is_neutral_off_family():
  cases = copycheck.generate_cases(20, seed=4)
  for case in cases:
    assert copycheck.habit(case) == copycheck.DESK_HABIT[case.forms["desk"]]
  assert copycheck.habit(taxcalc.TaxCase("forms-case", {}, {})) == 1.0
  assert copycheck.DESK_HABIT["north"] > 1 > copycheck.DESK_HABIT["south"]


def test_the_verifier_prompt_ends_with_the_proposed_amount_beside_the_field_only_on_this_family():
  cfg = rollout.RolloutConfig(lines=copycheck.LINES, compact_forms=True)
  case = copycheck.generate_cases(1, seed=2)[0]
  prompts = {line_id: prompt for _, line_id, prompt in rollout.gold_episodes([case], cfg)}
  box1, box2 = case.forms["w2"]["box1"], case.forms["w2"]["box2"]
  for line_id, amount, note in (
    ("1a", 111, f"Proposed 111; the line copies W-2 box 1 = {box1}; they differ."),
    ("1a", box1, f"Proposed {box1}; the line copies W-2 box 1 = {box1}; they match."),
    ("25d", 111, f"Proposed 111; the line copies W-2 box 2 = {box2}; they differ."),
    ("25d", box1, f"Proposed {box1}; the line copies W-2 box 2 = {box2}; they differ."),
    ("12", 111, "Proposed 111; no input field gives this line."),
  ):
    answer = cfg.answer(line_id, amount, "r")
    assert copycheck.verifier_note(case, line_id, answer) == note
    text = rollout.verifier_prompt(case, line_id, prompts[line_id], answer)
    assert f"The preparer answered:\n{answer}\n\nCheck the answer." in text
    assert text.endswith('"evidence": "..."}.\n' + note)
  none = f"Proposed none; the line copies W-2 box 1 = {box1}; they differ."
  assert copycheck.verifier_note(case, "1a", "no amount here") == none
  # Another family's verifier prompt is the text it was before the note existed, byte for byte.
  other = taxcalc.TaxCase("forms-0", {"w2": {"box1": 415}}, dict.fromkeys(taxcalc.LINE_IDS, 0.0))
  assert copycheck.verifier_note(other, "1a", "Line 1a: r | 7") == ""
  text = rollout.verifier_prompt(other, "1a", "the task", "Line 1a: r | 7")
  assert text == game.verifier_prompt("the task", "Line 1a: r | 7")
  assert text.startswith(
    "A preparer was given this task:\n---\nthe task\n---\nThe preparer answered:\nLine 1a: r | 7\n\n"
    "Check the answer."
  )
  assert text.endswith('"evidence": "..."}.')


def test_played_verifier_prompts_carry_the_note_of_their_case_and_line():
  """`rollout.play` with scripted roles (not models): each verifier prompt names its own case's field."""
  cfg = rollout.RolloutConfig(lines=copycheck.LINES, compact_forms=True, revisions=1, explore=0.0)
  cases = copycheck.generate_cases(3, seed=6)

  class Scripted:
    def __init__(self, reply):
      self.reply, self.prompts = reply, []

    def generate(self, prompts, *, n, seeds, **_):
      self.prompts.extend(prompts)
      sample = lambda p: rollout.Sample(text=self.reply(p), tokens=(1,), mean_logprob=0.0, finish="stop")
      return [[1]] * len(prompts), [[sample(p) for _ in range(n)] for p in prompts]

  line_of = lambda prompt: prompt.rsplit("Compute line ", 1)[1].split(".", 1)[0]
  g = Scripted(lambda p: cfg.answer(line_of(p), 415, "r"))
  v = Scripted(lambda p: game.render_verifier_reply("correct"))
  units = rollout.play(cases, g, v, cfg, seed=0, step=0)
  assert len(v.prompts) == len(units) == 9
  for unit, prompt in zip(units, v.prompts, strict=True):
    case = next(c for c in cases if c.case_id == unit.draft.case_id)
    assert prompt.endswith(copycheck.verifier_note(case, unit.line_id, unit.draft.x.text))
    assert copycheck.verifier_note(case, unit.line_id, unit.draft.x.text).startswith("Proposed 415;")
    assert unit.record()["verifier_prompt"] == prompt


def test_the_decision_note_says_which_amount_matches_and_is_off_unless_asked():
  """`RolloutConfig.decision_note` (a post-hoc exploration): off, the KEEP / REVISE prompt is the
  text it was before the note existed; on, its last line says which of draft and revision equals
  the field; never on another family."""
  case = copycheck.generate_cases(1, seed=2)[0]
  box1 = case.forms["w2"]["box1"]
  off = rollout.RolloutConfig(lines=copycheck.LINES, compact_forms=True)
  on = rollout.RolloutConfig(lines=copycheck.LINES, compact_forms=True, decision_note=True)
  sac = setup.reviewer_sac(case, "1a")
  x, z = off.answer("1a", 111, "r"), off.answer("1a", box1, "r")
  plain = game.decision_prompt("the task", x, sac, z)
  assert rollout.decision_prompt(case, "1a", "the task", x, sac, z, off) == plain
  assert plain.endswith('{"decision": "REVISE"}. Reply with that JSON only.')
  field = f"the line copies W-2 box 1 = {box1}"
  note = f"Earlier 111, revised {box1}; {field}; the earlier differs, the revision matches."
  assert copycheck.decision_note(case, "1a", x, z) == note
  assert rollout.decision_prompt(case, "1a", "the task", x, sac, z, on) == plain + "\n" + note
  assert copycheck.decision_note(case, "1a", z, x).endswith("the earlier matches, the revision differs.")
  x12, z12 = off.answer("12", 111, "r"), off.answer("12", 222, "r")
  assert (
    copycheck.decision_note(case, "12", x12, z12)
    == "Earlier 111, revised 222; no input field gives this line."
  )
  other = taxcalc.TaxCase("forms-0", {"w2": {"box1": 415}}, dict.fromkeys(taxcalc.LINE_IDS, 0.0))
  assert rollout.decision_prompt(other, "1a", "the task", x, sac, z, on) == plain


def test_testbed_preset_loads_copycheck_cases_with_a_160_unit_test_split():
  config = ExperimentConfig.from_dict(dpa_config.get_config("testbed").to_dict())
  train, test = setup.load_data(config.data)
  assert all(copycheck.is_copycheck(c) for c in train + test)
  assert len(test) * len(config.rollout.lines) >= 160
  assert not {c.case_id for c in train} & {c.case_id for c in test}


def _examples(tmp_path, **knobs):
  config = dpa_config.get_config("tiny")
  config.rollout.lines = copycheck.LINES
  cases = copycheck.generate_cases(200, seed=5)
  cfg = rollout_config(config.rollout)
  tokenizer = tokenizer_lib.load_tokenizer(setup.task_tokenizer(str(tmp_path), cases[:20], cfg, 512))
  examples = warm_start.examples(cases, tokenizer, cfg, warm_start.WarmStartConfig(**knobs))
  return cases, cfg, tokenizer, examples


def _units(cases, cfg):
  return [(c, i) for c in cases for i in cfg.lines]


def test_draft_wrong_follows_the_desk_habit(tmp_path):
  cases, cfg, tokenizer, examples = _examples(tmp_path, draft_wrong=0.45, seed=1)
  wrong = collections.Counter()
  total = collections.Counter()
  for (_, completion), (case, line_id) in zip(examples["draft"], _units(cases, cfg), strict=True):
    amount = taxcalc.parse_line_answer(tokenizer.decode(completion[:-1]), line_id).value
    assert amount in (case.gold[line_id], copycheck.confusion(case, line_id))  # the one mistake only
    wrong[case.forms["desk"]] += amount != case.gold[line_id]
    total[case.forms["desk"]] += 1
  north, south = (wrong[d] / total[d] for d in ("north", "south"))
  assert 0.62 < north < 0.82 and 0.1 < south < 0.27  # 0.45 x 1.6 = 0.72, 0.45 x 0.4 = 0.18


def test_verify_flip_and_revise_wrong_make_imperfect_targets(tmp_path):
  cases, cfg, tokenizer, examples = _examples(tmp_path, verify_flip=0.25, revise_wrong=0.4, seed=2)
  flipped = []
  for (prompt, completion), (case, line_id) in zip(examples["verify"], _units(cases, cfg), strict=True):
    proposal = tokenizer.decode(prompt).split("The preparer answered:\n", 1)[1].split("\n", 1)[0]
    right = taxcalc.parse_line_answer(proposal, line_id).value == case.gold[line_id]
    reply = game.parse_verifier_reply(tokenizer.decode(completion[:-1]))
    assert reply.valid
    flipped.append(reply.action != (game.NS if right else game.SAC_ACTION))
    if reply.action == game.SAC_ACTION:
      assert reply.sac == copycheck.sac(case, line_id)  # the evidence quotes the field
  assert 0.18 < sum(flipped) / len(flipped) < 0.32
  revised_wrong = [
    taxcalc.parse_line_answer(tokenizer.decode(c[:-1]), line_id).value != case.gold[line_id]
    for (_, c), (case, line_id) in zip(examples["revise"], _units(cases, cfg), strict=True)
  ]
  assert 0.32 < sum(revised_wrong) / len(revised_wrong) < 0.48


def test_zero_knobs_keep_the_forms_warm_start_stream(tmp_path):
  """With every new knob at 0 the warm start draws exactly what it drew before they existed: the
  forms preset's warm start (and the README numbers measured on it) do not move."""
  from dpa_grpo.envs import forms

  config = dpa_config.get_config("tiny")
  cases = forms.generate_cases(4, seed=3, difficulty=0)
  cfg = rollout_config(config.rollout)
  tokenizer = tokenizer_lib.load_tokenizer(setup.task_tokenizer(str(tmp_path), cases, cfg, 512))
  got = warm_start.examples(cases, tokenizer, cfg, warm_start.WarmStartConfig(seed=1))
  # The stream as it was: per unit corrupt, one draw for the verifier, two for the decision pair,
  # and a corrupt for a wrong revision.
  import random

  rng = random.Random(1)
  for (prompt, _), (case, line_id, p) in zip(
    got["verify"], list(rollout.gold_episodes(cases, cfg)), strict=True
  ):  # fmt: skip
    gold = case.gold[line_id]
    wrong = cfg.answer(line_id, warm_start.corrupt(gold, rng), warm_start.EXPLANATION)
    shown = wrong if rng.random() < 0.5 else cfg.answer(line_id, gold, warm_start.EXPLANATION)
    assert tokenizer.decode(prompt).count(shown) >= 1 and p in tokenizer.decode(prompt)
    _, z_right = rng.random() < 0.5, rng.random() < 0.5
    if not z_right:
      warm_start.corrupt(gold, rng)


def test_verify_pairs_show_every_prompt_with_a_right_and_a_wrong_answer(tmp_path):
  cases, cfg, tokenizer, examples = _examples(tmp_path, verify_pairs=True, seed=3)
  units = _units(cases, cfg)
  assert len(examples["verify"]) == 2 * len(units) and len(examples["draft"]) == len(units)
  for i, (case, line_id) in enumerate(units):
    pair = examples["verify"][2 * i : 2 * i + 2]
    shown = [tokenizer.decode(p).split("The preparer answered:\n", 1)[1] for p, _ in pair]
    proposals = [text.split("\n", 1)[0] for text in shown]
    assert all(
      copycheck.verifier_note(case, line_id, p) in text for text, p in zip(shown, proposals, strict=True)
    )
    amounts = [taxcalc.parse_line_answer(p, line_id).value for p in proposals]
    assert amounts == [case.gold[line_id], copycheck.confusion(case, line_id)]
    verdicts = [game.parse_verifier_reply(tokenizer.decode(c[:-1])).action for _, c in pair]
    assert verdicts == [game.NS, game.SAC_ACTION]  # verify_flip 0: the true labels
