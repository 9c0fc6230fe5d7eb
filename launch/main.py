"""The project's main job (`bash scripts/main.sh`): both papers' CPU testbeds into one report.

  python -m launch.main --workdir=runs/main

In order, each into its own sub-directory of --workdir, each resumable on its own:
  dpa_testbed/         the DPA-GRPO copy-and-check testbed (launch/dpa_testbed.py: warm start, step-0
                       gates, four arms x three seeds, pre-registered predictions, the ODE out of
                       sample) and, in dpa_testbed/theory/, the theory figures (launch/theory.py);
  kace_testbed/        the KACE latent-convention testbed (launch/kace_testbed.py: solver gates, every
                       method x three seeds, pre-registered predictions);
then report.md: the machine, the commit, each part's wall time and its report with its figures.

A part whose trained roles fail their gates (lm.gates.GateError) is reported as stopped there and
the other part still runs; the job then exits non-zero. Any other error stops the job. The warm
start and the KACE solver are cached across run directories (`warm_start.cache_dir`,
`synthetic.cache_dir`), so a second run directory on the same machine skips both builds.
`--parts` runs a subset; `--dpa_config.*` / `--kace_config.*` override either preset.
"""

import datetime
import os
import re
import subprocess
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from dpa_grpo import plots, testbed
from dpa_grpo.config import ExperimentConfig
from dpa_grpo.theory_config import TheoryConfig
from kace import config as kace_config
from kace import pipeline
from launch import common
from lm import machine, rundir, sharding
from lm.gates import GateError

PARTS = ("dpa_grpo", "kace")
_DPA = config_flags.DEFINE_config_file("dpa_config", "configs/dpa_grpo.py:testbed", lock_config=True)
_KACE = config_flags.DEFINE_config_file("kace_config", "configs/kace.py:testbed", lock_config=True)
_THEORY = config_flags.DEFINE_config_file("theory_config", "configs/theory.py", lock_config=True)
_PARTS = flags.DEFINE_list("parts", list(PARTS), f"Parts to run, of {list(PARTS)}.")

_DIRS = {"dpa_grpo": "dpa_testbed", "kace": "kace_testbed"}
_TITLES = {"dpa_grpo": "DPA-GRPO: the copy-and-check testbed", "kace": "KACE: the latent-convention testbed"}


def _run_dpa(workdir: str, allow_config_change: bool) -> str:
  config = ExperimentConfig.from_dict(_DPA.value.to_dict())
  theory = TheoryConfig.from_dict(_THEORY.value.to_dict())
  theory_dir = os.path.join(workdir, "theory")  # first: the testbed's report draws what it finds there
  rundir.prepare_workdir(theory_dir, theory, allow_changes=allow_config_change)
  if not os.path.exists(os.path.join(theory_dir, "theory.json")):  # written last by run_theory
    plots.run_theory(theory, theory_dir)
  testbed.run(config, workdir, allow_config_change=allow_config_change)
  return os.path.join(workdir, "report.md")


def _run_kace(workdir: str, allow_config_change: bool) -> str:
  config = kace_config.KaceConfig.from_dict(_KACE.value)
  return pipeline.run_testbed(workdir, config, allow_config_change=allow_config_change)


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


def main(argv):
  del argv
  sharding.initialize_distributed()
  unknown = sorted(set(_PARTS.value) - set(PARTS))
  if unknown:
    raise app.UsageError(f"--parts: unknown part(s) {unknown}; parts are {list(PARTS)}")
  workdir = common.WORKDIR.value
  os.makedirs(workdir, exist_ok=True)
  parts, failed, commit = {}, [], _commit()
  for part in (p for p in PARTS if p in _PARTS.value):
    sub = os.path.join(workdir, _DIRS[part])
    start = time.monotonic()
    try:
      report, status = _RUNNERS[part](sub, common.ALLOW_CONFIG_CHANGE.value), "done"
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


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir"])
  app.run(main)
