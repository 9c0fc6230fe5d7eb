"""run_theory writes every figure and its numbers; summarize_sweep builds the β figure from them."""

import os

import numpy as np
import pytest

from configs import theory as theory_config
from dpa_grpo import plots
from dpa_grpo.theory_config import TheoryConfig
from lm import rundir


@pytest.mark.slow
@pytest.mark.integration
def test_run_theory_and_sweep_summary(tmp_path):
  config = theory_config.get_config("smoke")
  config.loss.kl, config.loss.beta = "k3", 0.2
  config = TheoryConfig.from_dict(config.to_dict())
  result = plots.run_theory(config, rundir.prepare_workdir(tmp_path / "000", config))
  for name in plots.FIGURES:
    for ext in ("png", "pdf"):
      assert os.path.getsize(tmp_path / "000" / f"{name}.{ext}") > 1000
  saved = rundir.read_json(tmp_path / "000" / "theory.json")
  (fp,) = saved["variants"]["pair/k3"]["fixed_points"]
  assert fp["stable"] and max(fp["eigenvalues"]["real"]) < 0
  np.testing.assert_allclose(
    fp["probs"], [r[0] for r in saved["variants"]["pair/k3"]["closed_form"]], atol=1e-6
  )
  np.testing.assert_allclose(np.sum(saved["cases"]["probs"], axis=1), 1.0, rtol=1e-5)
  assert saved["figures"] == result["figures"]
  # A sweep index (as lm.sweep writes it) with this run done and one unfinished point.
  rundir.write_json(
    tmp_path / "index.json",
    {
      "points": [
        {"name": "000", "subdir": "000", "status": "done", "overrides": {"config.loss.beta": 0.2}},
        {"name": "001", "subdir": "001", "status": "failed", "overrides": {"config.loss.beta": 1.0}},
      ]
    },
  )
  rows = rundir.read_json(plots.summarize_sweep(str(tmp_path)))["rows"]
  assert [r["beta"] for r in rows] == [0.2]
  np.testing.assert_allclose(rows[0]["stable_fixed_point"], fp["probs"])
  assert os.path.exists(tmp_path / "sweep_summary.png")
