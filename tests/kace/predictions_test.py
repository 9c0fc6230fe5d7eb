"""Pre-registered predictions judged from records: paired differences pooled over runs, verdicts from
the bootstrap interval (held / not held / inconclusive, a tie within the margin), levels filtered."""

import os

import pytest

from kace import evaluate, predictions
from lm import rundir


def _run(tmp_path, name, outcomes):
  """outcomes: {method: [(level, correct), ...]} over problems p0, p1, ..."""
  run = tmp_path / name
  os.makedirs(run)
  rows = [
    {"method": m, "id": f"p{i}", "level": level, "correct": ok}
    for m, items in outcomes.items()
    for i, (level, ok) in enumerate(items)
  ]
  rundir.append_jsonl(run / evaluate.RECORDS, rows)
  return str(run)


def _judge(tmp_path, prediction, a, b, runs=2):
  dirs = [_run(tmp_path, f"s{s}", {prediction.a: a, prediction.b: b}) for s in range(runs)]
  return predictions.judge(prediction, predictions.outcomes(dirs), bootstrap=500)


def test_greater_is_held_not_held_or_inconclusive_from_the_interval(tmp_path):
  p = predictions.Prediction(number="1", a="kace", relation=">", b="tiered", min_gap=0.15)
  right, wrong = [(2, True)] * 60, [(2, False)] * 60
  held = _judge(tmp_path / "a", p, right, wrong)
  assert held["verdict"] == "held" and held["mean"] == 1.0 and held["problems"] == 120
  assert _judge(tmp_path / "b", p, wrong, right)["verdict"] == "not held"
  mixed = [(2, i % 2 == 0) for i in range(60)]
  assert _judge(tmp_path / "c", p, mixed, mixed[1:] + mixed[:1])["verdict"] == "inconclusive"
  small = [(2, True)] * 6 + [(2, False)] * 54
  assert _judge(tmp_path / "d", p, small, wrong)["verdict"].startswith("not held (gap")


def test_tie_within_the_margin_and_levels(tmp_path):
  p = predictions.Prediction(number="8", a="kace", relation="≈", b="tiered", levels=(1,))
  same = [(1, i % 3 == 0) for i in range(90)] + [(2, True)] * 30
  other = [(1, i % 3 == 0) for i in range(90)] + [(2, False)] * 30
  j = _judge(tmp_path / "a", p, same, other)
  assert j["verdict"] == "held" and j["problems"] == 180 and j["mean"] == 0.0
  far = predictions.Prediction(number="6", a="kace", relation="≈", b="tiered")
  assert _judge(tmp_path / "b", far, [(2, True)] * 60, [(2, False)] * 60)["verdict"] == "not held"


def test_report_lists_every_prediction_and_missing_methods_are_inconclusive(tmp_path):
  run = _run(tmp_path, "s0", {"kace": [(2, True)] * 10, "tiered": [(2, False)] * 10})
  text = predictions.report([run], predictions.MAIN, bootstrap=200)
  assert all(f"| {p.number} | " in text for p in predictions.MAIN)
  assert "no paired problems" in text
  with pytest.raises(KeyError):
    predictions.CONTROLS["none"]


def test_clustered_by_build_a_gain_carried_by_two_builds_is_not_held(tmp_path):
  """Ten builds of 30 problems: kace beats tiered on every problem in two builds, loses on every one
  in one, ties in seven. Pooled over 300 problems the gain (+0.10) looks held; clustered by build
  (the trees are what varies) it is inconclusive, and accuracy's interval widens the same way."""
  p = predictions.Prediction(number="x", a="kace", relation=">", b="tiered")
  dirs = []
  for s in range(10):
    kace = [(2, s in (0, 1) or s >= 3)] * 30
    tiered = [(2, s >= 2)] * 30
    dirs.append(_run(tmp_path, f"s{s}", {"kace": kace, "tiered": tiered}))
  by_method = predictions.outcomes(dirs)
  pooled = predictions.judge(p, by_method, bootstrap=500)
  clustered = predictions.judge(p, by_method, bootstrap=500, clustered=True)
  assert pooled["mean"] == clustered["mean"] == pytest.approx(0.1)
  assert pooled["verdict"] == "held" and clustered["verdict"] == "inconclusive"
  assert clustered["ci"][1] - clustered["ci"][0] > 3 * (pooled["ci"][1] - pooled["ci"][0])
  acc = predictions.accuracy(by_method, "kace", bootstrap=500, clustered=True)
  assert acc["runs"] == 10 and acc["accuracy"] == pytest.approx(0.9) and acc["ci"][0] < 0.8
  assert "clustered by run" in predictions.report(dirs, (p,), bootstrap=200, clustered=True)
