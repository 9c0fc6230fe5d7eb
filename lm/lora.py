"""LoRA adapters by role on one backbone; the reference policy is the backbone with adapters off.

An `Adapter` holds, for each targeted projection W of the stacked layers (q, k, v, o, gate, up,
down), two factors A [L, in axes..., R] and B [L, R, out axes...] that split W's own named axes:
the layer computes x·W + (α/R)·(x·A)·B (`lm.model.project`). B starts at zero, so a fresh adapter
leaves the model unchanged, and A starts like PEFT's (uniform ±1/√fan_in).

Roles share one backbone: `with_adapter(model, adapter)` is a *view* of the model (the same
parameter variables, no copy) that runs with that adapter, and `with_adapter(model, None)` is the
reference policy. Adapter factors are `LoRAParam` variables, not `nnx.Param`, so
`nnx.state(model, nnx.Param)`, `lm.sharding` and `lm.save_hf` see the backbone only and
`nnx.state(view, LoRAParam)` is exactly the trainable state. `merge` folds an adapter into the
weights for export through `lm.save_hf`.

`save_peft` / `load_peft` write and read one adapter as a Hugging Face PEFT directory
(`adapter_config.json` + `adapter_model.safetensors`, keys
`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` [R, in] and `...lora_B.weight`
[out, R], scaling lora_alpha / r): the format vLLM's `/v1/load_lora_adapter` and `lm.server` load.

Dropout (PEFT's `lora_dropout`) acts on the adapter's input only: x·W + (α/R)·(dropout(x)·A)·B.
`with_dropout(view, rate, key)` is a view for one training loss computation, with an explicit key;
every other view (sampling, evaluation, the reference) has none and runs the adapter
deterministically, exactly as without the option.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lm import hf, sharding
from lm.config import ModelConfig
from lm.model import Qwen, axis_sizes

# Projection -> (its stacked weight, the weight's input axes, its output axes).
PROJECTIONS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
  "q": ("q_dnh", ("D",), ("N", "H")),
  "k": ("k_dkh", ("D",), ("K", "H")),
  "v": ("v_dkh", ("D",), ("K", "H")),
  "o": ("o_nhd", ("N", "H"), ("D",)),
  "gate": ("gate_df", ("D",), ("F",)),
  "up": ("up_df", ("D",), ("F",)),
  "down": ("down_fd", ("F",), ("D",)),
}


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  """Rank R, scale α (the update is (α/R)·A·B) and the targeted projections."""

  rank: int = 16
  alpha: float = 32.0
  targets: tuple[str, ...] = tuple(PROJECTIONS)

  def __post_init__(self):
    unknown = [t for t in self.targets if t not in PROJECTIONS]
    if unknown:
      raise ValueError(f"unknown LoRA targets {unknown}; choose from {tuple(PROJECTIONS)}")
    if self.rank < 1:
      raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")


class LoRAParam(nnx.Variable):
  """A trainable adapter factor, kept apart from the backbone's `nnx.Param`s."""


class Adapter(nnx.Module):
  """One role's low-rank factors for every targeted projection of every layer."""

  def __init__(self, config: ModelConfig, lora: LoRAConfig, *, rngs: nnx.Rngs, dtype: Any = jnp.float32):
    sizes = axis_sizes(config)
    layers = config.num_layers
    for target in lora.targets:
      name, in_axes, out_axes = PROJECTIONS[target]
      fan_in = math.prod(sizes[a] for a in in_axes)
      bound = 1.0 / math.sqrt(fan_in)
      a_shape = (layers, *(sizes[a] for a in in_axes), lora.rank)
      b_shape = (layers, lora.rank, *(sizes[a] for a in out_axes))
      a = jax.random.uniform(rngs.params(), a_shape, jnp.float32, -bound, bound).astype(dtype)
      setattr(self, f"{name}_lora_a", LoRAParam(a))
      setattr(self, f"{name}_lora_b", LoRAParam(jnp.zeros(b_shape, dtype)))
    self.scale = lora.alpha / lora.rank

  def weights(self) -> dict[str, jax.Array]:
    """Stacked `<weight>_lora_a` / `<weight>_lora_b` entries for `lm.model.project`, B scaled by α/R."""
    out = {}
    for name, var in vars(self).items():
      if isinstance(var, LoRAParam):
        out[name] = var[...] * self.scale if name.endswith("_lora_b") else var[...]
    return out


