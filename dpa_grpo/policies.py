"""One backbone, one LoRA adapter per role: how parameter trees become each role's model."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from dpa_grpo import config as config_lib
from lm import lora
from lm.model import Qwen


@dataclasses.dataclass(frozen=True)
class Policies:
  """How (trainable, frozen) parameter trees become each role's model and the reference.

  LoRA: trainable = {role: that role's adapter state}, frozen = the backbone.
  Full fine-tuning: trainable = {"backbone": ...} shared by both roles, frozen = a copy of the
  initial backbone (the train step donates the trainable buffers, so the two never share one).
  `lora_dropout` is the adapters' dropout rate: a policy built with a `dropout_key` (the train
  step's loss, nothing else) drops out its adapter's input (`lm.lora.with_dropout`); without one
  — sampling, evaluation, export — the adapter runs deterministically.
  Hashable (graph definitions and a float), so it is a static argument of the jitted functions.
  """

  base: nnx.GraphDef
  adapted: nnx.GraphDef | None
  lora_dropout: float = 0.0

  def policy(self, trainable, frozen, role: str, dropout_key: jax.Array | None = None) -> Qwen:
    if self.adapted is None:
      return nnx.merge(self.base, trainable["backbone"])
    model = nnx.merge(self.adapted, frozen, trainable[role])
    return lora.with_dropout(model, self.lora_dropout, dropout_key)

  def reference(self, frozen) -> Qwen:
    return nnx.merge(self.base, frozen)


def init_policies(
  model: Qwen, cfg: config_lib.LoRAConfig, roles: Sequence[str], mesh, *, seed: int
) -> tuple[Policies, dict, Any]:
  """(policies, trainable, frozen) for the backbone `model`; adapters initialised from `seed`."""
  base, backbone = nnx.split(model)
  if not cfg.enabled:
    return Policies(base, None), {"backbone": backbone}, jax.tree.map(jnp.copy, backbone)
  lora_cfg = lora.LoRAConfig(rank=cfg.rank, alpha=cfg.alpha, targets=tuple(cfg.targets))
  adapters = lora.init_adapters(model, lora_cfg, tuple(roles), seed=seed, dtype=jnp.dtype(cfg.dtype))
  replicated = NamedSharding(mesh, P())
  trainable = {}
  adapted = None
  for role, adapter in adapters.items():
    adapted, _, state = nnx.split(lora.with_adapter(model, adapter), nnx.Param, lora.LoRAParam)
    trainable[role] = jax.device_put(state, replicated)
  return Policies(base, adapted, lora_dropout=cfg.dropout), trainable, backbone
