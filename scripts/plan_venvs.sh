#!/usr/bin/env bash
# Builds the two venvs `python -m launch.plan` compiles in, ahead of time, on a machine with no accelerator:
#   .plan_venvs/tpu   jax[tpu] (libtpu, ~0.7 GB): TPU targets through libtpu's topology descriptions
#   .plan_venvs/cuda  jax-cuda12-plugin + jax-cuda12-pjrt, --no-deps (no CUDA libraries, ~0.5 GB): GPU
#                     targets through XLA:GPU's deviceless compile (JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1)
# Both pin jax/jaxlib to the project's version and add flax, optax, ml_collections, absl. The project's
# other dependencies (safetensors, transformers, ... which its modules import) come from the project's
# own venv when it has one (a .pth line after this venv's site-packages, so this venv's jax wins),
# else from pip (the project with its pinned requirements). launch.plan runs with the repository on
# PYTHONPATH. Usage: scripts/plan_venvs.sh [tpu|cuda|all] [ROOT]
set -euo pipefail
which="${1:-all}"
root="${2:-$(cd "$(dirname "$0")/.." && pwd)/.plan_venvs}"
JAX_VERSION=0.10.2
repo="$(cd "$(dirname "$0")/.." && pwd)"
COMMON=(flax==0.12.8 optax==0.2.8 chex==0.1.92 ml_collections==1.1.0 absl-py==2.5.1 "numpy>=2.0,<3")

build() {  # name, pip args...
  local name="$1"; shift
  local venv="$root/$name"
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "$@"
  if [[ -x "$repo/.venv/bin/python" ]]; then
    "$repo/.venv/bin/python" -c 'import site; print(site.getsitepackages()[0])' \
      > "$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')/zz_project_venv.pth"
  else
    "$venv/bin/pip" install -q "$repo"
  fi
  echo "built $venv: $("$venv/bin/python" -c 'import jax; print("jax", jax.__version__)')"
}

if [[ "$which" == tpu || "$which" == all ]]; then
  build tpu "jax[tpu]==$JAX_VERSION" "${COMMON[@]}"
fi
if [[ "$which" == cuda || "$which" == all ]]; then
  build cuda "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION" "${COMMON[@]}"
  "$root/cuda/bin/pip" install -q --no-deps "jax-cuda12-plugin==$JAX_VERSION" "jax-cuda12-pjrt==$JAX_VERSION"
fi
