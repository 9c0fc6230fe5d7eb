"""DPA-GRPO training (and the generator-only baselines) on tax-form cases, resumable to the bit.

`run(config, workdir)` trains one method (`dpa_grpo.reproduce` calls it per method) from a typed
`dpa_grpo.config.ExperimentConfig`. A step:

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
import json
import logging
import math
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from dpa_grpo import config as config_lib
from dpa_grpo import game, packing, rollout, setup
from dpa_grpo import step as step_lib
from dpa_grpo.metrics import BEST_METRIC, draft_metrics, game_metrics, scalars
from dpa_grpo.policies import init_policies
from lm import checkpoint as ckpt_lib
from lm import lora, rundir, seeding, shapes
from lm import sampler as sampler_lib
from lm import sharding as sharding_lib
from lm.model import Qwen

_log = logging.getLogger(__name__)


def _summary_writer(logdir: str, purge_step: int) -> Any:
  """tensorboardX's writer. tensorboardX imports torch when torch is installed (the test extras
  install it for the parity checks) only to accept torch tensors, and that import was 3–8 s of
  every training process's start; the scalars written here are floats, so a process that has not
  imported torch yet imports tensorboardX with torch hidden (its own fallback: numpy only)."""
  if "tensorboardX" not in sys.modules and "torch" not in sys.modules:
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
    try:
      import tensorboardX  # noqa: F401
    finally:
      del sys.modules["torch"]
  from tensorboardX import SummaryWriter

  return SummaryWriter(logdir, purge_step=purge_step)


# A chunk's per-row arrays (`scoring.pack_pairs`'s and `pack_shared_pairs`'), split over the mesh's
# batch axes; its other arrays are per-pair or per-step values, replicated.
_ROW_KEYS = (
  "tokens",
  "attention_mask",
  "completion_mask",
  "completion_positions",
  "positions",
  "branch",
  "score_sources",
  "score_targets",
  "score_mask",
)


class Trainer:
  """The training loop's state and I/O; the numerics live in `dpa_grpo.step`'s jitted functions."""

  def __init__(self, config: config_lib.ExperimentConfig, workdir: str):
    self.config = config
    self.workdir = workdir
    self.method = config.method
    self.mesh = sharding_lib.make_mesh(config.mesh)
    self.train_cases, self.test_cases = setup.load_data(config.data)
    self.rollout_cfg = config.rollout
    tokenizer_dir = setup.tokenizer_dir(
      config.model, os.path.join(workdir, "tokenizer"), self.train_cases, self.rollout_cfg
    )
    self.model, self.tokenizer = setup.load_model(config.model, config.seed, self.mesh, tokenizer_dir)
    self.roles = config.roles
    self.policies, self.trainable, self.frozen = init_policies(
      self.model, config.lora, self.roles, self.mesh, seed=config.seed + 1
    )
    per_step = config.data.batch_cases if config.train.update_every == "case" else 1
    self.tx = step_lib.optimizer(config.optim, config.train.steps * per_step)
    # Every optimiser buffer on the mesh (moments beside their parameter, counters replicated), so a
    # restored state has exactly the placement of a fresh one.
    target = ckpt_lib.abstract_opt_state(self.tx, self.trainable, self.mesh)
    self.opt_state = jax.tree.map(
      lambda x, t: jax.device_put(x, t.sharding), self.tx.init(self.trainable), target
    )
    self.loss_cfgs = step_lib.loss_configs(
      self.method,
      config.loss,
      config.baseline,
      max_new_tokens=self.rollout_cfg.max_new_tokens,
      verdict_tokens=self.rollout_cfg.verdict_tokens,
    )
    self.loss_method = step_lib.loss_method(self.method, config.baseline)
    if self.loss_method != self.method and self.rollout_cfg.group_size != 2:
      raise ValueError(
        f"baseline.mode='reference' trains on pairs of drafts: set rollout.group_size=2, got "
        f"{self.rollout_cfg.group_size}"
      )
    self.pad_id = self.tokenizer.pad_id
    self.batch_multiple = math.prod(self.mesh.shape[a] for a in sharding_lib.BATCH_AXES)
    self.gap = rollout.LogprobGap()  # the roles' engine-vs-trainer log-prob gap (engine "openai")
    if self.rollout_cfg.engine == "openai":
      self.samplers = self._engine_policies(workdir)
    else:
      self.samplers = {
        role: rollout.RolePolicy(
          sampler_lib.Sampler(
            self._view(role), tokenizer=self.tokenizer, mesh=self.mesh, config=config.sampler
          ),
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
      if role in self.roles or self.rollout_cfg.engine == "jax":  # an engine serves trained roles only
        policy.set_model(self._view(role))

  def _engine_policies(self, workdir: str) -> dict[str, rollout.EngineRolePolicy]:
    """Each trained role sampled from the serving engine at `rollout.engine_url` as its LoRA
    adapter (model name = the role), its adapter synced now and after every update."""
    from lm import generators

    c, r = self.config, self.rollout_cfg
    if not c.lora.enabled:
      raise ValueError("rollout.engine='openai' serves each role as its LoRA adapter: set lora.enabled=True")
    peft = dict(
      rank=c.lora.rank,
      alpha=c.lora.alpha,
      target_modules=tuple(c.lora.targets),
      base_model_name=c.model.checkpoint or c.model.preset,
    )
    policies = {
      role: rollout.EngineRolePolicy(
        generators.OpenAIGenerator(r.engine_url, role, token_ids=True, max_concurrency=64),
        self.tokenizer,
        r.enable_thinking,
        name=role,
        engine_url=r.engine_url,
        adapter_dir=r.engine_adapter_dir or os.path.join(workdir, "engine_adapters"),
        peft=peft,
        gap=self.gap,
        chunk=c.loss.vocab_chunk,
      )
      for role in self.roles
    }
    for role, policy in policies.items():
      policy.set_model(self._view(role))
    return policies

  def _engine_gap(self) -> dict[str, float]:
    """The engine-vs-trainer log-prob gap over the tokens every role sampled since the last call
    (none with the jax engine): `engine_gap/mean_abs`, `engine_gap/max`, `engine_gap/tokens`."""
    return {f"engine_gap/{k}": v for k, v in self.gap.take().items()}

  # -- checkpoints --

  def restore(self) -> int:
    """Resumes from the newest checkpoint that restores (a damaged newer one is set aside with a
    warning, `CheckpointManager.restore_latest`); returns the step to continue after."""
    target = ckpt_lib.abstract_like({"params": self.trainable, "opt_state": self.opt_state})
    latest = self.checkpoints.restore_latest(target)
    if latest is None:
      return -1
    step, restored, meta = latest
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
      if key in _ROW_KEYS:  # [B, ...] rows
        placed[key] = jax.device_put(value, sharding_lib.batch_sharding(self.mesh, value.shape))
      else:
        placed[key] = jax.device_put(value, replicated)
    return placed

  def _chunks(
    self, step: int, cases, seed: int | None = None
  ) -> tuple[dict[str, list], list[dict[str, Any]], dict[str, Any]]:
    """Rollout and packing: chunks per role, the step's records and its rollout metrics."""
    c = self.config
    seed = c.seed if seed is None else seed
    rows_a_pair = 1 if c.loss.share_prompts else 2
    pairs = shapes.round_up(
      c.train.pairs_per_chunk, self.batch_multiple // math.gcd(self.batch_multiple, rows_a_pair)
    )
    if self.method == "dpa_grpo":
      g, v = self.samplers["generator"], self.samplers["verifier"]
      units = rollout.play(cases, g, v, self.rollout_cfg, seed=seed, step=step)
      items = packing.dpa_items(units, self.tokenizer, c.loss)
      chunks = {
        role: packing.dpa_chunks(
          items[role],
          len(self.loss_cfgs[role].components),
          pairs,
          self.pad_id,
          c.loss.aggregate,
          share_prompts=c.loss.share_prompts,
        )
        for role in self.roles
      }
      return chunks, [u.record() for u in units], game_metrics(units, self.rollout_cfg.tolerance)
    groups = rollout.sample_groups(cases, self.samplers["generator"], self.rollout_cfg, seed=seed, step=step)
    rewards = np.array([g.rewards for g in groups])
    metrics = {"reward": float(rewards.mean()), "groups": len(groups)}
    if self.loss_method == "dpa_grpo":  # the reference baseline: the pair loss, tied groups skipped
      items = packing.draft_pair_items(groups)
      chunks = {
        "generator": packing.dpa_chunks(
          items, 1, pairs, self.pad_id, c.loss.aggregate, share_prompts=c.loss.share_prompts
        )
      }
      return chunks, [g.record() for g in groups], {**metrics, "untied_groups": len(items)}
    chunks = {"generator": self._group_chunks(groups)}
    records = [g.record() for g in groups]
    if "verifier" in self.roles:  # testbed v3: `baseline.train_verifier`
      chunks["verifier"], units, verifier_metrics = self._verifier_chunks(step, cases, seed)
      records += [u.record() for u in units]
      metrics.update(verifier_metrics)
    return chunks, records, metrics

  def _group_chunks(self, groups: list[rollout.Group]) -> list[dict[str, np.ndarray]]:
    """Groups of one size as the method's group-loss chunks (`packing.group_chunks`), about
    `train.groups_per_chunk` groups each, rows rounded to the mesh's batch axes; none without groups."""
    if not groups:
      return []
    size = len(groups[0].samples)
    per_chunk = shapes.round_up(self.config.train.groups_per_chunk * size, self.batch_multiple) // size
    return packing.group_chunks(groups, self.method, max(per_chunk, 1), self.pad_id)

  def _verifier_chunks(self, step: int, cases, seed: int):
    """Testbed v3's verifier under a generator-only method (`baseline.train_verifier`): the step
    also plays the game, the verifier sampling `baseline.verifier_group_size` verdicts per unit
    (the first played, so revision and decision happen and are recorded as in every game), and
    each unit's verdicts are a group of the method's own loss (`packing.verifier_groups`).
    Returns (chunks, units, rollout metrics: `verifier_reward`, `verifier_groups`,
    `verifier_untied_groups`, `verifier_valid` over every sampled verdict, and `game`)."""
    b = self.config.baseline
    g, v = self.samplers["generator"], self.samplers["verifier"]
    units = rollout.play(cases, g, v, self.rollout_cfg, seed=seed, step=step, verdicts=b.verifier_group_size)
    groups = packing.verifier_groups(
      units,
      invalid_reward=b.verifier_invalid_reward,
      skip_invalid_draft=self.config.loss.skip_verifier_on_invalid_draft,
    )
    valid = [p.valid for u in units for p in (u.verdict.group_parsed or (u.verdict.parsed,))]
    metrics = {
      "verifier_reward": float(np.mean([g.rewards for g in groups])) if groups else float("nan"),
      "verifier_groups": len(groups),
      "verifier_untied_groups": sum(max(g.rewards) > min(g.rewards) for g in groups),
      "verifier_valid": float(np.mean(valid)),
      "game": game_metrics(units, self.rollout_cfg.tolerance),
    }
    return self._group_chunks(groups), units, metrics

  def train_step(self, step: int) -> dict[str, Any]:
    c = self.config
    rng = np.random.default_rng([c.seed, step, 11])
    batch_idx = rng.choice(
      len(self.train_cases), size=min(c.data.batch_cases, len(self.train_cases)), replace=False
    )
    cases = [self.train_cases[i] for i in sorted(batch_idx)]
    self._engine_gap()  # what evaluation sampled is not this step's
    if c.train.update_every == "case":
      return self._per_case_step(step, cases)
    t0 = time.perf_counter()
    chunks, records, rollout_metrics = self._chunks(step, cases)
    gap = self._engine_gap()
    t1 = time.perf_counter()
    metrics, grad_norm, tokens = self._update(chunks, step)
    t2 = time.perf_counter()
    rundir.append_jsonl(
      os.path.join(self.workdir, "records", "train.jsonl"), [{"step": step, **r} for r in records]
    )
    return {
      "step": step,
      **metrics,
      **gap,
      "grad_norm": float(grad_norm),
      "rollout": rollout_metrics,
      "rollout_s": t1 - t0,
      "update_s": t2 - t1,
      "update_tokens_per_s": tokens / max(t2 - t1, 1e-9),
    }

  def _per_case_step(self, step: int, cases) -> dict[str, Any]:
    """The reference code's schedule: each case is played with the current parameters and
    followed by its own AdamW update; the step's metrics are the mean over its cases (rollout
    metrics: those of the last case). A case's sampling seed derives from (seed, case id)."""
    c = self.config
    t_rollout = t_update = 0.0
    sums: dict[str, float] = {}
    norms, records, tokens = [], [], 0
    rollout_metrics: dict[str, Any] = {}
    for case in cases:
      t0 = time.perf_counter()
      seed = seeding.derive_seed(c.seed, case.case_id)
      chunks, case_records, rollout_metrics = self._chunks(step, [case], seed=seed)
      t1 = time.perf_counter()
      metrics, grad_norm, n = self._update(chunks, step, case.case_id)
      t_rollout, t_update, tokens = t_rollout + t1 - t0, t_update + time.perf_counter() - t1, tokens + n
      for key, value in metrics.items():
        sums[key] = sums.get(key, 0.0) + value / len(cases)
      norms.append(float(grad_norm))
      records.extend(case_records)
    rundir.append_jsonl(
      os.path.join(self.workdir, "records", "train.jsonl"), [{"step": step, **r} for r in records]
    )
    return {
      "step": step,
      **sums,
      **self._engine_gap(),
      "grad_norm": float(np.mean(norms)),
      "updates": len(cases),
      "rollout": rollout_metrics,
      "rollout_s": t_rollout,
      "update_s": t_update,
      "update_tokens_per_s": tokens / max(t_update, 1e-9),
    }

  def _dropout_key(self, *parts: int | str) -> jax.Array | None:
    """The LoRA-dropout key of one chunk's loss, a function of (seed, step, case, role, chunk)
    alone (`lm.seeding`), so a resumed run draws the masks an uninterrupted one drew; None when
    the adapters have no dropout (the train step then compiles today's program)."""
    if not self.policies.lora_dropout:
      return None
    key = jax.random.key(seeding.derive_seed(self.config.seed, "lora_dropout", *parts))
    return jax.device_put(key, NamedSharding(self.mesh, P()))

  def _update(
    self, chunks: dict[str, list], *update_id: int | str
  ) -> tuple[dict[str, float], jax.Array, int]:
    """One optimiser update from the summed gradient of `chunks`: (metrics, grad norm, tokens).
    `update_id` (the step, and the case under the per-case schedule) names it for its dropout keys."""
    grads = jax.tree.map(jnp.zeros_like, self.trainable)
    chunk_metrics = []
    tokens = 0
    for role, role_chunks in chunks.items():
      for index, chunk in enumerate(role_chunks):
        tokens += packing.chunk_tokens(chunk)
        grads, value, parts = step_lib.accumulate(
          grads,
          self.trainable,
          self.frozen,
          self._place(chunk),
          self._dropout_key(*update_id, role, index),
          policies=self.policies,
          role=role,
          method=self.loss_method,
          loss_cfg=self.loss_cfgs[role],
        )
        chunk_metrics.append((role, value, parts))
    # `apply` donates the parameters the samplers view: they are rebuilt right after.
    self.trainable, self.opt_state, grad_norm = step_lib.apply(
      self.trainable, self.opt_state, grads, tx=self.tx
    )
    metrics = step_lib.fetch_metrics(chunk_metrics)
    self._refresh_samplers()
    return metrics, grad_norm, tokens

  def evaluate(self, step: int) -> dict[str, Any]:
    """Temperature-0 play of the test split (the game for DPA-GRPO and for a generator-only method
    that trains the verifier too, `baseline.train_verifier`; drafts for the others). With
    `train.eval_cases` the metrics (and model selection) are those of the first eval_cases test
    cases, the reference code's; the all-cases figure is logged beside as `all_cases`."""
    cfg = self.rollout_cfg
    tol = cfg.tolerance
    n = self.config.train.eval_cases
    first = {case.case_id for case in self.test_cases[:n]}
    if self.config.plays_game:
      g, v = self.samplers["generator"], self.samplers["verifier"]
      units = rollout.play(self.test_cases, g, v, cfg, seed=self.config.seed, step=step, greedy=True)
      metrics, records = game_metrics(units, tol), [u.record() for u in units]
      if n:
        chosen = [u for u in units if u.draft.case_id in first]
        metrics = {**game_metrics(chosen, tol), "all_cases": metrics}
    else:
      greedy = dataclasses.replace(cfg, temperature=0.0, group_size=1)
      groups = rollout.sample_groups(self.test_cases, self.samplers["generator"], greedy, seed=0, step=step)
      metrics, records = draft_metrics(groups, tol), [g.record() for g in groups]
      if n:
        chosen = [g for g in groups if g.case_id in first]
        metrics = {**draft_metrics(chosen, tol), "all_cases": metrics}
    rundir.append_jsonl(
      os.path.join(self.workdir, "records", "eval.jsonl"), [{"step": step, **r} for r in records]
    )
    return metrics


