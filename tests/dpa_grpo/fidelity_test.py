"""The reference code's training mechanisms as config options, on hand-built episodes.

Each mechanism is off in the CPU presets (today's behaviour, which the CPU report was measured
with) and on in the paper presets; docs/dpa_grpo.md has the fidelity table these tests follow.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lm
from configs import dpa_grpo as dpa_config
from dpa_grpo import config as config_lib
from dpa_grpo import game, losses, metrics, packing, rollout
from dpa_grpo.envs import forms
from lm import scoring
from lm.config import ModelConfig

PAPER_PRESETS = [
  f"{s}{m}" for s in ("qwen3_4b", "qwen3_8b") for m in ("", "_grpo", "_dapo", "_gspo", "_zero_shot")
]


def _typed(preset):
  return config_lib.ExperimentConfig.from_dict(dpa_config.get_config(preset).to_dict())


# ---- presets -----------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["cpu", "tiny", "cpu_grpo", "tiny_dapo"])
def test_cpu_presets_resolve_to_todays_training(preset):
  """Every new option is today's choice in the CPU presets, so the CPU report stays valid."""
  c = _typed(preset)
  assert c.loss.decision_rewards == "outcome" and not c.loss.case_weights
  assert c.loss.revision_weight == 0.0 and not c.loss.skip_verifier_on_invalid_draft
  assert not c.loss.revision_filter and not c.loss.skip_decision_on_invalid_revision
  assert c.loss.case_weight_by == "case"
  assert c.loss.aggregate == "mean" and c.loss.verifier_weight == 1.0
  assert c.loss.proposal_weight == 1.0 and c.loss.invalid_penalty == 0.1
  assert c.loss.pair_actions == "reply_prefix"
  assert not c.rollout.missing_as_zero and c.rollout.context == "submitted"
  assert (
    c.rollout.keep_rule == "majority"
    and c.rollout.verdict_tokens == {"cpu": 40, "tiny": 8}[preset.split("_")[0]]
  )
  assert c.rollout.group_carry == "first" and c.baseline.mode == "library"
  assert c.rollout.unparsed_revision == "missing"
  assert c.train.update_every == "step" and c.train.eval_cases == 0 and c.train.min_steps == 0
  assert c.train.select_initial
  assert c.optim.weight_decay == 0.0 and c.optim.max_grad_norm == 1.0 and c.lora.dropout == 0.0
  assert c.rollout.decision_tokens == {"cpu": 10, "tiny": 4}[preset.split("_")[0]]
  assert c.data.batch_cases == {"cpu": 4, "tiny": 2}[preset.split("_")[0]]
  assert c.rollout.group_size == {"cpu": 4, "tiny": 2}[preset.split("_")[0]]
  assert (c.lora.rank, c.lora.alpha) == {"cpu": (8, 16.0), "tiny": (2, 4.0)}[preset.split("_")[0]]


@pytest.mark.parametrize("preset", PAPER_PRESETS)
def test_paper_presets_train_as_the_reference_code(preset):
  c = _typed(preset)
  assert c.loss.decision_rewards == "shaped" and c.loss.case_weights
  assert c.loss.revision_weight == 1.0 and c.loss.skip_verifier_on_invalid_draft
  assert c.loss.revision_filter and c.loss.skip_decision_on_invalid_revision
  assert (c.loss.cave_penalty, c.loss.miss_penalty, c.loss.outcome_bonus) == (0.2, 0.3, 0.5)
  assert (c.loss.revise_format_penalty, c.loss.balance_strength, c.loss.balance_target) == (0.25, 1.5, 0.3)
  assert c.loss.case_weight_by == "case_id" and c.loss.case_weight_power == 1.0
  assert c.loss.aggregate == "sum" and c.loss.verifier_weight == 0.5
  assert c.loss.proposal_weight == 0.0 and c.loss.invalid_penalty == 0.0
  assert c.loss.pair_actions == "reference_stub"
  assert c.loss.kl == "k1" and c.loss.weighting == "pair" and c.loss.beta == 0.04
  assert c.rollout.missing_as_zero and c.rollout.context == "draft" and c.rollout.keep_rule == "first"
  assert (c.rollout.max_new_tokens, c.rollout.verdict_tokens, c.rollout.decision_tokens) == (2048, 2048, 256)
  assert c.rollout.group_size == 2 and c.rollout.group_carry == "best" and c.baseline.mode == "reference"
  assert c.rollout.unparsed_revision == "keep_draft"
  assert c.train.update_every == "case" and c.data.batch_cases == 10
  assert c.train.eval_cases == 8 and c.train.min_steps == 10 and c.train.patience == 2
  assert not c.train.select_initial and c.train.eval_every == 5
  assert c.optim.weight_decay == 0.01 and c.optim.lr == 1e-5 and c.optim.max_grad_norm == 0.0
  assert (c.lora.rank, c.lora.alpha, c.lora.dropout) == (8, 32.0, 0.05)
  assert (c.rollout.revisions, c.rollout.revision_temperature, c.rollout.explore) == (5, 0.7, 0.4)
  assert (c.baseline.steps, c.baseline.batch_cases, c.baseline.patience) == (20, 5, 3)


