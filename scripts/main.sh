#!/usr/bin/env bash
# Sets up .venv and runs the project's main job on its built-in CPU default.
# Extra arguments go to the launcher (e.g. --config.beta=0.1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/setup_env.sh
workdir="${WORKDIR:-runs/theory}"
python -m launch.theory --config=configs/theory.py --workdir="$workdir" "$@"
echo "Figures and numbers written to $workdir"
