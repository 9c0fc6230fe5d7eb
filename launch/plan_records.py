"""What `launch.plan` keeps of its records, without its command-line flags (so tests and tools import
it freely): the key that makes a table resumable on one planning code, and the per-target overrides
the configs read (configs/plan_targets.json)."""

import json
import os

from lm import code_digest
from lm import plan as plan_lib

# The modules whose code (and every first-party module they import) makes a job's plans: a record's
# `planner` digest and `key`. Per job, so that changing one paper's planner leaves the other's records
# current.
PLANNERS = {"dpa_grpo": ("lm.plan", "dpa_grpo.plan"), "kace": ("lm.plan", "kace.plan")}


def plan_key(config: dict, target: str, options: dict, planners: tuple[str, ...]) -> str:
  """The key of a (preset config, target) plan: changes with the planning code (`planners`' import
  closure), the resolved config, the target, the options and the compiler's version, nothing else."""
  import jax

  blob = json.dumps(
    {"config": config, "target": target, "jax": jax.__version__, **options}, sort_keys=True, default=str
  )
  return code_digest.cache_key(blob, planners)


def planned_keys(path: str) -> set[str]:
  """Keys of the plans (not the failed or timed-out ones) a records file holds."""
  if not path or not os.path.exists(path):
    return set()
  with open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return {r["key"] for r in records if "key" in r and "error" not in r}


def targets_table(records: list[dict]) -> dict[str, dict[str, dict]]:
  """{preset: {target: entry}} of the newest record of each (preset, target): configs/plan_targets.json.
  A fitting plan's entry carries its overrides. A KACE plan whose build roles do not fit beside the
  solver still carries the solver's, when its own program fits: kace_eval runs that one alone."""
  newest = {(r["preset"], r["target"]): r for r in records}
  table: dict[str, dict[str, dict]] = {}
  for (preset, target), r in newest.items():
    budget = plan_lib.record_budget(r) * plan_lib.GiB
    # every program within the budget (records made before `fits` covered the sampler said yes anyway)
    fits = r["fits"] and all(p["peak"] <= budget for p in r.get("programs", []))
    entry = dict(fits=fits, platform=r["platform"], commit=r.get("commit", ""), planner=r.get("planner", ""))
    if "error" in r:
      entry["why"] = r["error"]
    elif fits:
      entry["overrides"] = r["overrides"]
    else:
      over = [
        f"{p['name']} peaks {p['peak'] / plan_lib.GiB:.1f} GiB" for p in r["programs"] if p["peak"] > budget
      ]
      solver = next((p for p in r["programs"] if p["name"] == "sample"), None)
      if preset.startswith("configs/kace.py") and solver is not None and solver["peak"] <= budget:
        entry["overrides"] = {k: v for k, v in r["overrides"].items() if k.startswith("roles.solver.")}
      entry["why"] = "; ".join(over + list(r.get("notes") or r.get("tried", [])[-1:])) or "no candidate fits"
    table.setdefault(preset, {})[target] = entry
  return table
