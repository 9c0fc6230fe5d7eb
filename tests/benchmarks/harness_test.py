"""The shared harness: rotating trial order, per-trial ratios, workers that fail to start."""

import sys

from benchmarks import harness


def test_interleave_rotates_the_order_every_trial():
  workers = {"a": None, "b": None, "c": None}
  calls = []

  def measure(name, worker):
    calls.append(name)
    return len(calls)

  out = harness.interleave(workers, 4, measure)
  assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
  assert out == {"a": [1, 6, 8, 10], "b": [2, 4, 9, 11], "c": [3, 5, 7, 12]}


def test_ratios_pair_measurements_within_a_trial():
  assert harness.ratios([100.0, 50.0, 100.0], [50.0, 25.0, 40.0]) == [2.0, 2.0, 2.5]
  assert harness.fmt([2.0, 2.0, 2.5], 2) == "2.00 [2.00–2.50]"


def test_a_worker_that_dies_on_load_is_reported_and_the_others_run(tmp_path):
  # A real process speaking the protocol (`benchmarks.engines.serve`) and one that exits at once.
  serve = (
    "import sys; from benchmarks import engines\n"
    "class R:\n"
    "  version = 'r'\n"
    "  def __init__(self, path): pass\n"
    "  def ping(self, x): return {'x': x + 1}\n"
    "engines.serve({'r': R}, 'r', '.')\n"
  )
  root = harness.pathlib.Path(__file__).parents[2]
  makers = {
    "good": lambda: harness.Worker("good", [sys.executable, "-c", serve], tmp_path / "good.log", {}, root),
    "dead": lambda: harness.Worker("dead", [sys.executable, "-c", "pass"], tmp_path / "dead.log", {}, root),
  }
  workers, info, first, failures = harness.start(makers, lambda w: w.call(cmd="ping", x=1)["x"])
  try:
    assert list(workers) == ["good"] and first == {"good": 2} and info["good"]["version"] == "r"
    assert set(failures) == {"dead"} and "dead worker exited" in failures["dead"]
  finally:
    for worker in workers.values():
      worker.close()
