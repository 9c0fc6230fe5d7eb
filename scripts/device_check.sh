#!/usr/bin/env bash
# The device check (launch/device_check.py, lm/device_check.py): parity in bf16 (inputs committed
# under lm/parity_inputs/), memory bandwidth, decode against its roofline, and docs/scale.md's rows
# for this device on random weights (the 4B DPA-GRPO sampler and accumulate at their planned sizes,
# dpa_grpo/device_check.py; KACE's solver sampler, kace/device_check.py, its program run for 1,024
# of its 38,912 decode steps: a truncated measurement, timed against the roofline of the steps run),
# in ascending order of their peaks, judged against the plan: memory within 10%, time within 2x of
# the roofline. Three ways to call it:
#   bash scripts/device_check.sh --cpu      # here and in CI: toy sizes (measured, not judged)
#   bash scripts/device_check.sh --prepare  # here, before a device session: wheels of the pure
#                                           # dependencies into device_check_inputs/wheels (ignored
#                                           # by git: carry it), for a machine without a registry
#   bash scripts/device_check.sh            # on the accelerator machine (its own newer jax): installs
#                                           # what is missing from the wheels, then checks
#   bash scripts/device_check.sh --parts=rows --attention_impl=cudnn   # the same, some parts, the
#                                           # rows under another option (launch.device_check --help)
#   bash scripts/device_check.sh exec python -m tools.device_profile --out=$OUT   # any command in
#                                           # the environment the check sets up
# The record goes to ${OUT:-.}/device_check.json; the exit status is 0 only when every part ran,
# parity held and every planned row agreed with the plan. Bounded to 9 minutes on the device.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
inputs="${DEVICE_CHECK_INPUTS:-device_check_inputs}"
out="${OUT:-.}/device_check.json"
mode="${1:-device}"
case "$mode" in --cpu | --prepare | exec) shift ;; *) mode=device ;; esac
# What `launch.device_check` imports beyond jax, numpy and what a GPU image carries anyway (python
# -X importtime on the project's venv), by distribution name, at the versions the project is tested
# with (constraints.txt): the code is written against these, so the device runs them too unless they
# fail there with its own (newer) jax, in which case the image's own are used (`smoke` decides).
pinned=(flax optax chex absl-py etils treescope ml_collections)
# A tiny model's forward and gradient through flax, optax and the trainer's modules: what breaks
# first when a package does not fit the device's jax.
smoke='import jax, jax.numpy as jnp, optax
from flax import nnx
from lm.config import ModelConfig
from lm.model import Qwen
import ml_collections, dpa_grpo.step, dpa_grpo.plan, lm.sampler, kace.plan
m = Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(0))
g = nnx.grad(lambda m, t: m(t).astype(jnp.float32).mean())(m, jnp.ones((1, 8), jnp.int32))
optax.adamw(1e-3).init(nnx.state(m, nnx.Param))
print("smoke ok: jax", jax.__version__, jax.devices()[0].device_kind)'

case "$mode" in
  --cpu)
    . scripts/setup_env.sh
    python -m launch.device_check check --cpu --out="${OUT:-$(mktemp -d)}/device_check.json"
    ;;
  --prepare)
    . scripts/setup_env.sh
    wheels="$inputs/wheels"
    rm -rf "$wheels" && mkdir -p "$wheels"
    pip download -q --no-deps -c constraints.txt -d "$wheels" "${pinned[@]}"
    du -sh "$inputs"
    ;;
  device | exec)
    py="${PYTHON:-python3}"
    site="${TMPDIR:-/tmp}/device_check_site"
    if [ -d "$inputs/wheels" ]; then
      "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site/pinned" "$inputs"/wheels/*.whl
      if PYTHONPATH="$PWD:$site/pinned" "$py" -c "$smoke"; then
        echo "device check: the project's pinned ${pinned[*]} with this machine's jax"
        export PYTHONPATH="$site/pinned${PYTHONPATH:+:$PYTHONPATH}"
      else
        echo "device check: the pinned packages fail with this machine's jax; using the image's own"
        for mod in ml_collections:ml_collections treescope:treescope etils:etils; do
          "$py" -c "import ${mod%%:*}" 2>/dev/null || {
            "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site/missing" \
              "$inputs"/wheels/"${mod##*:}"-*.whl
            export PYTHONPATH="$site/missing${PYTHONPATH:+:$PYTHONPATH}"
          }
        done
        PYTHONPATH="$PWD:${PYTHONPATH:-}" "$py" -c "$smoke"
      fi
    fi
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    if [ "$mode" = exec ]; then
      exec "$@"
    fi
    timeout "${DEVICE_CHECK_SECONDS:-540}" "$py" -m launch.device_check check --out="$out" "$@"
    ;;
esac
