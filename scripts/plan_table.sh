#!/usr/bin/env bash
# Regenerates docs/scale.md in one run: every paper preset that loads real weights planned for every
# target (`python -m launch.plan`), TPU targets in .plan_venvs/tpu, GPU targets in .plan_venvs/cuda
# (built by scripts/plan_venvs.sh), the two lanes side by side; then renders the table and the
# per-target overrides the configs read (configs/plan_targets.json). Each (preset, target) runs in its
# own process under a time limit (PLAN_TIMEOUT seconds, default 5400); one that runs past it is
# recorded as timed out with that limit, never left out. Every record carries the code's commit and
# its `key` (the planning code's digest, the preset, the options: launch/plan.py `plan_key`); a rerun
# skips what docs/results/plan.jsonl already holds under the same key, so an interrupted table
# resumes, and the rendered table says whether all its records share one planning code.
# Each platform's jobs are claimed by LANES workers (env TPU_LANES, GPU_LANES; default 1 each), one
# job at a time each: on a small host one KACE TPU search at a time leaves the memory for the GPU
# lane; two TPU lanes halve the table's longest leg where the memory allows (a search holds ~5 GiB).
# Usage: scripts/plan_table.sh [VENV_ROOT]    (env SAMPLE=false leaves out DPA-GRPO's sampler program)
set -euo pipefail
cd "$(dirname "$0")/.."
root="${1:-$PWD/.plan_venvs}"
out=docs/results/plan.jsonl
limit="${PLAN_TIMEOUT:-5400}"
logs="$(mktemp -d)"
# ALLOW_MULTIPLE_LIBTPU_LOAD: libtpu otherwise refuses a second process on the host (its lockfile).
export PYTHONPATH="$PWD" JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 JAX_PLATFORMS=cpu TF_CPP_MIN_LOG_LEVEL=2 ALLOW_MULTIPLE_LIBTPU_LOAD=1
lane() {  # platform, worker: every preset on every target of the platform not claimed by another worker
  local platform="$1" worker="$2" venv target preset
  venv="$root/$([[ $platform == gpu ]] && echo cuda || echo tpu)"
  for target in $("$venv/bin/python" -c "from lm import plan; print(' '.join(plan.${platform^^}_TARGETS))"); do
    for preset in configs/dpa_grpo.py:qwen3_4b configs/kace.py:qwen3_4b; do
      mkdir "$logs/claimed-$target-${preset//[\/:]/_}" 2>/dev/null || continue  # another worker's job
      local args=(--config="$preset" --target="$target" --sample="${SAMPLE:-true}" --out="$out" --skip_planned="$out")
      local rc=0
      timeout "$limit" "$venv/bin/python" -m launch.plan "${args[@]}" >> "$logs/$platform$worker.log" 2>&1 || rc=$?
      if ((rc == 124)); then
        "$venv/bin/python" -m launch.plan "${args[@]}" --failed="timed out after $limit s (PLAN_TIMEOUT)"
      elif ((rc != 0)); then
        "$venv/bin/python" -m launch.plan "${args[@]}" --failed="exited with status $rc (see $logs/$platform$worker.log)"
      fi
    done
  done
}
workers=()
for ((i = 1; i <= ${TPU_LANES:-1}; i++)); do lane tpu "$i" & workers+=($!); done
for ((i = 1; i <= ${GPU_LANES:-1}; i++)); do lane gpu "$i" & workers+=($!); done
wait "${workers[@]}"
"$root/tpu/bin/python" -m launch.plan --render="$out" --markdown=docs/scale.md
echo "logs in $logs"
