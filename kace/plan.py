"""KACE's in-process roles planned for a target (`lm.plan`): the solver's prefill-and-decode program
at the preset's sampling budget with the most rows a call (`sampler.max_rows`, up to 256) on the
first mesh searched that fits with headroom (what `launch.kace_eval` runs); and where the preset
runs its teacher and curator in the same process (`kind: jax`, e.g. Qwen3-32B), their sampler
planned beside the solver's resident weights (the frugal search: the mesh that fits one row with
the least memory, then as many rows as fit on it), and the solver's program beside theirs (what
`launch.kace_build` runs: `kace.methods.role` keeps every role it loads). KACE trains nothing, so
the samplers are its only programs.

A candidate (rows, mesh) whose weights and KV cache alone exceed the budget (`lm.plan.sampler_floor`)
is skipped uncompiled; every other is compiled whole. Screening by a peak extrapolated from compiles
at reduced depth was tried and dropped: for the 4B solver on v5p-8 (data 4) it was exact at 16 rows
(40.20 GiB from 2 and 4 layers, 40.26 compiled whole) and 76% high at 32 rows (114.9 GiB against
65.4), so it would have ruled out the row count that fits (XLA lays out a 2- or 4-layer program's
buffers unlike a 36-layer one's)."""

from __future__ import annotations

import dataclasses
from typing import Any

from flax import nnx

from lm import plan as plan_lib
from lm import progress
from lm import sampler as sampler_lib
from lm import sharding as sharding_lib
from lm.config import ModelConfig
from lm.sampler import SamplerConfig

PROMPT_TOKENS = 2048  # assumed: a problem, the cards in the prompt and the chat template (a model)
ROWS = (256, 128, 64, 32, 16, 8, 4, 2, 1)
# A teacher or curator given neither checkpoint nor preset is planned as the papers' Qwen3-32B.
ASSUMED_ROLE_PRESET = "qwen3_32b"
BUILD_ROLES = ("teacher", "curator")


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
  overrides: dict[str, Any]
  programs: list[plan_lib.ProgramPlan]
  fits: bool
  tried: tuple[str, ...] = ()  # the candidates before it that did not fit, and why
  notes: tuple[str, ...] = ()  # assumptions, and what was not planned and why


