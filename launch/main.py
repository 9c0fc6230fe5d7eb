"""The project's main job (`bash scripts/main.sh`): both papers' CPU testbeds into one report.

  python -m launch.main --workdir=runs/main

In order, each into its own sub-directory of --workdir, each resumable on its own:
  dpa_testbed/         the DPA-GRPO copy-and-check testbed v3 (launch/dpa_testbed.py, preset
                       testbed_v3: the committed warm start, step-0 gates, four arms x three seeds of
                       60 steps, the registered rows each labelled tested or not and why, the ODE
                       out of sample) and, in dpa_testbed/theory/, the theory figures
                       (launch/theory.py). Nine seeds, the registered run, is --dpa_seeds=0,...,8;
                       v1's testbed stays: --dpa_config=configs/dpa_grpo.py:testbed;
  kace_v3/             KACE testbed v3 (launch/kace_v3.py, configs/kace_v3.py): the trained solver's
                       gates on every build's calibration split, then every arm x ten builds with the
                       learned teacher, each registered prediction judged with intervals clustered
                       by build and labelled tested or not by the scripted readers (docs/kace_v3.md).
                       v1 and v2 stay: python -m launch.kace_testbed [--config=configs/kace.py:testbed_v2];
then report.md: the machine, the commit, each part's wall time and its report with its figures.

A part whose trained roles fail their gates (lm.gates.GateError) is reported as stopped there and
the other part still runs; the job then exits non-zero. Any other error stops the job. The warm
start and the KACE solver and teacher are cached across run directories (`warm_start.cache_dir`,
`cache_dir`), so a second run directory on the same machine skips their builds.
`--parts` runs a subset; `--dpa_config.*` / `--kace_config.*` override either preset.
"""

import datetime
import os
import re
import subprocess
import sys
import time

from absl import flags, logging

from launch import common
from lm import progress, rundir

# The libraries (jax and both papers) are imported in main(), after the plan is printed: importing
# them takes 5-10 s on 2 cores.

PARTS = ("dpa_grpo", "kace")
_DPA = common.define_config("dpa_config", "configs/dpa_grpo.py:testbed_v3")
_KACE = common.define_config("kace_config", "configs/kace_v3.py")
_THEORY = common.define_config("theory_config", "configs/theory.py")
common.define_workdir()
_PARTS = flags.DEFINE_list("parts", list(PARTS), f"Parts to run, of {list(PARTS)}.")
_DPA_SEEDS = flags.DEFINE_list(
  "dpa_seeds",
  ["0", "1", "2"],
  "Seeds of every DPA-GRPO testbed arm. Three keep the job to about an hour on 2 cores; the "
  "registered rows need nine (0-8), so with three each row is labelled 'not tested'.",
)

# What each part does and how long it takes on a 2-core CPU machine (docs/results/2026-12-01-main-job.md:
# the whole job 50.6 min from empty caches with v1's DPA-GRPO part; 2-core AMD EPYC with AVX2, load
# 2-5). The v3 part: 23.5 min (docs/results/2026-12-04-main-job-dpa-v3.md). The whole job with both v3
# parts, 2-core Intel Xeon with AVX-512: DPA-GRPO 15.8 min, KACE 6.2 (docs/results/2026-12-04-main-job.md).
PLAN = {
  "dpa_grpo": (
    "theory figures; testbed v3 from its committed warm start; step-0 gates; four arms x three "
    "seeds of 60 steps; the report",
    "about 16 min (three seeds of four arms; 24 on an AVX2 machine)",
  ),
  "kace": (
    "solver and teacher builds (once into ~/.cache/kace/, about 8 min each); the solver's gates; "
    "14 arms x ten builds; the scripted readers; the report",
    "about 6 min with both cached, 22 min building them (2026-12-04)",
  ),
}

_DIRS = {"dpa_grpo": "dpa_testbed", "kace": "kace_v3"}
_TITLES = {"dpa_grpo": "DPA-GRPO: the copy-and-check testbed", "kace": "KACE: testbed v3, trained solver"}


def _run_dpa(workdir: str, configs: dict, allow_config_change: bool) -> str:
  from dpa_grpo import plots, testbed

  config, theory = configs["dpa_grpo"], configs["theory"]
  theory_dir = os.path.join(workdir, "theory")  # first: the testbed's report draws what it finds there
  rundir.prepare_workdir(theory_dir, theory, allow_changes=allow_config_change)
  if not os.path.exists(os.path.join(theory_dir, "theory.json")):  # written last by run_theory
    plots.run_theory(theory, theory_dir)
  seeds = tuple(int(s) for s in _DPA_SEEDS.value)
  testbed.run(config, workdir, seeds=seeds, allow_config_change=allow_config_change)
  return os.path.join(workdir, "report.md")


def _run_kace(workdir: str, configs: dict, allow_config_change: bool) -> str:
  from kace import v3_run
  from lm.gates import GateError

  config = configs["kace"]
  rundir.prepare_workdir(workdir, config.to_dict(), allow_changes=allow_config_change)
  record = v3_run.run(workdir, config, progress=progress.say)
  if "stopped" in record:
    raise GateError(record["stopped"])
  return os.path.join(workdir, "report.md")


