"""Mesh construction and sharded forward passes on 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import lm
from lm import sharding
from lm.config import ModelConfig
from tests.lm.hf_helpers import save_tiny


def _axes(array) -> tuple:
  """The array's PartitionSpec as a tuple without trailing Nones (jax is not consistent there)."""
  spec = list(array.sharding.spec)
  while spec and spec[-1] is None:
    spec.pop()
  return tuple(spec)


def test_mesh_fills_minus_one_axis():
  assert sharding.MeshConfig(data=-1, fsdp=2, tp=2).shape(8) == (2, 2, 2)
  assert sharding.MeshConfig(data=1, fsdp=-1, tp=4).shape(8) == (1, 2, 4)
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=-1, tp=2))
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tp": 2}
  with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
    sharding.MeshConfig(data=-1, fsdp=-1).shape(8)
  with pytest.raises(ValueError, match="cannot be split"):
    sharding.MeshConfig(data=-1, tp=3).shape(8)


def test_fit_spec_replicates_indivisible_dims():
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=2, tp=4))
  assert sharding.fit_spec(P(None, "fsdp", "tp", None), (2, 32, 2, 16), mesh) == P(None, "fsdp", None, None)
  assert sharding.fit_spec(P(("data", "fsdp"), None), (6, 3), mesh) == P(("data", "fsdp"), None)


@pytest.mark.slow
@pytest.mark.parametrize(
  "mesh_config", [sharding.MeshConfig(data=2, fsdp=2, tp=2), sharding.MeshConfig(data=1, fsdp=2, tp=4)]
)
def test_sharded_forward_equals_single_device(mesh_config):
  config = ModelConfig.preset("tiny_qwen3", num_heads=8, num_kv_heads=4, vocab_size=128)
  model = lm.Qwen(config, rngs=nnx.Rngs(0))
  tokens = jnp.asarray(np.random.RandomState(0).randint(0, 128, (8, 6)), jnp.int32)
  expected = np.asarray(model(tokens))
  mesh = sharding.make_mesh(mesh_config)
  sharding.shard_model(model, mesh)
  assert _axes(model.layers.q_dnh[...]) == (None, "fsdp", "tp")
  assert len(model.layers.gate_df[...].sharding.device_set) == 8
  shard_shape = model.layers.gate_df[...].addressable_shards[0].data.shape
  assert shard_shape == (2, 32 // mesh.shape["fsdp"], 64 // mesh.shape["tp"])
  tokens = jax.device_put(tokens, sharding.batch_sharding(mesh, tokens.shape))
  logits = nnx.jit(lambda m, t: m(t))(model, tokens)
  np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-5)


@pytest.mark.slow
def test_load_hf_places_tensors_on_their_shardings(tmp_path):
  _, path = save_tiny(tmp_path, heads=4, kv_heads=2, head_dim=16)
  single = lm.load_hf(path, dtype="float32")
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tp=2))
  model = lm.load_hf(path, dtype="float32", mesh=mesh)
  assert _axes(model.layers.k_dkh[...]) == (None, "fsdp", "tp")
  assert _axes(model.embed_vd[...]) == ("tp", "fsdp")
  np.testing.assert_array_equal(np.asarray(model.layers.down_fd[...]), np.asarray(single.layers.down_fd[...]))
  tokens = jnp.asarray(np.random.RandomState(1).randint(0, 128, (4, 5)), jnp.int32)
  np.testing.assert_allclose(
    np.asarray(nnx.jit(lambda m, t: m(t))(model, tokens)), np.asarray(single(tokens)), atol=1e-5
  )
