"""A paper preset's overrides for one machine, one suffix away: `--config=configs/dpa_grpo.py:qwen3_4b@h100x1`
(or `configs/kace.py:qwen3_4b@v5p-8`). Each value is what the plan chose or compiled for that target
(docs/scale.md, from docs/results/plan.jsonl), re-read against the budget of `lm.plan.budget`: 90% of
the memory JAX may use, which on a GPU is the allocator's pool the launchers set (0.90 of the card,
`lm/memory.py`). `tests/configs/targets_test.py` checks every entry against its plan record.

A target the plan found no fitting setting for, or whose sampler rows it has not compiled, says so in
`UNPLANNED`; `launch.plan --target=<name>` plans it (docs/scale.md).
"""

from __future__ import annotations

from typing import Any

# DPA-GRPO, per preset size and target: micro-batch, remat and sampler rows a call. The mesh is the
# preset's (fsdp over every device), as the plan compiled it.
DPA_GRPO: dict[str, dict[str, dict[str, Any]]] = {
  "qwen3_4b": {
    "v5e-8": {"loss.remat": "full", "train.pairs_per_chunk": 8},  # accumulate 9.2 GiB of 14.4
    "v6e-8": {"loss.remat": "full", "train.pairs_per_chunk": 16},  # 16.8 GiB of 28.8
    "v5p-8": {"loss.remat": "full", "train.pairs_per_chunk": 32, "sampler.max_rows": 256},
    "v5p-64": {"loss.remat": "full", "train.pairs_per_chunk": 32, "sampler.max_rows": 256},
    # compiled with the sampler copies: accumulate 59.6 GiB, the sampler at 32 rows 42.6 GiB, of 64.1
    # GiB (0.9 x the 0.90 pool); 64 sampler rows peak at 68.9 GiB
    "h100x1": {"loss.remat": "full", "train.pairs_per_chunk": 8, "sampler.max_rows": 32},
    "h100x8": {"loss.remat": "full", "train.pairs_per_chunk": 32, "sampler.max_rows": 256},
    "h200x1": {"loss.remat": "full", "train.pairs_per_chunk": 16},  # 105.5 + 1.4 GiB of 113.7
    "h200x8": {"loss.remat": "full", "train.pairs_per_chunk": 32, "sampler.max_rows": 256},
  },
}

# KACE's in-process solver, per preset size and target: rows a sampler call.
KACE: dict[str, dict[str, dict[str, Any]]] = {
  "qwen3_4b": {
    "v5p-8": {"roles.solver.sampler.max_rows": 16},
    "v5p-64": {"roles.solver.sampler.max_rows": 16},
    "h100x1": {"roles.solver.sampler.max_rows": 8},  # 60.4 GiB of 64.1
    "h100x8": {"roles.solver.sampler.max_rows": 16},
    "h200x1": {"roles.solver.sampler.max_rows": 16},  # 105.8 GiB of 113.7
    "h200x8": {"roles.solver.sampler.max_rows": 16},
  },
}

# What the plan has not settled, by (job, size, target): the preset's own value stands there.
UNPLANNED: dict[tuple[str, str, str], str] = {
  ("dpa_grpo", "qwen3_4b", "v5e-8"): "sampler rows: the compiler refused 256 rows; fewer not compiled yet",
  (
    "dpa_grpo",
    "qwen3_4b",
    "v6e-8",
  ): "sampler rows: 256 rows peak at 31.3 GiB of 28.8; fewer not compiled yet",
  ("dpa_grpo", "qwen3_4b", "h200x1"): "sampler rows: 256 rows peak at 231 GiB; fewer not compiled yet",
  ("kace", "qwen3_4b", "v5e-8"): "no row count fits the preset's mesh (every candidate refused)",
  ("kace", "qwen3_4b", "v6e-8"): "not planned: its compile did not finish in time",
}

TABLES = {"dpa_grpo": DPA_GRPO, "kace": KACE}


def split(preset: str) -> tuple[str, str]:
  """(preset, target) of `<preset>@<target>`; the target is "" without a suffix."""
  preset, _, target = preset.partition("@")
  return preset, target


def overrides(job: str, size: str, target: str) -> dict[str, Any]:
  """The dotted overrides of `job`'s `size` preset on `target`; ValueError naming the known targets."""
  table = TABLES[job].get(size)
  if table is None:
    raise ValueError(
      f"configs/{job}.py: no per-target overrides for preset {size!r}; known: {sorted(TABLES[job])}"
    )
  unplanned = {t for (j, s, t) in UNPLANNED if j == job and s == size}
  if target not in table and target not in unplanned:
    raise ValueError(f"configs/{job}.py: unknown target {target!r} for {size}; known: {sorted(table)}")
  return dict(table.get(target, {}))


def apply(config: Any, job: str, size: str, target: str) -> None:
  """Sets `overrides(job, size, target)` on a ConfigDict, key by dotted key (each key must exist)."""
  for dotted, value in overrides(job, size, target).items():
    *path, leaf = dotted.split(".")
    node = config
    for part in path:
      node = node[part]
    if leaf not in node:
      raise KeyError(f"configs/targets.py: {dotted} is not a key of configs/{job}.py")
    node[leaf] = value
