"""launch/tpu_pod.sh and launch/slurm_gpu.sbatch in dry-run mode (DRY_RUN=1): the commands they would
run, checked word by word; a `gcloud` / `srun` placed first on PATH records any call, and none comes."""

import os
import shlex
import stat
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def tripwire(tmp_path):
  """A PATH whose gcloud, srun and sbatch write `called` when run: a dry run must leave it absent."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for name in ("gcloud", "srun", "sbatch"):
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\necho {name} "$@" >> {tmp_path}/called\nexit 1\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TPU_", "WORKER_IPS"))}
  env.update(PATH=f"{bin_dir}:{env['PATH']}", DRY_RUN="1")
  yield env
  assert not (tmp_path / "called").exists(), (tmp_path / "called").read_text()


def _dry_run(script, args, env, cwd=ROOT):
  done = subprocess.run(["bash", script, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
  assert done.returncode == 0, done.stderr
  return [shlex.split(line) for line in done.stdout.splitlines()]


def test_tpu_pod_dry_run_prints_copy_and_one_ssh_to_every_worker(tripwire):
  env = {
    **tripwire,
    "TPU_NAME": "my-v5p-16",
    "ZONE": "us-east5-a",
    "PROJECT": "proj",
    "WORKER_IPS": "10.0.0.5;10.0.0.6",
  }
  flags = ["--config=configs/dpa_grpo.py:qwen3_4b", "--workdir=/gcs/bucket/runs/a b"]
  lines = _dry_run("launch/tpu_pod.sh", ["launch.dpa_grpo", *flags], env)
  gcloud = ["gcloud", "compute", "tpus", "tpu-vm", "--project=proj"]
  tar, scp, ssh = lines  # WORKER_IPS given: no describe
  assert tar[:2] == ["git", "ls-files"] and "tar" in tar
  assert scp == [*gcloud, "scp", "code.tar.gz", "my-v5p-16:code.tar.gz", "--zone=us-east5-a", "--worker=all"]
  assert ssh[:8] == [*gcloud, "ssh", "my-v5p-16", "--zone=us-east5-a"] and ssh[8] == "--worker=all"
  remote = [shlex.split(part) for part in ssh[9].removeprefix("--command=").split("; ")]
  assert ["export", "JAX_COORDINATOR_ADDRESS=10.0.0.5:8476", "JAX_NUM_PROCESSES=2"] in remote
  assert any(
    p[:1] == ["export"] and p[1].startswith("JAX_PROCESS_ID=$(curl") and "agent-worker-number)" in p[-1]
    for p in remote
  )
  assert ["$V/bin/pip", "install", "-q", "-c", "constraints.txt", "-e", ".[tpu]"] in remote
  assert remote[-1] == ["exec", "$V/bin/python", "-m", "launch.dpa_grpo", *flags]


def test_tpu_pod_dry_run_without_ips_prints_describe_and_skip_install(tripwire):
  env = {**tripwire, "TPU_NAME": "v5e", "ZONE": "z", "SKIP_INSTALL": "1", "PORT": "9999"}
  lines = _dry_run("launch/tpu_pod.sh", ["launch.kace_eval", "--workdir=/w"], env)
  assert lines[0][:6] == ["gcloud", "compute", "tpus", "tpu-vm", "describe", "v5e"]
  command = lines[-1][-1]
  assert "pip install" not in command and "JAX_COORDINATOR_ADDRESS=WORKER0_IP:9999" in command
  assert command.endswith("exec $V/bin/python -m launch.kace_eval --workdir=/w ")


def test_slurm_dry_run_prints_venv_export_and_srun(tripwire, tmp_path):
  env = {**tripwire, "GPUS_PER_NODE": "4", "SLURM_SUBMIT_DIR": str(tmp_path)}
  flags = ["--config=configs/dpa_grpo.py:qwen3_4b", "--workdir=/shared/runs/x"]
  lines = _dry_run(os.path.join(ROOT, "launch/slurm_gpu.sbatch"), ["launch.dpa_grpo", *flags], env)
  assert lines == [
    ["python3.11", "-m", "venv", ".venv-gpu"],
    [".venv-gpu/bin/pip", "install", "-q", "-c", "constraints.txt", "-e", ".[cuda12]"],
    ["export", "JAX_LOCAL_DEVICE_IDS=0,1,2,3"],
    [
      "srun",
      "--ntasks-per-node=1",
      "--kill-on-bad-exit=1",
      ".venv-gpu/bin/python",
      "-m",
      "launch.dpa_grpo",
      *flags,
    ],
  ]
  assert not (tmp_path / ".venv-gpu").exists()


@pytest.mark.parametrize("script", ["launch/tpu_pod.sh", "launch/slurm_gpu.sbatch"])
def test_a_first_argument_that_is_not_a_launcher_is_refused(tripwire, script):
  env = {**tripwire, "TPU_NAME": "t", "ZONE": "z"}
  done = subprocess.run(["bash", script, "--workdir=/w"], cwd=ROOT, env=env, capture_output=True, text=True)
  assert done.returncode == 2 and "launcher module" in done.stderr
