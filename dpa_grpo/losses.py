"""Pure, jitted policy-gradient losses.

Every loss here is a function of arrays (log-probabilities under the policy and the frozen
reference, rewards) and static settings, and returns `(loss, metrics)`: no parameters, no model, no
I/O, no Python branches on traced values. The model-level train step scores sequences and calls
these; the theory (`dpa_grpo/theory.py`) calls the very same functions on the two-action game, so
the ODE it studies is the expected update that training performs.

Log-probabilities are *length-normalised* sequence log-probabilities (the mean over an action's
tokens): the DPA-GRPO reference code needed this because the longer SAC text otherwise drove the SAC
rate to 1. In the two-action game they are the exact log-probabilities of a logit policy.

## Paired-action loss (DPA-GRPO)

Each of U decision units has a group of the role's two counterfactual actions a ∈ {0, 1} (verifier:
NS, SAC; generator: KEEP, REVISE). Both actions are scored, whichever was sampled. With
ℓ_a = log π(a), ℓ^ref_a = log π_ref(a) and rewards r_a:

  Group-normalised advantages (population std over the group of two, explicit ε):
    A_a = (r_a − mean(r)) / (std(r) + ε),  so A = ±1·(1 − O(ε)) on a strict preference, 0 on a tie.

  The renormalised two-action distribution (exact policy in the game; a conditional in an LLM):
    p̂_a = exp(ℓ_a) / (exp(ℓ_0) + exp(ℓ_1)),   p̂^ref likewise from ℓ^ref.

  Per-action weights w_a:
    "pair"   (paper):  w_a = 1/2 — the mean over the pair's two per-action losses.
    "policy":          w_a = stop_gradient(p̂_a) — the expectation of the loss of one action sampled
                       from π, i.e. the on-policy ("expected-advantage") update.

  Per-unit loss:  L_u = Σ_a w_a·(−A_a·ℓ_a) + β·D_u, with the KL choice D_u:
    "k1"    (paper's reference code):  Σ_a w_a·(ℓ_a − ℓ^ref_a)
    "k3":                              Σ_a w_a·(exp(ℓ^ref_a − ℓ_a) − (ℓ^ref_a − ℓ_a) − 1)
    "exact":                           Σ_a p̂_a·(log p̂_a − log p̂^ref_a)   (= KL(p̂ ‖ p̂^ref), unweighted)

  Batch loss: Σ_u m_u·L_u / max(Σ_u m_u, 1), m the optional mask of units that have a pair (the
  generator's pair exists only after SAC).

With "pair" weights, k1 summed over both actions is not a KL: on the two-action simplex it equals
(β/2)·log(p(1−p)) + const, which pushes a policy *away* from uniform (see docs/theory.md).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from lm import scoring

KL_CHOICES = ("k1", "k3", "exact")
WEIGHTINGS = ("pair", "policy")
ADVANTAGE_EPS = 1e-6


def group_advantages(rewards: jax.Array, eps: float = ADVANTAGE_EPS) -> jax.Array:
  """(r − mean) / (std + ε) over the last axis (the group), population std as in GRPO."""
  mean = rewards.mean(axis=-1, keepdims=True)
  std = rewards.std(axis=-1, keepdims=True)
  return (rewards - mean) / (std + eps)


def k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """The k3 estimator of KL(π ‖ π_ref) per sample: e^{ref−logπ} − (ref−logπ) − 1 (≥ 0, unbiased)."""
  log_ratio = ref_logp - logp
  return jnp.exp(log_ratio) - log_ratio - 1.0


def _kl_terms(logp: jax.Array, ref_logp: jax.Array, weights: jax.Array, kl: str) -> jax.Array:
  """Per-unit divergence D_u of the module docstring.  # [U, 2] -> [U]"""
  if kl == "k1":
    return jnp.sum(weights * (logp - ref_logp), axis=-1)
  if kl == "k3":
    return jnp.sum(weights * k3(logp, ref_logp), axis=-1)
  log_p = jax.nn.log_softmax(logp, axis=-1)
  log_p_ref = jax.nn.log_softmax(ref_logp, axis=-1)
  return jnp.sum(jnp.exp(log_p) * (log_p - log_p_ref), axis=-1)


