#!/usr/bin/env bash
# Creates .venv-ref: this project (for lm.save_hf, the tiny checkpoint and its adapters) plus peft,
# the environment in which tools/dpa_reference_golden.py calls the DPA-GRPO authors' PyTorch
# update code. Not part of CI: the golden fixture it writes is committed under tests/.
#
#   bash scripts/ref_venv.sh
#   .venv-ref/bin/python -m tools.dpa_reference_golden --reference=/path/to/Generator_Verifier_Multi_Agent
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -x .venv-ref/bin/python ] || { python3.11 -m venv .venv-ref 2>/dev/null || python3 -m venv .venv-ref; }
.venv-ref/bin/python -m pip install -q --upgrade pip
.venv-ref/bin/python -m pip install -q --no-compile -c constraints.txt torch
.venv-ref/bin/python -m pip install -q --no-compile -c constraints.txt -e .
# The versions the committed fixture was generated with (tests/dpa_grpo/golden/golden.json says so too).
.venv-ref/bin/python -m pip install -q --no-compile -c constraints.txt peft==0.21.2 accelerate==1.16.0
