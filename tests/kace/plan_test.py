"""KACE's plan (`kace.plan.choose`): the teacher and curator planned beside the solver (what
`launch.kace_build` holds at once), on this host's 8 CPU devices with tiny models."""

import pytest

from configs import kace as kace_configs
from configs.generators import generator_config
from kace import plan as kace_plan
from lm import plan as plan_lib


def _tiny(teacher: bool = True, curator_same: bool = True) -> dict:
  config = kace_configs.get_config("cpu").to_dict()
  solver = config["roles"]["solver"]
  solver |= dict(preset="tiny_qwen3", dtype="float32", mesh=dict(data=-1, fsdp=1, tp=1))
  solver["sampler"] = {**solver["sampler"], "max_rows": 8, "min_prompt_bucket": 16, "step_bucket": 8}
  config["sampling"] = {**config["sampling"], "max_tokens": 8}
  config["role_sampling"] = {**config["role_sampling"], "max_tokens": 8}
  config["learn"] = {**config["learn"], "failures_per_prompt": 2, "attempt_tokens": 8}
  if teacher:
    role = generator_config(preset="tiny_qwen3", dtype="float32").to_dict()
    role |= dict(mesh=dict(data=1, fsdp=-1, tp=1))
    role["sampler"] = {**role["sampler"], "max_rows": 4, "min_prompt_bucket": 16, "step_bucket": 8}
    config["roles"]["teacher"] = role
    config["roles"]["curator"] = role if curator_same else {**role, "seed": 1}
  return config


pytestmark = pytest.mark.usefixtures("no_persistent_cache")  # compiled, never run (tests/conftest.py)


def test_identical_teacher_and_curator_are_one_model_planned_beside_the_solver():
  config = _tiny()
  assert kace_plan.build_groups(config) == [["teacher", "curator"]]
  assert kace_plan.build_groups(_tiny(curator_same=False)) == [["teacher"], ["curator"]]
  assert kace_plan.build_groups(_tiny(teacher=False)) == []
  target = plan_lib.cpu_target(8, 2**30)
  choice = kace_plan.choose(config, target, prompt_tokens=16, most=8)
  assert choice.fits
  names = [p.name for p in choice.programs]
  assert names == ["sample", "sample (teacher, curator)", "sample (solver, in kace_build)"]
  solver, taught, beside = choice.programs
  chosen = kace_plan._mesh_of(choice.overrides, "solver")
  assert taught.resident == kace_plan.held_bytes(config, "solver", target, chosen) > 0
  assert beside.resident == kace_plan.held_bytes(
    config, "teacher", target, kace_plan._mesh_of(choice.overrides, "teacher")
  )
  assert beside.peak == solver.peak + beside.resident and solver.resident == 0
  for key in ("sampler.max_rows", "mesh.data", "mesh.fsdp", "mesh.tp"):
    assert choice.overrides[f"roles.teacher.{key}"] == choice.overrides[f"roles.curator.{key}"]
  # The teacher's prompt holds its failed traces: 16 + 2 x 8 tokens, bucketed to the sampler's 16.
  assert "prompt 32" in taught.detail


def test_a_teacher_that_fits_nowhere_beside_the_solver_says_to_serve_it():
  config = _tiny()
  config["learn"]["attempt_tokens"] = 1 << 16  # its failed traces: a KV cache of 2 x 128K slots a row
  probe = plan_lib.cpu_target(8, 2**30)
  alone = kace_plan.choose(_tiny(teacher=False), probe, prompt_tokens=16, most=8, headroom=0.0)
  target = plan_lib.cpu_target(8, alone.programs[0].peak + 1)  # the solver's, with no room for that
  choice = kace_plan.choose(config, target, prompt_tokens=16, most=8, headroom=0.0)
  assert not choice.fits and [p.name for p in choice.programs] == ["sample"]
  assert choice.overrides == alone.overrides  # kace_eval's plan stands; no teacher override
  assert any("fits no candidate beside the solver; serve it" in n for n in choice.notes), choice.notes
  assert all("not compiled" in t for t in choice.tried if t.startswith("teacher: "))


def test_where_the_solver_does_not_fit_beside_the_teacher_the_preset_carries_rows_that_do():
  """One preset serves kace_eval and kace_build: where the solver's own best (8 rows, data parallel)
  does not fit beside the teacher's weights, the plan searches the solver again with them resident,
  and the notes keep kace_eval's own."""
  config = _tiny()
  probe = plan_lib.cpu_target(8, 2**30)
  alone = kace_plan.choose(_tiny(teacher=False), probe, prompt_tokens=16, most=8, headroom=0.0)
  assert alone.overrides["roles.solver.mesh.data"] == 8  # the first candidate, data parallel
  target = plan_lib.cpu_target(8, alone.programs[0].peak + 1)
  choice = kace_plan.choose(config, target, prompt_tokens=16, most=8, headroom=0.0)
  budget = plan_lib.budget(target, 0.0)
  assert choice.fits and all(p.peak <= budget for p in choice.programs)
  assert kace_plan._mesh_of(choice.overrides, "solver") != kace_plan._mesh_of(alone.overrides, "solver")
  assert any(n.startswith("kace_eval alone fits 8 solver rows") for n in choice.notes), choice.notes
  solver, taught, beside = choice.programs
  teacher_mesh = kace_plan._mesh_of(choice.overrides, "teacher")
  assert (
    beside.resident == kace_plan.held_bytes(config, "teacher", target, teacher_mesh) and solver.resident == 0
  )
  solver_mesh = kace_plan._mesh_of(choice.overrides, "solver")
  assert taught.resident == kace_plan.held_bytes(config, "solver", target, solver_mesh)


def test_a_build_roles_search_climbs_rows_on_its_most_frugal_mesh_and_stops_at_the_first_miss():
  config = _tiny()
  target = plan_lib.cpu_target(8, 2**30)
  roomy = kace_plan.search(config, "teacher", target, 2**30, most=4, prompt_tokens=16, frugal=True)
  mesh = kace_plan._mesh_of(roomy.overrides, "teacher")
  # The lowest floor at one row: weights and KV split 8 ways; at equal floors the most tp that
  # divides the tiny model's 2 KV heads (tp 4 would replicate them).
  assert (mesh.data, mesh.fsdp, mesh.tp) == (1, 4, 2)
  peaks = {
    r: kace_plan.program(config, "teacher", target, rows=r, prompt_tokens=16, mesh=mesh).peak for r in (1, 2)
  }
  assert roomy.fits and roomy.overrides["roles.teacher.sampler.max_rows"] == 4 and not roomy.tried
  between = kace_plan.search(
    config, "teacher", target, (peaks[1] + peaks[2]) // 2, most=4, prompt_tokens=16, frugal=True
  )
  assert between.fits and between.overrides["roles.teacher.sampler.max_rows"] == 1
  assert len(between.tried) == 1 and between.tried[0].startswith("teacher: 2 rows")  # 4 rows never compiled
  # Where nothing fits (here each mesh's floor alone is over the budget): every mesh tried at one
  # row, none at more.
  meshes = plan_lib.mesh_candidates(target, kace_plan.planned_model(config, "teacher")[0], mesh)
  short = kace_plan.search(config, "teacher", target, 1, most=4, prompt_tokens=16, frugal=True)
  assert not short.fits and [t.split(",")[0] for t in short.tried] == ["teacher: 1 rows"] * len(meshes)