def with_adapter(model: Qwen, adapter: Adapter | None) -> Qwen:
  """A view of `model` that runs with `adapter` (None: the backbone alone, the reference policy).

  The view shares every backbone variable with `model`: an update to either is seen by both.
  """
  view = copy.copy(model)
  view.lora = adapter
  return view


class DropoutAdapter:
  """An `Adapter` seen through inverted dropout on its input, for one loss computation.

  `weights()` adds, per targeted projection, a keep probability [L] and one PRNG key per layer
  (`<weight>_lora_key` [L, 2], raw key data) that `lm.model.project` reads; the projections' keys
  are folded from `key` by their order in `PROJECTIONS`, so q, k and v draw independent masks
  although they share an input, as PEFT's per-module dropout does. Not an nnx module: it exists
  only inside the traced loss function that made it.
  """

  def __init__(self, adapter: Adapter, rate: float, key: jax.Array):
    if not 0.0 < rate < 1.0:
      raise ValueError(f"LoRA dropout rate must be in (0, 1), got {rate}")
    self.adapter, self.rate, self.key = adapter, float(rate), key

  def weights(self) -> dict[str, jax.Array]:
    out = self.adapter.weights()
    for index, (name, _, _) in enumerate(PROJECTIONS.values()):
      if f"{name}_lora_a" not in out:
        continue
      layers = out[f"{name}_lora_a"].shape[0]
      keys = jax.random.split(jax.random.fold_in(self.key, index), layers)
      out[f"{name}_lora_key"] = jax.random.key_data(keys)  # [L, 2]
      out[f"{name}_lora_keep"] = jnp.full((layers,), 1.0 - self.rate, jnp.float32)
    return out


def with_dropout(model: Qwen, rate: float, key: jax.Array | None) -> Qwen:
  """A view of `model` whose adapter's input is dropped out at `rate` with `key` (a typed PRNG
  key); `model` itself when it has no adapter, `rate` is 0 or `key` is None, so the no-dropout
  path is today's program, bit for bit. Build it inside the traced function that uses it."""
  if model.lora is None or rate == 0.0 or key is None:
    return model
  view = copy.copy(model)
  view.lora = DropoutAdapter(model.lora, rate, key)
  return view


def init_adapters(
  model: Qwen, lora: LoRAConfig, roles: tuple[str, ...], *, seed: int, dtype: Any = jnp.float32
) -> dict[str, Adapter]:
  """A fresh adapter per role (B = 0: every role starts as the backbone)."""
  return {
    role: Adapter(model.config, lora, rngs=nnx.Rngs(seed + i), dtype=dtype) for i, role in enumerate(roles)
  }


def merge(model: Qwen) -> Qwen:
  """A plain `Qwen` (no adapter) whose weights include the attached adapter's update W + (α/R)·A·B."""
  merged = with_adapter(model, None)
  if model.lora is None:
    return merged
  merged.layers = copy.copy(model.layers)
  factors = model.lora.weights()
  stacked = model.layers.weights()
  for name, in_axes, out_axes in PROJECTIONS.values():
    if f"{name}_lora_a" not in factors:
      continue
    ins = "".join(a.lower() for a in in_axes)
    outs = "".join(a.lower() for a in out_axes)
    delta = jnp.einsum(
      f"l{ins}r,lr{outs}->l{ins}{outs}",
      factors[f"{name}_lora_a"].astype(jnp.float32),
      factors[f"{name}_lora_b"].astype(jnp.float32),
    )
    weight = stacked[name]
    setattr(merged.layers, name, nnx.Param((weight.astype(jnp.float32) + delta).astype(weight.dtype)))
  return merged


def export_hf(model: Qwen, path: str | os.PathLike, *, dtype: str | None = None) -> None:
  """Writes the model with its adapter merged as a Hugging Face checkpoint (`lm.save_hf`)."""
  hf.save_hf(merge(model), path, dtype=dtype)


# ---- PEFT format ---------------------------------------------------------------------------------

# Our projection -> the HF module it adapts (PEFT's `target_modules` names it by the last part).
PEFT_MODULES: dict[str, str] = {
  "q": "self_attn.q_proj",
  "k": "self_attn.k_proj",
  "v": "self_attn.v_proj",
  "o": "self_attn.o_proj",
  "gate": "mlp.gate_proj",
  "up": "mlp.up_proj",
  "down": "mlp.down_proj",
}
_PEFT_KEY = "base_model.model.model.layers.{i}.{module}.lora_{factor}.weight"
PEFT_CONFIG_FILE = "adapter_config.json"
PEFT_WEIGHTS_FILE = "adapter_model.safetensors"


