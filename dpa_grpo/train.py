"""DPA-GRPO training (and the generator-only baselines) on tax-form cases, resumable to the bit.

`run(config, workdir)` is the one library call of `launch/dpa_grpo.py` (configs/dpa_grpo.py holds
every knob). A step:

  rollout  `rollout.play` (DPA-GRPO) or `rollout.sample_groups` (GRPO/DAPO/GSPO) on a batch of train
           cases, sampling each role from its view (backbone + that role's LoRA adapter);
  pack     each role's pairs (or groups) into fixed-size chunks [rows, T] (T bucketed to a power of
           two, rows a multiple of the mesh's batch axes, so compiled shapes repeat);
  update   jitted value-and-grad of the role's loss per chunk, summed (gradient accumulation), then
           one AdamW update of every trainable parameter (clipped by global norm, scheduled lr).

Parameters: with LoRA (default) the trainable state is one adapter per role; the backbone is frozen
and, with adapters off, is the reference policy. With `lora.enabled=False` (full fine-tuning) both
roles train the backbone itself and the reference is the initial backbone, kept frozen (a second
copy of the weights once they first change).

Evaluation every `eval_every` steps (and before the first) plays the test split at temperature 0
and logs per-line pre-/post-revision accuracy with Wilson 95% intervals and the 8-case table; the
best-by-accuracy checkpoint is kept, and training stops after `patience` evaluations without
improvement. Checkpoints (orbax, every `checkpoint_every` steps and at every evaluation) hold the
trainable parameters, the optimiser state and the loop's counters; a restarted run resumes from the
newest complete one and — every step being a function of (parameters, optimiser state, seed, step)
only — ends with parameters bit-identical to an uninterrupted run. Logs written after the restored
step by the killed run are dropped on resume.

Run directory: config.json, metrics.jsonl, tb/ (TensorBoard), records/{train,eval}.jsonl (every
text of every unit), checkpoints/, summary.json, export/<role>/ (merged HF weights, optional).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from dpa_grpo import game, losses, rollout, warm_start
from dpa_grpo.envs import forms, taxcalc
from lm import checkpoint as ckpt_lib
from lm import lora, rundir, scoring, shapes, stats
from lm import sampler as sampler_lib
from lm import sharding as sharding_lib
from lm import tokenizer as tokenizer_lib
from lm.config import ModelConfig
from lm.model import Qwen

_log = logging.getLogger(__name__)

METHODS = ("dpa_grpo", "grpo", "dapo", "gspo", "zero_shot")
# Rollout prompts are long and of similar lengths: padding them to multiples of 64 rather than to
# powers of two keeps prefill attention (quadratic in the padded length) from doubling.
_SAMPLER = sampler_lib.SamplerConfig(prompt_bucket_multiple=64)
BEST_METRIC = "accuracy"  # post-revision accuracy (DPA-GRPO); draft accuracy (generator-only)


# ---- model, tokenizer, data ---------------------------------------------------------------------


def task_tokenizer(
  path: str, cases: Sequence[taxcalc.TaxCase], cfg: rollout.RolloutConfig, vocab_size: int
) -> str:
  """A byte-level BPE tokenizer fitted to this task's prompts and answers (for models trained from
  scratch: short prompts are what makes CPU-scale runs fast). Written once; reused on resume."""
  if os.path.exists(os.path.join(path, "tokenizer.json")):
    return path
  corpus = list(game.VERIFIER_PAIR + game.GENERATOR_PAIR)
  sac = warm_start.TEMPLATE_SAC
  for case, line_id, prompt in rollout.gold_episodes(cases, cfg):
    answer = cfg.answer(line_id, case.gold[line_id], warm_start.EXPLANATION)
    corpus += [
      prompt,
      answer,
      game.verifier_prompt(prompt, answer),
      game.render_verifier_reply("wrong", sac),
      game.decision_prompt(prompt, answer, sac, answer),
    ]
  return tokenizer_lib.train_bpe_tokenizer(path, corpus, vocab_size=vocab_size, split_digits=True)


def load_model(cfg, mesh, tokenizer_dir: str) -> tuple[Qwen, tokenizer_lib.Tokenizer]:
  """The backbone (an HF checkpoint, or a preset initialised from the seed) on the mesh."""
  tokenizer = tokenizer_lib.load_tokenizer(tokenizer_dir)
  if cfg.model.checkpoint:
    from lm import hf

    model = hf.load_hf(cfg.model.checkpoint, dtype=cfg.model.dtype, mesh=mesh)
  else:
    overrides = dict(cfg.model.overrides)
    overrides.setdefault("vocab_size", tokenizer.vocab_size)
    overrides.setdefault("eos_token_ids", tuple(tokenizer.eos_ids))
    overrides.setdefault("pad_token_id", tokenizer.pad_id)
    config = ModelConfig.preset(cfg.model.preset, **overrides)
    dtype = jnp.dtype(cfg.model.dtype)
    model = Qwen(config, rngs=nnx.Rngs(cfg.seed), param_dtype=dtype)
    sharding_lib.shard_model(model, mesh)
  if model.config.vocab_size < tokenizer.vocab_size:
    raise ValueError(f"model vocab {model.config.vocab_size} < tokenizer vocab {tokenizer.vocab_size}")
  return model, tokenizer


def load_data(cfg) -> tuple[list[taxcalc.TaxCase], list[taxcalc.TaxCase]]:
  """(train, test) cases: the benchmark at `data.root`, else synthetic forms; split by seed."""
  if cfg.data.root:
    cases = taxcalc.load_cases(cfg.data.root)
  else:
    syn = cfg.data.synthetic
    cases = forms.generate_cases(syn.n, seed=syn.seed, difficulty=syn.difficulty)
  return taxcalc.split_cases(cases, cfg.data.test_fraction, cfg.data.split_seed)


def rollout_config(cfg) -> rollout.RolloutConfig:
  values = dict(cfg.rollout)
  values["lines"] = tuple(values["lines"]) if values["lines"] else taxcalc.LINE_IDS
  return rollout.RolloutConfig(**values)


def optimizer(cfg) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and a warmup + constant / cosine learning-rate schedule."""
  o = cfg.optim
  if o.schedule == "cosine":
    lr = optax.warmup_cosine_decay_schedule(
      0.0, o.lr, max(o.warmup_steps, 1), max(cfg.train.steps, 2), o.end_lr
    )
  elif o.schedule == "constant":
    lr = optax.join_schedules(
      [optax.linear_schedule(0.0, o.lr, o.warmup_steps), optax.constant_schedule(o.lr)], [o.warmup_steps]
    )
  else:
    raise ValueError(f"config.optim.schedule must be 'constant' or 'cosine', got {o.schedule!r}")
  adamw = optax.adamw(lr, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)
  return optax.chain(optax.clip_by_global_norm(o.max_grad_norm), adamw)


