"""Model configuration: one frozen dataclass for the Qwen2 / Qwen2.5 / Qwen3 decoder family.

The two families differ in three switches only (q/k/v biases, per-head q/k RMSNorm, explicit
head_dim), so one config and one model serve both; `from_hf` reads a checkpoint's `config.json`
as written by transformers 4.x or 5.x.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of a Qwen-family decoder.

  Attributes:
    vocab_size: V.
    hidden_size: D, the residual width.
    intermediate_size: F, the SwiGLU width.
    num_layers: L.
    num_heads: N, query heads.
    num_kv_heads: K, key/value heads (GQA: N is a multiple of K).
    head_dim: H (Qwen3 sets it explicitly; Qwen2 uses D // N).
    rope_theta: RoPE base.
    rms_norm_eps: epsilon of every RMSNorm.
    tie_word_embeddings: logits use the embedding matrix transposed instead of `lm_head`.
    qkv_bias: q/k/v projections carry a bias (Qwen2/2.5).
    qk_norm: per-head RMSNorm on q and k before RoPE (Qwen3).
    max_position_embeddings: longest sequence the checkpoint was trained for (informational).
    model_type: "qwen3" or "qwen2", written back by `save_hf`.
    bos_token_id / eos_token_ids / pad_token_id: special tokens from the checkpoint config.
    attention_block: sequences longer than this run attention blockwise (queries in chunks of
      this many, an online softmax over key blocks of this many), so memory grows linearly with
      the length instead of with its square; shorter ones run the plain computation unchanged.
      Not a property of the checkpoint (not read from or written to config.json).
    attention_impl: how a `CausalMask`'s attention (sequences longer than `attention_block`
      starting at slot 0: training, scoring, a prefill from an empty cache) runs: "blockwise"
      (`lm.model.blockwise_attention`, every backend), or `jax.nn.dot_product_attention` with
      implementation "xla" or "cudnn" (the flash kernel; GPUs only) on rows whose real tokens are
      one contiguous run (left or right padding; others fall back to blockwise inside the program).
      On an H200, one layer of 8 x 4,096 tokens forward and backward: blockwise 0.237 s, "xla"
      0.062, "cudnn" 0.010 (docs/results/2026-12-04-device-check-h200.md). Not a property of
      the checkpoint.
    unroll_layers: a model of at most this many layers runs its layer loop unrolled in training
      and scoring (`lm.model.decoder_stack`); a deeper one scans over the stacked weights, so
      its compile time does not grow with depth (every Qwen preset: 28 layers and more). Unrolled,
      XLA schedules straight-line code without the scan's stacked residual buffers and per-layer
      slices: 1.08–1.17× the train step of rl_bench's 4-layer model on CPU
      (docs/results/2026-12-03-rl-bench.md). 0 always scans. Not a property of the checkpoint.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = True
  qkv_bias: bool = False
  qk_norm: bool = True
  max_position_embeddings: int = 40_960
  model_type: str = "qwen3"
  bos_token_id: int | None = 151_643
  eos_token_ids: tuple[int, ...] = (151_645, 151_643)
  pad_token_id: int | None = 151_643
  attention_block: int = 1024
  attention_impl: str = "blockwise"
  unroll_layers: int = 8

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for rotate-half RoPE, got {self.head_dim}")
    if self.model_type not in ("qwen2", "qwen3"):
      raise ValueError(f"model_type must be 'qwen2' or 'qwen3', got {self.model_type!r}")
    if self.attention_block < 1:
      raise ValueError(f"attention_block must be >= 1, got {self.attention_block}")
    if self.attention_impl not in ("blockwise", "xla", "cudnn"):
      raise ValueError(f"attention_impl must be 'blockwise', 'xla' or 'cudnn', got {self.attention_impl!r}")
    if self.unroll_layers < 0:
      raise ValueError(f"unroll_layers must be >= 0, got {self.unroll_layers}")

  def context_limit(self, limit: int | None = None) -> int:
    """Most prompt + generated tokens per sequence: the positions, or `limit` if smaller."""
    return self.max_position_embeddings if limit is None else min(limit, self.max_position_embeddings)

  def check_context(self, prompt_tokens: int, max_tokens: int, limit: int | None = None) -> None:
    """Raises ValueError naming the limit when a prompt plus `max_tokens` does not fit.

    RoPE past the trained positions gives a model text it was never trained on, and prefill and
    cache grow with the length: callers refuse instead (the server answers 400).
    """
    allowed = self.context_limit(limit)
    if prompt_tokens + max_tokens > allowed:
      raise ValueError(
        f"prompt of {prompt_tokens} tokens with max_tokens={max_tokens} exceeds the context limit of "
        f"{allowed} tokens"
      )

  # ---- presets -------------------------------------------------------------------------------
  @classmethod
  def qwen3_0p6b(cls) -> ModelConfig:
    return cls(151_936, 1024, 3072, 28, 16, 8, 128)

  @classmethod
  def qwen3_1p7b(cls) -> ModelConfig:
    return cls(151_936, 2048, 6144, 28, 16, 8, 128)

  @classmethod
  def qwen3_4b(cls) -> ModelConfig:
    return cls(151_936, 2560, 9728, 36, 32, 8, 128)

  @classmethod
  def qwen3_8b(cls) -> ModelConfig:
    return cls(151_936, 4096, 12_288, 36, 32, 8, 128, tie_word_embeddings=False)

  @classmethod
  def qwen3_32b(cls) -> ModelConfig:
    """Qwen3-32B (KACE's teacher and curator): 64 layers, 64 query and 8 KV heads, 32.8B parameters."""
    return cls(151_936, 5120, 25_600, 64, 64, 8, 128, tie_word_embeddings=False)

  @classmethod
  def qwen2p5_1p5b(cls) -> ModelConfig:
    return cls(
      151_936,
      1536,
      8960,
      28,
      12,
      2,
      128,
      rms_norm_eps=1e-6,
      tie_word_embeddings=True,
      qkv_bias=True,
      qk_norm=False,
      model_type="qwen2",
      max_position_embeddings=32_768,
      eos_token_ids=(151_645, 151_643),
    )

  @classmethod
  def qwen2p5_7b(cls) -> ModelConfig:
    return cls(
      152_064,
      3584,
      18_944,
      28,
      28,
      4,
      128,
      rms_norm_eps=1e-6,
      tie_word_embeddings=False,
      qkv_bias=True,
      qk_norm=False,
      model_type="qwen2",
      max_position_embeddings=32_768,
      eos_token_ids=(151_645, 151_643),
    )

  @classmethod
  def tiny_qwen3(cls, vocab_size: int = 256) -> ModelConfig:
    """Two layers, GQA 4/2, head_dim 16 ≠ D/N: exercises every Qwen3 code path in milliseconds."""
    return cls(
      vocab_size,
      32,
      64,
      2,
      4,
      2,
      16,
      rope_theta=10_000.0,
      bos_token_id=None,
      eos_token_ids=(1,),
      pad_token_id=0,
    )

  @classmethod
  def tiny_qwen2(cls, vocab_size: int = 256) -> ModelConfig:
    return cls(
      vocab_size,
      32,
      64,
      2,
      4,
      2,
      8,
      rope_theta=10_000.0,
      qkv_bias=True,
      qk_norm=False,
      model_type="qwen2",
      tie_word_embeddings=False,
      bos_token_id=None,
      eos_token_ids=(1,),
      pad_token_id=0,
    )

  @classmethod
  def preset(cls, name: str, **overrides: Any) -> ModelConfig:
    """A preset by name (e.g. "qwen3_4b", "tiny_qwen3"), with field overrides."""
    factory = getattr(cls, name, None)
    if name.startswith("_") or name in ("preset", "from_hf") or not callable(factory):
      raise ValueError(f"unknown model preset {name!r}; known: {', '.join(preset_names())}")
    return dataclasses.replace(factory(), **overrides)

  # ---- Hugging Face config.json --------------------------------------------------------------
  @classmethod
  def from_hf(cls, path: str | os.PathLike) -> ModelConfig:
    """Reads a checkpoint directory's (or a file's) `config.json`, transformers 4.x or 5.x layout."""
    file = os.path.join(path, "config.json") if os.path.isdir(path) else os.fspath(path)
    if not os.path.exists(file):
      raise FileNotFoundError(f"no config.json at {file}")
    with open(file, encoding="utf-8") as f:
      text = f.read()
    try:
      hf = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"{file} is not valid JSON ({len(text)} chars; truncated?): {e}") from e
    return cls.from_hf_dict(hf)

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any]) -> ModelConfig:
    model_type = hf.get("model_type", "qwen3")
    if model_type not in ("qwen2", "qwen3"):
      raise ValueError(f"config.json model_type {model_type!r} is not supported (qwen2, qwen3)")
    if "text_config" in hf:  # multimodal wrappers keep the decoder config nested
      hf = {**hf["text_config"], "model_type": model_type}
    missing = [
      k
      for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
      if k not in hf
    ]
    if missing:
      raise ValueError(f"config.json lacks required keys: {', '.join(missing)}")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_theta = hf.get("rope_theta", rope.get("rope_theta", 10_000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
      raise ValueError(f"rope type {rope_type!r} is not supported (only default RoPE)")
    num_heads = hf["num_attention_heads"]
    eos = hf.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    qwen3 = model_type == "qwen3"
    return cls(
      vocab_size=hf["vocab_size"],
      hidden_size=hf["hidden_size"],
      intermediate_size=hf["intermediate_size"],
      num_layers=hf["num_hidden_layers"],
      num_heads=num_heads,
      num_kv_heads=hf.get("num_key_value_heads") or num_heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
      rope_theta=float(rope_theta),
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", qwen3)),
      qkv_bias=bool(hf.get("attention_bias", False)) if qwen3 else True,
      qk_norm=qwen3,
      max_position_embeddings=int(hf.get("max_position_embeddings", 32_768)),
      model_type=model_type,
      bos_token_id=hf.get("bos_token_id"),
      eos_token_ids=eos_ids,
      pad_token_id=hf.get("pad_token_id"),
    )

  def to_hf_dict(self, torch_dtype: str = "float32") -> dict[str, Any]:
    """The `config.json` transformers expects for this architecture."""
    arch = "Qwen3ForCausalLM" if self.model_type == "qwen3" else "Qwen2ForCausalLM"
    out = {
      "architectures": [arch],
      "model_type": self.model_type,
      "vocab_size": self.vocab_size,
      "hidden_size": self.hidden_size,
      "intermediate_size": self.intermediate_size,
      "num_hidden_layers": self.num_layers,
      "num_attention_heads": self.num_heads,
      "num_key_value_heads": self.num_kv_heads,
      "head_dim": self.head_dim,
      "hidden_act": "silu",
      "rms_norm_eps": self.rms_norm_eps,
      "rope_theta": self.rope_theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
      "tie_word_embeddings": self.tie_word_embeddings,
      "max_position_embeddings": self.max_position_embeddings,
      "attention_dropout": 0.0,
      "use_cache": True,
      "torch_dtype": torch_dtype,
      "dtype": torch_dtype,
      "bos_token_id": self.bos_token_id,
      "eos_token_id": list(self.eos_token_ids)
      if len(self.eos_token_ids) > 1
      else (self.eos_token_ids[0] if self.eos_token_ids else None),
      "pad_token_id": self.pad_token_id,
    }
    if self.model_type == "qwen3":
      out["attention_bias"] = self.qkv_bias
    return out

  @property
  def num_params(self) -> int:
    d, f, n, k, h, v = (
      self.hidden_size,
      self.intermediate_size,
      self.num_heads,
      self.num_kv_heads,
      self.head_dim,
      self.vocab_size,
    )
    attn = d * n * h * 2 + d * k * h * 2 + (n * h + 2 * k * h if self.qkv_bias else 0)
    per_layer = attn + 3 * d * f + 2 * d + (2 * h if self.qk_norm else 0)
    return v * d * (1 if self.tie_word_embeddings else 2) + self.num_layers * per_layer + d


def preset_names() -> list[str]:
  return sorted(
    name
    for name, member in vars(ModelConfig).items()
    if isinstance(member, classmethod) and name not in ("preset", "from_hf", "from_hf_dict")
  )
