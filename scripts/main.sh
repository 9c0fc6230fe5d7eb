#!/usr/bin/env bash
# Sets up .venv and runs the project's main job: the DPA-GRPO copy-and-check testbed (warm start,
# step-0 gates, four arms x three seeds, the pre-registered predictions judged) with the theory
# figures beside, one report: $workdir/report.md (figures in $workdir/figures, $workdir/theory).
# Rerunning resumes. A warm start that fails a step-0 gate stops the job before any comparison.
# Extra arguments go to the testbed launcher (e.g. --seeds=0 --config.train.steps=5). The older
# synthetic-forms reproduction is `python -m launch.dpa_grpo --workdir=runs/dpa_grpo`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/setup_env.sh
workdir="${WORKDIR:-runs/dpa_testbed}"
python -m launch.theory --workdir="$workdir/theory" --verbosity=-1 > /dev/null
python -m launch.dpa_testbed --workdir="$workdir" --verbosity=-1 "$@"
echo "Report written to $workdir/report.md (figures in $workdir/figures and $workdir/theory)"
