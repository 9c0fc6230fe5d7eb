"""Fused q/k/v and gate/up weights (`lm.model.fuse_projections`): the same model as the separate ones."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lm import lora
from lm import model as model_lib
from lm.config import ModelConfig
from lm.model import Qwen


def _randomised(config):
  """A model whose norms and biases are not their init values, so every fused slice matters."""
  model = Qwen(config, rngs=nnx.Rngs(0))
  for i, (name, var) in enumerate(sorted(vars(model.layers).items())):
    if isinstance(var, nnx.Param) and ("norm" in name or "bias" in name):
      var[...] = var[...] + 0.1 * jax.random.normal(jax.random.key(i), var.shape)
  return model


@pytest.mark.parametrize("qwen2", [False, True])
def test_prefill_and_decode_with_fused_weights_equal_the_separate_ones(qwen2):
  config = ModelConfig.tiny_qwen3()
  if qwen2:  # q/k/v biases and no q/k norm: the other branch of the layer
    config = ModelConfig(**{**vars(config), "qkv_bias": True, "qk_norm": False, "model_type": "qwen2"})
  model = _randomised(config)
  fused = model_lib.fuse_projections(model.layers.weights())
  assert set(fused[0]) >= {"qkv_dx", "gate_up_dx"} and "q_dnh" not in fused[0] and "up_df" not in fused[0]
  tokens = jax.random.randint(jax.random.key(1), (2, 9), 2, config.vocab_size)
  mask = jnp.ones((2, 12), jnp.int32).at[1, :3].set(0)

  def run(layer_weights):
    cache = model.init_cache(2, 12)
    hidden, cache = model.hidden_states(
      tokens, attention_mask=mask, cache=cache, cache_index=0, layer_weights=layer_weights
    )
    step, _ = model.hidden_states(
      tokens[:, -1:], attention_mask=mask, cache=cache, cache_index=9, layer_weights=layer_weights
    )
    return hidden, step

  for got, want in zip(run(fused), run(model.unstacked_layer_weights()), strict=True):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_weights_with_a_lora_adapter_are_refused():
  model = Qwen(ModelConfig.tiny_qwen3(), rngs=nnx.Rngs(0))
  adapter = lora.init_adapters(model, lora.LoRAConfig(rank=2, alpha=4.0), ("a",), seed=0)["a"]
  with pytest.raises(ValueError, match="LoRA"):
    model_lib.fuse_projections(lora.with_adapter(model, adapter).stacked_layer_weights())
