#!/usr/bin/env bash
# The device check (lm/device_check.py): parity in bf16, memory bandwidth, decode against its
# roofline, the reduced Qwen3-4B DPA-GRPO step (accumulate) compiled as the plan compiles it,
# its predicted memory and time beside the measured. Three ways to call it:
#   bash scripts/device_check.sh --cpu      # here and in CI: prepare, then check at toy sizes
#   bash scripts/device_check.sh --prepare  # here, before a device session: writes device_check_inputs/
#                                           # (parity checkpoint + reference, wheels of the pure
#                                           # dependencies), which the device run carries along
#   bash scripts/device_check.sh            # on the accelerator machine (no registry, its own newer
#                                           # jax): installs what is missing from the wheels, checks
# The record goes to ${OUT:-.}/device_check.json; the exit status is 0 only when every part ran and
# parity held. Bounded to 9 minutes on the device.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
inputs="${DEVICE_CHECK_INPUTS:-device_check_inputs}"
out="${OUT:-.}/device_check.json"
mode="${1:-device}"
# What `lm.model`, `lm.sampler` and `lm.hf` import beyond jax and numpy (python -X importtime
# on the project's venv), by distribution name; binary ones are fetched for each Python a device
# image may have.
pure=(flax optax chex absl-py etils rich markdown-it-py mdurl pygments treescope typing_extensions ml_collections)
binary=(msgpack pyyaml safetensors)

case "$mode" in
  --cpu)
    . scripts/setup_env.sh
    tmp="$(mktemp -d)"
    python -m lm.device_check prepare --inputs="$tmp"
    python -m lm.device_check check --cpu --inputs="$tmp" --out="${OUT:-$tmp}/device_check.json"
    ;;
  --prepare)
    . scripts/setup_env.sh
    python -m lm.device_check prepare --inputs="$inputs"
    wheels="$inputs/wheels"
    mkdir -p "$wheels"
    pip download -q --no-deps -d "$wheels" "${pure[@]}"
    for py in 3.10 3.11 3.12 3.13; do
      pip download -q --no-deps --only-binary=:all: --python-version "$py" \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$wheels" "${binary[@]}" || true
    done
    du -sh "$inputs"
    ;;
  device)
    py="${PYTHON:-python3}"
    site="$inputs/site"
    missing=()
    for mod in flax optax chex absl etils rich treescope ml_collections msgpack yaml safetensors; do
      "$py" -c "import $mod" 2>/dev/null || missing+=("$mod")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
      echo "device check: not installed here: ${missing[*]}; installing from $inputs/wheels into $site"
      "$py" -m pip install -q --no-index --no-deps --find-links "$inputs/wheels" --target "$site" \
        "${pure[@]}" "${binary[@]}"
      export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    timeout 540 "$py" -m lm.device_check check --inputs="$inputs" --out="$out"
    ;;
  *)
    echo "usage: bash scripts/device_check.sh [--cpu | --prepare]" >&2
    exit 2
    ;;
esac