def role_prompt_tokens(config: dict, role: str, prompt_tokens: int = PROMPT_TOKENS) -> int:
  """A role's prompt tokens (a model): the solver's `prompt_tokens`; a teacher's or curator's
  `learn.failures_per_prompt` failed traces of `learn.attempt_tokens` each beside them."""
  if role == "solver":
    return prompt_tokens
  learn = config["learn"]
  return prompt_tokens + learn["failures_per_prompt"] * learn["attempt_tokens"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sampled:
  """A role's sampler for one row count on a target, abstract (`shaped`): what the plan compiles
  and the device check (`kace.device_check`) runs."""

  role: str
  model: Any  # `lm.plan.abstract_model`: parameters as `ShapeDtypeStruct`s with their shardings
  mesh: Any
  sampler: SamplerConfig
  shaped: Any  # `lm.sampler.ShapedSampler`
  rows: int  # asked (the sampler buckets them: `shaped.prompts` were compiled)
  prompt_tokens: int  # the role's (`role_prompt_tokens`)
  new_tokens: int


def shaped(
  config: dict,
  role: str,
  target: plan_lib.Target,
  *,
  rows: int,
  prompt_tokens: int = PROMPT_TOKENS,
  mesh: sharding_lib.MeshConfig | None = None,
) -> Sampled:
  """`role`'s sampler programs for `rows` rows (n = 1 each) on `target`, uncompiled: on `mesh`
  (default the role's own, data parallel across slices), at the role's prompt and sampling budget."""
  section = config["roles"][role]
  model_cfg, _ = planned_model(config, role)
  mesh_cfg = mesh or plan_lib.across_slices(sharding_lib.MeshConfig(**section["mesh"]), target)
  on = plan_lib.target_mesh(plan_lib.target_devices(target), mesh_cfg)
  model = plan_lib.abstract_model(model_cfg, section["dtype"], on, sharding_lib.ShardingConfig())
  sampler = SamplerConfig(**{**section["sampler"], "max_rows": rows})
  prompt = role_prompt_tokens(config, role, prompt_tokens)
  new_tokens = config[ROLE_SAMPLING.get(role, "role_sampling")]["max_tokens"]
  programs = sampler_lib.shaped_programs(
    model, on, rows=rows, prompt_len=prompt, new_tokens=new_tokens, n=1, config=sampler,
    platform=plan_lib.sampler_platform(target),
  )  # fmt: skip
  return Sampled(
    role=role, model=model, mesh=on, sampler=sampler, shaped=programs, rows=rows, prompt_tokens=prompt,
    new_tokens=new_tokens,
  )  # fmt: skip


def compiled_program(
  sampled: Sampled, target: plan_lib.Target, compiled: Any = None, resident: int = 0
) -> plan_lib.ProgramPlan:
  """The plan's figures of `sampled`'s program on `target` (`lm.plan.sampler_program`), `resident`
  bytes a device holds beside it (other roles' weights); `compiled`: its compile, read instead of
  compiling again (the device check compiles it to run it)."""
  out = plan_lib.sampler_program(
    sampled.model, sampled.mesh, target,
    rows=sampled.rows,  # the sampler buckets the prompt rows itself; the notes say what was compiled
    prompt_len=sampled.prompt_tokens, new_tokens=sampled.new_tokens, n=1, config=sampled.sampler,
    resident=resident, shaped=sampled.shaped, compiled=compiled,
  )  # fmt: skip
  return dataclasses.replace(out, name="sample" if sampled.role == "solver" else f"sample ({sampled.role})")


def program(config: dict, role: str, target: plan_lib.Target, *, resident: int = 0, **shape: Any):
  """`role`'s program (`shaped`'s keyword arguments) compiled, its figures beside `resident` bytes."""
  return compiled_program(shaped(config, role, target, **shape), target, resident=resident)


def solver_model(config: dict) -> ModelConfig:
  return planned_model(config, "solver")[0]


def planned_model(config: dict, role: str) -> tuple[ModelConfig, str]:
  """(the model a role is planned with: `role_model`'s, else an assumed one; the assumption, "" when
  none): a solver given no model as Qwen3-4B, a teacher or curator as the papers' Qwen3-32B."""
  model, _ = role_model(config, role)
  if model is not None:
    return model, ""
  assumed = "qwen3_4b" if role == "solver" else ASSUMED_ROLE_PRESET
  return ModelConfig.preset(assumed), f"{role}: no checkpoint or preset given, planned as {assumed}"


def held_bytes(config: dict, role: str, target: plan_lib.Target, mesh: sharding_lib.MeshConfig) -> int:
  """Per device, what a loaded role keeps between its calls on `mesh`: its weights as sharded and
  its sampler's copies (`lm.plan.sampler_held`)."""
  section = config["roles"][role]
  on = plan_lib.target_mesh(plan_lib.target_devices(target), mesh)
  model = plan_lib.abstract_model(
    planned_model(config, role)[0], section["dtype"], on, sharding_lib.ShardingConfig()
  )
  head, copy = plan_lib.sampler_held(model, on, SamplerConfig(**section["sampler"]))
  return plan_lib.tree_bytes(nnx.state(model, nnx.Param)) + head + copy


def search(
  config: dict,
  role: str,
  target: plan_lib.Target,
  budget: int,
  *,
  most: int,
  resident: int = 0,
  prompt_tokens: int = PROMPT_TOKENS,
  search_mesh: bool = True,
  frugal: bool = False,
) -> Choice:
  """The most rows a call (at most `most`) and, at that row count, the first mesh
  (`lm.plan.mesh_candidates`: the role's own first, then the least communication first) whose
  program fits `budget` beside `resident` bytes; the last compiled when none does. A candidate is
  skipped uncompiled when its weights and KV cache alone exceed the budget (`lm.plan.sampler_floor`).

  `frugal` (the build roles' search, `choose`): one row on each mesh, the least memory first (the
  lowest floor at one row; at equal floors one that does not replicate the KV heads over tp, then
  the most tp, which also splits the prefill's temporaries by heads), until one fits; then rows
  ascending on that mesh until one does not fit. Why: a 32B teacher was compiled at every mesh for
  every row count from its most down, 8-11 min a TPU compile here (v6e-8 ran 95 min without an
  answer, docs/results/2026-12-05-plan-table.md). "Fits nowhere" stays exact (every mesh at one
  row), in a third of the compiles; where it fits, the rows are the most on the first mesh that
  fits one row, which may be fewer than another mesh would take: for a role a build calls a few
  times, the fit is what matters."""
  section = config["roles"][role]
  model_cfg, _ = planned_model(config, role)
  first = plan_lib.across_slices(sharding_lib.MeshConfig(**section["mesh"]), target)
  meshes = plan_lib.mesh_candidates(target, model_cfg, first)
  meshes = meshes if search_mesh else meshes[:1]
  prompt = role_prompt_tokens(config, role, prompt_tokens)
  length = prompt + config[ROLE_SAMPLING.get(role, "role_sampling")]["max_tokens"]
  prefix = "" if role == "solver" else f"{role}: "
  floor = lambda mesh, rows: (  # noqa: E731
    plan_lib.sampler_floor(model_cfg, section["dtype"], mesh.shape(target.devices), rows, length) + resident
  )
  row_counts = [r for r in ROWS if r <= most] or [most]
  if frugal:
    meshes = sorted(meshes, key=lambda m: (floor(m[0], 1), bool(m[1]), -m[0].shape(target.devices)[2]))
    row_counts = row_counts[::-1]
  choice, fitting, tried = None, None, []
  for rows in row_counts:
    fits_now = False
    for mesh, note in meshes:
      shape = mesh.shape(target.devices)
      at = f"{prefix}{rows} rows, {plan_lib.mesh_label(mesh, target.devices)}" + (
        f" ({note})" if note else ""
      )
      overrides = {f"roles.{role}.sampler.max_rows": rows}
      overrides |= {f"roles.{role}.mesh.{k}": v for k, v in zip(("data", "fsdp", "tp"), shape, strict=True)}
      alone = floor(mesh, rows)
      if alone > budget:  # a lower bound over the budget: cannot fit, not compiled
        tried.append(f"{at}: not compiled, weights + KV cache alone {alone / plan_lib.GiB:.1f} GiB (model)")
        continue
      progress.say(f"plan {target.name}: compiling {at}")  # a search may take an hour
      plan_lib.release()
      try:
        compiled = program(
          config, role, target, rows=rows, prompt_tokens=prompt_tokens, mesh=mesh, resident=resident
        )
      except Exception as e:  # noqa: BLE001 -- an out-of-memory refusal is a candidate that does not fit
        if plan_lib.refusal(e) is None:
          raise
        tried.append(f"{at}: refused ({plan_lib.refusal(e)})")
        choice = Choice(overrides=overrides, programs=[], fits=False, tried=tuple(tried))
        continue
      if note:
        compiled = dataclasses.replace(compiled, detail=f"{compiled.detail}; {note}")
      choice = Choice(
        overrides=overrides, programs=[compiled], fits=compiled.peak <= budget, tried=tuple(tried)
      )
      if choice.fits and not frugal:
        return choice
      if choice.fits:
        fitting, fits_now, meshes = choice, True, [(mesh, note)]  # more rows: on this mesh only
        break
      tried.append(f"{at}: peak {compiled.peak / plan_lib.GiB:.1f} GiB")
    if frugal and not fits_now:  # ascending: the first row count that does not fit ends the search
      break
  if fitting is not None:
    return dataclasses.replace(fitting, tried=tuple(tried))
  if choice is None:  # every candidate skipped uncompiled
    return Choice(overrides={}, programs=[], fits=False, tried=tuple(tried))
  return dataclasses.replace(choice, tried=tuple(tried))


def choose(
  config: dict,
  target: plan_lib.Target,
  *,
  headroom: float = plan_lib.HEADROOM,
  prompt_tokens: int = PROMPT_TOKENS,
  search_mesh: bool = True,
  most: int = ROWS[0],
) -> Choice:
  """One configuration in which both of KACE's launchers fit `target`'s budget (`lm.plan.budget`:
  the memory JAX may use less `headroom`). The solver's `search` (at most `most` rows a call) is
  kace_eval's plan. Where the teacher and curator run in this process (identical sections are one
  model, `kace.methods.role`), each is searched at most its own `sampler.max_rows` beside the
  solver's held bytes, and the solver's program must fit again beside theirs (kace_build keeps every
  role it loads); where it does not, the solver is searched again with them resident, and the preset
  carries those rows (the notes give kace_eval's own). Where a build role fits nowhere, the plan is
  kace_eval's and does not fit: the notes say to serve that role instead."""
  budget = plan_lib.budget(target, headroom)
  solver = search(
    config, "solver", target, budget, most=most, prompt_tokens=prompt_tokens, search_mesh=search_mesh
  )
  overrides, programs, tried = dict(solver.overrides), list(solver.programs), list(solver.tried)
  groups = build_groups(config)
  notes = [] if groups else ["teacher and curator: not in this process (played by the solver, or served)"]
  if not groups or not solver.fits:
    return Choice(
      overrides=overrides, programs=programs, fits=solver.fits, tried=tuple(tried), notes=tuple(notes)
    )
  held = held_bytes(config, "solver", target, _mesh_of(overrides, "solver"))
  built, others = [], 0  # the build roles' programs, and what they hold (each loaded role stays)
  for group in groups:
    role, label = group[0], ", ".join(group)
    notes += [n for n in (planned_model(config, role)[1],) if n]
    found = search(
      config, role, target, budget, most=config["roles"][role]["sampler"]["max_rows"], resident=held + others,
      prompt_tokens=prompt_tokens, search_mesh=search_mesh, frugal=True,
    )  # fmt: skip
    tried += found.tried
    named = [dataclasses.replace(p, name=f"sample ({label})") for p in found.programs]
    if not found.fits:  # kace_eval's plan stands alone; kace_build cannot run this role here
      notes.append(f"kace_build: the {label} fits no candidate beside the solver; serve it (kind openai)")
      return Choice(
        overrides=overrides, programs=[*programs, *named], fits=False, tried=tuple(tried), notes=tuple(notes)
      )
    for name in group:  # identical sections: the same overrides keep them one model
      overrides |= {k.replace(f"roles.{role}.", f"roles.{name}."): v for k, v in found.overrides.items()}
    built += named
    others += held_bytes(config, role, target, _mesh_of(found.overrides, role))
  (alone,) = solver.programs
  beside = dataclasses.replace(alone, name="sample (solver, in kace_build)", resident=others)
  if beside.peak > budget:  # fewer solver rows (or another mesh) with the build roles resident
    rows = overrides["roles.solver.sampler.max_rows"]
    again = search(
      config, "solver", target, budget, most=rows, resident=others, prompt_tokens=prompt_tokens,
      search_mesh=search_mesh,
    )  # fmt: skip
    tried += [f"kace_build: {t}" for t in again.tried]
    if not again.fits:
      notes.append("kace_build: no solver candidate fits beside the build roles; serve them (kind openai)")
      return Choice(overrides=overrides, programs=[*programs, *built], fits=False, tried=tuple(tried),
                    notes=tuple(notes))  # fmt: skip
    flags = " ".join(f"--config.{k}={v}" for k, v in solver.overrides.items())
    notes.append(
      f"kace_eval alone fits {rows} solver rows ({alone.peak / plan_lib.GiB:.1f} GiB: {flags}); the preset "
      f"carries kace_build's {again.overrides['roles.solver.sampler.max_rows']}, so both launchers fit"
    )
    overrides |= again.overrides
    (beside,) = [dataclasses.replace(p, name="sample (solver, in kace_build)") for p in again.programs]
    alone = dataclasses.replace(beside, name="sample", resident=0)
    # The build roles were planned beside the first mesh's solver: now beside this one's.
    moved = held_bytes(config, "solver", target, _mesh_of(overrides, "solver")) - held
    built = [dataclasses.replace(p, resident=p.resident + moved) for p in built]
  programs = [alone, *built, beside]
  fits = all(p.peak <= budget for p in programs)
  if not fits:
    notes.append("kace_build: a build role no longer fits beside the solver's new mesh")
  return Choice(overrides=overrides, programs=programs, fits=fits, tried=tuple(tried), notes=tuple(notes))


def _mesh_of(overrides: dict[str, Any], role: str) -> sharding_lib.MeshConfig:
  return sharding_lib.MeshConfig(*(overrides[f"roles.{role}.mesh.{k}"] for k in ("data", "fsdp", "tp")))


def build_groups(config: dict) -> list[list[str]]:
  """The teacher / curator roles that run in this process (`kind: jax`), grouped by identical
  sections: one model a group (`kace.methods.role` loads a section once)."""
  groups: list[list[str]] = []
  for role in BUILD_ROLES:
    section = config["roles"].get(role)
    if section is None or section["kind"] != "jax":
      continue
    same = next((g for g in groups if config["roles"][g[0]] == section), None)
    if same is None:
      groups.append([role])
    else:
      same.append(role)
  return groups


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