@pytest.mark.parametrize("preset", ["qwen3_4b", "qwen3_4b_grpo", "cpu"])
def test_baselines_get_the_reference_budget_in_the_paper_presets(preset):
  """The reference's baseline scripts: 20 steps of 5 cases, patience 3; its DPA-GRPO: 30 of 10,
  patience 2. A compared or main generator-only method gets the former; DPA-GRPO keeps its own;
  the CPU presets (budget 0) give every method the experiment's."""
  c = _typed(preset)
  paper = preset.startswith("qwen3")
  for method in ("grpo", "dapo", "gspo"):
    run = c.for_method(method)
    budget = (run.train.steps, run.data.batch_cases, run.train.patience)
    assert budget == ((20, 5, 3) if paper else (c.train.steps, c.data.batch_cases, c.train.patience))
  dpa = c.for_method("dpa_grpo")
  assert (dpa.train.steps, dpa.data.batch_cases, dpa.train.patience) == (
    (30, 10, 2) if paper else (c.train.steps, c.data.batch_cases, c.train.patience)
  )
  assert c.for_method("zero_shot").train.steps == 0


def test_lora_dropout_needs_adapters_and_a_rate_below_one():
  assert config_lib.LoRAConfig(dropout=0.05).dropout == 0.05
  with pytest.raises(ValueError, match="needs lora.enabled=True"):
    config_lib.LoRAConfig(enabled=False, dropout=0.05)
  with pytest.raises(ValueError, match=r"lora.dropout must be in \[0, 1\)"):
    config_lib.LoRAConfig(dropout=1.0)


@pytest.mark.parametrize(
  "section, key, value",
  [
    ("loss", "decision_rewards", "binary"),
    ("train", "update_every", "epoch"),
    ("baseline", "mode", "trl"),
    ("rollout", "engine", "sglang"),  # any OpenAI-compatible engine is "openai"
    ("rollout", "engine_url", ""),  # engine="openai" without a URL (set below)
  ],
)
def test_unknown_choices_fail_with_their_key(section, key, value):
  values = dpa_config.get_config("tiny").to_dict()
  values[section][key] = value
  if key == "engine_url":
    values["rollout"]["engine"] = "openai"
  with pytest.raises(ValueError, match=f"{section}.{key}"):
    config_lib.ExperimentConfig.from_dict(values)


# ---- hand-built units --------------------------------------------------------------------------


def _sample(tokens, text="t"):
  return rollout.Sample(text, tuple(tokens), -0.5, "stop")