# ---- policies: one backbone, one adapter per role ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class Policies:
  """How (trainable, frozen) parameter trees become each role's model and the reference.

  LoRA: trainable = {role: that role's adapter state}, frozen = the backbone.
  Full fine-tuning: trainable = {"backbone": ...} shared by both roles, frozen = the initial backbone.
  Hashable (graph definitions only), so it is a static argument of the jitted functions.
  """

  base: nnx.GraphDef
  adapted: nnx.GraphDef | None

  def policy(self, trainable, frozen, role: str) -> Qwen:
    if self.adapted is None:
      return nnx.merge(self.base, trainable["backbone"])
    return nnx.merge(self.adapted, frozen, trainable[role])

  def reference(self, frozen) -> Qwen:
    return nnx.merge(self.base, frozen)


def init_policies(model: Qwen, cfg, roles: Sequence[str], mesh) -> tuple[Policies, dict, Any]:
  """(policies, trainable, frozen) for the backbone `model`."""
  base, backbone = nnx.split(model)
  if not cfg.lora.enabled:
    return Policies(base, None), {"backbone": backbone}, backbone
  lora_cfg = lora.LoRAConfig(rank=cfg.lora.rank, alpha=cfg.lora.alpha, targets=tuple(cfg.lora.targets))
  adapters = lora.init_adapters(
    model, lora_cfg, tuple(roles), seed=cfg.seed + 1, dtype=jnp.dtype(cfg.lora.dtype)
  )
  replicated = NamedSharding(mesh, P())
  trainable = {}
  adapted = None
  for role, adapter in adapters.items():
    adapted, _, state = nnx.split(lora.with_adapter(model, adapter), nnx.Param, lora.LoRAParam)
    trainable[role] = jax.device_put(state, replicated)
  return Policies(base, adapted), trainable, backbone


