"""The jitted train step: gradient accumulation on device, then one donated AdamW update.

A step's chunks (`dpa_grpo.packing`) go through `accumulate` one by one: each adds its gradient
into an on-device accumulator that the call donates (0 + g1 + g2 + ..., the order of the chunks),
and returns its loss metrics as device scalars. `apply` then updates every trainable parameter,
donating the parameters and the optimiser state it replaces. Nothing is fetched to the host until
the step's metrics are read once at its end (`fetch_metrics`).

Donated buffers are dead after the call: whatever holds views of the trainable arrays (the roles'
samplers) must be rebuilt from the returned ones.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from dpa_grpo import config as config_lib
from dpa_grpo import losses
from dpa_grpo.policies import Policies
from lm import sharding


def optimizer(optim: config_lib.OptimConfig, steps: int) -> optax.GradientTransformation:
  """AdamW with global-norm clipping (none when max_grad_norm <= 0) and a warmup + constant /
  cosine learning-rate schedule over `steps` optimiser updates."""
  o = optim
  if o.schedule == "cosine":
    lr = optax.warmup_cosine_decay_schedule(0.0, o.lr, max(o.warmup_steps, 1), max(steps, 2), o.end_lr)
  else:
    lr = optax.join_schedules(
      [optax.linear_schedule(0.0, o.lr, o.warmup_steps), optax.constant_schedule(o.lr)], [o.warmup_steps]
    )
  adamw = optax.adamw(lr, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)
  if o.max_grad_norm <= 0:
    return adamw
  return optax.chain(optax.clip_by_global_norm(o.max_grad_norm), adamw)


def loss_method(method: str, baseline: config_lib.BaselineConfig) -> str:
  """The registered loss a method trains with: DPA-GRPO's pair loss for the generator-only methods
  in the reference baseline mode, else the method's own."""
  return "dpa_grpo" if method in losses.BASELINES and baseline.mode == "reference" else method


def loss_configs(
  method: str,
  loss: config_lib.LossConfig,
  baseline: config_lib.BaselineConfig,
  *,
  max_new_tokens: int,
  verdict_tokens: int = 0,
) -> dict[str, Any]:
  """Each trained role's static loss settings: the DPA-GRPO loss of both roles, or the
  generator's baseline loss with `baseline.<method>`'s settings; none for zero_shot. In the
  reference baseline mode a generator-only method trains with the DPA-GRPO pair loss on its two
  drafts (k1, pair weighting, the method's β), as the reference code's baselines do. With
  `baseline.train_verifier` (testbed v3) the verifier gets the same baseline loss as the generator,
  its longest reply `verdict_tokens` (DAPO's overlong shaping; 0: `max_new_tokens`)."""
  if method in losses.BASELINES and baseline.mode == "reference":
    settings = baseline.method(method)
    return {
      "generator": losses.DPALossConfig(
        beta=settings.beta,
        kl="k1",
        weighting="pair",
        vocab_chunk=loss.vocab_chunk,
        remat=loss.remat,
        components=("draft",),
        component_weights=(1.0,),
      )
    }
  if method == "dpa_grpo":
    common = dict(
      beta=loss.beta, kl=loss.kl, weighting=loss.weighting, vocab_chunk=loss.vocab_chunk, remat=loss.remat
    )
    return {
      "verifier": losses.DPALossConfig(
        **common, components=("verdict",), component_weights=(loss.verifier_weight,)
      ),
      "generator": losses.DPALossConfig(
        **common,
        components=("decision", "proposal"),
        component_weights=(loss.decision_weight, loss.proposal_weight),
      ),
    }
  if method == "zero_shot":
    return {}
  settings = baseline.method(method)
  group_loss = lambda max_len: losses.BaselineConfig(
    method=method,
    beta=settings.beta,
    eps_low=settings.eps_low,
    eps_high=settings.eps_high,
    max_len=max_len,
    cache_len=baseline.overlong_cache,
    vocab_chunk=loss.vocab_chunk,
    remat=loss.remat,
  )
  configs = {"generator": group_loss(max_new_tokens)}
  if baseline.train_verifier:
    configs["verifier"] = group_loss(verdict_tokens or max_new_tokens)
  return configs


@functools.partial(
  jax.jit, static_argnames=("policies", "role", "method", "loss_cfg"), donate_argnames=("grads",)
)
def accumulate(
  grads, trainable, frozen, batch, dropout_key=None, *, policies: Policies, role: str, method: str, loss_cfg
):
  """(`grads` + the gradient of one role's loss on one chunk, that loss, its metrics).

  `grads` (a tree like `trainable`) is donated: the sum is written in its place. `dropout_key` (a
  PRNG key, or None) drives the policy's LoRA dropout (`Policies.lora_dropout`); the trainer
  derives one per step, case, role and chunk (`Trainer._dropout_key`), so a resumed run draws the
  same masks. The frozen reference never gets one.
  """

  def loss(params):
    model = policies.policy(params, frozen, role, dropout_key)
    ref = policies.reference(frozen)
    return losses.loss_fn(method)(model, ref, batch, loss_cfg)

  (value, metrics), chunk_grads = jax.value_and_grad(loss, has_aux=True)(trainable)
  return jax.tree.map(jnp.add, grads, chunk_grads), value, metrics


@functools.partial(jax.jit, static_argnames=("tx",), donate_argnames=("trainable", "opt_state", "grads"))
def apply(trainable, opt_state, grads, *, tx):
  """One optimiser update from the step's summed gradient: (trainable, opt_state, grad_norm).

  `trainable`, `opt_state` and `grads` are donated.
  """
  updates, opt_state = tx.update(grads, opt_state, trainable)
  return optax.apply_updates(trainable, updates), opt_state, optax.global_norm(grads)


def fetch_metrics(chunk_metrics: Sequence[tuple[str, jax.Array, dict[str, jax.Array]]]) -> dict[str, float]:
  """`role/loss` and `role/<metric>` summed over the step's chunks of (role, loss, metrics): one
  host transfer, then Python float sums in chunk order."""
  fetched = sharding.to_host(list(chunk_metrics))
  out: dict[str, float] = {}
  for role, loss, metrics in fetched:
    for key, value in {"loss": loss, **metrics}.items():
      out[f"{role}/{key}"] = out.get(f"{role}/{key}", 0.0) + float(value)
  return out
