"""Hugging Face checkpoints in and out: safetensors (single or sharded), fp32 / bf16 / fp16.

One table, `_WEIGHT_MAP`, maps every HF tensor name onto a model parameter together with the
layout change between them (torch Linear stores [out, in]; our weights name their axes), and both
`load_hf` and `save_hf` read it, so the two directions cannot disagree.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from safetensors import safe_open
from safetensors.numpy import save_file

from lm import rundir
from lm import sharding as sharding_lib
from lm.config import ModelConfig
from lm.model import Qwen, axis_sizes, param_axes

_DTYPES = {
  "float32": np.float32,
  "bfloat16": ml_dtypes.bfloat16,
  "float16": np.float16,
}


@dataclasses.dataclass(frozen=True)
class _Mapping:
  """HF tensor `hf_name` (with `{i}` for the layer) <-> our parameter `path`.

  `to_ours(t, sizes)` turns the HF tensor into our layout; `to_hf(w, sizes)` inverts it.
  """

  hf_name: str
  path: str
  to_ours: Callable[[np.ndarray, dict[str, int]], np.ndarray]
  to_hf: Callable[[np.ndarray, dict[str, int]], np.ndarray]

  @property
  def per_layer(self) -> bool:
    return "{i}" in self.hf_name


def _same(t, s):
  return t


def _linear_in_out(t, s):
  return t.T  # torch [out, in] -> ours [in, out]


def _proj_in_heads(heads: str):
  """q/k/v projections: torch [heads * H, D] <-> ours [D, heads, H]."""

  def to_ours(t, s):
    return t.T.reshape(s["D"], s[heads], s["H"])

  def to_hf(w, s):
    return w.reshape(s["D"], s[heads] * s["H"]).T

  return to_ours, to_hf


def _bias_heads(heads: str):
  return (lambda t, s: t.reshape(s[heads], s["H"]), lambda w, s: w.reshape(-1))


_Q = _proj_in_heads("N")
_KV = _proj_in_heads("K")
_PREFIX = "model.layers.{i}."

_WEIGHT_MAP: tuple[_Mapping, ...] = (
  _Mapping("model.embed_tokens.weight", "embed_vd", _same, _same),
  _Mapping("model.norm.weight", "final_norm_d", _same, _same),
  _Mapping("lm_head.weight", "lm_head_vd", _same, _same),
  _Mapping(_PREFIX + "input_layernorm.weight", "layers.input_norm_d", _same, _same),
  _Mapping(_PREFIX + "post_attention_layernorm.weight", "layers.post_norm_d", _same, _same),
  _Mapping(_PREFIX + "self_attn.q_proj.weight", "layers.q_dnh", *_Q),
  _Mapping(_PREFIX + "self_attn.k_proj.weight", "layers.k_dkh", *_KV),
  _Mapping(_PREFIX + "self_attn.v_proj.weight", "layers.v_dkh", *_KV),
  _Mapping(_PREFIX + "self_attn.q_proj.bias", "layers.q_bias_nh", *_bias_heads("N")),
  _Mapping(_PREFIX + "self_attn.k_proj.bias", "layers.k_bias_kh", *_bias_heads("K")),
  _Mapping(_PREFIX + "self_attn.v_proj.bias", "layers.v_bias_kh", *_bias_heads("K")),
  _Mapping(
    _PREFIX + "self_attn.o_proj.weight",
    "layers.o_nhd",
    lambda t, s: t.T.reshape(s["N"], s["H"], s["D"]),
    lambda w, s: w.reshape(s["N"] * s["H"], s["D"]).T,
  ),
  _Mapping(_PREFIX + "self_attn.q_norm.weight", "layers.q_norm_h", _same, _same),
  _Mapping(_PREFIX + "self_attn.k_norm.weight", "layers.k_norm_h", _same, _same),
  _Mapping(_PREFIX + "mlp.gate_proj.weight", "layers.gate_df", _linear_in_out, _linear_in_out),
  _Mapping(_PREFIX + "mlp.up_proj.weight", "layers.up_df", _linear_in_out, _linear_in_out),
  _Mapping(_PREFIX + "mlp.down_proj.weight", "layers.down_fd", _linear_in_out, _linear_in_out),
)


def _mappings(config: ModelConfig) -> list[_Mapping]:
  """The table rows this architecture uses."""
  paths = set(param_axes(config))
  if config.tie_word_embeddings:
    paths.discard("lm_head_vd")
  return [m for m in _WEIGHT_MAP if m.path in paths]


def _hf_names(m: _Mapping, config: ModelConfig) -> list[str]:
  return [m.hf_name.format(i=i) for i in range(config.num_layers)] if m.per_layer else [m.hf_name]


class _SafetensorsReader:
  """Reads tensors by name from a single-file or index-sharded safetensors checkpoint."""

  def __init__(self, path: str):
    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(index):
      weight_map = rundir.read_json(index)["weight_map"]
      self._file_of = {name: os.path.join(path, f) for name, f in weight_map.items()}
    elif os.path.exists(single):
      with _safe_open(single) as f:
        self._file_of = dict.fromkeys(f.keys(), single)
    else:
      raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")
    self._handles: dict[str, Any] = {}

  def names(self) -> set[str]:
    return set(self._file_of)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._open(name).get_slice(name).get_shape())

  def read(self, name: str) -> np.ndarray:
    try:
      return self._open(name).get_tensor(name)
    except (OSError, ValueError):
      raise
    except Exception as e:  # safetensors' own error type for a short or garbled file
      raise ValueError(f"cannot read tensor {name} from {self._file_of[name]}: {e}") from e

  def _open(self, name: str):
    file = self._file_of[name]
    if file not in self._handles:
      if not os.path.exists(file):
        raise FileNotFoundError(f"checkpoint shard {file} (holding {name}) is missing")
      self._handles[file] = _safe_open(file)
    return self._handles[file]


def _safe_open(file: str):
  """`safe_open`, with an error that names the file when it is truncated or not safetensors."""
  try:
    return safe_open(file, "np")
  except Exception as e:  # SafetensorError (header too short, bad JSON, sizes past the end)
    size = os.path.getsize(file) if os.path.exists(file) else None
    raise ValueError(f"{file} is not a readable safetensors file ({size} bytes; truncated?): {e}") from e


def load_hf(
  path: str | os.PathLike,
  *,
  dtype: str = "bfloat16",
  compute_dtype: str | None = None,
  mesh: jax.sharding.Mesh | None = None,
  sharding: sharding_lib.ShardingConfig | None = None,
  attention_impl: str = "blockwise",
) -> Qwen:
  """Loads a Qwen2/Qwen3 HF checkpoint directory into a `Qwen` model.

  Args:
    path: directory with `config.json` and `model.safetensors` (or a sharded index).
    dtype: parameter dtype ("float32", "bfloat16", "float16"); the checkpoint is converted.
    compute_dtype: matmul dtype; defaults to `dtype`.
    mesh: if given, each parameter is created directly on its sharding: every device's shard is
      filled from one layer's tensor at a time, so the host never holds the whole model.
    sharding: partitioning rules (default `ShardingConfig()`).
    attention_impl: `ModelConfig.attention_impl` (how long sequences attend; not of the checkpoint).

  Raises:
    ValueError: a tensor is missing, unexpected or has the wrong shape (named in the message).
  """
  path = os.fspath(path)
  if dtype not in _DTYPES:
    raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
  config = dataclasses.replace(ModelConfig.from_hf(path), attention_impl=attention_impl)
  reader = _SafetensorsReader(path)
  mappings = _mappings(config)
  _check_names(reader, mappings, config)
  sizes = axis_sizes(config)
  axes = param_axes(config)
  np_dtype = _DTYPES[dtype]
  model = nnx.eval_shape(
    lambda: Qwen(config, rngs=nnx.Rngs(0), param_dtype=np_dtype, dtype=compute_dtype or np_dtype)
  )
  sharding = sharding or sharding_lib.ShardingConfig()
  for m in mappings:
    expected = tuple(_get_path(model, m.path).shape)
    target = None
    if mesh is not None:
      target = sharding_lib.named(mesh, sharding.weight_spec(axes[m.path]), expected)
    value = _load_param(reader, m, config, sizes, expected, np_dtype, target)
    _set_path(model, m.path, value)
  if mesh is not None:
    model.activation_sharding = _activation_sharding(mesh, sharding)
  return model


def _activation_sharding(mesh, sharding):
  from lm.model import ActivationSharding

  return ActivationSharding(jax.sharding.NamedSharding(mesh, sharding.act_btd))


def _set_path(model: Qwen, path: str, value: jax.Array) -> None:
  *parents, leaf = path.split(".")
  owner = model
  for p in parents:
    owner = getattr(owner, p)
  setattr(owner, leaf, nnx.Param(value))


def _check_names(reader: _SafetensorsReader, mappings: list[_Mapping], config: ModelConfig) -> None:
  expected = {name for m in mappings for name in _hf_names(m, config)}
  found = reader.names()
  # Tied checkpoints may still carry lm_head.weight (a copy of the embedding): ignore it.
  ignorable = {"lm_head.weight"} if config.tie_word_embeddings else set()
  ignorable |= {n for n in found if n.endswith("rotary_emb.inv_freq")}
  missing = sorted(expected - found)
  unexpected = sorted(found - expected - ignorable)
  if missing:
    raise ValueError(
      f"checkpoint is missing tensors: {', '.join(missing[:10])}"
      + (f" (and {len(missing) - 10} more)" if len(missing) > 10 else "")
    )
  if unexpected:
    raise ValueError(
      f"checkpoint has unexpected tensors: {', '.join(unexpected[:10])}"
      + (f" (and {len(unexpected) - 10} more)" if len(unexpected) > 10 else "")
    )


def _load_param(
  reader: _SafetensorsReader,
  m: _Mapping,
  config: ModelConfig,
  sizes: dict[str, int],
  expected: tuple[int, ...],
  np_dtype: Any,
  target: jax.sharding.NamedSharding | None,
) -> jax.Array:
  """Reads one parameter (all layers of it for stacked weights) in our layout and dtype."""
  names = _hf_names(m, config)
  per_tensor = expected[1:] if m.per_layer else expected

  def read(name: str) -> np.ndarray:
    hf_shape = reader.shape(name)
    want = m.to_hf(np.empty(per_tensor, np.int8), sizes).shape
    if hf_shape != want:
      raise ValueError(f"tensor {name}: expected shape {want}, found {hf_shape}")
    return np.asarray(m.to_ours(reader.read(name), sizes)).astype(np_dtype)

  if target is None:
    if not m.per_layer:
      return jnp.asarray(read(names[0]))
    return jnp.asarray(np.stack([read(n) for n in names]))
  if not m.per_layer:
    tensor = read(names[0])
    return jax.make_array_from_callback(expected, target, lambda idx: tensor[idx])
  # Stacked weight on a mesh: read each layer's tensor once, then fill only the addressable
  # shards that hold it; the host keeps one layer tensor at a time.
  shards: dict[Any, list[np.ndarray]] = {}
  devices_index = target.addressable_devices_indices_map(expected)
  for layer, name in enumerate(names):
    tensor = read(name)
    for device, idx in devices_index.items():
      layers = range(*idx[0].indices(len(names)))
      if layer in layers:
        shards.setdefault(device, []).append(tensor[idx[1:]])
  arrays = [jax.device_put(np.stack(shards[d]), d) for d in devices_index]
  return jax.make_array_from_single_device_arrays(expected, target, arrays)


def save_hf(
  model: Qwen,
  path: str | os.PathLike,
  *,
  dtype: str | None = None,
  max_shard_bytes: int = 4 * 1024**3,
) -> None:
  """Writes `config.json` and safetensors that `transformers` loads with identical logits.

  Args:
    model: the model to export (LoRA adapters must be merged first).
    path: output directory (created).
    dtype: tensor dtype on disk; defaults to the parameters' dtype.
    max_shard_bytes: larger checkpoints are split into `model-0000k-of-0000n.safetensors` files
      with a `model.safetensors.index.json`, as transformers writes them.

  On several hosts every process calls it (each weight is gathered from all of them); process 0
  writes the files, and every process returns once they are written.
  """
  path = os.fspath(path)
  os.makedirs(path, exist_ok=True)
  config = model.config
  sizes = axis_sizes(config)
  tensors: dict[str, np.ndarray] = {}
  for m in _mappings(config):
    value = _get_path(model, m.path)
    np_dtype = _DTYPES[dtype] if dtype else value.dtype
    host = np.asarray(sharding_lib.to_host(value))
    layers = [host[i] for i in range(config.num_layers)] if m.per_layer else [host]
    for name, layer_value in zip(_hf_names(m, config), layers, strict=True):
      tensors[name] = np.ascontiguousarray(m.to_hf(layer_value, sizes)).astype(np_dtype)
  if rundir.is_writer():
    _write_files(config, tensors, path, max_shard_bytes)
  if jax.process_count() > 1:  # the others read these files only once they are complete
    multihost_utils.sync_global_devices(f"save_hf {path}")


def _write_files(
  config: ModelConfig, tensors: dict[str, np.ndarray], path: str, max_shard_bytes: int
) -> None:
  dtype_name = {np.dtype(v): k for k, v in _DTYPES.items()}[np.dtype(next(iter(tensors.values())).dtype)]
  _write_shards(tensors, path, max_shard_bytes)
  rundir.write_json(os.path.join(path, "config.json"), config.to_hf_dict(dtype_name))
  gen = {
    "bos_token_id": config.bos_token_id,
    "eos_token_id": list(config.eos_token_ids),
    "pad_token_id": config.pad_token_id,
    "do_sample": False,
  }
  rundir.write_json(os.path.join(path, "generation_config.json"), gen)


def _get_path(model: Qwen, path: str) -> jax.Array:
  """The value of the parameter at a dotted path (a ShapeDtypeStruct on an abstract model)."""
  owner = model
  for p in path.split("."):
    owner = getattr(owner, p)
  return owner.get_value()


def _write_shards(tensors: dict[str, np.ndarray], path: str, max_shard_bytes: int) -> None:
  groups: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, t in tensors.items():
    if groups[-1] and size + t.nbytes > max_shard_bytes:
      groups.append({})
      size = 0
    groups[-1][name] = t
    size += t.nbytes
  for stale in os.listdir(path):
    if stale.startswith("model") and (stale.endswith(".safetensors") or stale.endswith(".index.json")):
      os.unlink(os.path.join(path, stale))
  if len(groups) == 1:
    _save_atomic(groups[0], os.path.join(path, "model.safetensors"))
    return
  weight_map = {}
  for k, group in enumerate(groups, start=1):
    file = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
    _save_atomic(group, os.path.join(path, file))
    weight_map.update(dict.fromkeys(group, file))
  total = sum(t.nbytes for t in tensors.values())
  rundir.write_json(
    os.path.join(path, "model.safetensors.index.json"),
    {"metadata": {"total_size": total}, "weight_map": weight_map},
  )


def _save_atomic(tensors: dict[str, np.ndarray], file: str) -> None:
  tmp = file + ".tmp"
  save_file(tensors, tmp, metadata={"format": "pt"})
  os.replace(tmp, file)
