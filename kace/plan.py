"""KACE's in-process solver planned for a target (`lm.plan`): the sampler's prefill-and-decode
program at the preset's sampling budget, and the most rows per call (`sampler.max_rows`) that fit
with headroom. KACE trains nothing, so the sampler is its only program."""

from __future__ import annotations

import dataclasses
from typing import Any

from lm import plan as plan_lib
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


def solver_program(config: dict, target: plan_lib.Target, *, rows: int, prompt_tokens: int = PROMPT_TOKENS):
  """The solver's sampler program for `rows` rows (n = 1 each) on `target`."""
  solver = config["roles"]["solver"]
  shard = sharding_lib.ShardingConfig()
  mesh_cfg = plan_lib.across_slices(sharding_lib.MeshConfig(**solver["mesh"]), target)
  mesh = plan_lib.target_mesh(plan_lib.target_devices(target), mesh_cfg)
  model_cfg = ModelConfig.preset(solver.get("preset") or "qwen3_4b")
  model = plan_lib.abstract_model(model_cfg, solver["dtype"], mesh, shard)
  return plan_lib.sampler_program(
    model,
    mesh,
    target,
    rows=rows,  # the sampler buckets the prompt rows itself; the notes say what was compiled
    prompt_len=prompt_tokens,
    new_tokens=config["sampling"]["max_tokens"],
    n=1,
    config=SamplerConfig(**{**solver["sampler"], "max_rows": rows}),
  )


def choose(
  config: dict,
  target: plan_lib.Target,
  *,
  headroom: float = plan_lib.HEADROOM,
  prompt_tokens: int = PROMPT_TOKENS,
):
  """The most rows a call (at most the preset's `max_rows`) whose program fits `target`'s budget
  (`lm.plan.budget`: the memory JAX may use less `headroom`); the smallest tried when none does.
  The mesh is the preset's."""
  budget = plan_lib.budget(target, headroom)
  solver = config["roles"]["solver"]
  most = solver["sampler"].get("max_rows", 256)
  choice, tried = None, []
  for rows in [r for r in ROWS if r <= most] or [most]:
    overrides = {"roles.solver.sampler.max_rows": rows}
    overrides |= {f"roles.solver.mesh.{k}": v for k, v in solver["mesh"].items()}
    try:
      program = solver_program(config, target, rows=rows, prompt_tokens=prompt_tokens)
    except Exception as e:  # noqa: BLE001 -- an out-of-memory refusal is a candidate that does not fit
      if plan_lib.refusal(e) is None:
        raise
      tried.append(f"{rows} rows: refused ({plan_lib.refusal(e)})")
      choice = Choice(overrides=overrides, programs=[], fits=False, tried=tuple(tried))
      continue
    choice = Choice(overrides=overrides, programs=[program], fits=program.peak <= budget, tried=tuple(tried))
    if choice.fits:
      break
    tried.append(f"{rows} rows: peak {program.peak / plan_lib.GiB:.1f} GiB")
  return choice