def _unit(x_right, sac, action=None, z_right=None, z_parsed=True, x_parsed=True, gold=5.0, case_id="c0"):
  """A played unit built phase by phase (as `rollout.play` builds it), with the 8-case label."""
  draft = rollout.Draft(
    case_id=case_id,
    line_id="1a",
    gold=gold,
    prompt="draft prompt",
    prompt_ids=[1, 2, 3],
    x=_sample([4, 5]),
    amount=(gold if x_right else gold + 1) if x_parsed else None,
    right=x_right,
  )
  parsed = game.VerifierReply(
    action=game.SAC_ACTION if sac else game.NS,
    verdict="wrong" if sac else "correct",
    sac=game.SAC("c", "a", "e") if sac else None,
    valid=True,
    error="",
    text="",
  )
  verdict = rollout.Verdict(prompt="verify", prompt_ids=[6, 7], reply=_sample([8]), parsed=parsed)
  revision = decision = None
  if sac:
    z_amount = (gold if z_right else gold + 2) if z_parsed else None
    revision = rollout.Revision(
      prompt="revise",
      prompt_ids=[9, 10],
      samples=(_sample([11, 12]),),
      amounts=(z_amount,),
      kept=0,
      z_amount=z_amount,
      z_right=bool(z_right),
      rights=(bool(z_right),),
    )
    decision = rollout.Decision(
      prompt="decide",
      prompt_ids=[13, 14],
      reply=_sample([15]),
      parsed=game.GeneratorDecision(action=action, valid=True, error="", text=""),
      forced_revise=False,
      action=action,
    )
  return rollout._settle(draft, verdict, revision, decision)


class _Tokenizer:
  def encode(self, text):
    return [ord(ch) % 50 + 2 for ch in text[:8]]


K, R = game.KEEP, game.REVISE
# case: (x right, SAC, action, z right, z parsed)
EIGHT = {
  "1": (True, False, None, None, True),
  "2": (True, True, R, True, True),
  "3": (True, True, K, True, True),
  "4": (False, False, None, None, True),
  "5a": (False, True, R, True, True),
  "5b": (False, True, R, False, True),
  "6a": (False, True, K, False, True),
  "6b": (False, True, K, True, True),
}
# The preferred action of each SAC'd case: today's outcome rule (None: a tie, no signal) and the
# reference code's shaped rule.
OUTCOME = {"2": None, "3": None, "5a": R, "5b": None, "6a": None, "6b": R}
SHAPED = {"2": K, "3": K, "5a": R, "5b": K, "6a": K, "6b": R}


def _preferred(rewards):
  return None if rewards[0] == rewards[1] else int(rewards[1] > rewards[0])


@pytest.mark.parametrize("rule, expected", [("outcome", OUTCOME), ("shaped", SHAPED)])
@pytest.mark.parametrize("case", list(EIGHT))
def test_decision_rewards_across_the_eight_cases(case, rule, expected):
  unit = _unit(*EIGHT[case])
  assert unit.case == case
  loss = config_lib.LossConfig(decision_rewards=rule, proposal_weight=0.0, invalid_penalty=0.0)
  items = packing.dpa_items([unit], _Tokenizer(), loss)
  (verdict,) = items["verifier"]
  assert verdict.rewards == ((1.0, 0.0) if unit.x_right else (0.0, 1.0))  # [NS, SAC]
  if case in ("1", "4"):  # no SAC: the generator does not act, no decision pair
    assert items["generator"] == []
    return
  (decision,) = items["generator"]
  assert decision.completions == tuple(_Tokenizer().encode(s) for s in game.GENERATOR_PAIR)
  assert _preferred(decision.rewards) == expected[case]
  if rule == "outcome":
    assert decision.rewards == (float(unit.x_right), float(unit.z_right))


def test_shaped_rule_keeps_on_an_unparsable_revision():
  unit = _unit(False, True, R, z_right=False, z_parsed=False)
  rewards = packing.decision_rewards(unit, config_lib.LossConfig(decision_rewards="shaped"))
  assert _preferred(rewards) == K