def _target_name(name: str) -> str:
  """Our target name for "q" or PEFT's "q_proj" (either spelling is accepted)."""
  short = name[: -len("_proj")] if name.endswith("_proj") else name
  if short not in PEFT_MODULES:
    raise ValueError(f"unknown LoRA target module {name!r}; choose from {tuple(PEFT_MODULES)} (or *_proj)")
  return short


def _factors_of(lora_params: Any) -> dict[str, np.ndarray]:
  """{"<weight>_lora_a" / "_lora_b": unscaled host array} from an `Adapter`, an `nnx.State` of
  `LoRAParam`s (a view's trainable state, as DPA-GRPO's trainer holds it) or such a flat mapping."""
  if isinstance(lora_params, Adapter):
    items = [(name, var[...]) for name, var in vars(lora_params).items() if isinstance(var, LoRAParam)]
  elif isinstance(lora_params, nnx.State):
    items = [(str(path[-1]), value) for path, value in nnx.to_flat_state(lora_params)]
    items = [(name, value[...] if isinstance(value, nnx.Variable) else value) for name, value in items]
  elif isinstance(lora_params, Mapping):
    items = list(lora_params.items())
  else:
    raise TypeError(f"lora_params must be an Adapter, an nnx.State or a mapping, got {type(lora_params)}")
  out = {}
  for name, value in items:
    if name.endswith(("_lora_a", "_lora_b")):
      out[name] = np.asarray(sharding.to_host(value), np.float32)
  if not out:
    raise ValueError("lora_params holds no '<weight>_lora_a' / '_lora_b' factors")
  return out


def save_peft(
  lora_params: Any,
  directory: str | os.PathLike,
  *,
  rank: int,
  alpha: float,
  target_modules: Sequence[str],
  base_model_name: str,
) -> None:
  """Writes one adapter as a PEFT LoRA directory that vLLM and `lm.server` load by name.

  Args:
    lora_params: an `Adapter`, the `nnx.State` of a view's `LoRAParam`s, or a mapping
      `{"q_dnh_lora_a": [L, D, R], "q_dnh_lora_b": [L, R, N, H], ...}` of unscaled factors.
    directory: created if missing; `adapter_config.json` and `adapter_model.safetensors` are
      (re)written, the weights file first under a temporary name and renamed, so a reader never
      sees half a file.
    rank, alpha: R and α (the update is (α/R)·A·B, PEFT's `r` and `lora_alpha`).
    target_modules: the adapted projections, ours ("q", "gate") or PEFT's ("q_proj", "gate_proj").
    base_model_name: `base_model_name_or_path` (e.g. "Qwen/Qwen3-4B").

  On several hosts every process calls it (gathering the factors is a collective); process 0 writes.
  """
  from safetensors.numpy import save_file

  from lm import rundir

  targets = [_target_name(t) for t in target_modules]
  factors = _factors_of(lora_params)  # a collective on several hosts: every process calls save_peft
  if not rundir.is_writer():  # process 0 writes (the checks below ran there)
    return
  tensors = {}
  for target in targets:
    weight = PROJECTIONS[target][0]
    a, b = factors.get(f"{weight}_lora_a"), factors.get(f"{weight}_lora_b")
    if a is None or b is None:
      raise ValueError(f"save_peft: target {target!r} has no factors {weight}_lora_a / {weight}_lora_b")
    if a.shape[-1] != rank or b.shape[1] != rank:
      raise ValueError(f"save_peft: rank={rank} but {weight}'s factors have shapes {a.shape}, {b.shape}")
    for i in range(a.shape[0]):
      key = functools.partial(_PEFT_KEY.format, i=i, module=PEFT_MODULES[target])
      tensors[key(factor="A")] = np.ascontiguousarray(a[i].reshape(-1, rank).T)  # [R, in]
      tensors[key(factor="B")] = np.ascontiguousarray(b[i].reshape(rank, -1).T)  # [out, R]
  config = {
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "base_model_name_or_path": base_model_name,
    "r": int(rank),
    "lora_alpha": float(alpha),
    "target_modules": [PEFT_MODULES[t].split(".")[-1] for t in targets],
    "lora_dropout": 0.0,
    "bias": "none",
    "fan_in_fan_out": False,
    "use_rslora": False,
    "use_dora": False,
    "modules_to_save": None,
    "inference_mode": True,
  }
  os.makedirs(directory, exist_ok=True)
  weights = os.path.join(directory, PEFT_WEIGHTS_FILE)
  save_file(tensors, weights + ".tmp", metadata={"format": "pt"})
  os.replace(weights + ".tmp", weights)
  with open(os.path.join(directory, PEFT_CONFIG_FILE), "w") as f:
    json.dump(config, f, indent=2)