# ---- packing rollouts into fixed-shape chunks ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Item:
  """One loss item: a pair of rows sharing a prompt, its rewards, component and row penalties."""

  prompt: Sequence[int]
  completions: tuple[Sequence[int], Sequence[int]]
  rewards: tuple[float, float] = (0.0, 0.0)
  component: int = -1
  penalty: tuple[float, float] = (0.0, 0.0)


def pack_rows(prompts, completions, pad_id: int) -> dict[str, np.ndarray]:
  """`scoring.pack_pairs` with the width bucketed to a power of two (few compiled shapes)."""
  width = shapes.width_bucket(max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True)))
  return scoring.pack_pairs(prompts, completions, pad_id=pad_id, length_multiple=width)


def dpa_items(units: Sequence[rollout.Unit], tokenizer, cfg) -> dict[str, list[Item]]:
  """Each role's items: verdict pairs for every unit; decision and proposal pairs after a SAC.

  Verifier: [NS, SAC] canonical strings on the verifier prompt, rewards [S_x, 1 − S_x].
  Generator: [KEEP, REVISE] canonical strings on the decision prompt, rewards [S_x, S_z]; and the
  proposal pair [x, z] on the *draft* prompt, rewards [S_x, S_z] — the generator's proposal itself
  is trained on the two candidate answers the unit produced (see docs/dpa_grpo.md). An invalid reply
  adds an item whose first row is that reply, penalised (component −1).
  """
  encode = tokenizer.encode
  verdict_pair = tuple(encode(s) for s in game.VERIFIER_PAIR)
  decision_pair = tuple(encode(s) for s in game.GENERATOR_PAIR)
  penalty = cfg.loss.invalid_penalty
  items: dict[str, list[Item]] = {"verifier": [], "generator": []}
  for u in units:
    sx = float(u.x_right)
    items["verifier"].append(Item(u.prompt_ids["verify"], verdict_pair, (sx, 1.0 - sx), 0))
    if penalty > 0 and not u.verifier.valid:
      items["verifier"].append(
        Item(u.prompt_ids["verify"], (u.verifier_reply.tokens, ()), penalty=(penalty, 0.0))
      )
    if u.verifier.action != game.SAC_ACTION:
      continue
    sz = float(u.z_right)
    items["generator"].append(Item(u.prompt_ids["decide"], decision_pair, (sx, sz), 0))
    if cfg.loss.proposal_weight > 0:
      items["generator"].append(Item(u.prompt_ids["draft"], (u.x.tokens, u.z.tokens), (sx, sz), 1))
    if penalty > 0 and not u.decision.valid:
      items["generator"].append(
        Item(u.prompt_ids["decide"], (u.decision_reply.tokens, ()), penalty=(penalty, 0.0))
      )
  return items