# The reference's shaped [KEEP, REVISE] rewards (`dpa_grpo/dual_rollout.py`, `updates.py`) at the
# paper presets' values: outcome bonus b = 0.5, cave 0.2, miss 0.3, format penalty 0.25, balance
# strength 1.5 and target 0.3. Each unit is alone in its update, so the REVISE share is 1 if it
# played REVISE (bonus 1.5·max(0.3 − 1, 0) = 0) and 0 if KEEP (bonus 1.5·0.3 = 0.45 on REVISE).
#   case (x, action, z)        KEEP              REVISE
#   2  (right, R, right)       1 + b·1 = 1.5     b·S_z = 0.5
#   2  (right, R, wrong)       1.5               −cave = −0.2
#   3  (right, K, right)       1.5               0.5 + 0.45 = 0.95
#   3  (right, K, wrong)       1.5               −0.2 + 0.45 = 0.25
#   5a (wrong, R, right)       −miss = −0.3      1 + b·1 = 1.5
#   5b (wrong, R, wrong)       1                 b·0 = 0
#   6a (wrong, K, wrong)       1                 0 + 0.45 = 0.45
#   6b (wrong, K, right)       −0.3              1.5 + 0.45 = 1.95
#   6a with z unparsable       1                 −0.25 + 0.45 = 0.2 (skipped in the presets)
SHAPED_REWARDS = [
  ("2", (True, True, R, True, True), (1.5, 0.5)),
  ("2", (True, True, R, False, True), (1.5, -0.2)),
  ("3", (True, True, K, True, True), (1.5, 0.95)),
  ("3", (True, True, K, False, True), (1.5, 0.25)),
  ("5a", (False, True, R, True, True), (-0.3, 1.5)),
  ("5b", (False, True, R, False, True), (1.0, 0.0)),
  ("6a", (False, True, K, False, True), (1.0, 0.45)),
  ("6b", (False, True, K, True, True), (-0.3, 1.95)),
  ("6a", (False, True, K, False, False), (1.0, 0.2)),
]


@pytest.mark.parametrize("case, spec, expected", SHAPED_REWARDS)
def test_shaped_rewards_are_the_references_numbers(case, spec, expected):
  loss = _typed("qwen3_4b").loss
  unit = _unit(*spec)
  assert unit.case == case
  bonus = packing.balance_bonus([unit], loss)
  assert bonus == pytest.approx(0.45 if unit.generator_action == K else 0.0)
  np.testing.assert_allclose(packing.decision_rewards(unit, loss, bonus), expected, atol=1e-12)
  generator = packing.dpa_items([unit], _Tokenizer(), loss)["generator"]
  decisions = [i for i in generator if i.component == 0]
  if unit.revision.z_amount is None:  # the reference skips the decision on an unparsable revision
    assert decisions == []
    loss = dataclasses.replace(loss, skip_decision_on_invalid_revision=False)
    decisions = [i for i in packing.dpa_items([unit], _Tokenizer(), loss)["generator"] if i.component == 0]
  (decision,) = decisions
  np.testing.assert_allclose(decision.rewards, expected, atol=1e-12)


def test_balance_bonus_follows_the_updates_revise_share():
  """Three KEEPs and one REVISE: share 0.25, bonus 1.5·(0.3 − 0.25) = 0.075 on every unit's REVISE;
  two of four REVISE (share 0.5 ≥ 0.3): no bonus; the outcome rule never gets one."""
  loss = _typed("qwen3_4b").loss
  units = [_unit(*EIGHT["3"])] * 3 + [_unit(*EIGHT["5a"])]
  assert packing.balance_bonus(units, loss) == pytest.approx(0.075)
  items = [i for i in packing.dpa_items(units, _Tokenizer(), loss)["generator"] if i.component == 0]
  np.testing.assert_allclose([i.rewards for i in items], [(1.5, 0.575)] * 3 + [(-0.3, 1.575)])
  half = [_unit(*EIGHT["3"]), _unit(*EIGHT["6a"]), _unit(*EIGHT["5a"]), _unit(*EIGHT["5b"])]
  assert packing.balance_bonus(half, loss) == 0.0
  unchallenged = [_unit(*EIGHT["1"]), _unit(*EIGHT["4"])]
  assert packing.balance_bonus(unchallenged, loss) == 0.0
  assert packing.balance_bonus(units, dataclasses.replace(loss, decision_rewards="outcome")) == 0.0


