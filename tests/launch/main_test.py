"""The main job (`bash scripts/main.sh` -> `python -m launch.main`): both testbeds into one report.

The testbeds' pipelines past their gates are tested in tests/dpa_grpo/testbed_test.py and
tests/kace/testbed_pipeline_test.py; here, how the main job composes them: report sections, links
re-rooted under each part's directory, a part stopped at its gates not stopping the other.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from launch import main as main_job

ROOT = pathlib.Path(__file__).parents[2]


def test_embed_report_demotes_headings_and_reroots_relative_links_only():
  text = "# Title\n## Sub\n![acc](figures/accuracy.png) [doc](docs/x.md) [web](https://a.b/c) [top](#x)\n"
  out = main_job.embed_report(text, "dpa_testbed")
  assert out.splitlines()[:2] == ["## Title", "### Sub"]
  assert "![acc](dpa_testbed/figures/accuracy.png)" in out and "[doc](dpa_testbed/docs/x.md)" in out
  assert "[web](https://a.b/c)" in out and "[top](#x)" in out


def test_write_report_says_each_parts_status_and_embeds_what_it_wrote(tmp_path):
  dpa = tmp_path / "dpa_testbed"
  dpa.mkdir()
  (dpa / "report.md").write_text("# DPA report\n\n![cases](figures/cases.png)\n")
  parts = {
    "dpa_grpo": {"status": "done", "minutes": 3.25, "report": str(dpa / "report.md")},
    "kace": {"status": "stopped at its gates (x)", "minutes": 0.5, "report": str(tmp_path / "none.md")},
  }
  text = pathlib.Path(main_job.write_report(str(tmp_path), parts, "abc1234")).read_text()
  assert "DPA-GRPO: the copy-and-check testbed: done, 3.2 min" in text
  assert "**Stopped: stopped at its gates (x).** See `kace_v3/gates.json`." in text
  assert "## DPA report" in text and "![cases](dpa_testbed/figures/cases.png)" in text
  assert "CPUs" in text and "commit abc1234" in text  # the machine and the code the numbers came from


@pytest.mark.slow
@pytest.mark.integration
def test_the_main_job_at_smoke_size_reports_both_parts_stopped_at_their_gates(tmp_path):
  """`python -m launch.main` with smoke-size overrides of both presets: a 2-step warm start and a
  1-step solver fail their gates, so each part stops there, the other still runs, the report says
  both, the theory figures are drawn, and the job exits non-zero."""
  run = tmp_path / "run"
  cache = tmp_path / "cache"
  command = [
    sys.executable, "-m", "launch.main", f"--workdir={run}", "--verbosity=-1",
    "--dpa_config.data.synthetic.n=12", "--dpa_config.warm_start.steps=2",
    "--dpa_config.warm_start.from_dir=",  # train a 2-step start, not testbed v3's committed one
    f"--dpa_config.warm_start.cache_dir={cache}", "--dpa_config.train.steps=1",
    "--dpa_config.rollout.revisions=2",
    "--kace_config=configs/kace_v3.py:smoke", f"--kace_config.cache_dir={cache}",
    "--theory_config=configs/theory.py:smoke",
  ]  # fmt: skip
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=False)
  assert done.returncode != 0 and "GateError: dpa_grpo, kace stopped" in done.stderr, done.stderr[-3000:]
  assert "main job into" in done.stderr.splitlines()[0]  # the plan comes first
  assert "I1" not in done.stderr and "orbax" not in done.stderr  # no INFO log without --verbosity
  report = (run / "report.md").read_text()
  assert report.count("**Stopped: stopped at its gates") == 2
  assert (run / "dpa_testbed" / "gates.json").exists() and (run / "kace_v3" / "gates.json").exists()
  assert (run / "dpa_testbed" / "theory" / "phase_portrait.png").exists()
  assert any(p.name.startswith("v3-solver-") for p in cache.iterdir())  # the solver, cached there
  assert not any(p.name.startswith("learned-teacher-") for p in cache.iterdir())  # past the gates only
  assert len([p for p in cache.iterdir() if len(p.name) == 12]) == 1  # the warm start, by its key
