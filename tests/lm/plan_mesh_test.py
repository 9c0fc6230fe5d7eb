"""The plan's mesh search (`lm.plan.mesh_candidates`, `kace.plan.choose`, `dpa_grpo.plan.choose`): the
preset's mesh first, then every (data, fsdp, tp) factorisation, least communication first; a mesh
that fits is found where the preset's own does not (compiled at tiny size on 8 CPU devices)."""

import pytest

from configs import dpa_grpo as dpa_configs
from configs import kace as kace_configs
from dpa_grpo import plan as dpa_plan
from kace import plan as kace_plan
from lm import plan as plan_lib
from lm import sharding
from lm.config import ModelConfig


def _shapes(meshes, devices):
  return [m.shape(devices) for m, _ in meshes]


pytestmark = pytest.mark.usefixtures("no_persistent_cache")  # compiled, never run (tests/conftest.py)


def test_candidates_start_with_the_presets_mesh_then_least_communication_first():
  target = plan_lib.cpu_target(8, 2**30)
  first = sharding.MeshConfig(data=1, fsdp=-1, tp=1)
  meshes = plan_lib.mesh_candidates(target, ModelConfig.tiny_qwen3(), first)  # 4 heads: tp <= 4
  assert _shapes(meshes, 8) == [
    (1, 8, 1), (8, 1, 1), (4, 2, 1), (2, 4, 1), (4, 1, 2), (2, 2, 2), (1, 4, 2), (2, 1, 4), (1, 2, 4),
  ]  # fmt: skip
  # tp over more devices than the 2 KV heads: the KV replicated, and said.
  notes = dict(zip(_shapes(meshes, 8), (n for _, n in meshes), strict=True))
  assert notes[(2, 1, 4)].startswith("tp=4 does not divide the 2 KV heads") and notes[(4, 1, 2)] == ""


def test_candidates_keep_data_across_slices():
  target = plan_lib.TARGETS["2xh100x8"]
  first = plan_lib.across_slices(sharding.MeshConfig(data=1, fsdp=-1, tp=1), target)
  shapes = _shapes(plan_lib.mesh_candidates(target, ModelConfig.qwen3_4b(), first), 16)
  assert shapes[0] == (2, 8, 1) and all(d % 2 == 0 for d, _, _ in shapes)


def _tiny_kace(max_rows: int) -> dict:
  config = kace_configs.get_config("cpu").to_dict()
  solver = config["roles"]["solver"]
  solver |= dict(preset="tiny_qwen3", dtype="float32", mesh=dict(data=-1, fsdp=1, tp=1))
  solver["sampler"] = {**solver["sampler"], "max_rows": max_rows, "min_prompt_bucket": 16, "step_bucket": 8}
  config["sampling"] = {**config["sampling"], "max_tokens": 8}
  return config


def test_kace_search_finds_a_mesh_that_fits_where_the_presets_does_not():
  config = _tiny_kace(8)
  probe = plan_lib.cpu_target(8, 2**30)
  preset = kace_plan.program(config, "solver", probe, rows=8, prompt_tokens=16)  # data parallel over 8
  target = plan_lib.cpu_target(8, preset.peak - 1)  # a budget the preset's mesh misses by one byte
  choice = kace_plan.choose(config, target, headroom=0.0, prompt_tokens=16, most=8)
  assert choice.fits and choice.overrides["roles.solver.sampler.max_rows"] == 8
  chosen = tuple(choice.overrides[f"roles.solver.mesh.{a}"] for a in ("data", "fsdp", "tp"))
  assert chosen != (8, 1, 1) and choice.programs[0].peak <= plan_lib.budget(target, 0.0)
  assert choice.tried[0].startswith("8 rows, mesh data=8 fsdp=1 tp=1: ")
  # Without the search the preset's mesh is all there is: fewer rows.
  alone = kace_plan.choose(config, target, headroom=0.0, prompt_tokens=16, search_mesh=False, most=8)
  assert (
    alone.overrides["roles.solver.mesh.data"] == 8 and alone.overrides["roles.solver.sampler.max_rows"] < 8
  )


def test_dpa_choose_tries_meshes_in_order_and_names_the_ones_ruled_out(monkeypatch):
  """The mesh loop around `search` (a stand-in for the compiles: only data=2 fsdp=4 fits)."""
  seen = []

  def search(exp, target, budget, **_):
    shape = exp.mesh.shape(target.devices)
    seen.append(shape)
    fits = shape == (2, 4, 1)
    return dpa_plan.Choice(
      overrides={"mesh": shape}, programs=[], fits=fits, tried=() if fits else ("x: peak 9 GiB",)
    )

  monkeypatch.setattr(dpa_plan, "search", search)
  config = dpa_configs.get_config("tiny").to_dict()
  choice = dpa_plan.choose(config, plan_lib.cpu_target(8, 2**30))
  assert seen == [(8, 1, 1), (4, 2, 1), (2, 4, 1)] and choice.fits  # the tiny preset: data parallel
  assert [t.split(":")[0] for t in choice.tried] == ["mesh data=8 fsdp=1 tp=1", "mesh data=4 fsdp=2 tp=1"]
  seen.clear()
  assert not dpa_plan.choose(config, plan_lib.cpu_target(8, 2**30), search_mesh=False).fits and len(seen) == 1


def test_the_sampler_floor_is_below_every_compiled_peak():
  """The search skips a mesh whose floor exceeds the budget uncompiled: the floor must never exceed
  what the compile then reads (tiny solver, three meshes, 8 rows)."""
  config = _tiny_kace(8)
  target = plan_lib.cpu_target(8, 2**30)
  model = kace_plan.solver_model(config)
  for shape in ((8, 1, 1), (1, 8, 1), (2, 2, 2)):
    mesh = sharding.MeshConfig(*shape)
    program = kace_plan.program(config, "solver", target, rows=8, prompt_tokens=16, mesh=mesh)
    floor = plan_lib.sampler_floor(model, "float32", shape, 8, 16 + 8)
    assert 0 < floor <= program.peak, (shape, floor, program.peak)
