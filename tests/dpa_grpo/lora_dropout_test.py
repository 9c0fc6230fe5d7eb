"""LoRA dropout in the train step (`Policies.lora_dropout`, `step.accumulate`'s key): off without a
key or at rate 0 (today's numbers, bit for bit), on in the loss only, reproducible from its key."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import lm
from dpa_grpo import config as config_lib
from dpa_grpo import game, losses, packing, step
from dpa_grpo import train as train_lib
from dpa_grpo.policies import init_policies
from lm import lora, sampler, sharding
from lm.config import ModelConfig

CFG = losses.DPALossConfig(components=("verdict",), component_weights=(1.0,), vocab_chunk=64)


class _Tokenizer:
  def encode(self, text):
    return [ord(ch) % 50 + 2 for ch in text[:8]]


@pytest.fixture(scope="module")
def setup():
  """A tiny backbone, two roles' adapters with nonzero B (so dropout moves the loss), and one chunk
  of verifier pairs, rewards alternating so every pair has an advantage."""
  model = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(0))
  mesh = sharding.make_mesh(sharding.MeshConfig())
  made = {}
  for rate in (0.0, 0.05):
    cfg = config_lib.LoRAConfig(rank=4, alpha=8.0, dropout=rate)
    policies, trainable, frozen = init_policies(model, cfg, game.ROLES, mesh, seed=1)
    made[rate] = policies
  rng = np.random.RandomState(0)
  trainable = jax.tree_util.tree_map_with_path(
    lambda path, x: jnp.asarray(0.1 * rng.randn(*x.shape), x.dtype) if "lora_b" in str(path) else x, trainable
  )
  pair = tuple(_Tokenizer().encode(s) for s in game.VERIFIER_PAIR)
  items = [
    packing.Item(
      prompt=[3 + i, 9, 4 + i], completions=pair, rewards=(float(i % 2), float(1 - i % 2)), component=0
    )
    for i in range(4)
  ]
  (chunk,) = packing.dpa_chunks(items, 1, 4, pad_id=0)
  batch = {k: jnp.asarray(v) for k, v in chunk.items()}
  return made, trainable, frozen, batch


def _accumulate(policies, trainable, frozen, batch, key):
  zeros = jax.tree.map(jnp.zeros_like, trainable)
  grads, loss, _ = step.accumulate(
    zeros, trainable, frozen, batch, key, policies=policies, role="verifier", method="dpa_grpo", loss_cfg=CFG
  )
  return float(loss), jax.tree.map(np.asarray, grads)


def _leaves(tree):
  return jax.tree_util.tree_leaves_with_path(tree)


def test_rate_zero_or_no_key_gives_todays_numbers_bit_for_bit(setup):
  made, trainable, frozen, batch = setup
  base_loss, base_grads = _accumulate(made[0.0], trainable, frozen, batch, None)
  for policies, key in ((made[0.0], jax.random.key(5)), (made[0.05], None)):
    loss, grads = _accumulate(policies, trainable, frozen, batch, key)
    assert loss == base_loss
    for (_, a), (_, b) in zip(_leaves(grads), _leaves(base_grads), strict=True):
      np.testing.assert_array_equal(a, b)


def test_dropout_changes_the_loss_reproducibly_and_gradients_flow(setup):
  made, trainable, frozen, batch = setup
  base_loss, _ = _accumulate(made[0.0], trainable, frozen, batch, None)
  loss, grads = _accumulate(made[0.05], trainable, frozen, batch, jax.random.key(5))
  again, _ = _accumulate(made[0.05], trainable, frozen, batch, jax.random.key(5))
  other, _ = _accumulate(made[0.05], trainable, frozen, batch, jax.random.key(6))
  assert loss == again and loss != base_loss and loss != other
  verifier = [(p, g) for p, g in _leaves(grads) if "verifier" in str(p)]
  assert verifier and all(np.isfinite(g).all() for _, g in verifier)
  assert all(np.abs(g).max() > 0 for p, g in verifier if "lora_a" in str(p) or "lora_b" in str(p))
  generator = [g for p, g in _leaves(grads) if "generator" in str(p)]
  assert all(np.abs(g).max() == 0 for g in generator)  # the other role's adapter: no gradient


def test_the_loss_is_unbiased_to_first_order(setup):
  """Over 64 keys the mean loss is the no-dropout loss up to noise and a second-order bias.
  Inverted dropout leaves each adapter output's expectation unchanged (`lm` test); the loss is a
  smooth function of those outputs, so its mean moves only by O(p/(1−p)·|adapter update|²) — with
  B ~ 0.1·N(0, 1) that is far below the per-key spread. Tolerance: 5 standard errors of the mean
  plus 10% of the per-key standard deviation for that bias (measured on this fixture: mean −
  base = 9.4e-4, 1.4 standard errors of 6.6e-4; per-key std 5.3e-3). The train step's own
  compiled `accumulate` (shared with the tests above) computes each loss."""
  made, trainable, frozen, batch = setup
  base_loss, _ = _accumulate(made[0.0], trainable, frozen, batch, None)
  keys = range(64)
  values = np.array([_accumulate(made[0.05], trainable, frozen, batch, jax.random.key(k))[0] for k in keys])
  spread = values.std()
  assert spread > 0
  assert abs(values.mean() - base_loss) <= 5 * spread / np.sqrt(len(values)) + 0.1 * spread


def test_sampling_views_have_no_dropout(setup):
  """The trainer samples (and evaluates) from `policies.policy(...)` without a key: with a dropout
  rate the sampled tokens are those of the same adapters without one."""
  made, trainable, frozen, _ = setup
  outs = []
  for rate in (0.0, 0.05):
    view = made[rate].policy(trainable, frozen, "generator")
    assert isinstance(view.lora, lora.Adapter)  # not a dropout view
    s = sampler.Sampler(view)
    outs.append(s.generate([[5, 9, 2], [7, 7]], max_new_tokens=6, temperature=1.0, seed=[3, 4]).tokens)
  assert outs[0] == outs[1]


def test_dropout_keys_are_a_function_of_the_update_role_and_chunk():
  """`Trainer._dropout_key` derives from (seed, step, case, role, chunk) only — a resumed run
  draws the same masks — and is None without dropout (today's compiled step)."""
  mesh = sharding.make_mesh(sharding.MeshConfig())

  def trainer(rate, seed=0):
    return types.SimpleNamespace(
      policies=types.SimpleNamespace(lora_dropout=rate), config=types.SimpleNamespace(seed=seed), mesh=mesh
    )

  key = lambda t, *parts: np.asarray(jax.random.key_data(train_lib.Trainer._dropout_key(t, *parts)))
  t = trainer(0.05)
  np.testing.assert_array_equal(
    key(t, 3, "case7", "generator", 0), key(trainer(0.05), 3, "case7", "generator", 0)
  )
  distinct = {
    key(t, *parts).tobytes()
    for parts in ((3, "case7", "generator", 0), (3, "case7", "generator", 1), (3, "case7", "verifier", 0))
    + ((4, "case7", "generator", 0), (3, "case8", "generator", 0))
  }
  assert len(distinct) == 5
  assert key(trainer(0.05, seed=1), 3, "case7", "generator", 0).tobytes() not in distinct
  assert train_lib.Trainer._dropout_key(trainer(0.0), 3, "case7", "generator", 0) is None