def load_peft(directory: str | os.PathLike, config: ModelConfig, *, dtype: Any = jnp.float32) -> Adapter:
  """The `Adapter` a PEFT LoRA directory holds, for a model of `config` (the inverse of `save_peft`).

  Refuses (ValueError naming the file and field or key) what it cannot represent: another
  `peft_type`, rsLoRA / DoRA, biases, modules other than the seven projections, a missing layer's
  factor or a shape that does not fit `config`.
  """
  from safetensors.flax import load_file  # bfloat16 files too (numpy has no bfloat16)

  config_path = os.path.join(directory, PEFT_CONFIG_FILE)
  weights_path = os.path.join(directory, PEFT_WEIGHTS_FILE)
  for path in (config_path, weights_path):
    if not os.path.isfile(path):
      raise ValueError(
        f"load_peft: {path} does not exist (a PEFT directory holds {PEFT_CONFIG_FILE} and "
        f"{PEFT_WEIGHTS_FILE})"
      )
  with open(config_path) as f:
    peft = json.load(f)

  def refuse(field: str, why: str):
    raise ValueError(f"load_peft: {config_path}: '{field}' = {peft.get(field)!r}: {why}")

  if peft.get("peft_type", "LORA") != "LORA":
    refuse("peft_type", "only LORA is supported")
  for field in ("use_rslora", "use_dora"):
    if peft.get(field):
      refuse(field, "not supported")
  if peft.get("bias", "none") != "none":
    refuse("bias", "only 'none' is supported")
  if peft.get("modules_to_save"):
    refuse("modules_to_save", "not supported")
  if not isinstance(peft.get("r"), int) or peft["r"] < 1:
    refuse("r", "must be an integer >= 1")
  modules = peft.get("target_modules")
  if isinstance(modules, str) or not isinstance(modules, list) or not modules:
    refuse("target_modules", "must be a non-empty list of module names")
  try:
    targets = tuple(_target_name(m) for m in modules)
  except ValueError as e:
    refuse("target_modules", str(e))
  rank, alpha = peft["r"], float(peft.get("lora_alpha", peft["r"]))
  lora_config = LoRAConfig(rank=rank, alpha=alpha, targets=targets)
  tensors = load_file(weights_path)
  # PEFT names a saved adapter's factors with or without the adapter name ("default") before .weight.
  tensors = {k.replace(".default.weight", ".weight"): np.asarray(v, np.float32) for k, v in tensors.items()}
  adapter = Adapter(config, lora_config, rngs=nnx.Rngs(0), dtype=dtype)
  sizes = axis_sizes(config)
  used = set()
  for target in targets:
    weight, in_axes, out_axes = PROJECTIONS[target]
    a_shape = (*(sizes[x] for x in in_axes), rank)
    b_shape = (rank, *(sizes[x] for x in out_axes))
    a_layers, b_layers = [], []
    for i in range(config.num_layers):
      key = functools.partial(_PEFT_KEY.format, i=i, module=PEFT_MODULES[target])
      for factor, shape, layers in (("A", a_shape, a_layers), ("B", b_shape, b_layers)):
        name = key(factor=factor)
        if name not in tensors:
          raise ValueError(f"load_peft: {weights_path} has no tensor {name!r}")
        t = tensors[name]
        want = (rank, math.prod(shape[:-1])) if factor == "A" else (math.prod(shape[1:]), rank)
        if t.shape != want:
          raise ValueError(f"load_peft: {weights_path}: {name!r} has shape {t.shape}, expected {want}")
        layers.append(t.T.reshape(shape))
        used.add(name)
    getattr(adapter, f"{weight}_lora_a")[...] = jnp.asarray(np.stack(a_layers), dtype)
    getattr(adapter, f"{weight}_lora_b")[...] = jnp.asarray(np.stack(b_layers), dtype)
  unused = sorted(set(tensors) - used)
  if unused:
    raise ValueError(f"load_peft: {weights_path} has tensors this model does not use, e.g. {unused[0]!r}")
  return adapter
