"""Memory knobs and the plan (`lm.plan`, `dpa_grpo.plan`, docs/scale.md): per-layer remat and the
micro-batch leave the train step's loss and gradients unchanged; the plan compiles the tiny preset's
programs on 8 CPU devices, reads their memory, picks overrides that fit a stated budget, and the
flags it emits parse back into the config."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from flax import nnx
from ml_collections import config_flags

import lm
from configs import dpa_grpo as dpa_configs
from dpa_grpo import config as config_lib
from dpa_grpo import game, losses, packing, step
from dpa_grpo import plan as dpa_plan
from dpa_grpo.policies import init_policies
from lm import plan as plan_lib
from lm import sharding
from lm.config import ModelConfig
from lm.model import REMAT_POLICIES


@pytest.fixture(scope="module")
def setup():
  """A tiny backbone with two roles' adapters (B nonzero, so every adapter has a gradient) and 4
  verifier pairs with alternating rewards."""
  model = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(0))
  mesh = sharding.make_mesh(sharding.MeshConfig())
  policies, trainable, frozen = init_policies(
    model, config_lib.LoRAConfig(rank=4, alpha=8.0), game.ROLES, mesh, seed=1
  )
  rng = np.random.RandomState(0)
  trainable = jax.tree_util.tree_map_with_path(
    lambda path, x: jnp.asarray(0.1 * rng.randn(*x.shape), x.dtype) if "lora_b" in str(path) else x, trainable
  )
  items = [
    packing.Item(
      prompt=[3 + i, 9, 4 + i, 7],
      completions=([5, 6 + i, 8], [11, 12]),
      rewards=(float(i % 2), float(1 - i % 2)),
      component=0,
    )
    for i in range(4)
  ]
  return policies, trainable, frozen, items


def _step(setup, pairs: int, remat: str):
  """(loss, grads) of one step's chunks of `pairs` pairs summed, as the trainer accumulates them."""
  policies, trainable, frozen, items = setup
  cfg = losses.DPALossConfig(components=("verdict",), component_weights=(1.0,), vocab_chunk=64, remat=remat)
  grads, total = jax.tree.map(jnp.zeros_like, trainable), 0.0
  for chunk in packing.dpa_chunks(items, 1, pairs, pad_id=0):
    batch = {k: jnp.asarray(v) for k, v in chunk.items()}
    grads, loss, _ = step.accumulate(
      grads,
      trainable,
      frozen,
      batch,
      None,
      policies=policies,
      role="verifier",
      method="dpa_grpo",
      loss_cfg=cfg,
    )
    total += float(loss)
  return total, jax.tree.map(np.asarray, grads)


@pytest.mark.slow
def test_remat_and_micro_batch_leave_loss_and_gradients_unchanged(setup):
  base_loss, base_grads = _step(setup, pairs=4, remat="none")
  assert any(np.abs(g).max() > 0 for g in jax.tree.leaves(base_grads))
  for pairs, remat in [(4, "full"), (2, "dots_saveable")]:  # each a compile of its own
    loss, grads = _step(setup, pairs=pairs, remat=remat)
    np.testing.assert_allclose(loss, base_loss, rtol=1e-5, atol=1e-6, err_msg=f"{pairs=} {remat=}")
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(base_grads), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=f"{pairs=} {remat=}")


def test_remat_names_are_checked_where_the_config_is_built():
  assert REMAT_POLICIES == ("none", "dots_saveable", "full")
  with pytest.raises(ValueError, match="loss.remat"):
    config_lib.LossConfig(remat="sometimes")


@pytest.mark.slow
def test_plan_compiles_the_tiny_preset_and_its_overrides_fit_and_parse_back():
  memory = 64 * 2**20  # per device: what the chosen setting must fit in with 25% headroom
  config = dpa_configs.get_config("tiny").to_dict()
  config["sampler"]["max_rows"] = 8
  target = plan_lib.cpu_target(8, memory)
  choice = dpa_plan.choose(config, target, headroom=0.25, length=64, prompt_tokens=16)
  names = [p.name for p in choice.programs]
  assert names == ["accumulate", "apply", "sample"]
  for p in choice.programs:
    assert p.arguments > 0 and p.temporaries >= 0 and p.flops > 0 and p.seconds > 0, p
  assert choice.fits and choice.overrides["sampler.max_rows"] == 8
  assert max(p.peak for p in choice.programs) <= 0.75 * memory == plan_lib.budget(target, 0.25)
  # Every role's sampler keeps its own [D, V] head through the train step: in accumulate's peak.
  vocab, hidden = dpa_configs.get_config("tiny").model.tokenizer_vocab, 32
  assert choice.programs[0].resident >= 2 * vocab * hidden * 4 // 8
  record = plan_lib.run_plan(lambda c, t, headroom: choice, "configs/dpa_grpo.py:tiny", config, target, 0.25)
  assert "accumulate" in plan_lib.summary(record) and "| cpu-8 | yes | accumulate |" in plan_lib.render(
    [record], date="today"
  )
  # The emitted flags parse back into the preset's config, and the typed config takes them.
  argv = ["prog", "--config=configs/dpa_grpo.py:tiny", *record["flags"]]
  holder = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=holder, lock_config=False, sys_argv=argv)
  holder(argv)
  parsed = config_lib.ExperimentConfig.from_dict(holder.config.to_dict())
  assert parsed.loss.remat == choice.overrides["loss.remat"]
  assert parsed.train.pairs_per_chunk == choice.overrides["train.pairs_per_chunk"]
  assert parsed.sampler.max_rows == 8


