"""lm.sweep: the sweep helper, real runs of one subprocess per point, resumption, dry runs."""

import csv
import os
import shlex
import subprocess
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

  index = sweep.run_sweep(f"{config}:small", launcher, workdir, workers=2)
  assert [p["status"] for p in index["points"]] == ["done", "done"]
  assert len(open(os.path.join(workdir, "summary.csv")).read().splitlines()) == 1 + 2
  assert rundir.read_json(os.path.join(workdir, "index.json"))["points"] == index["points"]
  for point, beta in zip(index["points"], [0.1, 1.0], strict=True):
    run_dir = os.path.join(workdir, point["subdir"])
    resolved = rundir.read_json(os.path.join(run_dir, "config.json"))
    assert os.path.exists(os.path.join(run_dir, sweep.DONE))
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


def test_command_line_axes_multiply_ranges_include_both_ends_and_slashes_zip():
  points = sweep.parse_axes(["loss.beta=0.01,0.04", "seed=0:2"])
  assert len(points) == 6
  assert points[0] == {"config.loss.beta": "0.01", "config.seed": "0"}
  assert points[-1] == {"config.loss.beta": "0.04", "config.seed": "2"}
  assert [p["config.seed"] for p in sweep.parse_axes(["config.seed=0:9:3"])] == ["0", "3", "6", "9"]
  zipped = sweep.parse_axes(["loss.kl/loss.beta=k1/0.04,k3/0.2"])
  assert zipped == [{"config.loss.kl": "k1", "config.loss.beta": "0.04"},
                    {"config.loss.kl": "k3", "config.loss.beta": "0.2"}]  # fmt: skip
  for bad, message in [("seed=3:1", "lo <= hi"), ("seed", "expected key="), ("a/b=1/2,3", "2 parts"),
                       ("beta=0.1,", "a,b,c")]:  # fmt: skip
    with pytest.raises(ValueError, match=message):
      sweep.parse_axes([bad])


def test_dry_run_writes_nothing_and_a_rerun_skips_what_is_done(tmp_path, capsys):
  workdir = tmp_path / "sweep"
  points = sweep.parse_axes(["loss.beta=0.1,1.0"])
  index = sweep.run_sweep("cfg.py:small", "launch.theory", str(workdir), points=points,
                          fixed=["--config.seed=3"], dry_run=True)  # fmt: skip
  assert not workdir.exists()
  printed = capsys.readouterr().out.splitlines()
  assert printed == [p["command"] for p in index["points"]]
  assert all(" --config.seed=3 --config.loss.beta=" in line for line in printed)
  first = index["points"][0]
  workdir.mkdir()
  rundir.write_json(workdir / "index.json", {"points": [{**first, "status": "done", "wall_seconds": 9.0}]})
  resumed = sweep.plan("cfg.py:small", "launch.theory", str(workdir), points)
  assert [p["status"] for p in resumed["points"]] == ["done", "planned"]
  assert resumed["points"][0]["wall_seconds"] == 9.0  # the finishing run's record is kept
  (workdir / index["points"][1]["subdir"]).mkdir()  # finished elsewhere (a SLURM task)
  (workdir / index["points"][1]["subdir"] / sweep.DONE).write_text("")
  resumed = sweep.plan("cfg.py:small", "launch.theory", str(workdir), points)
  assert [p["status"] for p in resumed["points"]] == ["done", "done"]


def test_summary_has_one_row_per_point_with_its_final_metrics(tmp_path):
  index = sweep.plan("cfg.py", "launch.theory", str(tmp_path), sweep.parse_axes(["seed=0:2"]))
  dirs = [tmp_path / p["subdir"] for p in index["points"]]
  dirs[0].mkdir()
  rundir.append_jsonl(
    dirs[0] / "metrics.jsonl", [{"step": 1, "loss": 2.0}, {"step": 2, "eval": {"acc": 0.5}}]
  )
  dirs[1].mkdir()
  rundir.write_json(dirs[1] / "report.json", {"eval": {"acc": 0.75}, "note": "text", "curve": [1, 2]})
  for entry in index["points"][:2]:
    entry.update(status="done", wall_seconds=3.0)
  index["points"][2]["status"] = "failed"
  csv_path, md_path = sweep.write_summary(str(tmp_path), index)
  rows = list(csv.DictReader(open(csv_path)))
  assert [(r["seed"], r["status"], r["eval.acc"]) for r in rows] == [
    ("0", "done", "0.5"), ("1", "done", "0.75"), ("2", "failed", "")]  # fmt: skip
  assert rows[0]["loss"] == "2.0" and rows[0]["step"] == "2" and rows[0]["wall_s"] == "3.0"
  table = open(md_path).read().splitlines()
  assert table[0].startswith("| point | seed | status | wall_s |") and len(table) == 2 + 3


@pytest.mark.integration
def test_slurm_array_parses_and_each_index_runs_its_point(tmp_path):
  points = sweep.parse_axes(["loss.beta=0.01,0.04", "seed=0:2"])
  root = str(tmp_path)
  index = sweep.plan(f"{root}/configs/dpa_grpo.py:tiny", "launch.dpa_grpo", "/runs/s", points)
  script = tmp_path / "sweep.sbatch"
  script.write_text(sweep.emit("slurm", index, root))
  assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
  assert "#SBATCH --array=0-5\n" in script.read_text()
  for i in (0, 5):
    env = {**os.environ, "DRY_RUN": "1", "SLURM_ARRAY_TASK_ID": str(i)}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True)
    expected = shlex.split(index["points"][i]["command"])
    assert shlex.split(done.stdout) == [
      "python",
      *expected[1:3],
      "--config=configs/dpa_grpo.py:tiny",
      *expected[4:],
    ]
  env = {**os.environ, "SLURM_ARRAY_TASK_ID": "6"}
  assert subprocess.run(["bash", str(script)], env=env, capture_output=True, check=False).returncode == 2
  tpu = sweep.emit("tpu", index, root)
  assert tpu.count("launch/tpu_pod.sh launch.dpa_grpo --config=configs/dpa_grpo.py:tiny") == 6
  script.write_text(tpu)
  assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0


@pytest.mark.parametrize("name", ["dpa_grpo.py", "kace.py", "theory.py"])
def test_every_launcher_config_defines_a_sweep(name):
  points = sweep.load_points(os.path.join(os.path.dirname(__file__), "..", "..", "configs", name))
  assert points and all(key.startswith("config.") for p in points for key in p)