def dpa_chunks(
  items: Sequence[Item], num_components: int, pairs: int, pad_id: int
) -> list[dict[str, np.ndarray]]:
  """Fixed-size chunks of `pairs` items; `share` and penalties make chunk losses add to the step's."""
  counts = np.bincount([i.component for i in items if i.component >= 0], minlength=num_components)
  units = max(1, sum(1 for i in items if i.component == 0) or len(items))
  chunks = []
  for start in range(0, len(items), pairs):
    chunk = list(items[start : start + pairs])
    chunk += [Item([pad_id], ((), ()))] * (pairs - len(chunk))
    prompts = [i.prompt for i in chunk for _ in range(2)]
    completions = [c for i in chunk for c in i.completions]
    batch = pack_rows(prompts, completions, pad_id)
    component = np.array([i.component for i in chunk], np.int32)
    in_chunk = np.bincount(component[component >= 0], minlength=num_components)
    batch.update(
      rewards=np.array([i.rewards for i in chunk], np.float32),
      component=component,
      share=(in_chunk / np.maximum(counts, 1)).astype(np.float32),
      row_penalty=np.array([i.penalty for i in chunk], np.float32) / units,
    )
    chunks.append(batch)
  return chunks


def group_chunks(
  groups: Sequence[rollout.Group], method: str, per_chunk: int, pad_id: int
) -> list[dict[str, np.ndarray]]:
  """Fixed-size chunks of `per_chunk` groups, `share` = the chunk's part of the aggregation unit."""
  size = len(groups[0].samples)
  kept = lambda g: max(g.rewards) > min(g.rewards)
  if method == "dapo":  # token-level mean over the kept groups
    weight = lambda g: sum(len(s.tokens) for s in g.samples) if kept(g) else 0
  else:  # mean over sequences
    weight = lambda g: size
  total = max(sum(weight(g) for g in groups), 1)
  chunks = []
  for start in range(0, len(groups), per_chunk):
    chunk = list(groups[start : start + per_chunk])
    real = len(chunk)
    prompts = [g.prompt_ids for g in chunk for _ in range(size)] + [[pad_id]] * (per_chunk - real) * size
    completions = [s.tokens for g in chunk for s in g.samples] + [()] * (per_chunk - real) * size
    batch = pack_rows(prompts, completions, pad_id)
    rewards = [g.rewards for g in chunk] + [(0.0,) * size] * (per_chunk - real)
    batch.update(
      rewards=np.array(rewards, np.float32),
      group_mask=np.array([1.0] * real + [0.0] * (per_chunk - real), np.float32),
      share=np.float32(sum(weight(g) for g in chunk) / total),
    )
    chunks.append(batch)
  return chunks