@functools.partial(jax.jit, static_argnames=("kl", "weighting"))
def paired_loss(
  logp: jax.Array,
  ref_logp: jax.Array,
  rewards: jax.Array,
  *,
  beta: float | jax.Array,
  kl: str,
  weighting: str = "pair",
  mask: jax.Array | None = None,
  eps: float = ADVANTAGE_EPS,
  unit_weights: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Loss of one role over U decision units, each with its two counterfactual actions.

  Args:
    logp: [U, 2] length-normalised log-probs of actions (0, 1) under the policy.
    ref_logp: [U, 2] the same under the frozen reference policy.
    rewards: [U, 2] the reward of each action of the pair.
    beta: KL coefficient.
    kl: "k1", "k3" or "exact" (see the module docstring).
    weighting: "pair" (the paper's mean over both actions) or "policy" (on-policy expectation).
    mask: optional [U]; 1 where the unit has a pair, 0 where it has none (contributes nothing).
    eps: the ε of the group-normalised advantage.
    unit_weights: optional [U] weight of each unit's loss (inverse-frequency case weights, mean 1
      over the step); the loss is Σ m·w·L / Σ m, so the mean over units keeps its denominator.

  Returns:
    (loss, metrics): the scalar loss and its parts, averaged over the masked units.
  """
  if kl not in KL_CHOICES:
    raise ValueError(f"kl must be one of {KL_CHOICES}, got {kl!r}")
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
  if logp.shape != ref_logp.shape or logp.shape != rewards.shape or logp.shape[-1:] != (2,):
    raise ValueError(
      f"logp {logp.shape}, ref_logp {ref_logp.shape} and rewards {rewards.shape} must all be [U, 2]"
    )
  advantages = group_advantages(rewards, eps)  # [U, 2]
  probs = jax.nn.softmax(logp, axis=-1)  # [U, 2] renormalised two-action policy
  if weighting == "pair":
    weights = jnp.full_like(logp, 0.5)
  else:
    weights = jax.lax.stop_gradient(probs)
  pg = jnp.sum(weights * (-advantages * logp), axis=-1)  # [U]
  divergence = _kl_terms(logp, ref_logp, weights, kl)  # [U]
  per_unit = pg + beta * divergence  # [U]
  m = jnp.ones(logp.shape[:1], logp.dtype) if mask is None else mask.astype(logp.dtype)  # [U]
  denom = jnp.maximum(m.sum(), 1.0)
  mean = lambda x: jnp.sum(m * x) / denom
  loss = mean(per_unit) if unit_weights is None else mean(unit_weights * per_unit)
  metrics = {
    "loss": loss,
    "pg": mean(pg),
    "kl": mean(divergence),
    "prob_action1": mean(probs[:, 1]),
    "tie_fraction": mean((rewards[:, 0] == rewards[:, 1]).astype(logp.dtype)),
    "units": m.sum(),
  }
  return loss, metrics


# -------------------------------------------------------------------------------------------------
# Model-level DPA-GRPO loss: the paired core on length-normalised sequence log-probs of an LLM.


@dataclasses.dataclass(frozen=True)
class DPALossConfig:
  """Static settings of `dpa_loss` (hashable: it is a static argument under jit).

  Attributes:
    beta, kl, weighting: as in `paired_loss`.
    components: names of the paired groups a role's batch holds, e.g. ("decision", "proposal") for
      the generator; `batch["component"]` indexes them.
    component_weights: the weight of each component's mean loss in the role's loss.
    vocab_chunk: vocabulary chunk of `lm.scoring` (memory of the log-prob computation).
    remat: each layer's rematerialisation in the backward pass (`lm.model.REMAT_POLICIES`; True = full).
  """

  beta: float = 0.04
  kl: str = "k1"
  weighting: str = "pair"
  components: tuple[str, ...] = ("verdict",)
  component_weights: tuple[float, ...] = (1.0,)
  vocab_chunk: int = 8192
  remat: bool | str = False

  def __post_init__(self):
    if len(self.components) != len(self.component_weights):
      raise ValueError(
        f"components {self.components} and component_weights {self.component_weights} differ in length"
      )


def pair_logprobs(
  model, batch: dict[str, jax.Array], *, vocab_chunk: int = 8192, remat: bool = False
) -> jax.Array:
  """Length-normalised log-probs [P, 2] of both actions of P pairs.

  The batch holds pair p as rows (2p, 2p+1) (`scoring.pack_pairs`) or as one row with the prompt
  once (`scoring.pack_shared_pairs`, which has `branch`: `loss.share_prompts`); both give the same
  values, the second with each prompt's forward and backward pass computed once.
  """
  _, per_sequence = scoring.sequence_logprobs(model, batch, normalize=True, chunk=vocab_chunk, remat=remat)
  return per_sequence.reshape(-1, 2)


def dpa_loss(model, ref_model, batch: dict[str, jax.Array], cfg: DPALossConfig) -> tuple[jax.Array, dict]:
  """One role's DPA-GRPO loss on a chunk of its decision units (the train step sums chunks).

  Both actions of every pair are scored under the role's policy (`model`) and the frozen reference
  (`ref_model`: the backbone with adapters off), whichever was sampled, and fed to `paired_loss` per
  component. Sampled replies that were invalid actions sit in pair slots of no component (index −1)
  and add `row_penalty · ℓ` (a REINFORCE step with reward −penalty on the malformed text).
  Optional keys: `item_weight` [P] weights each pair's paired loss (case weights); `row_coef`,
  `row_kl` [P, 2] add Σ row_coef·ℓ + row_kl·(ℓ − ℓ_ref) — a group whose advantages were computed
  on the host over more than two samples (the revise turn's K revisions), k1 to the reference;
  `component_total` [K] multiplies component k's loss (not its metrics) by its units in the update,
  turning the mean into the reference code's sum (`loss.aggregate="sum"`).

  Args:
    model, ref_model: `lm.Qwen` models (the policy is differentiated; the reference is not).
    batch: `tokens`, `attention_mask`, `completion_mask` [2P, T] (pair p = rows 2p, 2p+1, each a
      prompt + one action's canonical text); `rewards` [P, 2]; `component` [P] int (−1: none);
      `share` [K]: this chunk's units of component k over the step's (so chunk losses add up to
      the step's mean); `row_penalty` [P, 2]: penalty / units on invalid replies, else 0.
    cfg: static settings.

  Returns:
    (loss, metrics) with metrics already multiplied by `share`, so they too add up over chunks.
  """
  logp = pair_logprobs(model, batch, vocab_chunk=cfg.vocab_chunk, remat=cfg.remat)  # [P, 2]
  ref_logp = jax.lax.stop_gradient(pair_logprobs(ref_model, batch, vocab_chunk=cfg.vocab_chunk))  # [P, 2]
  loss = jnp.sum(batch["row_penalty"] * logp)
  metrics = {"invalid_penalty": loss}
  if "row_coef" in batch:
    rows = jnp.sum(batch["row_coef"] * logp + batch["row_kl"] * (logp - ref_logp))
    loss = loss + rows
    metrics["revision/loss"] = rows
  for k, (name, weight) in enumerate(zip(cfg.components, cfg.component_weights, strict=True)):
    part, parts = paired_loss(
      logp,
      ref_logp,
      batch["rewards"],
      beta=cfg.beta,
      kl=cfg.kl,
      weighting=cfg.weighting,
      mask=batch["component"] == k,
      unit_weights=batch.get("item_weight"),
    )
    share = batch["share"][k]
    total = batch["component_total"][k] if "component_total" in batch else 1.0
    loss = loss + weight * share * total * part
    metrics.update({f"{name}/{key}": share * value for key, value in parts.items() if key != "units"})
  return loss, metrics


# -------------------------------------------------------------------------------------------------
# Generator-only baselines: GRPO, DAPO and GSPO on groups of G sampled completions per prompt.
#
# Shapes: N groups of G completions of T tokens; per-token arrays are [N, G, T] with `mask` 1 on
# completion tokens; rewards are [N, G]. `old_logp` are the sampling policy's token log-probs: with
# one update per rollout (the trainer's setting) they equal the current ones, so the trainer passes
# stop_gradient(logp) and every ratio is exactly 1 with the on-policy gradient.


def overlong_shaping(lengths: jax.Array, max_len: int, cache_len: int) -> jax.Array:
  """DAPO's soft overlong penalty: 0 up to max_len − cache_len, then linear down to −1 at max_len.

  R(|y|) = 0 if |y| ≤ L_max − L_cache; ((L_max − L_cache) − |y|) / L_cache if below L_max; −1 beyond.
  """
  lengths = lengths.astype(jnp.float32)
  soft = (max_len - cache_len - lengths) / max(cache_len, 1)
  return jnp.where(lengths <= max_len - cache_len, 0.0, jnp.where(lengths <= max_len, soft, -1.0))


def _clipped_objective(ratio, advantages, eps_low: float, eps_high: float):
  """−min(ρA, clip(ρ, 1−ε_low, 1+ε_high)A): PPO's pessimistic surrogate, as a loss."""
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  return -jnp.minimum(ratio * advantages, clipped * advantages)


def _masked_mean(x, mask):
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _group_weights(rewards, group_mask):
  """[N, G] weight 1 on the sequences of real groups (a chunk pads with empty groups)."""
  ones = jnp.ones(rewards.shape[:1], rewards.dtype)
  gm = ones if group_mask is None else group_mask.astype(rewards.dtype)
  return jnp.broadcast_to(gm[:, None], rewards.shape)


@functools.partial(jax.jit, static_argnames=("eps", "beta"))
def grpo_loss(
  logp, old_logp, ref_logp, mask, rewards, group_mask=None, *, eps: float = 0.2, beta: float = 0.04
):
  """GRPO: per-token clipped ratio with group-normalised advantages and k3 KL to the reference.

  L = mean_i mean_t [−min(ρ_it Â_i, clip(ρ_it, 1±ε) Â_i) + β·k3_it], the per-sequence token mean
  then the mean over sequences (the GRPO paper's aggregation); `group_mask` [N] drops padding.
  """
  advantages = group_advantages(rewards)[..., None]  # [N, G, 1]
  ratio = jnp.exp(logp - old_logp)  # [N, G, T]
  per_token = _clipped_objective(ratio, advantages, eps, eps) + beta * k3(logp, ref_logp)
  lengths = jnp.maximum(mask.sum(-1), 1.0)  # [N, G]
  seq_weight = _group_weights(rewards, group_mask)  # [N, G]
  loss = _masked_mean(jnp.sum(per_token * mask, -1) / lengths, seq_weight)
  clipped = (jnp.abs(ratio - 1.0) > eps).astype(logp.dtype)
  metrics = {
    "loss": loss,
    "kl": _masked_mean(jnp.sum(k3(logp, ref_logp) * mask, -1) / lengths, seq_weight),
    "clip_fraction": _masked_mean(clipped, mask * seq_weight[..., None]),
    "reward": _masked_mean(rewards, seq_weight),
  }
  return loss, metrics


@functools.partial(jax.jit, static_argnames=("eps_low", "eps_high", "max_len", "cache_len"))
def dapo_loss(
  logp,
  old_logp,
  mask,
  rewards,
  group_mask=None,
  *,
  eps_low: float = 0.2,
  eps_high: float = 0.28,
  max_len: int,
  cache_len: int,
):
  """DAPO: clip-higher, token-level aggregation, dynamic sampling, overlong shaping, no KL.

  Rewards get `overlong_shaping` of each completion's length; groups whose (unshaped) rewards are
  all equal carry no signal and are dropped (dynamic sampling; DAPO then over-samples to refill the
  batch, here the step is simply smaller). L = Σ_tokens −min(ρÂ, clip(ρ, 1−ε_low, 1+ε_high)Â) / tokens,
  over every token of the kept groups.
  """
  lengths = mask.sum(-1)  # [N, G]
  keep = (rewards.max(-1) > rewards.min(-1)).astype(logp.dtype)  # [N]
  seq_weight = _group_weights(rewards, group_mask)  # [N, G]
  keep = keep * seq_weight[:, 0]
  shaped = rewards + overlong_shaping(lengths, max_len, cache_len)
  advantages = group_advantages(shaped)[..., None]  # [N, G, 1]
  ratio = jnp.exp(logp - old_logp)
  per_token = _clipped_objective(ratio, advantages, eps_low, eps_high)
  token_mask = mask * keep[:, None, None]
  loss = _masked_mean(per_token, token_mask)
  metrics = {
    "loss": loss,
    "kept_groups": _masked_mean(keep, seq_weight[:, 0]),
    "clip_fraction": _masked_mean(
      ((ratio < 1 - eps_low) | (ratio > 1 + eps_high)).astype(logp.dtype), token_mask
    ),
    "reward": _masked_mean(rewards, seq_weight),
  }
  return loss, metrics


@functools.partial(jax.jit, static_argnames=("eps_low", "eps_high", "beta"))
def gspo_loss(
  logp,
  old_logp,
  ref_logp,
  mask,
  rewards,
  group_mask=None,
  *,
  eps_low: float = 3e-4,
  eps_high: float = 4e-4,
  beta: float = 0.0,
):
  """GSPO: a sequence-level ratio s_i = exp(mean_t log ρ_it), clipped per sequence.

  L = mean_i −min(s_i Â_i, clip(s_i, 1−ε_low, 1+ε_high) Â_i) (+ β·k3 per-sequence mean; β = 0 in GSPO).
  """
  advantages = group_advantages(rewards)  # [N, G]
  lengths = jnp.maximum(mask.sum(-1), 1.0)
  log_ratio = jnp.sum((logp - old_logp) * mask, -1) / lengths  # [N, G]
  ratio = jnp.exp(log_ratio)
  kl = jnp.sum(k3(logp, ref_logp) * mask, -1) / lengths
  seq_weight = _group_weights(rewards, group_mask)
  loss = _masked_mean(_clipped_objective(ratio, advantages, eps_low, eps_high) + beta * kl, seq_weight)
  clipped = ((ratio < 1 - eps_low) | (ratio > 1 + eps_high)).astype(logp.dtype)
  metrics = {
    "loss": loss,
    "kl": _masked_mean(kl, seq_weight),
    "clip_fraction": _masked_mean(clipped, seq_weight),
    "reward": _masked_mean(rewards, seq_weight),
  }
  return loss, metrics


# Each baseline's objective by name: (logp, old, ref, mask, rewards, group_mask, cfg) -> (loss, metrics).
_OBJECTIVES: dict[str, Callable] = {}


def _objective(name: str):
  def add(fn):
    _OBJECTIVES[name] = fn
    return fn

  return add


@_objective("grpo")
def _grpo(logp, old, ref, mask, rewards, group_mask, cfg):
  return grpo_loss(logp, old, ref, mask, rewards, group_mask, eps=cfg.eps_low, beta=cfg.beta)


@_objective("dapo")
def _dapo(logp, old, ref, mask, rewards, group_mask, cfg):
  del ref  # DAPO has no KL term
  return dapo_loss(
    logp,
    old,
    mask,
    rewards,
    group_mask,
    eps_low=cfg.eps_low,
    eps_high=cfg.eps_high,
    max_len=cfg.max_len,
    cache_len=cfg.cache_len,
  )


@_objective("gspo")
def _gspo(logp, old, ref, mask, rewards, group_mask, cfg):
  return gspo_loss(
    logp, old, ref, mask, rewards, group_mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high, beta=cfg.beta
  )


BASELINES = tuple(_OBJECTIVES)


@dataclasses.dataclass(frozen=True)
class BaselineConfig:
  """Static settings of `baseline_loss`; the defaults are each method's paper's.

  Attributes:
    method: "grpo", "dapo" or "gspo".
    beta: KL weight (GRPO 0.04; DAPO has none; GSPO 0).
    eps_low, eps_high: clip range (GRPO 0.2/0.2, DAPO 0.2/0.28, GSPO 3e-4/4e-4).
    max_len, cache_len: DAPO's overlong shaping (max_len = the rollout's max new tokens).
  """

  method: str = "grpo"
  beta: float = 0.04
  eps_low: float = 0.2
  eps_high: float = 0.2
  max_len: int = 2048
  cache_len: int = 512
  vocab_chunk: int = 8192
  remat: bool | str = False

  def __post_init__(self):
    if self.method not in BASELINES:
      raise ValueError(f"method must be one of {BASELINES}, got {self.method!r}")

  @classmethod
  def paper(cls, method: str, **overrides) -> BaselineConfig:
    defaults = {
      "grpo": dict(beta=0.04, eps_low=0.2, eps_high=0.2),
      "dapo": dict(beta=0.0, eps_low=0.2, eps_high=0.28),
      "gspo": dict(beta=0.0, eps_low=3e-4, eps_high=4e-4),
    }
    if method not in defaults:
      raise ValueError(f"method must be one of {BASELINES}, got {method!r}")
    return cls(method=method, **{**defaults[method], **overrides})


def baseline_loss(
  model, ref_model, batch: dict[str, jax.Array], cfg: BaselineConfig
) -> tuple[jax.Array, dict]:
  """A generator-only baseline on a chunk of N groups of G completions (rows i·G + g).

  Args:
    model, ref_model: the policy and the frozen reference (`lm.Qwen`).
    batch: `tokens`, `attention_mask`, `completion_mask` [N·G, T]; `rewards` [N, G]; `group_mask`
      [N] (0 on padding groups); `share` []:
      this chunk's part of the step's aggregation unit (sequences, or tokens of kept groups for
      DAPO), so the chunks' losses add up to the step's loss.
    cfg: static settings.
  """
  groups, size = batch["rewards"].shape
  per_token, _ = scoring.sequence_logprobs(model, batch, chunk=cfg.vocab_chunk, remat=cfg.remat)
  shape = (groups, size, per_token.shape[-1])
  logp = per_token.reshape(shape)  # [N, G, T]
  old = jax.lax.stop_gradient(logp)
  mask = batch["completion_mask"].reshape(shape).astype(logp.dtype)
  if cfg.beta > 0:
    ref_token, _ = scoring.sequence_logprobs(ref_model, batch, chunk=cfg.vocab_chunk)
    ref = jax.lax.stop_gradient(ref_token.reshape(shape))
  else:
    ref = old
  loss, metrics = _OBJECTIVES[cfg.method](logp, old, ref, mask, batch["rewards"], batch["group_mask"], cfg)
  share = batch["share"]
  return share * loss, {k: share * v for k, v in metrics.items()}


# Every trainable method's loss by name: (model, ref_model, batch, cfg) -> (loss, metrics), with
# `cfg` a `DPALossConfig` for "dpa_grpo" and a `BaselineConfig` for the generator-only baselines.
LOSSES: dict[str, Callable] = {"dpa_grpo": dpa_loss, **{name: baseline_loss for name in BASELINES}}


def loss_fn(method: str) -> Callable:
  """The loss of `method`; an unknown name fails listing the registered ones."""
  if method not in LOSSES:
    raise ValueError(f"no loss registered for {method!r}; registered: {sorted(LOSSES)}")
  return LOSSES[method]
