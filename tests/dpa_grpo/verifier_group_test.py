"""Testbed v3's GRPO arm with a trained verifier (`baseline.train_verifier`): the verifier's group of
sampled verdicts, their rewards and advantages on hand-made units; its items train the verifier's
adapter alone; the option's roles and config, off by default; the game played with a verdict group;
the v3 format gate on a hand-made run; and the arm end to end on the tiny preset."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lm
from configs import dpa_grpo as dpa_config
from dpa_grpo import config as config_lib
from dpa_grpo import game, losses, packing, rollout, setup, step, testbed_arms, testbed_report, train
from dpa_grpo.policies import init_policies
from lm import rundir, sharding
from lm.config import ModelConfig

NS_TEXT = '{"verdict": "correct"}'
SAC_TEXT = '{"verdict": "wrong", "claim": "c", "argument": "a", "evidence": "e"}'
BAD_TEXT = "no verdict here"


def _sample(tokens, text="t"):
  return rollout.Sample(text, tuple(tokens), -0.5, "stop")


def _unit(x_right, replies, gold=5.0):
  """A unit whose verifier sampled `replies` (texts; the first played), with no revision phase
  (the verdict group is all the verifier's loss reads)."""
  draft = rollout.Draft(
    case_id="c0",
    line_id="1a",
    gold=gold,
    prompt="draft prompt",
    prompt_ids=[1, 2, 3],
    x=_sample([4, 5]),
    amount=gold if x_right else gold + 1,
    right=x_right,
  )
  group = tuple(_sample([8 + i, 20 + len(t) % 7], t) for i, t in enumerate(replies))
  parsed = tuple(game.parse_verifier_reply(t) for t in replies)
  verdict = rollout.Verdict(
    prompt="verify",
    prompt_ids=[6, 7],
    reply=group[0],
    parsed=parsed[0],
    group=group,
    group_parsed=parsed,
  )
  return rollout.Unit(draft=draft, verdict=verdict, case="?", submitted=draft.amount, submitted_right=x_right)


# (x right, the G replies, their rewards): a right verdict 1, a wrong one 0, an unparsable one 0.
HAND_MADE = [
  (True, (NS_TEXT, SAC_TEXT), (1.0, 0.0)),  # right draft: NS is right
  (False, (NS_TEXT, SAC_TEXT), (0.0, 1.0)),  # wrong draft: SAC is right
  (False, (BAD_TEXT, SAC_TEXT), (0.0, 1.0)),  # unparsable = a wrong verdict (its fallback plays SAC)
  (True, (BAD_TEXT, NS_TEXT), (0.0, 1.0)),
  (True, (NS_TEXT, NS_TEXT), (1.0, 1.0)),  # tied: no advantage
  (False, (SAC_TEXT, BAD_TEXT), (1.0, 0.0)),
]


@pytest.mark.parametrize("x_right, replies, rewards", HAND_MADE)
def test_verdict_group_rewards_and_advantages(x_right, replies, rewards):
  (group,) = packing.verifier_groups([_unit(x_right, replies)])
  assert group.rewards == rewards and group.prompt_ids == [6, 7] and len(group.samples) == 2
  advantages = np.asarray(losses.group_advantages(jnp.asarray([rewards])))[0]
  if rewards[0] == rewards[1]:  # a tied group: zero advantage, as the GRPO loss's group does
    np.testing.assert_array_equal(advantages, [0.0, 0.0])
  else:  # G = 2: ±1 toward the right verdict
    np.testing.assert_allclose(advantages, np.where(np.array(rewards) > 0, 1.0, -1.0), atol=1e-4)


def test_the_unparsable_reward_is_the_configured_one():
  unit = _unit(False, (BAD_TEXT, SAC_TEXT))
  (group,) = packing.verifier_groups([unit], invalid_reward=-0.5)
  assert group.rewards == (-0.5, 1.0)
  assert packing.verdict_reward(game.parse_verifier_reply(BAD_TEXT), True, 0.25) == 0.25
  # A SAC without its body parses a verdict but is not valid: unparsable for the reward too.
  incomplete = game.parse_verifier_reply('{"verdict": "wrong"}')
  assert not incomplete.valid and packing.verdict_reward(incomplete, False) == 0.0


def test_units_without_a_group_give_their_played_verdict_and_invalid_drafts_can_be_left_out():
  unit = _unit(True, (NS_TEXT, SAC_TEXT))
  single = dataclasses.replace(unit, verdict=dataclasses.replace(unit.verdict, group=(), group_parsed=()))
  (group,) = packing.verifier_groups([single])
  assert group.rewards == (1.0,)
  missing = dataclasses.replace(unit, draft=dataclasses.replace(unit.draft, amount=None, right=False))
  assert packing.verifier_groups([missing], skip_invalid_draft=True) == []
  assert len(packing.verifier_groups([missing])) == 1


def test_a_tied_group_adds_no_policy_gradient_only_its_kl():
  """The method's own group loss on one chunk: a tied group's loss is the KL term alone, zero at
  the reference; a contrasted group's is not."""
  model = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(0))
  cfg = losses.BaselineConfig.paper("grpo", vocab_chunk=64)
  for replies, tied in (((NS_TEXT, NS_TEXT), True), ((NS_TEXT, SAC_TEXT), False)):
    groups = packing.verifier_groups([_unit(True, replies)])
    (chunk,) = packing.group_chunks(groups, "grpo", 1, pad_id=0)
    batch = {k: jnp.asarray(v) for k, v in chunk.items()}
    grads = nnx.grad(lambda m: losses.baseline_loss(m, model, batch, cfg)[0])(model)  # noqa: B023
    norm = float(jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(nnx.state(grads)))))
    assert (norm == 0.0) == tied