# ---- jitted pieces --------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("policies", "role", "loss_cfg"))
def _grads(trainable, frozen, batch, *, policies: Policies, role: str, loss_cfg):
  """value-and-grad of one role's loss on one chunk: the pure function at the jit boundary."""

  def loss(params):
    model = policies.policy(params, frozen, role)
    ref = policies.reference(frozen)
    if isinstance(loss_cfg, losses.DPALossConfig):
      return losses.dpa_loss(model, ref, batch, loss_cfg)
    return losses.baseline_loss(model, ref, batch, loss_cfg)

  (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(trainable)
  return value, metrics, grads


@jax.jit
def _add(a, b):
  return jax.tree.map(jnp.add, a, b)


@functools.partial(jax.jit, static_argnames=("tx",))
def _apply(trainable, opt_state, grads, *, tx):
  updates, opt_state = tx.update(grads, opt_state, trainable)
  return optax.apply_updates(trainable, updates), opt_state, optax.global_norm(grads)


# ---- evaluation ------------------------------------------------------------------------------------


def per_line(units_or_groups, flag: str) -> dict[str, dict[str, float]]:
  """Accuracy of each line with its Wilson 95% interval."""
  out = {}
  lines = sorted({u.line_id for u in units_or_groups}, key=taxcalc.LINE_IDS.index)
  for line_id in lines:
    hits = [bool(getattr(u, flag)) for u in units_or_groups if u.line_id == line_id]
    low, high = stats.wilson_interval(sum(hits), len(hits))
    out[line_id] = {"accuracy": sum(hits) / len(hits), "ci_low": low, "ci_high": high, "n": len(hits)}
  return out


def game_metrics(units: Sequence[rollout.Unit]) -> dict[str, Any]:
  """Accuracies, SAC / revise rates, invalid replies and the 8-case table of played units."""
  n = len(units)
  challenged = [u for u in units if u.verifier.action == game.SAC_ACTION]
  pre = sum(u.x_right for u in units)
  post = sum(u.submitted_right for u in units)
  return {
    BEST_METRIC: post / n,
    "accuracy_ci": stats.wilson_interval(post, n),
    "pre_revision_accuracy": pre / n,
    "pre_revision_accuracy_ci": stats.wilson_interval(pre, n),
    "sac_rate": len(challenged) / n,
    "revise_rate": sum(u.generator_action == game.REVISE for u in challenged) / max(len(challenged), 1),
    "invalid_verdicts": sum(not u.verifier.valid for u in units),
    "invalid_decisions": sum(not u.decision.valid for u in challenged),
    "units": n,
    "cases": game.case_table(u.case for u in units),
    "per_line_post": per_line(units, "submitted_right"),
    "per_line_pre": per_line(units, "x_right"),
  }


@dataclasses.dataclass
class _GroupView:
  line_id: str
  right: bool


def draft_metrics(groups: Sequence[rollout.Group]) -> dict[str, Any]:
  """Accuracy of the first completion of each group (the greedy draft in evaluation)."""
  views = [_GroupView(g.line_id, g.rewards[0] > 0) for g in groups]
  hits = sum(v.right for v in views)
  return {
    BEST_METRIC: hits / len(views),
    "accuracy_ci": stats.wilson_interval(hits, len(views)),
    "units": len(views),
    "per_line": per_line(views, "right"),
  }


def _scalars(prefix: str, metrics: dict[str, Any]) -> dict[str, float]:
  """The numeric leaves of a metrics dict, flattened as `prefix/key/...` for TensorBoard."""
  flat = {}
  for key, value in metrics.items():
    name = f"{prefix}/{key}"
    if isinstance(value, dict):
      flat.update(_scalars(name, value))
    elif isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool):
      flat[name] = float(value)
  return flat


# ---- the trainer ---------------------------------------------------------------------------------


