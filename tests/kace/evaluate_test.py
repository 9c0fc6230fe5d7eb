"""Metrics on hand-built records, the method registry, and a killed evaluation that resumes."""

import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import configs.kace
from kace import config as kace_config
from kace import data, evaluate, methods, synthetic, tiers
from lm import rundir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize(
  "exit_tiers, rates, expected",
  [
    (["ES", "MS", "HS", "POOL"], [0.9, 0.6, 0.3, 0.0], (6, 6, 0)),  # perfectly ordered
    (["ES", "MS", "HS", "POOL"], [0.0, 0.3, 0.6, 0.9], (0, 6, 0)),  # perfectly reversed
    (["ES", "MS", "HS"], [0.5, 0.8, 0.1], (2, 3, 0)),  # one discordant pair
    (["ES", "ES", "MS"], [0.9, 0.5, 0.5], (1, 1, 2)),  # a tier tie and a rate tie are left out
    (["HS", "HS"], [0.1, 0.9], (0, 0, 1)),  # nothing comparable
  ],
)
def test_order_preservation_on_hand_built_cases(exit_tiers, rates, expected):
  order = evaluate.order_preservation(exit_tiers, rates)
  assert (order.concordant, order.compared, order.tied) == expected
  assert order.rate == (expected[0] / expected[1] if expected[1] else None)


def _record(pid, exit_tier, correct, calls, tokens):
  return {
    "id": pid,
    "exit_tier": exit_tier,
    "correct": correct,
    "calls": calls,
    "completion_tokens": tokens,
    "prompt_tokens": 10 * calls,
  }


def test_method_metrics_on_hand_built_records():
  records = [
    _record("a", "ES", True, 2, 20),
    _record("b", "MS", True, 5, 50),
    _record("c", "HS", False, 10, 100),
    _record("d", "POOL", False, 10, 90),
  ]
  rates = {"a": 1.0, "b": 0.8, "c": 0.2, "d": 0.4}  # c and d out of order
  m = evaluate.method_metrics(records, rates, bootstrap=500)
  assert m["problems"] == 4 and m["accuracy"] == 0.5
  assert m["ci_low"] <= 0.5 <= m["ci_high"]
  assert m["mean_calls"] == 6.75 and m["mean_completion_tokens"] == 65.0 and m["mean_prompt_tokens"] == 67.5
  assert m["exit_tiers"] == {"ES": 1, "MS": 1, "HS": 1, "POOL": 1}
  assert m["order_pairs"] == {"concordant": 5, "compared": 6, "tied": 0}
  assert m["order_preservation"] == pytest.approx(5 / 6)
  table = evaluate.results_table(
    {"tiered": m}, benchmark="synthetic", problems=4, solve_rate_k=10, bootstrap=2000
  )
  assert "| tiered | 50.0% |" in table and "83.3% (6 pairs)" in table


def test_registry_names_unknown_methods_and_refuses_duplicates():
  config = kace_config.KaceConfig.from_dict(configs.kace.get_config()).method_options()
  assert methods.build("best_of_n", config).schedule.pool_size == 5
  assert methods.build("tiered", config).schedule.tiers[0].name == "ES"
  with pytest.raises(ValueError, match="registered: best_of_n"):
    methods.build("nope", config)
  with pytest.raises(ValueError, match="config.kace.tree"):
    methods.build("kace", config)
  with pytest.raises(ValueError, match="twice"):
    methods.register("tiered")(methods.tiered)


def _eval_command(workdir, checkpoint, tree):
  return [
    sys.executable, "-m", "launch.kace_eval", f"--workdir={workdir}",
    "--config.synthetic.build_solver=False", f"--config.roles.solver.checkpoint={checkpoint}",
    f"--config.kace.tree={tree}", '--config.methods=("tiered","kace")',
    "--config.synthetic.per_cell=2", "--config.synthetic.test_per_cell=1", "--config.data.limit=6",
    "--config.eval.batch_size=2", "--config.eval.solve_rate_k=2", "--config.eval.bootstrap=100",
    "--config.sampling.max_tokens=6", "--config.grader.workers=1",
    "--config.roles.solver.sampler.min_prompt_bucket=256", "--config.roles.solver.sampler.step_bucket=8",
  ]  # fmt: skip


def _lines(path):
  return open(path).read().splitlines() if os.path.exists(path) else []


@pytest.mark.slow
@pytest.mark.integration
def test_a_killed_run_resumes_without_solving_anything_twice(tmp_path, tiny_checkpoint):
  tree = str(tmp_path / "tree.json")
  synthetic.demo_tree().save(tree)
  workdir = tmp_path / "run"
  records = workdir / "records.jsonl"
  command = _eval_command(workdir, tiny_checkpoint, tree)
  # The rerun reads what the killed run compiled from the tests' persistent cache (tests/conftest.py).
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO}
  first = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  deadline = time.time() + 240
  while len(_lines(records)) < 2 and first.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  first.send_signal(signal.SIGKILL)
  _, stderr = first.communicate()
  before = _lines(records)
  assert 2 <= len(before) < 12, stderr.decode()[-3000:]

  subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, timeout=240)
  after = [json.loads(line) for line in _lines(records)]
  assert _lines(records)[: len(before) - 1] == before[:-1]  # finished records kept (the last may be torn)
  keys = [(r["method"], r["id"]) for r in after]
  assert len(keys) == len(set(keys)) == 12  # 6 problems x 2 methods, each solved once
  rates = [json.loads(line)["id"] for line in _lines(workdir / "solve_rates.jsonl")]
  assert len(rates) == len(set(rates)) == 6
  metrics = json.loads((workdir / "metrics.json").read_text())
  assert set(metrics) == {"tiered", "kace"} and all(m["problems"] == 6 for m in metrics.values())
  assert all(st["cards"] for r in after if r["method"] == "kace" for st in r["stages"] if st["stage"] == "MS")
  for name in (
    "results.md",
    "accuracy_vs_calls.png",
    "exit_tier_vs_solve_rate.png",
    "domains.json",
    "config.json",
  ):
    assert (workdir / name).exists(), name


