r"""Plans a preset for a target: compiles its programs ahead of time, picks remat / micro-batch /
sampler rows that fit the target's budget (`lm.plan.budget`: 90% of the memory JAX may use, on a GPU
its allocator pool, lm/memory.py), and the mesh: the preset's first, then every (data, fsdp, tp)
factorisation of the target's devices, least communication first (`lm.plan.mesh_candidates`;
`--nosearch_mesh`: the preset's only). Prints `--config.*` overrides (docs/scale.md); each record
carries the code's commit.

  python -m launch.plan --config=configs/dpa_grpo.py:qwen3_4b --target=h100x8
  python -m launch.plan --config=configs/kace.py:qwen3_4b --target=v5p-8 --out=docs/results/plan.jsonl
  python -m launch.plan --render=docs/results/plan.jsonl        # writes docs/scale.md

TPU targets need .plan_venvs/tpu, GPU targets .plan_venvs/cuda (scripts/plan_venvs.sh builds both;
scripts/plan_table.sh runs every preset and target and renders the table). Run from the repository
root with the venv's python: `.plan_venvs/cuda/bin/python -m launch.plan ...`. Without the venv a
TPU / GPU target stops at once, saying which venv to build.

  .plan_venvs/cuda/bin/python -m launch.plan --config=configs/dpa_grpo.py:qwen3_8b --target=h200x8 \
      --config.train.pairs_per_chunk=16             # plan from an override
"""

import os

# Before jax is imported: the deviceless compiles run on a machine without the accelerator. The CUDA
# plugin otherwise refuses to load without CUDA's libraries (its version check), libtpu refuses a
# second process on the host (its lock file), and the default backend is the CPU. A user's own
# setting of any of these wins.
for _name, _value in (
  ("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1"),
  ("JAX_PLATFORMS", "cpu"),
  ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
  ("TF_CPP_MIN_LOG_LEVEL", "2"),
):
  os.environ.setdefault(_name, _value)

import datetime  # noqa: E402
import functools  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

from absl import flags  # noqa: E402

from dpa_grpo import plan as dpa_plan  # noqa: E402
from kace import plan as kace_plan  # noqa: E402
from launch import common  # noqa: E402
from launch.plan_records import PLANNERS, plan_key, planned_keys, targets_table  # noqa: E402
from lm import code_digest  # noqa: E402
from lm import plan as plan_lib  # noqa: E402

_CONFIG = common.define_config(
  "config", "configs/dpa_grpo.py:qwen3_4b", "A preset: configs/<job>.py:<preset> (default the DPA-GRPO 4B)."
)
_TARGET = flags.DEFINE_string(
  "target", "h100x8", f"One of {list(plan_lib.TARGETS)}, comma-separated, tpu or gpu."
)
_HEADROOM = flags.DEFINE_float(
  "headroom",
  plan_lib.HEADROOM,
  "Share of the memory JAX may use (on a GPU its allocator's pool, lm/memory.py) left free by the plan.",
)
_SAMPLE = flags.DEFINE_bool("sample", True, "DPA-GRPO: also compile the sampler's program (slow to compile).")
_SEARCH_MESH = flags.DEFINE_bool(
  "search_mesh",
  True,
  "Search (data, fsdp, tp) meshes when the preset's own does not fit (lm.plan.mesh_candidates).",
)
_OUT = flags.DEFINE_string("out", "", "Append each (preset, target) result as a JSON line here.")
_FAILED = flags.DEFINE_string(
  "failed",
  "",
  "Record this cause as the (preset, target)'s plan instead of planning it (scripts/plan_table.sh: a "
  "plan that ran past its time limit or crashed is in the table with its cause, never left out).",
)
_SKIP_PLANNED = flags.DEFINE_string(
  "skip_planned",
  "",
  "A plan records file: skip each (preset, target) it already holds a plan of, made by the same "
  "planning code, preset and options (the record's `key`), so that an interrupted table resumes "
  "and every record of it stays one code's (scripts/plan_table.sh).",
)
_RENDER = flags.DEFINE_string("render", "", "Render a results JSONL into --markdown and exit.")
_MARKDOWN = flags.DEFINE_string("markdown", "docs/scale.md", "Where --render writes the table.")
_TARGETS_JSON = flags.DEFINE_string(
  "targets_json",
  "configs/plan_targets.json",
  "Where --render writes each preset's per-target overrides, which `<preset>@<target>` applies.",
)


