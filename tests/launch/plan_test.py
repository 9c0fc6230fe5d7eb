"""`launch.plan`'s records for a table made in one run: the key that lets an interrupted table
resume without mixing planning codes, the failure record, and the table's statement of which
planning code made its records."""

import json
import os
import subprocess
import sys

from launch import plan_records as launch_plan
from lm import plan as plan_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KACE = launch_plan.PLANNERS["kace"]


def _plan(*args: str) -> str:
  """`python -m launch.plan` in its own process (its flags are absl's globals), its stdout."""
  env = {**os.environ, "PYTHONPATH": ROOT}
  done = subprocess.run(
    [sys.executable, "-m", "launch.plan", *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    check=True,
  )
  return done.stdout


def test_the_key_changes_with_config_target_and_options_and_nothing_else():
  config = {"a": 1, "b": [1, 2]}
  key = launch_plan.plan_key(config, "v5p-8", {"headroom": 0.1}, KACE)
  assert key == launch_plan.plan_key({"b": [1, 2], "a": 1}, "v5p-8", {"headroom": 0.1}, KACE)
  assert key != launch_plan.plan_key({**config, "a": 2}, "v5p-8", {"headroom": 0.1}, KACE)
  assert key != launch_plan.plan_key(config, "v5p-64", {"headroom": 0.1}, KACE)
  assert key != launch_plan.plan_key(config, "v5p-8", {"headroom": 0.2}, KACE)
  assert key != launch_plan.plan_key(config, "v5p-8", {"headroom": 0.1}, launch_plan.PLANNERS["dpa_grpo"])


def test_a_rerun_skips_what_the_records_hold_under_its_key_but_not_failures(tmp_path):
  out = tmp_path / "plan.jsonl"
  args = ["--config=configs/kace.py:qwen3_4b", "--target=v5e-8", f"--out={out}", f"--skip_planned={out}"]
  _plan(*args, "--failed=timed out after 1 s (PLAN_TIMEOUT)")
  (failed,) = [json.loads(line) for line in out.read_text().splitlines()]
  assert failed["error"].startswith("timed out") and not failed["fits"] and failed["key"]
  assert launch_plan.planned_keys(str(out)) == set()  # a failure is planned again on a rerun
  planned = {k: v for k, v in failed.items() if k != "error"} | {"fits": True}
  out.write_text(out.read_text() + json.dumps(planned) + "\n")
  assert launch_plan.planned_keys(str(out)) == {failed["key"]}
  # Planned under its key: skipped (it would otherwise compile for a TPU, and stop: no libtpu here).
  assert "already planned" in _plan(*args) and len(out.read_text().splitlines()) == 2


def test_the_table_says_whether_one_planning_code_made_each_presets_records():
  base = {"preset": "p", "platform": "tpu", "devices": 8, "hbm_gib": 16.0, "headroom": 0.1, "fits": False}
  one = [{**base, "target": t, "error": "x", "planner": "abc"} for t in ("v5e-8", "v5p-8")]
  other = {**base, "preset": "q", "target": "v5e-8", "error": "x", "planner": "xyz"}  # another job's planner
  text = plan_lib.render([*one, other], date="d")
  assert "one planning code: `planner` abc" in text and "one planning code: `planner` xyz" in text
  two = [one[0], {**one[1], "planner": "def"}]
  text = plan_lib.render(two, date="d")
  assert "more than one planning code" in text and "- def: v5p-8" in text