def test_reference_case_weights_merge_the_a_b_cases():
  """The reference counts its integer case ids over an update's SAC'd units: 5a and 5b are one
  class, 6a and 6b another. Cases 5a, 5b, 6a, 3: ids 5, 5, 6, 3, mean count 4/3, weights
  (4/3)/2 = 2/3 for the 5s and (4/3)/1 = 4/3 for the others; over the 8 cases all four are 1."""
  units = [_unit(*EIGHT[c]) for c in ("5a", "5b", "6a", "3")]
  loss = _typed("qwen3_4b").loss
  weights = [i.weight for i in packing.dpa_items(units, _Tokenizer(), loss)["generator"] if i.component == 0]
  np.testing.assert_allclose(weights, [2 / 3, 2 / 3, 4 / 3, 4 / 3])
  by_case = dataclasses.replace(loss, case_weight_by="case")
  items = packing.dpa_items(units, _Tokenizer(), by_case)["generator"]
  weights = [i.weight for i in items if i.component == 0]
  np.testing.assert_allclose(weights, [1.0] * 4)
  # The power: cases 3, 3, 3, 5a at α = 0.5 → (2/3)^0.5 three times and 2^0.5.
  np.testing.assert_allclose(packing.case_weights(["3", "3", "3", "5"], 0.5), [(2 / 3) ** 0.5] * 3 + [2**0.5])


def test_unparsable_revisions_count_in_the_case_weights_and_share_even_when_skipped():
  """A unit whose kept revision is unparsable trains no decision pair in the presets, but still
  counts among the update's SAC'd units (the reference's `considered` transitions)."""
  loss = _typed("qwen3_4b").loss
  skipped = _unit(False, True, K, z_right=False, z_parsed=False)  # 6a, KEEP
  units = [skipped, _unit(*EIGHT["6a"]), _unit(*EIGHT["5a"])]  # REVISE share 1/3 ≥ 0.3: no bonus
  items = [i for i in packing.dpa_items(units, _Tokenizer(), loss)["generator"] if i.component == 0]
  assert len(items) == 2
  # ids 6, 6, 5: mean count 3/2 → 6a weight 3/4, 5a weight 3/2.
  np.testing.assert_allclose([i.weight for i in items], [0.75, 1.5])
  np.testing.assert_allclose([i.rewards for i in items], [(1.0, 0.0), (-0.3, 1.5)])


def test_case_weights_are_inverse_frequency_with_mean_one():
  units = [_unit(*EIGHT["3"])] * 3 + [_unit(*EIGHT["6a"])]
  loss = config_lib.LossConfig(case_weights=True, proposal_weight=0.0, invalid_penalty=0.0)
  weights = [i.weight for i in packing.dpa_items(units, _Tokenizer(), loss)["generator"]]
  np.testing.assert_allclose(weights, [2 / 3, 2 / 3, 2 / 3, 2.0])
  assert np.mean(weights) == pytest.approx(1.0)
  chunk = packing.dpa_chunks(packing.dpa_items(units, _Tokenizer(), loss)["generator"], 1, 4, pad_id=0)[0]
  np.testing.assert_allclose(chunk["item_weight"], weights)


def test_verifier_update_is_skipped_when_the_draft_is_unparsable():
  unit = _unit(False, True, K, z_right=False, x_parsed=False)
  for skip, expected in ((False, 1), (True, 0)):
    loss = config_lib.LossConfig(skip_verifier_on_invalid_draft=skip)
    assert len(packing.dpa_items([unit], _Tokenizer(), loss)["verifier"]) == expected
  parsed = _unit(False, True, K, z_right=False)
  loss = config_lib.LossConfig(skip_verifier_on_invalid_draft=True)
  assert len(packing.dpa_items([parsed], _Tokenizer(), loss)["verifier"]) == 1


def test_pair_loss_on_the_draft_prompt_and_invalid_penalty_are_options():
  unit = _unit(*EIGHT["5a"])
  unit = dataclasses.replace(
    unit, decision=dataclasses.replace(unit.decision, parsed=game.GeneratorDecision(K, False, "bad", "?"))
  )
  on = packing.dpa_items([unit], _Tokenizer(), config_lib.LossConfig())["generator"]
  assert [i.component for i in on] == [0, 1, -1]  # decision, proposal [x, z], the invalid reply
  assert on[1].prompt == unit.draft.prompt_ids and on[2].penalty == (0.1, 0.0)
  off = config_lib.LossConfig(proposal_weight=0.0, invalid_penalty=0.0)
  assert [i.component for i in packing.dpa_items([unit], _Tokenizer(), off)["generator"]] == [0]


# ---- the revise turn's group -------------------------------------------------------------------


