"""`loss.share_prompts`: each pair as one row [prompt, first, second] gives the train step's loss
and gradient of the two rows it stands for, with every kind of item the trainer packs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lm
from dpa_grpo import config as config_lib
from dpa_grpo import game, losses, packing, step
from dpa_grpo.policies import init_policies
from lm import sharding
from lm.config import ModelConfig

CFG = losses.DPALossConfig(components=("decision", "proposal"), component_weights=(1.0, 0.5), vocab_chunk=64)


def _items() -> list[packing.Item]:
  rng = np.random.RandomState(3)
  draw = lambda n: [int(t) for t in rng.randint(2, 64, n)]
  item = packing.Item
  return [
    item(prompt=draw(30), completions=(draw(4), draw(6)), rewards=(1.0, 0.0), component=0, weight=2.0),
    item(prompt=draw(12), completions=(draw(9), draw(3)), rewards=(0.0, 1.0), component=1),
    item(prompt=draw(30), completions=(draw(7), ()), penalty=(0.1, 0.0)),  # an invalid reply
    item(prompt=draw(20), completions=(draw(5), draw(5)), coef=(0.2, -0.3), kl_coef=(0.04, 0.04)),
    item(prompt=draw(25), completions=(draw(2), draw(11)), rewards=(0.0, 1.0), component=0),
  ]  # fmt: skip


@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_shared_prompt_chunks_give_the_two_row_loss_and_gradient(compute_dtype):
  model = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(0), dtype=compute_dtype)
  mesh = sharding.make_mesh(sharding.MeshConfig())
  policies, trainable, frozen = init_policies(model, config_lib.LoRAConfig(rank=4), game.ROLES, mesh, seed=1)
  rng = np.random.RandomState(0)  # adapters away from zero, so the policy is not the reference
  trainable = jax.tree_util.tree_map_with_path(
    lambda path, x: jnp.asarray(0.1 * rng.randn(*x.shape), x.dtype) if "lora_b" in str(path) else x, trainable
  )
  results = []
  for share in (False, True):
    (chunk,) = packing.dpa_chunks(_items(), 2, 6, pad_id=0, share_prompts=share)  # 5 items and a pad
    assert chunk["tokens"].shape[0] == (6 if share else 12)
    # 5 items' prompts and completions, two rows each; the padding item's one-token prompt twice
    expected = sum(2 * len(i.prompt) + sum(map(len, i.completions)) for i in _items()) + 2
    assert packing.chunk_tokens(chunk) == expected
    zeros = jax.tree.map(jnp.zeros_like, trainable)
    grads, loss, metrics = step.accumulate(
      zeros,
      trainable,
      frozen,
      {k: jnp.asarray(v) for k, v in chunk.items()},
      None,
      policies=policies,
      role="generator",
      method="dpa_grpo",
      loss_cfg=CFG,
    )
    results.append((float(loss), {k: float(v) for k, v in metrics.items()}, jax.tree.map(np.asarray, grads)))
  (loss, metrics, grads), (shared_loss, shared_metrics, shared_grads) = results
  tol = 1e-5 if compute_dtype == "float32" else 2e-2
  np.testing.assert_allclose(shared_loss, loss, rtol=tol, atol=tol)
  assert shared_metrics.keys() == metrics.keys()
  for key in metrics:
    np.testing.assert_allclose(shared_metrics[key], metrics[key], rtol=tol, atol=tol, err_msg=key)
  leaves = jax.tree_util.tree_leaves(grads)
  assert sum(float(np.abs(g).sum()) for g in leaves) > 0
  scale = max(float(np.abs(g).max()) for g in leaves)
  for a, b in zip(jax.tree_util.tree_leaves(shared_grads), leaves, strict=True):
    np.testing.assert_allclose(a, b, atol=tol * scale)


@pytest.mark.slow
def test_a_trainer_step_with_shared_prompts_matches_two_row_packing(tmp_path, monkeypatch):
  """The tiny preset's first step (both roles, the same rollout from the same seed) with
  `loss.share_prompts` on and off: the same losses and, after the update, the same parameters."""
  from configs import dpa_grpo as dpa_config
  from dpa_grpo import train
  from lm import scoring

  packed = []
  pack = scoring.pack_shared_pairs
  monkeypatch.setattr(scoring, "pack_shared_pairs", lambda *a, **k: packed.append(1) or pack(*a, **k))
  entries, params = [], []
  for share in (False, True):
    c = dpa_config.get_config("tiny")
    c.train.update(steps=1)
    c.loss.share_prompts = share
    trainer = train.Trainer(config_lib.ExperimentConfig.from_dict(c.to_dict()), str(tmp_path / str(share)))
    entries.append(trainer.train_step(1))
    assert bool(packed) == share
    params.append(jax.tree.map(np.asarray, trainer.trainable))
  for key in ("generator/loss", "verifier/loss"):
    assert np.isfinite(entries[0][key]) and entries[0][key] != 0
    np.testing.assert_allclose(entries[1][key], entries[0][key], rtol=1e-4, atol=1e-6, err_msg=key)
  for a, b in zip(jax.tree.leaves(params[1]), jax.tree.leaves(params[0]), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5)
