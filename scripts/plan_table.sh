#!/usr/bin/env bash
# Regenerates docs/scale.md: every paper preset that loads real weights planned for every target
# (`python -m launch.plan`), TPU targets in .plan_venvs/tpu, GPU targets in .plan_venvs/cuda (built by
# scripts/plan_venvs.sh), results appended to docs/results/plan.jsonl, then rendered.
# Usage: scripts/plan_table.sh [VENV_ROOT]    (env SAMPLE=false leaves out DPA-GRPO's sampler program)
set -euo pipefail
cd "$(dirname "$0")/.."
root="${1:-$PWD/.plan_venvs}"
out=docs/results/plan.jsonl
mkdir -p docs/results && : > "$out"
# ALLOW_MULTIPLE_LIBTPU_LOAD: libtpu otherwise refuses a second process on the host (its lockfile).
export PYTHONPATH="$PWD" JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=2 ALLOW_MULTIPLE_LIBTPU_LOAD=1
for platform in tpu gpu; do
  venv="$root/$([[ $platform == gpu ]] && echo cuda || echo tpu)"
  for preset in configs/dpa_grpo.py:qwen3_4b configs/kace.py:qwen3_4b; do
    "$venv/bin/python" -m launch.plan --config="$preset" --target="$platform" --sample="${SAMPLE:-true}" --out="$out"
  done
done
"$root/tpu/bin/python" -m launch.plan --render="$out" --markdown=docs/scale.md