def _drop_after(path: str, step: int) -> None:
  """Rewrites a JSONL log without the records of steps after `step` (written by a killed run)."""
  if not os.path.exists(path) or not rundir.is_writer():
    return
  kept = [r for r in rundir.read_jsonl(path) if r.get("step", -1) <= step]
  rundir.atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))


def run(config: config_lib.ExperimentConfig, workdir: str) -> dict[str, Any]:
  """Trains (or, for zero_shot, evaluates) and returns the summary also written to summary.json."""
  trainer = Trainer(config, workdir)
  c = config.train
  start = trainer.restore()
  steps = 0 if config.method == "zero_shot" else c.steps
  # One process writes the run directory (lm.rundir.is_writer): metrics, records, events, summary.
  writer = _summary_writer(os.path.join(workdir, "tb"), max(start + 1, 0)) if rundir.is_writer() else None
  metrics_path = os.path.join(workdir, "metrics.jsonl")

  def log(entry: dict[str, Any]) -> None:
    rundir.append_jsonl(metrics_path, [entry])
    if writer is None:
      return
    for name, value in scalars("", {k: v for k, v in entry.items() if k != "step"}).items():
      writer.add_scalar(name.lstrip("/"), value, entry["step"])
    writer.flush()

  def evaluate_and_track(step: int) -> dict[str, float] | None:
    """Evaluates; the result competes for the best step (and counts for patience) unless it is the
    untrained model's of a training run under `train.select_initial=False` (the reference's
    selection, whose first evaluation is after step `eval_every`): that one is only logged."""
    metrics = trainer.evaluate(step)
    s = trainer.state
    log({"step": step, "eval": metrics})
    if step == 0 and steps > 0 and not c.select_initial:
      return None
    if s["best"] is None or metrics[BEST_METRIC] > s["best"]:
      s.update(best=metrics[BEST_METRIC], best_step=step, bad_evals=0)
    else:
      s["bad_evals"] += 1
    s["stopped"] = steps > 0 and s["bad_evals"] >= c.patience and step >= c.min_steps
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
  if writer is not None:
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
  if rundir.is_writer():
    rundir.write_json(os.path.join(workdir, "summary.json"), summary)
  return summary


def export(trainer: Trainer, step: int, directory: str) -> None:
  """Writes each trained role of checkpoint `step` as merged HF weights under directory/<role>."""
  target = ckpt_lib.abstract_like({"params": trainer.trainable, "opt_state": trainer.opt_state})
  restored, _ = trainer.checkpoints.restore(step, target)
  for role in trainer.roles:
    model = trainer.policies.policy(restored["params"], trainer.frozen, role)
    lora.export_hf(model, os.path.join(directory, role))  # every process gathers, one writes
    if rundir.is_writer():
      trainer.tokenizer.hf.save_pretrained(os.path.join(directory, role))
