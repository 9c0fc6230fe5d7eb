"""DPA-GRPO's programs planned for a target (`lm.plan`): the train step's `accumulate` (policy
loss, its gradient and the frozen reference's scoring, one chunk), `apply` (the AdamW update) and
the sampler's prefill-and-decode at the config's `sampler.max_rows`, on abstract weights; and the
choice of remat, micro-batch and sampler rows (`loss.remat`, `train.pairs_per_chunk`,
`sampler.max_rows`) that fits a target with headroom.

Each program's peak counts what the trainer keeps beside it (`resident`): the optimiser state, and
every role's sampler's copies (`lm.plan.sampler_held`: the [D, V] head `Sampler.refresh` makes, the
decode layout's weights where they differ from the training layout)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from dpa_grpo import config as config_lib
from dpa_grpo import game, packing, policies, step
from lm import plan as plan_lib
from lm import progress, shapes
from lm import sharding as sharding_lib
from lm.config import ModelConfig

ROLE = "verifier"  # the role planned: its rows are as long as the generator's
PROMPT_TOKENS = 2048  # assumed prompt length of a TaxCalcBench form (a stated model, not measured)


def seq_len(exp: config_lib.ExperimentConfig) -> int:
  """The loss rows' padded width: prompt + the longest completion, bucketed as packing does."""
  longest = max(exp.rollout.max_new_tokens, exp.rollout.verdict_tokens)
  return shapes.width_bucket(PROMPT_TOKENS + longest)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShapedStep:
  """What `accumulate`, `apply` and the sampler of one preset are built from on one target: their
  abstract inputs (`shaped_step`), which the plan compiles and the device check fills with arrays."""

  accumulate_args: tuple  # (grads, trainable, frozen, batch, dropout_key), abstract
  accumulate_kwargs: dict
  chunk: dict  # the batch as host arrays (the abstract `batch` is its shapes and shardings)
  policies: Any
  trainable: Any
  frozen: Any
  opt_state: Any
  tx: Any
  mesh: Any
  shard: sharding_lib.ShardingConfig
  model: tuple[float, float]  # counted (FLOPs, bytes) of one accumulate call per device
  detail: str
  sampler_head: int  # per device, one role's sampler's [D, V] head copy (`lm.plan.sampler_held`)
  sampler_copy: int  # per device, one role's sampler's decode-layout weight copy (0: none)

  @property
  def samplers_held(self) -> int:
    """Per device, what every role's sampler keeps through the train step (the trainer has one a role)."""
    return len(game.ROLES) * (self.sampler_head + self.sampler_copy)