def _nonzero(tree) -> bool:
  return any(bool(jnp.any(leaf != 0)) for leaf in jax.tree.leaves(tree))


def test_verifier_groups_train_the_verifiers_adapter_and_not_the_generators():
  model = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(0))
  mesh = sharding.make_mesh(sharding.MeshConfig())
  lora_cfg = config_lib.LoRAConfig(rank=4, alpha=8.0)
  policies, trainable, frozen = init_policies(model, lora_cfg, game.ROLES, mesh, seed=1)
  baseline = config_lib.BaselineConfig(train_verifier=True)
  cfgs = step.loss_configs(
    "grpo", config_lib.LossConfig(vocab_chunk=64), baseline, max_new_tokens=8, verdict_tokens=4
  )
  assert set(cfgs) == {"generator", "verifier"} and cfgs["verifier"].max_len == 4
  units = [_unit(r, replies) for r, replies, _ in HAND_MADE]
  (chunk,) = packing.group_chunks(packing.verifier_groups(units), "grpo", len(units), pad_id=0)
  batch = {k: jnp.asarray(v) for k, v in chunk.items()}
  zeros = jax.tree.map(jnp.zeros_like, trainable)
  grads, loss, _ = step.accumulate(
    zeros,
    trainable,
    frozen,
    batch,
    None,
    policies=policies,
    role="verifier",
    method="grpo",
    loss_cfg=cfgs["verifier"],
  )
  assert np.isfinite(float(loss))
  assert _nonzero(grads["verifier"]) and not _nonzero(grads["generator"])


# ---- the option ---------------------------------------------------------------------------------


def _typed(preset, **baseline):
  c = dpa_config.get_config(preset)
  c.baseline.update(baseline)
  return config_lib.ExperimentConfig.from_dict(c.to_dict())


def test_train_verifier_trains_both_roles_of_a_generator_only_method():
  on = config_lib.BaselineConfig(train_verifier=True)
  for method in ("grpo", "dapo", "gspo"):
    c = config_lib.ExperimentConfig(method=method, baseline=on)
    assert c.roles == game.ROLES and c.plays_game
  assert config_lib.ExperimentConfig(method="zero_shot", baseline=on).roles == ("generator",)
  assert config_lib.ExperimentConfig(method="dpa_grpo", baseline=on).roles == game.ROLES
  assert _typed("tiny_grpo", train_verifier=True).roles == game.ROLES


@pytest.mark.parametrize(
  "preset", ["cpu", "tiny", "tiny_grpo", "testbed_grpo", "testbed_v2", "qwen3_4b_grpo"]
)
def test_the_option_is_off_by_default_and_leaves_the_config_file_unchanged(preset):
  c = _typed(preset)
  assert not c.baseline.train_verifier and c.baseline.verifier_group_size == 2
  assert c.baseline.verifier_invalid_reward == 0.0
  assert c.roles == (game.ROLES if c.method == "dpa_grpo" else ("generator",))
  # config.json of a run without the option is the one written before it existed.
  assert not set(config_lib.V3_BASELINE_DEFAULTS) & set(c.to_dict()["baseline"])
  assert config_lib.ExperimentConfig.from_dict(c.to_dict()) == c


def test_the_option_is_saved_and_read_back_when_set():
  c = _typed("tiny_grpo", train_verifier=True, verifier_group_size=4)
  saved = c.to_dict()["baseline"]
  assert saved["train_verifier"] and saved["verifier_group_size"] == 4
  assert "verifier_invalid_reward" not in saved
  assert config_lib.ExperimentConfig.from_dict(c.to_dict()) == c


def test_the_left_out_defaults_are_the_dataclass_defaults():
  fields = {f.name: f.default for f in dataclasses.fields(config_lib.BaselineConfig)}
  assert {k: fields[k] for k in config_lib.V3_BASELINE_DEFAULTS} == config_lib.V3_BASELINE_DEFAULTS


@pytest.mark.parametrize(
  "values, field",
  [
    (dict(verifier_group_size=1), "baseline.verifier_group_size"),
    (dict(verifier_invalid_reward=float("nan")), "baseline.verifier_invalid_reward"),
    (dict(train_verifier=True, mode="reference"), "baseline.train_verifier"),
  ],
)
def test_bad_values_fail_naming_the_field(values, field):
  with pytest.raises(ValueError, match=field):
    config_lib.BaselineConfig(**values)