class Trainer:
  """The training loop's state and I/O; the numerics live in the jitted functions above."""

  def __init__(self, config, workdir: str):
    if config.method not in METHODS:
      raise ValueError(f"config.method must be one of {METHODS}, got {config.method!r}")
    self.config = config
    self.workdir = workdir
    self.method = config.method
    self.mesh = sharding_lib.make_mesh(sharding_lib.MeshConfig(**config.mesh))
    self.train_cases, self.test_cases = load_data(config)
    self.rollout_cfg = rollout_config(config)
    tokenizer_dir = config.model.tokenizer or config.model.checkpoint
    if not tokenizer_dir:
      path = os.path.join(workdir, "tokenizer")
      tokenizer_dir = task_tokenizer(path, self.train_cases, self.rollout_cfg, config.model.tokenizer_vocab)
    self.model, self.tokenizer = load_model(config, self.mesh, tokenizer_dir)
    self.roles = game.ROLES if self.method == "dpa_grpo" else ("generator",)
    self.policies, self.trainable, self.frozen = init_policies(self.model, config, self.roles, self.mesh)
    self.tx = optimizer(config)
    # Every optimiser buffer on the mesh (moments beside their parameter, counters replicated), so a
    # restored state has exactly the placement of a fresh one.
    target = ckpt_lib.abstract_opt_state(self.tx, self.trainable, self.mesh)
    self.opt_state = jax.tree.map(
      lambda x, t: jax.device_put(x, t.sharding), self.tx.init(self.trainable), target
    )
    self.loss_cfgs = self._loss_configs()
    self.pad_id = self.tokenizer.pad_id
    self.batch_multiple = math.prod(self.mesh.shape[a] for a in sharding_lib.BATCH_AXES)
    self.samplers = {
      role: rollout.RolePolicy(
        sampler_lib.Sampler(self._view(role), tokenizer=self.tokenizer, mesh=self.mesh, config=_SAMPLER),
        self.tokenizer,
        self.rollout_cfg.enable_thinking,
      )
      for role in game.ROLES
    }
    best = ckpt_lib.CheckpointConfig(
      max_to_keep=config.train.keep_checkpoints, best_metric=BEST_METRIC, best_mode="max", keep_best=1
    )
    self.checkpoints = ckpt_lib.CheckpointManager(os.path.join(workdir, "checkpoints"), best)
    self.state = {"step": 0, "best": None, "best_step": None, "bad_evals": 0, "stopped": False}

  # -- parameters --

  def _view(self, role: str) -> Qwen:
    """The role's model for sampling (shares arrays with the trainable / frozen trees)."""
    if role not in self.roles:  # generator-only methods: the verifier is the untrained backbone
      return self.policies.reference(self.frozen)
    return self.policies.policy(self.trainable, self.frozen, role)

  def _refresh_samplers(self) -> None:
    for role, policy in self.samplers.items():
      policy.sampler.model = self._view(role)
      policy.sampler.refresh()

  def _loss_configs(self):
    c = self.config
    if self.method == "dpa_grpo":
      common = dict(
        beta=c.loss.beta, kl=c.loss.kl, weighting=c.loss.weighting, vocab_chunk=c.loss.vocab_chunk
      )
      return {
        "verifier": losses.DPALossConfig(**common, components=("verdict",), component_weights=(1.0,)),
        "generator": losses.DPALossConfig(
          **common,
          components=("decision", "proposal"),
          component_weights=(c.loss.decision_weight, c.loss.proposal_weight),
        ),
      }
    if self.method == "zero_shot":
      return {}
    b = c.baseline
    return {
      "generator": losses.BaselineConfig(
        method=self.method,
        beta=b.beta,
        eps_low=b.eps_low,
        eps_high=b.eps_high,
        max_len=self.rollout_cfg.max_new_tokens,
        cache_len=b.overlong_cache,
        vocab_chunk=c.loss.vocab_chunk,
      )
    }

  # -- checkpoints --

  def restore(self) -> int:
    """Resumes from the newest complete checkpoint; returns the step to continue after."""
    step = self.checkpoints.latest_step()
    if step is None:
      return -1
    target = ckpt_lib.abstract_like({"params": self.trainable, "opt_state": self.opt_state})
    restored, meta = self.checkpoints.restore(step, target)
    self.trainable, self.opt_state = restored["params"], restored["opt_state"]
    self.state = meta
    self._refresh_samplers()
    for name in ("metrics.jsonl", "records/train.jsonl", "records/eval.jsonl"):
      _drop_after(os.path.join(self.workdir, name), step)
    _log.info("resumed from step %d", step)
    return step

  def save(self, step: int, metrics: dict[str, float] | None) -> None:
    self.checkpoints.save(
      step, {"params": self.trainable, "opt_state": self.opt_state}, dict(self.state), metrics=metrics
    )

  # -- one step --

  def _place(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    replicated = NamedSharding(self.mesh, P())
    placed = {}
    for key, value in batch.items():
      if key in ("tokens", "attention_mask", "completion_mask"):
        placed[key] = jax.device_put(value, sharding_lib.batch_sharding(self.mesh, value.shape))
      else:
        placed[key] = jax.device_put(value, replicated)
    return placed

  def _chunks(self, step: int, cases) -> tuple[dict[str, list], list[dict[str, Any]], dict[str, Any]]:
    """Rollout and packing: chunks per role, the step's records and its rollout metrics."""
    c = self.config
    seed = c.seed
    if self.method == "dpa_grpo":
      g, v = self.samplers["generator"], self.samplers["verifier"]
      units = rollout.play(cases, g, v, self.rollout_cfg, seed=seed, step=step)
      items = dpa_items(units, self.tokenizer, c)
      pairs = shapes.round_up(
        c.train.pairs_per_chunk, self.batch_multiple // math.gcd(self.batch_multiple, 2)
      )
      chunks = {
        role: dpa_chunks(items[role], len(self.loss_cfgs[role].components), pairs, self.pad_id)
        for role in self.roles
      }
      return chunks, [u.record() for u in units], game_metrics(units)
    groups = rollout.sample_groups(cases, self.samplers["generator"], self.rollout_cfg, seed=seed, step=step)
    size = self.rollout_cfg.group_size
    per_chunk = shapes.round_up(c.train.groups_per_chunk * size, self.batch_multiple) // size
    chunks = {"generator": group_chunks(groups, self.method, max(per_chunk, 1), self.pad_id)}
    rewards = np.array([g.rewards for g in groups])
    return chunks, [g.record() for g in groups], {"reward": float(rewards.mean()), "groups": len(groups)}

  def train_step(self, step: int) -> dict[str, Any]:
    c = self.config
    rng = np.random.default_rng([c.seed, step, 11])
    batch_idx = rng.choice(
      len(self.train_cases), size=min(c.data.batch_cases, len(self.train_cases)), replace=False
    )
    cases = [self.train_cases[i] for i in sorted(batch_idx)]
    t0 = time.perf_counter()
    chunks, records, rollout_metrics = self._chunks(step, cases)
    t1 = time.perf_counter()
    grads = jax.tree.map(jnp.zeros_like, self.trainable)
    metrics: dict[str, float] = {}
    tokens = 0
    for role, role_chunks in chunks.items():
      for chunk in role_chunks:
        tokens += int(chunk["attention_mask"].sum())
        value, parts, g = _grads(
          self.trainable,
          self.frozen,
          self._place(chunk),
          policies=self.policies,
          role=role,
          loss_cfg=self.loss_cfgs[role],
        )
        grads = _add(grads, g)
        for key, val in {"loss": value, **parts}.items():
          metrics[f"{role}/{key}"] = metrics.get(f"{role}/{key}", 0.0) + float(val)
    self.trainable, self.opt_state, grad_norm = _apply(self.trainable, self.opt_state, grads, tx=self.tx)
    self._refresh_samplers()
    t2 = time.perf_counter()
    rundir.append_jsonl(
      os.path.join(self.workdir, "records", "train.jsonl"), [{"step": step, **r} for r in records]
    )
    return {
      "step": step,
      **metrics,
      "grad_norm": float(grad_norm),
      "rollout": rollout_metrics,
      "rollout_s": t1 - t0,
      "update_s": t2 - t1,
      "update_tokens_per_s": tokens / max(t2 - t1, 1e-9),
    }

  def evaluate(self, step: int) -> dict[str, Any]:
    """Temperature-0 play of the test split (the game for DPA-GRPO, drafts for the others)."""
    cfg = self.rollout_cfg
    if self.method == "dpa_grpo":
      g, v = self.samplers["generator"], self.samplers["verifier"]
      units = rollout.play(self.test_cases, g, v, cfg, seed=self.config.seed, step=step, greedy=True)
      metrics, records = game_metrics(units), [u.record() for u in units]
    else:
      greedy = dataclasses.replace(cfg, temperature=0.0, group_size=1)
      groups = rollout.sample_groups(self.test_cases, self.samplers["generator"], greedy, seed=0, step=step)
      metrics, records = draft_metrics(groups), [g.record() for g in groups]
    rundir.append_jsonl(
      os.path.join(self.workdir, "records", "eval.jsonl"), [{"step": step, **r} for r in records]
    )
    return metrics


def _drop_after(path: str, step: int) -> None:
  """Rewrites a JSONL log without the records of steps after `step` (written by a killed run)."""
  if not os.path.exists(path):
    return
  kept = [r for r in rundir.read_jsonl(path) if r.get("step", -1) <= step]
  rundir.atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))