def _revise_unit(rights, tokens):
  unit = _unit(False, True, R, z_right=rights[0])
  samples = tuple(_sample(t) for t in tokens)
  revision = dataclasses.replace(
    unit.revision, samples=samples, amounts=(5.0,) * len(samples), rights=tuple(rights)
  )
  return dataclasses.replace(unit, revision=revision)


def test_revision_items_carry_the_groups_advantages():
  unit = _revise_unit((False, True, False), [[20, 21], [22, 23], [24]])
  loss = config_lib.LossConfig(revision_weight=1.0, beta=0.04)
  items = packing.revision_items([unit], loss)
  assert len(items) == 2 and items[1].completions == ((24,), ())
  adv = np.array([-1, 2, -1]) / np.sqrt(2)  # (r − μ)/σ of [0, 1, 0]
  coefs = [items[0].coef[0], items[0].coef[1], items[1].coef[0]]
  np.testing.assert_allclose(coefs, -adv / 3, rtol=1e-6)
  np.testing.assert_allclose([items[0].kl_coef, items[1].kl_coef], [[0.04 / 3] * 2, [0.04 / 3, 0.0]])
  tied = _revise_unit((True, True), [[20], [21]])
  assert packing.revision_items([tied], loss)[0].coef == (0.0, 0.0)  # a tie: only the k1 term


def test_revision_filter_drops_unparsable_revisions_and_skips_groups_without_contrast():
  """The reference trains the revise group on its parsed revisions only, and not at all when fewer
  than two parse or their rewards agree (no KL term either)."""
  loss = config_lib.LossConfig(revision_weight=1.0, beta=0.04, revision_filter=True)
  unit = _revise_unit((False, True, False), [[20, 21], [22, 23], [24]])
  unit = dataclasses.replace(unit, revision=dataclasses.replace(unit.revision, amounts=(5.0, 5.0, None)))
  (item,) = packing.revision_items([unit], loss)  # the third (unparsable) revision left the group
  assert item.completions == ((20, 21), (22, 23))
  np.testing.assert_allclose(item.coef, [0.5, -0.5], rtol=1e-6)  # −A/K with A = ∓1, K = 2
  np.testing.assert_allclose(item.kl_coef, [0.02, 0.02])
  tied = _revise_unit((True, True, False), [[20], [21], [22]])
  tied = dataclasses.replace(tied, revision=dataclasses.replace(tied.revision, amounts=(5.0, 5.0, None)))
  assert packing.revision_items([tied], loss) == []  # the two parsed ones agree: skipped
  lone = dataclasses.replace(unit, revision=dataclasses.replace(unit.revision, amounts=(5.0, None, None)))
  assert packing.revision_items([lone], loss) == []  # one parsed revision: no group
  assert len(packing.revision_items([lone], dataclasses.replace(loss, revision_filter=False))) == 2


def test_the_revise_group_moves_log_prob_of_the_right_revision_up():
  """One gradient step of the generator's loss on a unit whose second revision is right: its mean
  log-prob under the policy rises, the wrong ones' fall (no other term in the batch)."""
  model = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(0))
  ref = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(0))
  unit = _revise_unit((False, True, False, False), [[20, 21], [30, 31], [40, 41], [50, 51]])
  loss = config_lib.LossConfig(revision_weight=1.0, proposal_weight=0.0, invalid_penalty=0.0)
  items = [i for i in packing.dpa_items([unit], _Tokenizer(), loss)["generator"] if i.component < 0]
  (chunk,) = packing.dpa_chunks(items, 1, 2, pad_id=0)
  batch = {k: jnp.asarray(v) for k, v in chunk.items()}
  cfg = losses.DPALossConfig(components=("decision",), component_weights=(1.0,), vocab_chunk=64)
  graph, params, rest = nnx.split(model, nnx.Param, ...)

  def loss_of(p):
    return losses.dpa_loss(nnx.merge(graph, p, rest), ref, batch, cfg)[0]

  def logp_of(p):
    _, seq = scoring.sequence_logprobs(nnx.merge(graph, p, rest), batch, normalize=True, chunk=64)
    return np.asarray(seq)  # rows: revisions 0, 1, 2, 3

  grads = jax.grad(loss_of)(params)
  stepped = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
  before, after = logp_of(params), logp_of(stepped)
  assert after[1] > before[1] + 1e-3
  assert all(after[k] < before[k] for k in (0, 2, 3))


