"""The sampler on meshes: decode keeps the weights sharded (read from the compiled program), and a
sampling mesh of its own gives the tokens one device gives."""

import jax
import numpy as np
import pytest
from flax import nnx

import lm
from lm import sampler as sampler_lib
from lm import sharding
from lm.config import ModelConfig
from lm.model import Qwen
from tests.lm.hf_helpers import save_tiny

PROMPTS = [[5, 17, 33, 2, 90, 41, 7], [12, 3], [64, 65, 66, 67, 99]]


def _weight_bytes(model) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.slow
def test_decode_holds_no_full_copy_of_the_weights():
  """A model sharded over 8 devices (fsdp 8, the training layout): in the training layout XLA
  gathers every weight before the decode loop (the whole model on each device); in the sampler's
  own (tensor parallel) layout no weight is gathered at all, only rows of activations in the loop."""
  config = ModelConfig(256, 64, 128, 2, 8, 8, 16, bos_token_id=None, eos_token_ids=(1,), pad_token_id=0)
  model = Qwen(config, rngs=nnx.Rngs(0))
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=8, tp=1))
  sharding.shard_model(model, mesh)
  full = _weight_bytes(model)

  def decode(layout):
    sampler = sampler_lib.Sampler(model, mesh=mesh, sharding=layout)
    compiled = sampler.lowered([[5, 6, 7]] * 8, max_new_tokens=16, n=2)["decode"].compile()
    return sampler_lib.gathered_bytes(compiled.as_text()), compiled.memory_analysis()

  (train_gathers, train_memory), (gathers, memory) = decode(sharding.ShardingConfig()), decode(None)
  assert train_gathers["outside"] >= 0.99 * full  # the detector sees the hoisted copy (norms stay replicated)
  assert gathers["outside"] < full / 8, gathers  # no weight gathered outside the loop
  assert gathers["inside"] < full / 8, gathers  # nor gathered inside it (one step's logits rows)
  assert memory.temp_size_in_bytes < train_memory.temp_size_in_bytes - full / 2
  assert memory.argument_size_in_bytes < full / 4  # each device's own shard of the weights


@pytest.fixture(scope="module")
def model(tmp_path_factory):
  _, path = save_tiny(tmp_path_factory.mktemp("qwen3"), kind="qwen3", vocab=128)
  return lm.load_hf(path, dtype="float32")


@pytest.mark.slow
def test_a_sampling_mesh_of_its_own_samples_what_one_device_does(model):
  """The weights live on a training mesh (fsdp 8); the sampler reshards them onto its own tp=2 mesh
  (two of the devices). Greedy rows and seeded samples equal the single-device sampler's."""
  kwargs = dict(max_new_tokens=8, n=2, temperature=[0.0, 1.0, 0.0], seed=5)
  expected = sampler_lib.Sampler(model).generate(PROMPTS, **kwargs)
  trained = jax.tree.map(lambda x: x, model)  # a second model object over the same arrays
  sharding.shard_model(trained, sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=8, tp=1)))
  sampling_mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=1, tp=2), devices=jax.devices()[:2])
  sampler = sampler_lib.Sampler(trained, mesh=sampling_mesh)
  assert sampler._state["layers"]["q_dnh"][...].sharding.mesh.shape == sampling_mesh.shape
  out = sampler.generate(PROMPTS, **kwargs)
  assert out.tokens == expected.tokens
  for a, b in zip(out.logprobs, expected.logprobs, strict=True):
    np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5)
