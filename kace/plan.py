"""KACE's in-process solver planned for a target (`lm.plan`): the sampler's prefill-and-decode
program at the preset's sampling budget, and the most rows per call (`sampler.max_rows`), on the
first mesh searched that fits with headroom. KACE trains nothing, so the sampler is its only
program."""

from __future__ import annotations

import dataclasses
from typing import Any

from lm import plan as plan_lib
from lm import progress
from lm import sampler as sampler_lib
from lm import sharding as sharding_lib
from lm.config import ModelConfig
from lm.sampler import SamplerConfig

PROMPT_TOKENS = 2048  # assumed: a problem, the cards in the prompt and the chat template (a model)
ROWS = (256, 128, 64, 32, 16, 8, 4, 2, 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
  overrides: dict[str, Any]
  programs: list[plan_lib.ProgramPlan]
  fits: bool
  tried: tuple[str, ...] = ()  # the row counts before it that did not fit, and why


@dataclasses.dataclass(frozen=True, kw_only=True)
class Solver:
  """The solver's sampler for one row count on a target, abstract (`solver_shaped`): what the plan
  compiles and the device check (`kace.device_check`) runs."""

  model: Any  # `lm.plan.abstract_model`: parameters as `ShapeDtypeStruct`s with their shardings
  mesh: Any
  sampler: SamplerConfig
  shaped: Any  # `lm.sampler.ShapedSampler`
  rows: int  # asked (the sampler buckets them: `shaped.prompts` were compiled)
  prompt_tokens: int
  new_tokens: int


def solver_shaped(
  config: dict,
  target: plan_lib.Target,
  *,
  rows: int,
  prompt_tokens: int = PROMPT_TOKENS,
  mesh: sharding_lib.MeshConfig | None = None,
) -> Solver:
  """The solver's sampler programs for `rows` rows (n = 1 each) on `target`, on `mesh` (default the
  preset's, data parallel across slices), at the preset's sampling budget, uncompiled."""
  solver = config["roles"]["solver"]
  mesh_cfg = mesh or plan_lib.across_slices(sharding_lib.MeshConfig(**solver["mesh"]), target)
  mesh = plan_lib.target_mesh(plan_lib.target_devices(target), mesh_cfg)
  model = plan_lib.abstract_model(solver_model(config), solver["dtype"], mesh, sharding_lib.ShardingConfig())
  sampler = SamplerConfig(**{**solver["sampler"], "max_rows": rows})
  new_tokens = config["sampling"]["max_tokens"]
  shaped = sampler_lib.shaped_programs(
    model, mesh, rows=rows, prompt_len=prompt_tokens, new_tokens=new_tokens, n=1, config=sampler,
    platform=plan_lib.sampler_platform(target),
  )  # fmt: skip
  return Solver(
    model=model, mesh=mesh, sampler=sampler, shaped=shaped, rows=rows, prompt_tokens=prompt_tokens,
    new_tokens=new_tokens,
  )  # fmt: skip


def solver_program(solver: Solver, target: plan_lib.Target, compiled: Any = None) -> plan_lib.ProgramPlan:
  """The plan's figures of `solver`'s program (`solver_shaped`) on `target`, compiled
  (`lm.plan.sampler_program`); `compiled`: its compile, read instead of compiling again (the device
  check compiles it to run it)."""
  return plan_lib.sampler_program(
    solver.model, solver.mesh, target,
    rows=solver.rows,  # the sampler buckets the prompt rows itself; the notes say what was compiled
    prompt_len=solver.prompt_tokens, new_tokens=solver.new_tokens, n=1, config=solver.sampler,
    shaped=solver.shaped, compiled=compiled,
  )  # fmt: skip


def solver_model(config: dict) -> ModelConfig:
  return ModelConfig.preset(config["roles"]["solver"].get("preset") or "qwen3_4b")


def choose(
  config: dict,
  target: plan_lib.Target,
  *,
  headroom: float = plan_lib.HEADROOM,
  prompt_tokens: int = PROMPT_TOKENS,
  search_mesh: bool = True,
):
  """The most rows a call (at most the preset's `max_rows`), and at that row count the first mesh
  (`lm.plan.mesh_candidates`: the preset's first, then the least communication first) whose program
  fits `target`'s budget (`lm.plan.budget`: the memory JAX may use less `headroom`); the last
  compiled when none does. A mesh whose weights and KV cache alone exceed the budget
  (`lm.plan.sampler_floor`) is skipped uncompiled. `search_mesh=False`: the preset's mesh only."""
  budget = plan_lib.budget(target, headroom)
  solver = config["roles"]["solver"]
  model_cfg = solver_model(config)
  most = solver["sampler"].get("max_rows", 256)
  first = plan_lib.across_slices(sharding_lib.MeshConfig(**solver["mesh"]), target)
  meshes = plan_lib.mesh_candidates(target, model_cfg, first)
  meshes = meshes if search_mesh else meshes[:1]
  length = prompt_tokens + config["sampling"]["max_tokens"]
  choice, tried = None, []
  for rows in [r for r in ROWS if r <= most] or [most]:
    for mesh, note in meshes:
      shape = mesh.shape(target.devices)
      at = f"{rows} rows, {plan_lib.mesh_label(mesh, target.devices)}" + (f" ({note})" if note else "")
      overrides = {"roles.solver.sampler.max_rows": rows}
      overrides |= {f"roles.solver.mesh.{k}": v for k, v in zip(("data", "fsdp", "tp"), shape, strict=True)}
      floor = plan_lib.sampler_floor(model_cfg, solver["dtype"], shape, rows, length)
      if len(meshes) > 1 and floor > budget:
        tried.append(f"{at}: not compiled, weights + KV cache alone {floor / plan_lib.GiB:.1f} GiB (model)")
        continue
      progress.say(f"plan {target.name}: compiling the solver at {at}")  # a search may take an hour
      try:
        shaped = solver_shaped(config, target, rows=rows, prompt_tokens=prompt_tokens, mesh=mesh)
        program = solver_program(shaped, target)
      except Exception as e:  # noqa: BLE001 -- an out-of-memory refusal is a candidate that does not fit
        if plan_lib.refusal(e) is None:
          raise
        tried.append(f"{at}: refused ({plan_lib.refusal(e)})")
        choice = Choice(overrides=overrides, programs=[], fits=False, tried=tuple(tried))
        continue
      if note:
        program = dataclasses.replace(program, detail=f"{program.detail}; {note}")
      choice = Choice(
        overrides=overrides, programs=[program], fits=program.peak <= budget, tried=tuple(tried)
      )
      if choice.fits:
        return choice
      tried.append(f"{at}: peak {program.peak / plan_lib.GiB:.1f} GiB")
  if choice is None:  # every candidate skipped uncompiled
    return Choice(overrides={}, programs=[], fits=False, tried=tuple(tried))
  return dataclasses.replace(choice, tried=tuple(tried))


# Each in-process role's new tokens: the solver samples at `sampling`, the classifier at
# `classifier_sampling`, the teacher, curator and router at `role_sampling` (configs/kace.py).
ROLE_SAMPLING = {"solver": "sampling", "classifier": "classifier_sampling"}
TINY_PROMPT_TOKENS = 512  # assumed: a synthetic problem and its cards for the CPU-scale tiny solver


def role_model(config: dict, role: str) -> tuple[ModelConfig | None, str]:
  """(the model of a role that runs in this process, else None; why not or where it comes from).
  The CPU presets' solver is built at run time (`kace.synthetic`): planned from its config's sizes,
  its vocabulary at most `vocab_size` (the BPE tokenizer's target)."""
  section = config["roles"][role]
  if section is None:
    return None, "played by the solver"
  if section["kind"] != "jax":
    return None, f"kind {section['kind']}: not in this process"
  model = plan_lib.generator_model(section)
  if model is not None:
    return model, ""
  if role == "solver" and config["synthetic"]["build_solver"]:
    from kace import config as config_lib

    tiny = config_lib.KaceConfig.from_dict(config).synthetic.tiny_solver()
    sizes = (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_layers",
      "num_heads",
      "num_kv_heads",
      "head_dim",
    )
    model = ModelConfig(
      **{k: getattr(tiny, k) for k in sizes},
      max_position_embeddings=2048,
      bos_token_id=None,
      eos_token_ids=(1, 0),
    )
    return (
      model,
      f"the tiny solver built at run time (kace.synthetic), its vocabulary at most {tiny.vocab_size}",
    )
  return None, "no checkpoint directory or preset to read its model from"


def check(
  config: dict,
  target: plan_lib.Target,
  *,
  headroom: float = plan_lib.HEADROOM,
  prompt_tokens: int = PROMPT_TOKENS,
):
  """`launch.kace_eval` / `kace_build --dry_run`: every role that samples in this process (kind
  jax), at its own `sampler.max_rows` rows and mesh, prompts of `prompt_tokens` (a model; the
  CPU-scale tiny solver's `TINY_PROMPT_TOKENS`); the roles not planned, and why, in `notes`. It
  fits when every program does (a config whose roles all run elsewhere has none)."""
  budget = plan_lib.budget(target, headroom)
  programs, notes = [], []
  for role in ("solver", "classifier", "teacher", "curator", "router"):
    model, why = role_model(config, role)
    if model is None:
      notes.append(f"{role}: not planned, {why}")
      continue
    section = config["roles"][role]
    rows, new_tokens = (
      section["sampler"]["max_rows"],
      config[ROLE_SAMPLING.get(role, "role_sampling")]["max_tokens"],
    )
    prompt = TINY_PROMPT_TOKENS if why.startswith("the tiny solver") else prompt_tokens
    program = plan_lib.generator_program(
      f"sample ({role})", model, section, target, rows=rows, prompt_len=prompt, new_tokens=new_tokens
    )
    programs.append(dataclasses.replace(program, detail=f"{program.detail}; {why}") if why else program)
  fits = all(p.peak <= budget for p in programs)
  return plan_lib.Checked(programs=programs, fits=fits, notes=tuple(notes))
