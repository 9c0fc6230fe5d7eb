#!/usr/bin/env bash
# Sets up .venv and runs the project's main job on its built-in CPU default: both papers' CPU
# testbeds into one report (python -m launch.main): the DPA-GRPO copy-and-check testbed v3 (its
# committed warm start, step-0 gates, four arms x three seeds, the registered rows labelled tested
# or not, the ODE out of sample, the theory figures) and KACE testbed v3 (the trained solver's gates,
# every arm x ten builds with the learned teacher, the registered predictions labelled tested or not).
# The solver and teacher are cached in ~/.cache; README says how long each part takes. Rerunning resumes. Extra arguments go to the launcher
# (e.g. --parts=kace). The synthetic-forms reproduction of the earlier main job:
# python -m launch.dpa_grpo --workdir=runs/dpa_grpo
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/setup_env.sh
workdir="${WORKDIR:-runs/main}"
# XLA's compiled programs persist across runs and processes (v1's KACE seed workers reused what its
# gates compiled: 13.8 -> 11.6 min for that part from a cold cache, docs/kace.md).
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/jax}"
python -m launch.main --workdir="$workdir" --verbosity=-1 "$@"
echo "Report written to $workdir/report.md"
