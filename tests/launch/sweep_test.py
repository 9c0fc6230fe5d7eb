"""lm.sweep: the sweep helper, real runs of one subprocess per point, resumption, dry runs."""

import os
import textwrap

import pytest

from lm import rundir, sweep

CONFIG = textwrap.dedent(
  """
    import ml_collections

    def get_config(arg="default"):
      return ml_collections.ConfigDict(dict(loss=dict(beta=0.04, kl="k1"), tag=arg))

    def get_sweep(h):
      return h.product([h.sweep("config.loss.beta", [0.1, 1.0])])
    """
)


def test_helper_product_and_zip():
  h = sweep.Helper()
  a, b = h.sweep("config.x", [1, 2]), h.sweep("config.y", ["u", "v"])
  assert h.product([a, b]) == [
    {"config.x": 1, "config.y": "u"},
    {"config.x": 1, "config.y": "v"},
    {"config.x": 2, "config.y": "u"},
    {"config.x": 2, "config.y": "v"},
  ]
  assert h.zip([a, b]) == [{"config.x": 1, "config.y": "u"}, {"config.x": 2, "config.y": "v"}]
  with pytest.raises(ValueError, match="equal length"):
    h.zip([a, h.sweep("config.y", [1])])
  with pytest.raises(ValueError, match="same key twice"):
    h.product([a, a])
  with pytest.raises(ValueError, match="must name a config field"):
    h.sweep("loss.beta", [1])


@pytest.mark.slow
@pytest.mark.integration
def test_sweep_runs_one_process_per_point_and_resumes(tmp_path, capsys):
  config = tmp_path / "cfg.py"
  config.write_text(CONFIG)
  workdir = str(tmp_path / "sweep")
  launcher = "tests.launch.echo_launcher"

  sweep.run_sweep(f"{config}:small", launcher, workdir, dry_run=True)
  commands = capsys.readouterr().out.strip().splitlines()
  assert len(commands) == 2 and all("--config.loss.beta=" in c for c in commands)
  assert not os.path.exists(os.path.join(workdir, sweep.point_name(0, {"config.loss.beta": 0.1})))

  index = sweep.run_sweep(f"{config}:small", launcher, workdir)
  assert [p["status"] for p in index["points"]] == ["done", "done"]
  assert rundir.read_json(os.path.join(workdir, "index.json"))["points"] == index["points"]
  for point, beta in zip(index["points"], [0.1, 1.0], strict=True):
    run_dir = os.path.join(workdir, point["subdir"])
    resolved = rundir.read_json(os.path.join(run_dir, "config.json"))
    assert resolved["loss"]["beta"] == beta and resolved["tag"] == "small"
    assert point["overrides"] == {"config.loss.beta": beta}

  sweep.run_sweep(f"{config}:small", launcher, workdir)  # resumed: nothing runs again
  for point in index["points"]:
    with open(os.path.join(workdir, point["subdir"], "runs.txt")) as f:
      assert f.read() == "run\n"


@pytest.mark.integration
def test_failed_points_are_recorded_and_reported(tmp_path):
  config = tmp_path / "cfg.py"
  config.write_text(CONFIG)
  with pytest.raises(RuntimeError, match="2 sweep point"):
    sweep.run_sweep(str(config), "tests.launch.no_such_launcher", str(tmp_path / "sweep"))
  statuses = [p["status"] for p in rundir.read_json(tmp_path / "sweep" / "index.json")["points"]]
  assert statuses == ["failed", "failed"]
