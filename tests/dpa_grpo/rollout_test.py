"""Rollout pieces that need no model: keep rules (never the oracle), seeds, compact forms, packing."""

import numpy as np
import pytest

from dpa_grpo import packing, rollout
from dpa_grpo.envs import forms


def _samples(logprobs):
  return [rollout.Sample(f"s{i}", (i,), lp, "stop") for i, lp in enumerate(logprobs)]


@pytest.mark.parametrize(
  "rule, amounts, logprobs, kept",
  [
    ("majority", (5.0, 7.0, 7.0, None), (-0.1, -0.9, -0.5, -0.01), 2),  # 7 wins; the likelier 7
    ("majority", (5.0, 7.0, None), (-0.3, -0.2, -0.01), 1),  # a tie: the likelier of 5 and 7
    ("majority", (None, None), (-0.3, -0.2), 1),  # nothing parses: the likeliest sample
    ("logprob", (5.0, 7.0, 7.0), (-0.4, -0.5, -0.1), 2),
    ("first_parseable", (None, 7.0, 5.0), (-0.1, -0.9, -0.2), 1),
    ("first_parseable", (None, None), (-0.1, -0.9), 0),
    ("first", (None, 7.0, 5.0), (-0.9, -0.1, -0.2), 0),  # the reference code's: the first sample
  ],
)
def test_keep_rules(rule, amounts, logprobs, kept):
  assert rollout.keep_revision(_samples(logprobs), amounts, rule) == kept


def test_compact_keeps_values_and_structure():
  case = forms.generate_cases(1, seed=0, difficulty=1)[0]
  shown = rollout.compact(case).forms["return_data"]
  assert shown["w2"][0]["wages"] == case.forms["return_data"]["w2"][0]["wages"]["value"]
  assert rollout.compact(case).gold == case.gold


def test_config_rejects_unknown_choices():
  with pytest.raises(ValueError, match="keep_rule"):
    rollout.RolloutConfig(keep_rule="oracle")
  with pytest.raises(KeyError, match="unknown Form 1040 line"):
    rollout.RolloutConfig(lines=("99",))
  with pytest.raises(ValueError, match="rollout.truncated"):
    rollout.RolloutConfig(truncated="last_number")


def test_a_reply_cut_by_max_new_tokens_answers_only_in_its_complete_lines():
  cut = "Line 9: wages | 4016\nLine 9: restated | 40"  # cut mid-number: 40 of 4016
  unanswered, extract = rollout.RolloutConfig(), rollout.RolloutConfig(truncated="extract")
  assert rollout._amount(rollout.Sample(cut, (), 0.0, "length"), "9", unanswered) == 4016.0
  assert rollout._amount(rollout.Sample(cut, (), 0.0, "length"), "9", extract) == 40.0
  assert rollout._amount(rollout.Sample(cut, (), 0.0, "stop"), "9", unanswered) == 40.0  # it chose to stop
  alone = rollout.Sample("Line 9: wages | 40", (), 0.0, "length")
  assert rollout._amount(alone, "9", unanswered) is None and rollout._amount(alone, "9", extract) == 40.0


def test_chunk_shares_add_up_to_the_step_mean():
  items = [
    packing.Item(prompt=[5, 6], completions=([7], [8, 9]), rewards=(1.0, 0.0), component=i % 2)
    for i in range(5)
  ]
  items.append(packing.Item(prompt=[5], completions=([9, 9, 9], ()), penalty=(0.5, 0.0)))
  chunks = packing.dpa_chunks(items, 2, 4, pad_id=0)
  assert len(chunks) == 2 and all(c["tokens"].shape == (8, 64) for c in chunks)
  np.testing.assert_allclose(sum(c["share"] for c in chunks), [1.0, 1.0])
  assert list(chunks[1]["component"]) == [0, -1, -1, -1]  # one item, the penalty row, two pads
  np.testing.assert_allclose(chunks[1]["row_penalty"][1], [0.5 / 3, 0.0])  # per unit of component 0
  np.testing.assert_array_equal(chunks[0]["completion_mask"][1, -2:], [1, 1])


@pytest.mark.slow  # a sampler and a scorer compile: ~10 s alone
def test_rescore_gives_the_samplers_own_token_logprobs():
  """What an engine sampled is rescored by the trainer (`rollout.rescore`); on the in-process
  sampler's own samples it must return the sampler's log-probs (the engine gap of a faithful
  engine: float noise)."""
  from flax import nnx

  import lm
  from lm.config import ModelConfig
  from lm.sampler import Sampler

  model = lm.Qwen(ModelConfig.tiny_qwen3(64), rngs=nnx.Rngs(0))
  prompts = [[5, 6, 7], [9], [3, 4, 5, 6, 8]]
  out = Sampler(model).generate(prompts, max_new_tokens=6, n=2, temperature=1.0, seed=0)
  flat_prompts = [p for p in prompts for _ in range(2)]
  tokens = [t for row in out.tokens for t in row]
  ours = rollout.rescore(model, flat_prompts, tokens, pad_id=0)
  for mine, theirs in zip(ours, [lp for row in out.logprobs for lp in row], strict=True):
    np.testing.assert_allclose(mine, theirs, atol=2e-4)
  gap = rollout.LogprobGap()
  gap.add([-1.0, -2.0], np.array([-1.5, -2.0]))
  gap.add([-0.25], np.array([-0.0]))
  assert gap.take() == {"mean_abs": 0.25, "max": 0.5, "tokens": 3} and gap.take() == {}