def shaped_step(exp: config_lib.ExperimentConfig, target: plan_lib.Target, length: int = 0) -> ShapedStep:
  """The train step's abstract inputs for `exp` on `target` (as maxtext's `get_shaped_inputs`): the
  plan compiles them, the device check (`dpa_grpo.device_check`) runs them on real arrays."""
  shard = sharding_lib.ShardingConfig()
  devices = plan_lib.target_devices(target)
  mesh = plan_lib.target_mesh(devices, exp.mesh)
  impl, stand_in = exp.model.attention_impl, ""
  if impl == "cudnn" and jax.default_backend() != "gpu":
    # cuDNN's attention lowers only where a cuDNN library and a GPU are (a deviceless compile has
    # neither): the plan compiles the blockwise attention in its place. On an H200 the two compiled
    # to 119.1 and 117.5 GiB (16 pairs; docs/results/2026-12-04-attention-choice.md), within the
    # plan's 10% headroom.
    impl, stand_in = "blockwise", "; attention cuDNN, compiled as blockwise (no cuDNN without a GPU)"
  overrides = dict(exp.model.overrides, attention_impl=impl)
  model_cfg = ModelConfig.preset(exp.model.preset, **overrides)
  model = plan_lib.abstract_model(model_cfg, exp.model.dtype, mesh, shard)
  host_mesh = sharding_lib.make_mesh(sharding_lib.MeshConfig(1, 1, 1), jax.devices("cpu")[:1])
  pols, trainable, frozen = policies.init_policies(model, exp.lora, exp.roles, host_mesh, seed=exp.seed)
  trainable = plan_lib.abstract(trainable, mesh)  # adapters are replicated (`init_policies`)
  if not exp.lora.enabled:  # full fine-tuning: the trainable backbone sharded like the frozen one
    trainable = {"backbone": frozen}
  batch_multiple = math.prod(mesh.shape[a] for a in sharding_lib.BATCH_AXES)
  pairs = shapes.round_up(exp.train.pairs_per_chunk, batch_multiple // math.gcd(batch_multiple, 2))
  length = length or seq_len(exp)
  loss_cfg = step.loss_configs(exp.method, exp.loss, exp.baseline, max_new_tokens=exp.rollout.max_new_tokens)
  role = ROLE if ROLE in loss_cfg else next(iter(loss_cfg))
  completion = length // 4
  items = [
    packing.Item(prompt=[1] * (length - completion), completions=([1] * completion,) * 2, rewards=(1.0, 0.0),
                 component=0)
    for _ in range(pairs)
  ]  # fmt: skip
  (chunk,) = packing.dpa_chunks(
    items, len(loss_cfg[role].components), pairs, 0, exp.loss.aggregate, share_prompts=exp.loss.share_prompts
  )
  batch = plan_lib.abstract_rows(chunk, mesh, shard)
  key = None
  if exp.lora.enabled and exp.lora.dropout > 0:
    key = plan_lib.abstract(jax.random.key(0), mesh)
  tx = step.optimizer(exp.optim, exp.train.steps)
  opt_state = jax.eval_shape(tx.init, trainable)
  opt_state = plan_lib.abstract(opt_state, mesh) if exp.lora.enabled else _like_params(opt_state, trainable)
  rows = 2 * pairs
  fwd = plan_lib.forward_flops(model_cfg, rows, length) / len(devices)
  extra = {"none": 0.0, "dots_saveable": 0.5, "full": 1.0}[exp.loss.remat]
  weights = plan_lib.tree_bytes(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), frozen))
  passes = 3 + extra  # policy forward, its backward (activation gradients), the reference's forward
  head, copied = plan_lib.sampler_held(pols.policy(trainable, frozen, role), mesh, exp.sampler)
  detail = f"{role}, {rows} rows x {length} tokens, remat {exp.loss.remat}{stand_in}"
  if target.slices > 1:  # the step's one exchange across slices / nodes: its gradients' all-reduce
    share = 2 * (target.slices - 1) / target.slices
    seconds = share * plan_lib.tree_bytes(trainable) / target.dcn_bandwidth
    detail += f"; gradient all-reduce across {target.slices} slices / nodes {seconds:.3g} s a step (model)"
  return ShapedStep(
    accumulate_args=(trainable, trainable, frozen, batch, key),
    accumulate_kwargs=dict(policies=pols, role=role, method=exp.method, loss_cfg=loss_cfg[role]),
    chunk=chunk,
    policies=pols,
    trainable=trainable,
    frozen=frozen,
    opt_state=opt_state,
    tx=tx,
    mesh=mesh,
    shard=shard,
    model=(fwd * passes, weights * passes),
    detail=detail,
    sampler_head=head,
    sampler_copy=copied,
  )


def programs(
  exp: config_lib.ExperimentConfig,
  target: plan_lib.Target,
  *,
  train: bool = True,
  sample: bool = True,
  length: int = 0,
  prompt_tokens: int = PROMPT_TOKENS,
) -> list[plan_lib.ProgramPlan]:
  """`accumulate`, `apply` (and the sampler's program at `exp.sampler.max_rows` rows) of `exp`'s
  preset compiled for `target`; `length`: the loss rows' width (0: `seq_len`)."""
  su = shaped_step(exp, target, length)
  opt_state = plan_lib.tree_bytes(su.opt_state)
  frozen = plan_lib.tree_bytes(su.frozen)
  out = []
  if train:
    out += [
      plan_lib.compile_program(
        "accumulate", step.accumulate, su.accumulate_args, su.accumulate_kwargs, target, model=su.model,
        resident=opt_state + su.samplers_held, detail=su.detail,
      ),
      plan_lib.compile_program(
        "apply", step.apply, (su.trainable, su.opt_state, su.trainable), dict(tx=su.tx), target,
        model=(0.0, 4 * plan_lib.tree_bytes(su.trainable)), resident=frozen + su.samplers_held,
      ),
    ]  # fmt: skip
  if sample:
    sampled = su.policies.policy(su.trainable, su.frozen, su.accumulate_kwargs["role"])
    # Beside a role's sampling: the optimiser state, the other roles' samplers, and the training
    # layout's weights where this sampler reads a copy of them.
    others = su.samplers_held - su.sampler_head - su.sampler_copy
    out.append(
      plan_lib.sampler_program(
        sampled, su.mesh, target, rows=exp.sampler.max_rows, prompt_len=prompt_tokens,
        new_tokens=exp.rollout.max_new_tokens, n=1, config=exp.sampler,
        resident=opt_state + others + (frozen if su.sampler_copy else 0),
      )
    )  # fmt: skip
  return out