def run(config, workdir: str) -> dict[str, Any]:
  """Trains (or, for zero_shot, evaluates) and returns the summary also written to summary.json."""
  from tensorboardX import SummaryWriter

  trainer = Trainer(config, workdir)
  c = config.train
  start = trainer.restore()
  steps = 0 if config.method == "zero_shot" else c.steps
  writer = SummaryWriter(os.path.join(workdir, "tb"), purge_step=max(start + 1, 0))
  metrics_path = os.path.join(workdir, "metrics.jsonl")

  def log(entry: dict[str, Any]) -> None:
    rundir.append_jsonl(metrics_path, [entry])
    for name, value in _scalars("", {k: v for k, v in entry.items() if k != "step"}).items():
      writer.add_scalar(name.lstrip("/"), value, entry["step"])
    writer.flush()

  def evaluate_and_track(step: int) -> dict[str, float]:
    metrics = trainer.evaluate(step)
    s = trainer.state
    if s["best"] is None or metrics[BEST_METRIC] > s["best"]:
      s.update(best=metrics[BEST_METRIC], best_step=step, bad_evals=0)
    else:
      s["bad_evals"] += 1
    s["stopped"] = steps > 0 and s["bad_evals"] >= c.patience
    log({"step": step, "eval": metrics})
    return {BEST_METRIC: metrics[BEST_METRIC]}

  if start < 0:
    trainer.save(0, evaluate_and_track(0))
    start = 0
  bar = tqdm.tqdm(total=steps, initial=start, desc=config.method, disable=not c.progress, dynamic_ncols=True)
  step = start
  while step < steps and not trainer.state["stopped"]:
    step += 1
    entry = trainer.train_step(step)
    log(entry)
    evaluated = step % c.eval_every == 0 or step == steps
    eval_metrics = evaluate_and_track(step) if evaluated else None
    if evaluated or step % c.checkpoint_every == 0:
      trainer.save(step, eval_metrics)
    bar.update(1)
    bar.set_postfix(loss=sum(v for k, v in entry.items() if k.endswith("/loss")), best=trainer.state["best"])
  bar.close()
  trainer.checkpoints.wait_until_finished()
  summary = _summarize(trainer, workdir)
  if c.export_hf and trainer.state["best_step"] is not None:
    export(trainer, trainer.state["best_step"], os.path.join(workdir, "export"))
  trainer.checkpoints.close()
  writer.close()
  return summary


def _summarize(trainer: Trainer, workdir: str) -> dict[str, Any]:
  evals = [r for r in rundir.read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "eval" in r]
  by_step = {r["step"]: r["eval"] for r in evals}
  s = trainer.state
  summary = {
    "method": trainer.method,
    "best_step": s["best_step"],
    "best": s["best"],
    "stopped_early": s["stopped"],
    "before": by_step.get(0),
    "after": by_step.get(s["best_step"]),
    "last_step": max(by_step) if by_step else None,
  }
  rundir.write_json(os.path.join(workdir, "summary.json"), summary)
  return summary


def export(trainer: Trainer, step: int, directory: str) -> None:
  """Writes each trained role of checkpoint `step` as merged HF weights under directory/<role>."""
  target = ckpt_lib.abstract_like({"params": trainer.trainable, "opt_state": trainer.opt_state})
  restored, _ = trainer.checkpoints.restore(step, target)
  for role in trainer.roles:
    model = trainer.policies.policy(restored["params"], trainer.frozen, role)
    lora.export_hf(model, os.path.join(directory, role))
    trainer.tokenizer.hf.save_pretrained(os.path.join(directory, role))
