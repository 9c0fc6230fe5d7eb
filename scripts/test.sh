#!/usr/bin/env bash
# Sets up .venv and runs the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/setup_env.sh
python -m pytest -q -n 2 --durations=15 tests "$@"
