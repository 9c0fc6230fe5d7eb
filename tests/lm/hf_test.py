"""Parity of lm.model / lm.hf with transformers Qwen2 and Qwen3 on random tiny checkpoints."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

import lm
from lm.config import ModelConfig
from tests.lm.hf_helpers import save_tiny

# bfloat16 keeps 8 mantissa bits. Both our bf16 run and transformers' bf16 run are compared with the
# float32 reference; measured on these tiny models: 0.002–0.004 for both (logits are O(1)).
BF16_ATOL = 0.02


def _tokens(batch=3, length=9, vocab=128, seed=0):
  return np.random.RandomState(seed).randint(2, vocab, (batch, length)).astype(np.int32)


def _hf_logits(model, tokens, mask=None):
  with torch.no_grad():
    out = model(
      torch.tensor(tokens, dtype=torch.long), attention_mask=None if mask is None else torch.tensor(mask)
    )
  return out.logits.float().numpy()


@pytest.mark.slow
@pytest.mark.parametrize(
  "kind,heads,kv_heads,head_dim,tied",
  [
    ("qwen3", 4, 4, 16, False),  # GQA ratio 1, head_dim != D / N
    ("qwen3", 4, 2, 8, True),  # ratio 2, tied head
    ("qwen3", 6, 2, 12, False),  # ratio 3
    ("qwen2", 4, 1, 8, False),  # ratio 4, q/k/v biases
    ("qwen2", 4, 2, 8, True),
  ],
)
def test_float32_logits_match_transformers(tmp_path, kind, heads, kv_heads, head_dim, tied):
  hf_model, path = save_tiny(
    tmp_path, kind=kind, heads=heads, kv_heads=kv_heads, head_dim=head_dim, tied=tied
  )
  model = lm.load_hf(path, dtype="float32")
  assert model.config.model_type == kind
  assert model.config.tie_word_embeddings == tied
  tokens = _tokens()
  ours = np.asarray(model(jnp.asarray(tokens)))
  np.testing.assert_allclose(ours, _hf_logits(hf_model, tokens), atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen3", "qwen2"])
def test_bfloat16_logits_within_tolerance(tmp_path, kind):
  hf_model, path = save_tiny(tmp_path, kind=kind, head_dim=8)
  tokens = _tokens()
  reference = _hf_logits(hf_model, tokens)
  ours = np.asarray(lm.load_hf(path, dtype="bfloat16")(jnp.asarray(tokens)))
  assert ours.dtype == np.float32  # logits are always float32
  hf_bf16 = _hf_logits(hf_model.to(torch.bfloat16), tokens)
  ours_err = np.abs(ours - reference).max()
  hf_err = np.abs(hf_bf16 - reference).max()
  assert ours_err < BF16_ATOL, (ours_err, hf_err)
  assert hf_err < BF16_ATOL


@pytest.mark.slow
def test_left_padded_batch_equals_rows_alone(tmp_path):
  hf_model, path = save_tiny(tmp_path, kind="qwen3")
  model = lm.load_hf(path, dtype="float32")
  lengths = [9, 5, 2]
  tokens = _tokens(batch=3, length=9)
  mask = np.zeros_like(tokens)
  for row, n in enumerate(lengths):
    mask[row, 9 - n :] = 1
  tokens = np.where(mask == 1, tokens, 0)
  batched = np.asarray(model(jnp.asarray(tokens), attention_mask=jnp.asarray(mask)))
  for row, n in enumerate(lengths):
    alone = np.asarray(model(jnp.asarray(tokens[row : row + 1, 9 - n :])))
    np.testing.assert_allclose(batched[row, 9 - n :], alone[0], atol=1e-5)
    # and transformers agrees on the padded batch
  hf = _hf_logits(hf_model, tokens, mask)
  np.testing.assert_allclose(batched[mask == 1], hf[mask == 1], atol=1e-4)


@pytest.mark.slow
def test_kv_cache_decoding_equals_full_forward(tmp_path):
  _, path = save_tiny(tmp_path, kind="qwen2")
  model = lm.load_hf(path, dtype="float32")
  tokens = jnp.asarray(_tokens(batch=2, length=8))
  full = model(tokens)
  mask = jnp.ones((2, 12), jnp.int32)
  cache = model.init_cache(2, 12)
  prefill, cache = model(tokens[:, :5], attention_mask=mask, cache=cache, cache_index=0)
  steps = [prefill]
  for i in range(5, 8):
    logits, cache = model(tokens[:, i : i + 1], attention_mask=mask, cache=cache, cache_index=i)
    steps.append(logits)
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("tied,max_shard_bytes", [(True, 1 << 30), (False, 20_000)])
def test_save_hf_round_trip_through_transformers(tmp_path, tied, max_shard_bytes):
  config = ModelConfig.preset("tiny_qwen3", vocab_size=128, tie_word_embeddings=tied)
  model = lm.Qwen(config, rngs=nnx.Rngs(3))
  lm.save_hf(model, tmp_path / "out", max_shard_bytes=max_shard_bytes)
  sharded = (tmp_path / "out" / "model.safetensors.index.json").exists()
  assert sharded == (max_shard_bytes < 1 << 30)
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
  tokens = _tokens(vocab=128)
  ours = np.asarray(model(jnp.asarray(tokens)))
  np.testing.assert_allclose(_hf_logits(hf_model, tokens), ours, atol=1e-5)
  reloaded = lm.load_hf(tmp_path / "out", dtype="float32")
  np.testing.assert_array_equal(np.asarray(reloaded(jnp.asarray(tokens))), ours)


@pytest.mark.slow
def test_bfloat16_save_is_loadable(tmp_path):
  model = lm.Qwen(ModelConfig.tiny_qwen2(vocab_size=64), rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16)
  lm.save_hf(model, tmp_path / "bf16")
  assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
  assert next(hf_model.parameters()).dtype == torch.bfloat16
  back = lm.load_hf(tmp_path / "bf16", dtype="bfloat16")
  np.testing.assert_array_equal(np.asarray(back.layers.q_dnh[...]), np.asarray(model.layers.q_dnh[...]))


def _rewrite(path, edit):
  from safetensors.numpy import load_file, save_file

  file = path / "model.safetensors"
  tensors = load_file(file)
  edit(tensors)
  save_file(tensors, file)


def test_missing_tensor_is_named(tmp_path):
  _, path = save_tiny(tmp_path)
  _rewrite(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  with pytest.raises(ValueError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.weight"):
    lm.load_hf(path, dtype="float32")


def test_unexpected_tensor_is_named(tmp_path):
  _, path = save_tiny(tmp_path)
  _rewrite(path, lambda t: t.__setitem__("model.layers.0.extra.weight", np.zeros(3, np.float32)))
  with pytest.raises(ValueError, match=r"unexpected tensors: model\.layers\.0\.extra\.weight"):
    lm.load_hf(path, dtype="float32")


def test_misshaped_tensor_names_both_shapes(tmp_path):
  _, path = save_tiny(tmp_path)
  _rewrite(
    path, lambda t: t.__setitem__("model.layers.0.self_attn.k_proj.weight", np.zeros((16, 32), np.float32))
  )
  with pytest.raises(ValueError, match=r"k_proj\.weight: expected shape \(32, 32\), found \(16, 32\)"):
    lm.load_hf(path, dtype="float32")


def test_from_hf_reads_transformers_4_and_5_layouts(tmp_path):
  base = {
    "model_type": "qwen3",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "tie_word_embeddings": True,
  }
  v4 = {**base, "rope_theta": 123.0}
  v5 = {**base, "rope_parameters": {"rope_type": "default", "rope_theta": 456.0}}
  for layout, theta in ((v4, 123.0), (v5, 456.0)):
    (tmp_path / "config.json").write_text(json.dumps(layout))
    assert ModelConfig.from_hf(tmp_path).rope_theta == theta
  with pytest.raises(ValueError, match="lacks required keys: hidden_size"):
    ModelConfig.from_hf_dict({k: v for k, v in base.items() if k != "hidden_size"})