def _program(name: str, peak: int) -> plan_lib.ProgramPlan:
  return plan_lib.ProgramPlan(
    name=name, arguments=peak, outputs=0, aliased=0, temporaries=0, resident=0, flops=1.0,
    flops_source="model", bytes_accessed=1.0, bytes_source="model", seconds=1.0,
  )  # fmt: skip


def test_choose_halves_the_sampler_rows_until_they_fit_and_fits_covers_the_sampler(monkeypatch):
  """The search over `sampler.max_rows` (a stand-in for the compiles: each program's peak given)."""
  sampler_peak = {256: 300, 128: 150, 64: 90, 32: 45}

  def programs(exp, target, *, train=True, sample=True, **_):
    if train:
      return [_program("accumulate", 40), _program("apply", 10)]
    return [_program("sample", sampler_peak.get(exp.sampler.max_rows, 500))]

  monkeypatch.setattr(dpa_plan, "programs", programs)
  monkeypatch.setattr(plan_lib, "sampler_floor", lambda *_: 0)  # bytes-sized budgets: no floor
  config = dpa_configs.get_config("tiny").to_dict()
  target = plan_lib.cpu_target(1, 100)
  choice = dpa_plan.choose(config, target, headroom=0.5)  # a budget of 50 bytes
  assert choice.fits and choice.overrides["sampler.max_rows"] == 32
  assert [t.split(":")[0] for t in choice.tried] == [f"sampler at {r} rows" for r in (256, 128, 64)]
  assert not any("not compiled" in t for t in choice.tried)
  # A row count whose weights and KV cache alone exceed the budget is not compiled at all.
  compiled = []
  monkeypatch.setattr(plan_lib, "sampler_floor", lambda cfg, dtype, shape, rows, slots: rows // 2)

  def counted(exp, *args, train=True, **kwargs):
    compiled.extend([] if train else [exp.sampler.max_rows])
    return programs(exp, *args, train=train, **kwargs)

  monkeypatch.setattr(dpa_plan, "programs", counted)
  choice = dpa_plan.choose(config, target, headroom=0.5)
  assert choice.fits and choice.overrides["sampler.max_rows"] == 32 and compiled == [64, 32]
  assert [t.split(": ")[1].startswith("not compiled") for t in choice.tried] == [True, True, False]
  sampler_peak.clear()  # no row count fits: the plan does not fit, though its training programs do
  monkeypatch.setattr(plan_lib, "sampler_floor", lambda *_: 0)
  choice = dpa_plan.choose(config, target, headroom=0.5)
  assert not choice.fits and choice.overrides["sampler.max_rows"] == 1


def test_qwen3_4b_presets_ship_the_plans_remat():
  assert dpa_configs.get_config("qwen3_4b").loss.remat == "full"
  assert dpa_configs.get_config("cpu").loss.remat == "none"


def test_targets_are_the_tables_ten_with_their_published_figures():
  assert plan_lib.target_names("tpu") == ["v5e-8", "v6e-8", "v5p-8", "v5p-64", "2xv5p-64"]
  assert plan_lib.target_names("gpu") == ["h100x1", "h100x8", "2xh100x8", "h200x1", "h200x8"]
  h100, h200 = plan_lib.TARGETS["h100x8"], plan_lib.TARGETS["h200x8"]
  assert (h100.hbm_bandwidth, h200.hbm_bandwidth, h100.peak_flops) == (3.35e12, 4.8e12, 989e12)
  for target in (h100, h200):  # the text proto XLA:GPU compiles against carries the same memory size
    with open(f"{plan_lib.TARGET_DIR}/{target.target_config}") as f:
      assert f"device_memory_size: {target.hbm_bytes}" in f.read()
  with pytest.raises(ValueError, match="unknown targets"):
    plan_lib.target_names("h100x9")


def test_cudnn_attention_is_planned_as_blockwise_without_a_gpu():
  # a deviceless compile has no cuDNN library: the plan compiles the blockwise attention in its
  # place and says so in the program's detail; other attentions are compiled as they are
  config = dpa_configs.get_config("tiny")
  target = plan_lib.cpu_target(1, 16 * plan_lib.GiB)
  for impl, stand_in in (("cudnn", True), ("xla", False)):
    config.model.attention_impl = impl
    exp = config_lib.ExperimentConfig.from_dict(config.to_dict())
    su = dpa_plan.shaped_step(exp, target, 64)
    assert ("compiled as blockwise" in su.detail) is stand_in, su.detail
  # the stand-in compiles here, where cuDNN's attention would not lower (blocks of 16 tokens: the
  # 64-token rows take the long-sequence path, where the attention implementation is chosen)
  config.model.attention_impl = "cudnn"
  config.model.overrides = dict(config.model.overrides, attention_block=16)
  su = dpa_plan.shaped_step(config_lib.ExperimentConfig.from_dict(config.to_dict()), target, 64)
  assert step.accumulate.lower(*su.accumulate_args, **su.accumulate_kwargs).compile() is not None


def test_release_drops_what_earlier_compiles_cached():
  """A search calls `release` before each candidate: the executables and traces JAX kept of the
  last ones are gone, so a search's memory does not grow with its candidates."""
  f = jax.jit(lambda x: x * 2 + 1)
  f(jnp.ones(3))
  f(jnp.ones(4))
  assert f._cache_size() == 2
  plan_lib.release()
  assert f._cache_size() == 0
  assert float(f(jnp.ones(3))[0]) == 3.0  # and compiles again on its next call