# The compiler each platform's deviceless compile needs: (module, the venv scripts/plan_venvs.sh builds).
_BACKENDS = {"tpu": ("libtpu", "tpu"), "cuda": ("jax_cuda12_plugin", "cuda")}


def missing_backend(platform: str) -> str | None:
  """What to do when this Python lacks the compiler of `platform`'s targets; None when it has it."""
  if platform not in _BACKENDS:
    return None
  module, venv = _BACKENDS[platform]
  if importlib.util.find_spec(module) is not None:
    return None
  return (
    f"{platform} targets compile with {module}, which this Python lacks; build its venv once with "
    f"`bash scripts/plan_venvs.sh {venv}`, then run `.plan_venvs/{venv}/bin/python -m launch.plan ...` "
    "from the repository root"
  )


def _commit() -> str:
  """The code's commit, "+dirty" when the working tree differs from it ("" outside a git checkout);
  the table's own outputs (docs/results/plan.jsonl, docs/scale.md), which a run writes, are not code."""
  import subprocess

  def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=common.ROOT, capture_output=True, text=True).stdout.strip()

  head = git("rev-parse", "--short", "HEAD")
  outputs = (":(exclude)docs/results/plan.jsonl", ":(exclude)docs/scale.md")
  dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", *outputs)
  return head + ("+dirty" if head and dirty else "")


def main(argv):
  del argv
  if _RENDER.value:
    with open(_RENDER.value) as f:
      rows = [json.loads(line) for line in f if line.strip()]
    with open(_MARKDOWN.value, "w") as f:
      f.write(plan_lib.render(rows, date=datetime.date.today().isoformat()))
    with open(_TARGETS_JSON.value, "w") as f:
      f.write(json.dumps(targets_table(rows), indent=1, sort_keys=True) + "\n")
    print(f"wrote {_MARKDOWN.value} and {_TARGETS_JSON.value} ({len(rows)} plans)")
    return
  try:
    names = plan_lib.target_names(_TARGET.value)  # an unknown target stops before any compile
  except ValueError as e:
    common.fail(f"--target: {e}")
  path, preset_name = common.config_source("config")
  preset = f"{os.path.relpath(path, common.ROOT)}:{preset_name}"  # as the table names it
  # The job's planner: DPA-GRPO trains (accumulate, apply, sampler), KACE samples only.
  kace = "kace" in os.path.basename(path)
  search = dict(search_mesh=_SEARCH_MESH.value)
  choose = (
    functools.partial(kace_plan.choose, **search)
    if kace
    else functools.partial(dpa_plan.choose, sample=_SAMPLE.value, **search)
  )
  commit = _commit()  # the code that runs, read before the compiles (edits made meanwhile are not theirs)
  options = dict(headroom=_HEADROOM.value, sample=_SAMPLE.value, search_mesh=_SEARCH_MESH.value)
  done = planned_keys(_SKIP_PLANNED.value)
  planners = PLANNERS["kace" if kace else "dpa_grpo"]
  planner = code_digest.source_digest(planners)[:12]  # the planning code alone (the key adds the rest)
  keys = {name: plan_key(_CONFIG.value.to_dict(), name, options, planners) for name in names}
  for name in names:  # a compiler missing stops before any compile (a failure record needs none)
    missing = (
      None if keys[name] in done or _FAILED.value else missing_backend(plan_lib.TARGETS[name].platform)
    )
    if missing:
      common.fail(f"--target={name}: {missing}")
  for name in names:
    target, key = plan_lib.TARGETS[name], keys[name]
    if key in done:
      print(f"{preset} on {name}: already planned by this code and options (key {key}), skipped")
      continue
    if _FAILED.value:
      result = {
        **plan_lib.target_record(preset, target, _HEADROOM.value),
        "fits": False,
        "error": _FAILED.value,
      }
    else:
      result = plan_lib.run_plan(choose, preset, _CONFIG.value.to_dict(), target, _HEADROOM.value)
    result["given"] = [a for a in sys.argv[1:] if a.startswith("--config.")]  # the plan started from these
    result["commit"], result["key"], result["planner"] = commit, key, planner
    print(plan_lib.summary(result))
    if _OUT.value:
      os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
      with open(_OUT.value, "a") as f:
        f.write(json.dumps(result) + "\n")


def run():
  """The console entry point (setup.py)."""
  common.run(main, required=())


if __name__ == "__main__":
  run()
