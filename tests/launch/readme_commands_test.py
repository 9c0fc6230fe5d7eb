"""The README's CPU commands, run as written (or at smoke size by override) in subprocesses.

`tests/readme_test.py` maps every `python -m launch...` command of the README to the test that
runs it; these are the ones no other test ran. Each takes seconds to a minute on 2 cores.
"""

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.lm.tokenizer_helpers import make_tiny_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env():
  return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}


def _run(args, timeout):
  done = subprocess.run(
    [sys.executable, "-m", *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return done


def test_theory_smoke_run_writes_its_figures(tmp_path):
  """`python -m launch.theory --workdir=...` at the smoke preset."""
  _run(["launch.theory", "--config=configs/theory.py:smoke", f"--workdir={tmp_path}"], timeout=600)
  numbers = json.loads((tmp_path / "theory.json").read_text())
  assert numbers and (tmp_path / "phase_portrait.png").stat().st_size > 1000


def test_sweep_over_theory_runs_two_points_at_once_resumes_and_summarises(tmp_path):
  """`python -m launch.sweep --config=configs/theory.py:smoke --launcher=launch.theory
  --sweep=loss.kl=k1,k3 --workers=2 --workdir=DIR`, as written: both points run, a rerun runs none,
  the summary has a row of final numbers per point."""
  args = ["launch.sweep", "--config=configs/theory.py:smoke", "--launcher=launch.theory",
          "--sweep=loss.kl=k1,k3", "--workers=2", f"--workdir={tmp_path}"]  # fmt: skip
  _run(args, timeout=600)
  logs = sorted(tmp_path.glob("*/sweep.log"))
  assert [p.parent.name for p in logs] == ["000_loss.kl=k1", "001_loss.kl=k3"]
  stamps = [p.stat().st_mtime_ns for p in logs]
  again = _run(args, timeout=300)
  assert "2 already done" in again.stderr and [p.stat().st_mtime_ns for p in logs] == stamps
  rows = (tmp_path / "summary.csv").read_text().splitlines()
  assert len(rows) == 3 and rows[0].startswith("point,loss.kl,status,wall_s,") and ",done," in rows[1]
  assert (tmp_path / "summary.md").read_text().startswith("| point | loss.kl | status |")


def test_serve_tiny_answers_and_stops_on_ctrl_c(tmp_path):
  """`python -m launch.serve --config=configs/serve.py ...` as docs/serving.md's CPU recipe runs it
  (the README's checkpoint is a real Qwen3): the tiny preset builds its tokenizer (under a fresh
  HOME), listens, answers a completion and the recipe's `openai` snippet, and exits cleanly on SIGINT."""
  command = [sys.executable, "-m", "launch.serve", "--config=configs/serve.py:tiny", "--config.server.port=0"]
  log = tmp_path / "server.log"  # a file, polled: a pipe read line by line blocks when nothing comes
  with open(log, "w") as f:
    env = {**_env(), "HOME": str(tmp_path)}
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
  try:
    base_url, deadline = None, time.time() + 300
    while base_url is None and time.time() < deadline:
      assert server.poll() is None, f"the server exited before listening: {log.read_text()[-2000:]}"
      found = re.search(r"serving 'local' at (http://\S+/v1)", log.read_text())
      base_url = found and found.group(1)
      time.sleep(0.2)
    assert base_url, f"the server never said where it listens: {log.read_text()[-2000:]}"
    with urllib.request.urlopen(f"{base_url}/models", timeout=60) as response:
      assert json.loads(response.read())["data"][0]["id"] == "local"
    body = json.dumps({"model": "local", "prompt": "hello", "max_tokens": 4, "seed": 0}).encode()
    request = urllib.request.Request(
      f"{base_url}/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
      answer = json.loads(response.read())
    assert answer["usage"]["completion_tokens"] >= 1
    assert (tmp_path / ".cache" / "lm_serve" / "byte_tokenizer" / "tokenizer.json").exists()
    recipe = open(os.path.join(ROOT, "docs", "serving.md")).read().split("### On a CPU, in one command")[1]
    snippet = re.search(r"```python\n(.*?)```", recipe, re.S).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
      exec(snippet.replace("http://127.0.0.1:8000/v1", base_url), {})
    assert int(printed.getvalue().split()[-1]) >= 1  # the reply's completion tokens
    server.send_signal(signal.SIGINT)
    assert server.wait(timeout=60) == 0
  finally:
    if server.poll() is None:
      server.kill()
      server.wait()


def _kace_smoke_overrides(tmp_path):
  """configs/kace.py shrunk as tests/kace/methods_test.py does: a random tiny solver checkpoint
  (no solver training), two problems, a few tokens, one grader worker."""
  from flax import nnx

  import lm
  from lm.config import ModelConfig
  from lm.tokenizer import load_tokenizer
  from tests.kace.learn_helpers import tiny_bert

  checkpoint = make_tiny_tokenizer(tmp_path / "solver")
  model = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=load_tokenizer(checkpoint).vocab_size), rngs=nnx.Rngs(0))
  lm.save_hf(model, checkpoint)
  bert = tiny_bert(str(tmp_path / "bert"))
  return [
    "--config.synthetic.build_solver=False", "--config.synthetic.per_cell=2",
    "--config.synthetic.test_per_cell=1",
    f"--config.roles.solver.checkpoint={checkpoint}", "--config.roles.solver.dtype=float32",
    "--config.roles.solver.sampler.min_prompt_bucket=256", "--config.roles.solver.sampler.step_bucket=8",
    "--config.sampling.max_tokens=6", "--config.role_sampling.max_tokens=8", "--config.data.limit=2",
    "--config.eval.solve_rate_k=0", "--config.eval.bootstrap=50", "--config.eval.batch_size=8",
    "--config.grader.workers=1", "--config.learn.train_limit=4", "--config.learn.retries=0",
    "--config.learn.attempt_tokens=16", "--config.learn.failures_per_prompt=1", "--config.learn.max_cards=1",
    f"--config.learn.embedder_dir={bert}", f"--config.retrieval.model_dir={bert}",
  ]  # fmt: skip


def test_kace_build_and_table_smoke_runs(tmp_path):
  """`python -m launch.kace_build --workdir=... '--config.methods=("kace",)'` and
  `python -m launch.kace_table --workdir=...`, at smoke size."""
  overrides = _kace_smoke_overrides(tmp_path)
  build = tmp_path / "kace_build"
  _run(["launch.kace_build", f"--workdir={build}", '--config.methods=("kace",)', *overrides], timeout=900)
  assert (build / "kace" / "tree.json").exists()
  table = tmp_path / "kace_table"
  done = _run(
    ["launch.kace_table", f"--workdir={table}", '--config.table.methods=("tiered",)', *overrides], 900
  )
  assert "| tiered |" in done.stdout and (table / "table.md").exists()