def _like_params(opt_state: Any, trainable: Any) -> Any:
  """Full fine-tuning: optimiser moments sharded like the parameters they follow (by shape)."""
  by_shape = {tuple(x.shape): x.sharding for x in jax.tree.leaves(trainable)}
  return jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=by_shape.get(tuple(x.shape), None)), opt_state
  )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
  """A fitting setting and its programs: `overrides` are `--config.*` flags."""

  overrides: dict[str, Any]
  programs: list[plan_lib.ProgramPlan]
  fits: bool
  tried: tuple[str, ...] = ()  # the candidates before it that did not fit, and why


# Tried in order, fastest first: remat none → dots_saveable → full, then smaller micro-batches.
CANDIDATES = (("none", 1), ("dots_saveable", 1), ("full", 1), ("full", 2), ("full", 4), ("full", 8))


def choose(
  config: dict,
  target: plan_lib.Target,
  *,
  headroom: float = plan_lib.HEADROOM,
  sample: bool = True,
  length: int = 0,
  prompt_tokens: int = PROMPT_TOKENS,
  search_mesh: bool = True,
) -> Choice:
  """The first mesh (`lm.plan.mesh_candidates`: the preset's, data parallel across slices, first;
  then the least communication first) on which `search` fits `target`'s budget (`lm.plan.budget`:
  the memory JAX may use less `headroom`); the preset mesh's search when none does. `tried` names
  each mesh ruled out with its last candidate's reason. `config`: a preset's `to_dict()`;
  `search_mesh=False`: the preset's mesh only."""
  budget = plan_lib.budget(target, headroom)
  base = config_lib.ExperimentConfig.from_dict(config)
  model_cfg = ModelConfig.preset(base.model.preset, **dict(base.model.overrides))
  meshes = plan_lib.mesh_candidates(target, model_cfg, plan_lib.across_slices(base.mesh, target))
  meshes = meshes if search_mesh else meshes[:1]
  first, ruled_out = None, []
  for mesh, note in meshes:
    at = dataclasses.replace(base, mesh=mesh)
    choice = search(at, target, budget, sample=sample, length=length, prompt_tokens=prompt_tokens)
    first = first or choice
    if choice.fits:
      if note:  # the KV heads replicated over tp: said beside the programs
        choice = dataclasses.replace(
          choice,
          programs=[
            dataclasses.replace(p, detail=f"{p.detail}; {note}".lstrip("; ")) for p in choice.programs
          ],
        )
      return dataclasses.replace(choice, tried=(*ruled_out, *choice.tried))
    label = plan_lib.mesh_label(mesh, target.devices) + (f" ({note})" if note else "")
    last = choice.tried[-1] if choice.tried else "peak over budget"
    ruled_out.append(f"{label}: no candidate fits, the last {last}")
  return dataclasses.replace(first, tried=(*first.tried, *ruled_out[1:]))


