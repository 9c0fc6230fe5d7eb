"""LoRA: zero-init is the identity, adapters off is the reference, merge = unmerged, HF export."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

import lm
from lm import lora, sampler
from lm.config import ModelConfig

TOKENS = jnp.array([[5, 9, 2, 7, 30, 11], [3, 3, 8, 1, 0, 4]])
_logits = jax.jit(lambda model, tokens: model(tokens))


def _randomise(adapter: lora.Adapter, seed: int) -> lora.Adapter:
  """Non-zero B factors, so the adapter changes the model."""
  rng = np.random.RandomState(seed)
  for name, var in vars(adapter).items():
    if isinstance(var, lora.LoRAParam) and name.endswith("_lora_b"):
      var[...] = jnp.asarray(0.05 * rng.randn(*var.shape), var.dtype)
  return adapter


@pytest.fixture(scope="module")
def setup():
  model = lm.Qwen(ModelConfig.tiny_qwen3(64), rngs=nnx.Rngs(0))
  adapters = lora.init_adapters(model, lora.LoRAConfig(rank=4, alpha=8.0), ("generator", "verifier"), seed=1)
  return model, adapters


def test_zero_init_adapter_is_the_identity(setup):
  model, adapters = setup
  base = _logits(model, TOKENS)
  np.testing.assert_array_equal(_logits(lora.with_adapter(model, adapters["generator"]), TOKENS), base)


def test_adapters_off_is_the_reference_and_roles_differ(setup):
  model, adapters = setup
  base = np.asarray(_logits(model, TOKENS))
  generator = lora.with_adapter(model, _randomise(adapters["generator"], 0))
  verifier = lora.with_adapter(model, _randomise(adapters["verifier"], 1))
  gen_logits, ver_logits = np.asarray(_logits(generator, TOKENS)), np.asarray(_logits(verifier, TOKENS))
  assert np.abs(gen_logits - base).max() > 1e-3 and np.abs(gen_logits - ver_logits).max() > 1e-3
  np.testing.assert_array_equal(_logits(lora.with_adapter(generator, None), TOKENS), base)
  # One backbone: the views share its variables, and the trainable state is the adapter only.
  assert generator.embed_vd is model.embed_vd and verifier.layers is model.layers
  trainable = jax.tree_util.tree_leaves_with_path(nnx.state(generator, lora.LoRAParam))
  assert len(trainable) == 14 and all(path[0].key == "lora" for path, _ in trainable)
  assert len(jax.tree.leaves(nnx.state(generator, nnx.Param))) == len(
    jax.tree.leaves(nnx.state(model, nnx.Param))
  )


@pytest.mark.slow
def test_merge_equals_unmerged_and_exports_to_transformers(setup, tmp_path):
  model, adapters = setup
  adapted = lora.with_adapter(model, _randomise(adapters["generator"], 0))
  merged = lora.merge(adapted)
  assert merged.lora is None and model.layers.q_dnh is not merged.layers.q_dnh
  np.testing.assert_allclose(_logits(merged, TOKENS), _logits(adapted, TOKENS), atol=1e-5)
  lora.export_hf(adapted, tmp_path / "export")
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export").eval()
  with torch.no_grad():
    theirs = torch_model(torch.tensor(np.asarray(TOKENS))).logits.numpy()
  np.testing.assert_allclose(theirs, _logits(adapted, TOKENS), atol=1e-4)


@pytest.mark.slow
def test_sampler_samples_from_the_role(setup):
  model, adapters = setup
  adapted = lora.with_adapter(model, _randomise(adapters["verifier"], 3))
  prompts = [[5, 9, 2], [7, 7]]
  ours = sampler.Sampler(adapted).generate(prompts, max_new_tokens=6, temperature=0.0)
  merged = sampler.Sampler(lora.merge(adapted)).generate(prompts, max_new_tokens=6, temperature=0.0)
  base = sampler.Sampler(model).generate(prompts, max_new_tokens=6, temperature=0.0)
  assert ours.tokens == merged.tokens and ours.tokens != base.tokens
