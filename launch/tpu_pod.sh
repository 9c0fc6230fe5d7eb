#!/usr/bin/env bash
# Runs one launcher on every worker of a Cloud TPU VM (a single host or a pod slice), one JAX
# process per worker. See docs/multihost.md.
#
#   TPU_NAME=my-v5p-32 ZONE=us-east5-a launch/tpu_pod.sh launch.dpa_grpo \
#     --config=configs/dpa_grpo.py:qwen3_8b --workdir=/gcs/my-bucket/runs/dpa_qwen3_8b
#
# Environment:
#   TPU_NAME, ZONE  (required) the TPU VM and its zone; PROJECT (optional) the GCP project.
#   DRY_RUN=1       print every command (one a line, each argument quoted) instead of running it.
#   WORKER_IPS      the workers' internal IPs in worker order, separated by ';' or ',' (default: read
#                   with `gcloud compute tpus tpu-vm describe`; a dry run without it prints that
#                   command and shows placeholders).
#   REMOTE_DIR      code directory on the workers, replaced on every call (default: kace-dpa-grpo).
#   VENV            virtual environment on the workers, kept between calls (default: venv-kace).
#   PYTHON          Python >= 3.11 on the workers, used to create VENV (default: python3.11).
#   SKIP_INSTALL=1  skip `pip install -c constraints.txt -e '.[tpu]'` (the code is still copied).
#   PORT            coordinator port on worker 0 (default: 8476).
set -euo pipefail

: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
MODULE="${1:?usage: TPU_NAME=... ZONE=... $0 launch.MODULE [--config=... --workdir=...]}"
shift
[[ "$MODULE" == launch.* ]] || { echo "$0: the first argument is a launcher module (launch.<job>), got '$MODULE'" >&2; exit 2; }
REMOTE_DIR="${REMOTE_DIR:-kace-dpa-grpo}"
VENV="${VENV:-venv-kace}"
DRY_RUN="${DRY_RUN:-0}"
tpu=(gcloud compute tpus tpu-vm ${PROJECT:+--project="$PROJECT"})

run() { # the command, or in a dry run its words, quoted
  if [[ "$DRY_RUN" == 1 ]]; then echo "${*@Q}"; else "$@"; fi
}

# Worker IPs in worker order; worker 0 hosts the jax.distributed coordinator.
if [[ -n "${WORKER_IPS:-}" ]]; then
  ips="$WORKER_IPS"
elif [[ "$DRY_RUN" == 1 ]]; then
  run "${tpu[@]}" describe "$TPU_NAME" --zone="$ZONE" --format='value(networkEndpoints[].ipAddress)'
  ips="WORKER0_IP;WORKER1_IP"
else
  ips=$("${tpu[@]}" describe "$TPU_NAME" --zone="$ZONE" --format='value(networkEndpoints[].ipAddress)')
fi
IFS=';,' read -ra hosts <<<"$ips"
echo "# ${#hosts[@]} worker(s): ${hosts[*]}" >&2

# Ship this checkout (tracked and untracked files, minus .gitignore'd ones) to every worker.
if [[ "$DRY_RUN" == 1 ]]; then
  tarball=code.tar.gz
  echo "git ls-files -z --cached --others --exclude-standard | tar -czf $tarball --null -T -"
else
  tarball=$(mktemp --suffix=.tar.gz)
  trap 'rm -f "$tarball"' EXIT
  git ls-files -z --cached --others --exclude-standard | tar -czf "$tarball" --null -T -
fi
run "${tpu[@]}" scp "$tarball" "$TPU_NAME:code.tar.gz" --zone="$ZONE" --worker=all

# On every worker at once: unpack, install (the tested versions: constraints.txt), then run with the
# explicit JAX_* variables that lm.sharding.initialize_distributed() passes to
# jax.distributed.initialize(). The worker's index comes from the metadata server, as JAX's own TPU
# detection reads it.
if [[ "${SKIP_INSTALL:-0}" == 1 ]]; then
  install=true
else
  install="{ [ -x \$V/bin/python ] || ${PYTHON:-python3.11} -m venv \$V; }; \$V/bin/pip install -q -c constraints.txt -e '.[tpu]'"
fi
worker_id='$(curl -sf -H Metadata-Flavor:Google http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number)'
remote="set -e; rm -rf $REMOTE_DIR && mkdir -p $REMOTE_DIR && tar -xzf code.tar.gz -C $REMOTE_DIR && cd $REMOTE_DIR"
remote+="; V=\$HOME/$VENV; $install"
remote+="; export JAX_COORDINATOR_ADDRESS=${hosts[0]}:${PORT:-8476} JAX_NUM_PROCESSES=${#hosts[@]}"
remote+="; export JAX_PROCESS_ID=$worker_id"
remote+="; exec \$V/bin/python -m $MODULE $(printf '%q ' "$@")"
run "${tpu[@]}" ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command="$remote"