def search(
  base: config_lib.ExperimentConfig,
  target: plan_lib.Target,
  budget: int,
  *,
  sample: bool = True,
  length: int = 0,
  prompt_tokens: int = PROMPT_TOKENS,
) -> Choice:
  """On `base`'s mesh: the first candidate (remat, pairs_per_chunk ÷ k) whose training programs fit
  `budget`, then the most sampler rows a call (the config's `sampler.max_rows`, halved until it
  fits) whose program fits beside them; the last one tried when none does. It fits only when every
  program does; the sampler is not compiled when no training candidate fits, nor at a row count
  whose weights and KV cache alone exceed the budget (`lm.plan.sampler_floor`)."""
  choice, tried, exp = None, [], base
  start = [r for r, _ in CANDIDATES].index(base.loss.remat) if base.loss.remat != "none" else 0
  for remat, divide in CANDIDATES[start:]:
    pairs = max(1, base.train.pairs_per_chunk // divide)
    exp = dataclasses.replace(
      base,
      loss=dataclasses.replace(base.loss, remat=remat),
      train=dataclasses.replace(base.train, pairs_per_chunk=pairs),
    )
    overrides = {"loss.remat": remat, "train.pairs_per_chunk": pairs, **_mesh_overrides(exp.mesh)}
    label = plan_lib.mesh_label(exp.mesh, target.devices)
    progress.say(f"plan {target.name}: compiling accumulate and apply, remat {remat}, {pairs} pairs, {label}")
    plan_lib.release()
    try:
      train_programs = programs(exp, target, sample=False, length=length)
    except Exception as e:  # noqa: BLE001 -- an out-of-memory refusal is a candidate that does not fit
      if plan_lib.refusal(e) is None:
        raise
      tried.append(f"remat {remat}, {pairs} pairs: refused ({plan_lib.refusal(e)})")
      choice = Choice(overrides=overrides, programs=[], fits=False, tried=tuple(tried))
      continue
    peak = max(p.peak for p in train_programs)
    choice = Choice(overrides=overrides, programs=train_programs, fits=peak <= budget, tried=tuple(tried))
    if choice.fits:
      break
    tried.append(f"remat {remat}, {pairs} pairs: peak {peak / plan_lib.GiB:.1f} GiB")
  if not sample or not choice.fits:  # the sampler runs beside training: no use planning it alone
    return choice
  rows = base.sampler.max_rows
  model_cfg = ModelConfig.preset(exp.model.preset, **dict(exp.model.overrides))
  slots = prompt_tokens + exp.rollout.max_new_tokens
  while True:
    at = dataclasses.replace(exp, sampler=dataclasses.replace(exp.sampler, max_rows=rows))
    floor = plan_lib.sampler_floor(model_cfg, exp.model.dtype, exp.mesh.shape(target.devices), rows, slots)
    if floor > budget and rows > 1:  # its weights and KV cache alone: fewer rows, uncompiled
      alone = f"weights + KV cache alone {floor / plan_lib.GiB:.1f} GiB (model)"
      tried.append(f"sampler at {rows} rows: not compiled, {alone}")
      rows //= 2
      continue
    progress.say(f"plan {target.name}: compiling the sampler at {rows} rows")
    plan_lib.release()
    try:
      (sampled,) = programs(at, target, train=False, length=length, prompt_tokens=prompt_tokens)
      why = None if sampled.peak <= budget else f"peak {sampled.peak / plan_lib.GiB:.1f} GiB"
    except Exception as e:  # noqa: BLE001 -- the sampler refused for memory: fewer rows may fit
      if plan_lib.refusal(e) is None:
        raise
      sampled, why = None, f"refused ({plan_lib.refusal(e)})"
    if why is None or rows == 1:
      break
    tried.append(f"sampler at {rows} rows: {why}")
    rows //= 2
  return Choice(
    overrides={**choice.overrides, "sampler.max_rows": rows},
    programs=[*choice.programs, *([sampled] if sampled else [])],
    fits=choice.fits and why is None,
    tried=(*tried, *([f"sampler at {rows} rows: {why}"] if why else [])),
  )


def check(
  config: dict,
  target: plan_lib.Target,
  *,
  headroom: float = plan_lib.HEADROOM,
  prompt_tokens: int = PROMPT_TOKENS,
) -> Choice:
  """The config's own programs on `target`, as given (no search): what `launch.dpa_grpo --dry_run`
  prints for this host's devices. It fits when every program's peak is within `lm.plan.budget`."""
  exp = config_lib.ExperimentConfig.from_dict(config)
  budget = plan_lib.budget(target, headroom)
  compiled = programs(exp, target, prompt_tokens=prompt_tokens)
  return Choice(overrides={}, programs=compiled, fits=all(p.peak <= budget for p in compiled))


def _mesh_overrides(mesh: sharding_lib.MeshConfig) -> dict[str, int]:
  return {f"mesh.{k}": v for k, v in dataclasses.asdict(mesh).items()}


def as_flags(overrides: dict[str, Any]) -> list[str]:
  """`--config.<key>=<value>` flags of a choice's overrides."""
  return [f"--config.{k}={v}" for k, v in overrides.items()]