def test_sum_aggregation_is_the_reference_sum_of_group_losses():
  """Under aggregate="sum" a component's loss is the sum of its units' pair losses (the reference's
  groups ÷ their size, summed over the case) — n times the mean — with the metrics still means;
  the revise groups are summed too (−A/K per revision, not ÷ the number of groups)."""
  model = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(0))
  ref = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(1))
  units = [_unit(*EIGHT[c]) for c in ("3", "5a", "6a")]
  loss = config_lib.LossConfig(decision_rewards="shaped", proposal_weight=0.0, invalid_penalty=0.0)
  items = [i for i in packing.dpa_items(units, _Tokenizer(), loss)["generator"] if i.component == 0]
  cfg = losses.DPALossConfig(components=("decision",), component_weights=(1.0,), vocab_chunk=64)
  out = {}
  for how in ("mean", "sum"):
    (chunk,) = packing.dpa_chunks(items, 1, 4, pad_id=0, aggregate=how)
    assert ("component_total" in chunk) == (how == "sum")
    out[how] = losses.dpa_loss(model, ref, {k: jnp.asarray(v) for k, v in chunk.items()}, cfg)
  assert abs(float(out["mean"][0])) > 1e-6
  np.testing.assert_allclose(float(out["sum"][0]), 3 * float(out["mean"][0]), rtol=1e-4)
  for key, value in out["mean"][1].items():
    np.testing.assert_allclose(out["sum"][1][key], value, rtol=1e-6)
  two = [_revise_unit((False, True), [[20], [21]]), _revise_unit((True, False), [[22], [23]])]
  summed = dataclasses.replace(config_lib.LossConfig(revision_weight=1.0), aggregate="sum")
  np.testing.assert_allclose(
    [i.coef for i in packing.revision_items(two, summed)], [[0.5, -0.5], [-0.5, 0.5]]
  )
  meaned = config_lib.LossConfig(revision_weight=1.0)
  np.testing.assert_allclose(
    [i.coef for i in packing.revision_items(two, meaned)], [[0.25, -0.25], [-0.25, 0.25]]
  )


def test_verifier_weight_scales_the_verdict_component():
  from dpa_grpo import step

  c = _typed("qwen3_4b")
  cfgs = step.loss_configs("dpa_grpo", c.loss, c.baseline, max_new_tokens=8)
  assert cfgs["verifier"].component_weights == (0.5,) and cfgs["generator"].component_weights[0] == 1.0


# ---- scoring, context and the reference baseline -----------------------------------------------


@pytest.mark.parametrize("mode", ["missing", "keep_draft"])
def test_a_revise_on_an_unparsable_revision_submits_z_or_keeps_the_draft(mode):
  """Line with gold 0, x wrong (7), REVISE played on an unparsable revision, missing amounts read
  as 0.0. "missing": z reads as 0.0, right — case 5a, submitted None, right. "keep_draft" (the
  reference): S_z = 0 — case 5b — and the submitted line is x, wrong."""
  cfg = rollout.RolloutConfig(missing_as_zero=True, unparsed_revision=mode)
  base = _unit(False, True, R, z_right=False, z_parsed=False, gold=0.0)
  z_right = cfg.revision_correct(None, 0.0)
  revision = dataclasses.replace(base.revision, z_right=z_right, rights=(z_right,))
  unit = rollout._settle(
    base.draft, base.verdict, revision, base.decision, keep_draft_on_unparsed=mode == "keep_draft"
  )
  if mode == "missing":
    assert (unit.case, unit.submitted, unit.submitted_right) == ("5a", None, True)
  else:
    assert (unit.case, unit.submitted, unit.submitted_right) == ("5b", 1.0, False)
  assert cfg.revision_correct(0.0, 0.0) and not cfg.revision_correct(3.0, 0.0)  # parsed: the oracle


def test_reference_scoring_reads_a_missing_amount_as_zero():
  today, reference = rollout.RolloutConfig(), rollout.RolloutConfig(missing_as_zero=True)
  assert not today.correct(None, 0.0) and reference.correct(None, 0.0)
  assert not reference.correct(None, 12.0) and reference.correct(12.0, 12.0)
  both = metrics.both_scorings([(None, 0.0), (None, 3.0), (3.0, 3.0), (1.0, 0.0)])
  assert both == {"accuracy_missing_wrong": 0.25, "accuracy_missing_as_zero": 0.5}


