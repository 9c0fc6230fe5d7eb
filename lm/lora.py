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

Dropout (PEFT's `lora_dropout`) acts on the adapter's input only: x·W + (α/R)·(dropout(x)·A)·B.
`with_dropout(view, rate, key)` is a view for one training loss computation, with an explicit key;
every other view (sampling, evaluation, the reference) has none and runs the adapter
deterministically, exactly as without the option.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from lm import hf
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
