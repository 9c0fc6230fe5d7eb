"""Tiny transformers checkpoints for parity tests, built locally (no hub)."""

import torch
import transformers


def tiny_hf_model(
  kind: str = "qwen3",
  *,
  heads: int = 4,
  kv_heads: int = 2,
  head_dim: int = 16,
  tied: bool = False,
  vocab: int = 128,
  layers: int = 2,
  seed: int = 0,
):
  """A random Qwen2/Qwen3 model whose every weight (norms and biases too) is non-trivial."""
  common = dict(
    vocab_size=vocab,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    num_key_value_heads=kv_heads,
    tie_word_embeddings=tied,
    rope_theta=10_000.0,
    max_position_embeddings=256,
    eos_token_id=1,
    pad_token_id=0,
    bos_token_id=None,
  )
  if kind == "qwen3":
    cfg = transformers.Qwen3Config(head_dim=head_dim, **common)
    cls = transformers.Qwen3ForCausalLM
  else:
    cfg = transformers.Qwen2Config(**common)
    cls = transformers.Qwen2ForCausalLM
  torch.manual_seed(seed)
  model = cls(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      elif name.endswith("bias"):
        p.copy_(0.1 * torch.randn_like(p))
  return model


def save_tiny(tmp_path, name="ckpt", **kwargs):
  model = tiny_hf_model(**kwargs)
  path = tmp_path / name
  model.save_pretrained(path)
  return model, path