class _Scripted:
  """A generator that answers every prompt with fixed amounts (one per sample), recording prompts."""

  def __init__(self, cfg, amounts):
    self.cfg, self.amounts, self.prompts = cfg, amounts, []

  def generate(self, prompts, *, n, seeds, **_):
    self.prompts.extend(prompts)
    line = len(self.prompts) // len(prompts) - 1
    texts = [self.cfg.answer(self.cfg.lines[line], a, "because") for a in self.amounts(line, n)]
    samples = [[_sample([2 + i], t) for i, t in enumerate(texts)] for _ in prompts]
    return [[1]] * len(prompts), samples


@pytest.mark.parametrize("carry", ["first", "best"])
def test_baseline_carries_the_first_or_the_oracle_best_draft(carry):
  case = forms.generate_cases(1, seed=0, difficulty=0)[0]
  cfg = rollout.RolloutConfig(lines=("1a", "9"), group_size=2, group_carry=carry)
  gold = case.gold["1a"]
  g = _Scripted(cfg, lambda line, n: [gold + 7, gold] if line == 0 else [0.0, 0.0])
  groups = rollout.sample_groups([case], g, cfg, seed=0, step=0)
  assert groups[0].rewards == (0.0, 1.0)
  carried = gold if carry == "best" else gold + 7
  assert g.prompts[1] == cfg.line_prompt(cfg.show(case), "9", {"1a": carried})
  items = packing.draft_pair_items(groups)
  tied = groups[1].rewards[0] == groups[1].rewards[1]
  assert tied and len(items) == 1  # the tied group of line 9 is skipped
  assert items[0].rewards == (0.0, 1.0) and items[0].completions == ((2,), (3,))


def test_reference_baseline_mode_trains_with_the_pair_loss():
  from dpa_grpo import step

  c = _typed("qwen3_4b_dapo")
  assert step.loss_method("dapo", c.baseline) == "dpa_grpo"
  cfg = step.loss_configs("dapo", c.loss, c.baseline, max_new_tokens=8)["generator"]
  assert (cfg.kl, cfg.weighting, cfg.beta, cfg.components) == ("k1", "pair", 0.0, ("draft",))
  library = _typed("cpu_dapo")
  assert step.loss_method("dapo", library.baseline) == "dapo"


def _played(context):
  """Two lines of one case: the verifier always SACs, the decision is REVISE, the revision right."""
  case = forms.generate_cases(1, seed=0, difficulty=0)[0]
  cfg = rollout.RolloutConfig(lines=("1a", "9"), revisions=1, context=context, explore=0.0)
  gold = case.gold["1a"]

  class Policy:
    def __init__(self, reply):
      self.reply, self.prompts = reply, []

    def generate(self, prompts, *, n, seeds, **_):
      self.prompts.extend(prompts)
      return [[1]] * len(prompts), [[_sample([2], self.reply(p)) for _ in range(n)] for p in prompts]

  def generator_reply(prompt):
    if '"decision"' in prompt or "KEEP" in prompt:
      return game.render_decision(game.REVISE)
    revising = "Claim" in prompt or "claim" in prompt
    return cfg.answer("1a", gold if revising else gold + 9, "r")

  g = Policy(generator_reply)
  v = Policy(lambda p: game.render_verifier_reply("wrong", game.SAC("c", "a", "e")))
  units = rollout.play([case], g, v, cfg, seed=0, step=0)
  return cfg, case, units, g


@pytest.mark.parametrize("context", ["submitted", "draft"])
def test_later_lines_show_the_submitted_amount_or_the_original_draft(context):
  cfg, case, units, g = _played(context)
  first = units[0]
  assert first.case == "5a" and first.submitted != first.draft.amount
  shown = first.submitted if context == "submitted" else first.draft.amount
  expected = cfg.line_prompt(cfg.show(case), "9", {"1a": shown})
  assert expected in g.prompts and units[1].draft.prompt == expected