def _curve_record(pid, answers, right, method="best_of_n_curve"):
  samples = [{"answer": a, "correct": c} for a, c in zip(answers, right, strict=True)]
  return {
    **_record(pid, "POOL", False, len(answers), 0),
    "method": method,
    "stages": [{"stage": "POOL", "cards": [], "samples": samples}],
  }


CURVE_RECORDS = [
  _curve_record("p", ["5", "5", "7"], [True, True, False]),
  _curve_record("q", [None, "7", "5"], [False, False, True]),
]


def test_best_of_n_curve_votes_every_subset_as_tiers_vote_would():
  equal = lambda a, b: a == b
  curve = evaluate.best_of_n_curve(CURVE_RECORDS, equal)
  # By hand: p is right on 2 of 3 singletons, every pair (a 5-7 tie goes to the earlier 5), and the
  # triple; q on 1 of 3 singletons, 1 of 3 pairs (the 7-5 tie goes to the earlier 7), not the triple.
  expected = [(2 / 3 + 1 / 3) / 2, (1 + 1 / 3) / 2, (1 + 0) / 2]
  assert [c["n"] for c in curve] == [1, 2, 3] and [c["mean_calls"] for c in curve] == [1.0, 2.0, 3.0]
  np.testing.assert_allclose([c["accuracy"] for c in curve], expected, atol=1e-12)
  # The same numbers from tiers.vote on every subset (the solver's own rule).
  for c in curve:
    per = []
    for r in CURVE_RECORDS:
      s = r["stages"][0]["samples"]
      subsets = list(itertools.combinations(range(3), c["n"]))
      wins = 0
      for sub in subsets:
        v = tiers.vote([s[i]["answer"] for i in sub], equal)
        wins += v.answer is not None and any(s[i]["correct"] and s[i]["answer"] == v.answer for i in sub)
      per.append(wins / len(subsets))
    assert c["accuracy"] == pytest.approx(np.mean(per))
  assert evaluate.at_equal_calls(curve, 1.5) == pytest.approx((expected[0] + expected[1]) / 2)
  assert evaluate.at_equal_calls(curve, 3.5) is None and evaluate.at_equal_calls(curve, 0.5) is None


def test_report_puts_every_method_against_best_of_n_at_equal_calls(tmp_path):
  config = kace_config.KaceConfig(methods=("best_of_n_curve", "kace"))
  config = dataclasses.replace(config, eval=kace_config.EvalSection(bootstrap=20, solve_rate_k=0))
  kace_records = [
    {**_curve_record("p", ["5", "5"], [True, True], "kace"), "calls": 2, "correct": True},
    {**_curve_record("q", ["7"], [False], "kace"), "calls": 1, "correct": False},
  ]
  curve_records = [{**r, "correct": r["id"] == "p"} for r in CURVE_RECORDS]
  rundir.append_jsonl(tmp_path / evaluate.RECORDS, curve_records + kace_records)
  problems = [data.Problem(id=i, question="?", answer="5", source="t") for i in "pq"]
  metrics = evaluate.report(config, problems, str(tmp_path))
  bon = metrics["kace"]["bon_at_equal_calls"]
  assert metrics["kace"]["mean_calls"] == 1.5 and bon == pytest.approx((0.5 + 2 / 3) / 2)
  assert metrics["kace"]["vs_bon"] == pytest.approx(0.5 - bon)
  assert metrics["best_of_n_curve"]["vs_bon"] == pytest.approx(0.0)  # its own point is on the curve
  table = (tmp_path / "results.md").read_text()
  assert f"| {100 * (0.5 - bon):+.1f} pts (BoN {100 * bon:.1f}%) |" in table and "N=3: 50.0%" in table
  assert (tmp_path / "accuracy_vs_calls.png").exists()


def test_aime_is_evaluated_whole_and_learned_on_other_data(tmp_path, grader):
  aime, math_train = tmp_path / "aime2025.jsonl", tmp_path / "math_train.jsonl"
  aime.write_text("".join(json.dumps({"question": f"AIME {i}?", "answer": str(i)}) + "\n" for i in range(30)))
  rows = [
    {"problem": f"M{i}?", "level": f"Level {lvl}", "type": "Algebra", "solution": f"\\boxed{{{i}}}"}
    for i, lvl in enumerate([3, 4, 5, 5])
  ]
  math_train.write_text("".join(json.dumps(r) + "\n" for r in rows))
  typed = kace_config.KaceConfig.from_dict(configs.kace.get_config())
  bench = typed.benchmark("aime2025").data
  assert (bench.test_fraction, bench.train_name) == (0.0, "math")
  d = dataclasses.replace(bench, source=str(aime), train_source=str(math_train))
  tiny = typed.synthetic.tiny_solver()
  test = evaluate.load_problems(d, tiny, grader, half="test")
  train = evaluate.load_problems(d, tiny, grader, half="train")
  assert len(test) == 30 and {p.source for p in test} == {"AIME2025"}
  assert sorted(p.question for p in train) == ["M1?", "M2?", "M3?"] and {p.level for p in train} == {4, 5}
  with pytest.raises(ValueError, match="train_name"):
    evaluate.load_problems(dataclasses.replace(d, train_name=""), tiny, grader, half="train")
