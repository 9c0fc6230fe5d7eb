"""`--dry_run` on every launcher that loads a model (`launch.common.dry_run`, one function for all):
the config checked, the plan of its programs printed for this host's devices, nothing written —
no run directory, no built tokenizer or solver, nothing in the working directory."""

import os
import subprocess
import sys

import pytest

from tests.launch.common_test import ENV

CASES = {
  "kace_eval": ["--config=configs/kace.py", "--config.roles.solver.sampler.max_rows=8"],
  "kace_build": ["--config=configs/kace.py", "--config.roles.solver.sampler.max_rows=8"],
  "dpa_testbed": ["--config=configs/dpa_grpo.py:testbed", "--config.sampler.max_rows=8"],
  "serve": ["--config=configs/serve.py:tiny", "--config.server.max_batch_prompts=8"],
}
PROGRAMS = {"kace_eval": ["sample (solver)"], "kace_build": ["sample (solver)"],
            "dpa_testbed": ["accumulate", "apply", "sample"], "serve": ["sample"]}  # fmt: skip


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("launcher", sorted(CASES))
def test_dry_run_prints_the_plan_and_writes_nothing(launcher, tmp_path):
  cwd, home = tmp_path / "cwd", tmp_path / "home"
  cwd.mkdir()
  workdir = tmp_path / "run"
  args = [*CASES[launcher], "--dry_run"] + ([] if launcher == "serve" else [f"--workdir={workdir}"])
  env = {**ENV, "HOME": str(home), "MPLCONFIGDIR": str(tmp_path / "mpl")}
  env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
  proc = subprocess.run(
    [sys.executable, "-m", f"launch.{launcher}", *args], cwd=cwd, env=env, capture_output=True, text=True,
    timeout=300,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
  assert "fits in" in proc.stdout, proc.stdout
  for program in PROGRAMS[launcher]:
    assert f"  {program} " in proc.stdout, proc.stdout
  assert not workdir.exists() and os.listdir(cwd) == []
  assert not (home / ".cache" / "lm_serve").exists() and not (home / ".cache" / "kace").exists()
