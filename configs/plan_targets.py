"""The plan's per-target overrides, as `launch.plan --render` writes them (configs/plan_targets.json,
from docs/results/plan.jsonl's newest record of each preset and target): what
`--config=configs/<job>.py:<preset>@<target>` applies. Written by the plan, never by hand, so a
target's preset is always what the plan compiled and found fitting (docs/scale.md shows the figures).
Read with the standard library only, as config files import no library module."""

import json
import os

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plan_targets.json")


def planned(preset: str) -> dict[str, dict]:
  """{target: entry} of `preset` ("configs/kace.py:qwen3_4b"). An entry: `fits`, `platform`,
  `commit`, `planner`; `overrides` (dotted config keys) where a run fits, `why` where it does not."""
  with open(PATH, encoding="utf-8") as f:
    return json.load(f).get(preset, {})
