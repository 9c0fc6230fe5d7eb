"""PEFT LoRA directories: save_peft / load_peft round trip, and the saved factors mean to transformers
what the adapter means to our model (base HF weights + (lora_alpha / r) · B @ A give its logits)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file

import lm
from lm import lora
from lm.config import ModelConfig
from tests.lm.lora_test import _randomise

TOKENS = jnp.array([[5, 9, 2, 7, 30, 11], [3, 3, 8, 1, 0, 4]])
RANK, ALPHA = 4, 8.0


@pytest.fixture(scope="module")
def setup():
  model = lm.Qwen(ModelConfig.tiny_qwen3(64), rngs=nnx.Rngs(0))
  config = lora.LoRAConfig(rank=RANK, alpha=ALPHA, targets=("q", "v", "o", "down"))
  adapter = _randomise(lora.init_adapters(model, config, ("generator",), seed=1)["generator"], 3)
  return model, adapter


def _save(params, directory):
  lora.save_peft(
    params, directory, rank=RANK, alpha=ALPHA, target_modules=("q", "v", "o", "down"), base_model_name="tiny"
  )


def test_round_trip_and_the_trainers_state_save_the_same_file(setup, tmp_path):
  model, adapter = setup
  _save(adapter, tmp_path / "a")
  # DPA-GRPO's trainer holds each role's adapter as the view's LoRAParam state.
  _, _, state = nnx.split(lora.with_adapter(model, adapter), nnx.Param, lora.LoRAParam)
  _save(state, tmp_path / "b")
  first, second = (
    load_file(tmp_path / "a" / "adapter_model.safetensors"),
    load_file(tmp_path / "b" / "adapter_model.safetensors"),
  )
  assert sorted(first) == sorted(second)
  for key in first:
    np.testing.assert_array_equal(first[key], second[key])
  assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in first
  down_b = first["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
  assert down_b.shape == (model.config.hidden_size, RANK)  # [out, R], as torch's Linear
  peft_config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
  assert (peft_config["r"], peft_config["lora_alpha"]) == (RANK, ALPHA)
  assert peft_config["target_modules"] == ["q_proj", "v_proj", "o_proj", "down_proj"]
  loaded = lora.load_peft(tmp_path / "a", model.config)
  assert loaded.scale == adapter.scale
  for name, want in adapter.weights().items():
    np.testing.assert_allclose(loaded.weights()[name], want, rtol=1e-6, atol=1e-7)


@pytest.mark.slow  # transformers' import and model build: ~20 s on 2 busy cores
def test_the_saved_factors_give_transformers_our_logits(setup, tmp_path):
  model, adapter = setup
  _save(adapter, tmp_path / "peft")
  lm.save_hf(model, tmp_path / "base")
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
  factors = load_file(tmp_path / "peft" / "adapter_model.safetensors")
  peft_config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
  scaling = peft_config["lora_alpha"] / peft_config["r"]
  modules = dict(torch_model.named_modules())
  with torch.no_grad():
    for key, a in factors.items():
      if ".lora_A." not in key:
        continue
      b = factors[key.replace(".lora_A.", ".lora_B.")]
      name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
      modules[name].weight += scaling * torch.from_numpy(b) @ torch.from_numpy(a)
    want = torch_model(torch.tensor(np.asarray(TOKENS))).logits.numpy()
  ours = jax.jit(lambda m, t: m(t))(lora.with_adapter(model, adapter), TOKENS)
  np.testing.assert_allclose(np.asarray(ours), want, atol=2e-4)
  assert not np.allclose(np.asarray(jax.jit(lambda m, t: m(t))(model, TOKENS)), want, atol=1e-3)


def test_load_peft_names_what_it_cannot_load(setup, tmp_path):
  model, adapter = setup
  _save(adapter, tmp_path)
  peft_config = json.loads((tmp_path / "adapter_config.json").read_text())
  (tmp_path / "adapter_config.json").write_text(json.dumps(dict(peft_config, use_dora=True)))
  with pytest.raises(ValueError, match="'use_dora'"):
    lora.load_peft(tmp_path, model.config)
  (tmp_path / "adapter_config.json").write_text(json.dumps(peft_config))
  weights = load_file(tmp_path / "adapter_model.safetensors")
  key = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
  save_file({k: v for k, v in weights.items() if k != key}, tmp_path / "adapter_model.safetensors")
  with pytest.raises(ValueError, match="has no tensor 'base_model.model.model.layers.1.self_attn.v_proj"):
    lora.load_peft(tmp_path, model.config)
  with pytest.raises(ValueError, match="does not exist"):
    lora.load_peft(tmp_path / "nowhere", model.config)


@pytest.mark.slow
def test_the_peft_library_loads_our_directory_and_we_load_its_save(setup, tmp_path):
  """Against HF peft itself, where installed (not in the test extras; docs/serving.md says how)."""
  peft = pytest.importorskip("peft")
  model, adapter = setup
  lm.save_hf(model, tmp_path / "base")
  _save(adapter, tmp_path / "ours")
  tokens = torch.tensor(np.asarray(TOKENS))
  base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
  with torch.no_grad():
    theirs = peft.PeftModel.from_pretrained(base, tmp_path / "ours").eval()(tokens).logits.numpy()
  ours = jax.jit(lambda m, t: m(t))(lora.with_adapter(model, adapter), TOKENS)
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=2e-4)
  modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
  config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=modules, lora_dropout=0.0)
  fresh = peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base"), config)
  with torch.no_grad():
    for name, param in fresh.named_parameters():
      if "lora_B" in name:
        param.copy_(0.05 * torch.randn_like(param))
    fresh.save_pretrained(tmp_path / "theirs")
    theirs = fresh.eval()(tokens).logits.numpy()
  loaded = lora.load_peft(tmp_path / "theirs", model.config)
  np.testing.assert_allclose(np.asarray(jax.jit(lambda m, t: m(t))(lora.with_adapter(model, loaded), TOKENS)),
                             theirs, atol=2e-4)  # fmt: skip
