#!/usr/bin/env bash
# Sets up .venv and runs the project's main job on its built-in CPU default: the CPU-scale
# DPA-GRPO reproduction on synthetic TY24 forms (warm start, DPA-GRPO, generator-only GRPO, the
# report with the theory overlay), about 10 minutes on 2 cores. Rerunning resumes.
# Extra arguments go to the launcher (e.g. --config.train.steps=10).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/setup_env.sh
workdir="${WORKDIR:-runs/dpa_grpo}"
python -m launch.dpa_grpo --workdir="$workdir" --verbosity=-1 "$@"
echo "Report written to $workdir/report.md (figures in $workdir/figures)"