def _typed_configs(parts: list[str]) -> dict:
  """Every part's typed config, checked before any part runs (one line and exit 2 on a bad one)."""
  from dpa_grpo.config import ExperimentConfig
  from dpa_grpo.theory_config import TheoryConfig
  from kace import v3_run

  configs = {}
  if "dpa_grpo" in parts:
    configs["dpa_grpo"] = common.typed(_DPA, lambda c: ExperimentConfig.from_dict(c.to_dict()))
    configs["theory"] = common.typed(_THEORY, lambda c: TheoryConfig.from_dict(c.to_dict()))
  if "kace" in parts:
    configs["kace"] = common.typed(_KACE, lambda c: v3_run.V3RunConfig.from_dict(c.to_dict()))
  return configs


_RUNNERS = {"dpa_grpo": _run_dpa, "kace": _run_kace}


def _commit() -> str:
  """The checkout's commit (with "+ local changes" when the tree differs), or "unknown"."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, text=True)  # fmt: skip
  except OSError:
    return "unknown"
  if head.returncode:
    return "unknown"
  return head.stdout.strip() + (" + local changes" if dirty.stdout.strip() else "")


def embed_report(text: str, subdir: str) -> str:
  """A part's report.md as a section of the main report: headings one level down, relative links
  and images re-rooted under the part's directory."""
  text = re.sub(r"^(#+) ", r"#\1 ", text, flags=re.M)
  return re.sub(r"(!?\[[^\]]*\]\()(?![a-z]+:|/|#)([^)]+\))", rf"\1{subdir}/\2", text)


def write_report(workdir: str, parts: dict[str, dict], commit: str) -> str:
  """`workdir/report.md` from each part's record (status, minutes, report path); `commit`: the
  code's, read when the job started (the checkout may move while it runs)."""
  from lm import machine

  lines = [
    "# The main job: both papers' CPU testbeds",
    "",
    f"- Finished {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on {machine.summary()} "
    f"(load at the end); commit {commit} (at the start).",
    "- Command: `bash scripts/main.sh` (`python -m launch.main`); each part resumes on its own.",
  ]
  lines += [
    f"- {_TITLES[p]}: {r['status']}, {r['minutes']:.1f} min this invocation." for p, r in parts.items()
  ]
  for part, record in parts.items():
    lines += ["", f"# {_TITLES[part]}", ""]
    if record["status"] != "done":
      lines += [f"**Stopped: {record['status']}.** See `{_DIRS[part]}/gates.json`.", ""]
    if os.path.exists(record["report"]):
      with open(record["report"], encoding="utf-8") as f:
        lines.append(embed_report(f.read(), _DIRS[part]))
  path = os.path.join(workdir, "report.md")
  rundir.atomic_write_text(path, "\n".join(lines) + "\n")
  return path


def print_plan(workdir: str, parts: list[str]) -> None:
  """The job's plan, first thing: each part, what it builds, how long it takes on 2 cores."""
  progress.say(f"main job into {workdir}: {len(parts)} part(s), then report.md (times: 2-core CPU)")
  for i, part in enumerate(parts, 1):
    does, expected = PLAN[part]
    progress.say(f"  {i}. {_TITLES[part]} -> {_DIRS[part]}/: {does}; {expected}")
  progress.say("  a progress line at least every 30 s; --verbosity=0 shows the INFO log")


def main(argv):
  del argv
  unknown = sorted(set(_PARTS.value) - set(PARTS))
  if unknown:
    common.fail(f"--parts: unknown part(s) {unknown}; parts are {list(PARTS)}")
  selected = [p for p in PARTS if p in _PARTS.value]
  workdir = common.WORKDIR.value
  print_plan(workdir, selected)
  configs = _typed_configs(selected)  # every check before any part runs
  if not all(s.isdigit() for s in _DPA_SEEDS.value):
    common.fail(f"--dpa_seeds must be non-negative integers, got {_DPA_SEEDS.value}")

  from lm import sharding
  from lm.gates import GateError

  sharding.initialize_distributed()
  os.makedirs(workdir, exist_ok=True)
  parts, failed, commit = {}, [], _commit()
  for part in selected:
    sub = os.path.join(workdir, _DIRS[part])
    start = time.monotonic()
    try:
      with progress.phase(_TITLES[part], PLAN[part][1]):
        report = _RUNNERS[part](sub, configs, common.ALLOW_CONFIG_CHANGE.value)
      status = "done"
    except rundir.ConfigFileError as e:  # a part's directory holds another config: one line, exit 2
      common.fail(common.config_change_message(e))
    except GateError as e:  # the other part still runs; the job exits non-zero at the end
      logging.error("%s stopped at its gates: %s", part, e)
      report, status = os.path.join(sub, "report.md"), f"stopped at its gates ({e})"
      failed.append(part)
    parts[part] = {"status": status, "minutes": (time.monotonic() - start) / 60, "report": report}
    path = write_report(workdir, parts, commit)
  with open(path, encoding="utf-8") as f:
    print(f.read())
  if failed:
    sys.exit(f"GateError: {', '.join(failed)} stopped at the gates; see {path}")


def run():
  """The console entry point (setup.py)."""
  common.run(main)


if __name__ == "__main__":
  run()
