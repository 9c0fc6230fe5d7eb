#!/usr/bin/env bash
# The device check (launch/device_check.py, lm/device_check.py): parity in bf16 (inputs committed
# under lm/parity_inputs/), memory bandwidth, decode against its roofline, and docs/scale.md's row
# for this device (the 4B DPA-GRPO accumulate at its planned micro-batch, random weights,
# dpa_grpo/device_check.py) judged against the plan: memory within 10%, time within 2x of the
# roofline. Three ways to call it:
#   bash scripts/device_check.sh --cpu      # here and in CI: toy sizes (measured, not judged)
#   bash scripts/device_check.sh --prepare  # here, before a device session: wheels of the pure
#                                           # dependencies into device_check_inputs/wheels (ignored
#                                           # by git: carry it), for a machine without a registry
#   bash scripts/device_check.sh            # on the accelerator machine (its own newer jax): installs
#                                           # what is missing from the wheels, then checks
# The record goes to ${OUT:-.}/device_check.json; the exit status is 0 only when every part ran,
# parity held and the planned row agreed with the plan. Bounded to 9 minutes on the device.
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
    python -m launch.device_check check --cpu --out="${OUT:-$(mktemp -d)}/device_check.json"
    ;;
  --prepare)
    . scripts/setup_env.sh
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
    timeout 540 "$py" -m launch.device_check check --out="$out"
    ;;
  *)
    echo "usage: bash scripts/device_check.sh [--cpu | --prepare]" >&2
    exit 2
    ;;
esac