def test_the_v3_arm_trains_the_verifier_and_no_earlier_arm_changes():
  config = _typed("testbed")
  arm = testbed_arms.ALL_ARMS["grpo_verifier"]
  assert arm is testbed_arms.V3_ARMS["grpo_verifier"] and "2" in arm.label
  c = testbed_arms.arm_config(config, arm, seed=1, checkpoint="/ckpt")
  assert c.method == "grpo" and c.roles == game.ROLES and c.baseline.verifier_group_size == 2
  assert c.baseline.mode == "library"
  for name in {**testbed_arms.ARMS, **testbed_arms.V2_ARMS}:
    other = testbed_arms.arm_config(config, testbed_arms.ALL_ARMS[name], seed=1, checkpoint="/ckpt")
    assert not other.baseline.train_verifier
  assert testbed_arms.default_arms(config) == tuple(testbed_arms.ARMS)


# ---- the game with a verdict group --------------------------------------------------------------


class _Scripted:
  """A role that replies from a list, in order, to every prompt (n replies each)."""

  def __init__(self, texts):
    self.texts = texts
    self.calls = []

  def generate(self, prompts, *, n, temperature, top_p, top_k, max_new_tokens, seeds):
    self.calls.append(n)
    samples = [[_sample([2 + k], self.texts[k % len(self.texts)]) for k in range(n)] for _ in prompts]
    return [[1, 2] for _ in prompts], samples


@pytest.mark.parametrize("greedy", [False, True])
def test_play_samples_a_verdict_group_and_plays_the_first(greedy):
  cfg = _typed("tiny_grpo")
  train_cases, _ = setup.load_data(cfg.data)
  generator = _Scripted([cfg.rollout.answer("1a", 1.0, "e"), '{"decision": "KEEP"}'])
  verifier = _Scripted([SAC_TEXT, NS_TEXT])
  units = rollout.play(
    train_cases[:1], generator, verifier, cfg.rollout, seed=0, step=1, greedy=greedy, verdicts=2
  )
  assert verifier.calls == [1 if greedy else 2] * len(cfg.rollout.lines)
  for u in units:
    assert u.challenged  # the first reply (SAC) is the one played
    record = u.record()
    if greedy:
      assert u.verdict.group == () and "verifier_group" not in record
    else:
      assert [s.text for s in u.verdict.group] == [SAC_TEXT, NS_TEXT]
      assert [r["action"] for r in record["verifier_group"]] == ["SAC", "NS"]
      assert json.dumps(record)  # the record stays JSON


# ---- the v3 format gate -------------------------------------------------------------------------


def _run(path, valid_by_step):
  """A finished run directory whose training records hold one played unit per step."""
  os.makedirs(os.path.join(path, "records"))
  rundir.write_json(os.path.join(path, "summary.json"), {})
  rows = [{"step": s, "verifier_valid": v, "decision": None} for s, v in valid_by_step]
  rundir.append_jsonl(os.path.join(path, "records", "train.jsonl"), rows)
  rundir.append_jsonl(os.path.join(path, "metrics.jsonl"), [{"step": s} for s, _ in valid_by_step])


def test_the_v3_format_gate_reads_the_last_fifth_of_training(tmp_path):
  healthy = [(s, True) for s in range(1, 11)]
  _run(tmp_path / "healthy", healthy)
  gate = testbed_report.v3_format_gate(str(tmp_path / "healthy"))
  assert gate == {"share": 1.0, "bound": testbed_arms.GATE_V3_FORMAT, "passes": True}
  # Early breakage does not count; the last fifth (steps 9-10) at 1/2 fails.
  _run(tmp_path / "late", [(s, s < 9 or s == 10) for s in range(1, 11)])
  gate = testbed_report.v3_format_gate(str(tmp_path / "late"))
  assert gate["share"] == 0.5 and not gate["passes"]
  assert testbed_arms.GATE_V3_FORMAT == 0.9
  assert testbed_report.v3_format_gate(str(tmp_path / "absent")) is None


# ---- end to end -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_arm_trains_both_roles_for_two_steps_on_the_tiny_preset(tmp_path):
  c = dpa_config.get_config("tiny_grpo")
  c.baseline.train_verifier = True
  c.train.update(steps=2, eval_every=2)
  config = config_lib.ExperimentConfig.from_dict(c.to_dict())
  summary = train.run(config, str(tmp_path))
  entries = list(rundir.read_jsonl(os.path.join(tmp_path, "metrics.jsonl")))
  steps = [e for e in entries if "eval" not in e]
  assert [e["step"] for e in steps] == [1, 2]
  for e in steps:
    assert np.isfinite(e["generator/loss"]) and np.isfinite(e["verifier/loss"])
    assert e["rollout"]["verifier_groups"] > 0 and "game" in e["rollout"]
  records = list(rundir.read_jsonl(os.path.join(tmp_path, "records", "train.jsonl")))
  played = [r for r in records if "verifier_valid" in r]
  assert played and all(len(r["verifier_group"]) == 2 for r in played)
  assert any("completions" in r for r in records)  # the generator's groups of drafts, as in grpo
  assert summary["method"] == "grpo" and "sac_rate" in summary["after"]  # evaluation plays the game
