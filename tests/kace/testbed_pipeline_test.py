"""The testbed pipeline end to end at smoke size: a testbed solver built (2 SFT steps) into a cache,
every registered method learned and evaluated on testbed problems into one table, the oracle
(programmatic) teacher and curator answering every teacher and curator prompt, labelled as such."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import pytest

import configs.kace
from kace import cards, learn, methods, oracle, pipeline, testbed
from kace import config as kace_config
from lm import rundir
from tests.kace import learn_helpers

ALL = tuple(sorted(methods.METHODS))
ROOT = pathlib.Path(__file__).parents[2]


@pytest.mark.slow
@pytest.mark.integration
def test_testbed_comparison_runs_every_method_with_the_oracle_roles(tmp_path, monkeypatch):
  bert_dir = learn_helpers.tiny_bert(str(tmp_path / "bert"))
  c = configs.kace.get_config("testbed")
  c.synthetic.cache_dir = str(tmp_path / "cache")
  c.testbed.update(per_cell=4, test_per_cell=1)
  # the solver of the launcher tests (below, tests/launch/main_test.py): its build compiles the
  # programs theirs does, and the comparison's plumbing needs no better one
  c.testbed.solver.update(
    examples=16, steps=1, curriculum_steps=1, batch_size=4, hidden_size=32, intermediate_size=64
  )
  c.roles.solver.sampler = dict(min_prompt_bucket=256, min_rows=8, step_bucket=8, max_rows=512)
  c.sampling.max_tokens = 6
  c.role_sampling.max_tokens = 8
  c.data.limit = 3
  c.eval.update(solve_rate_k=0, bootstrap=50, batch_size=8)
  c.grader.workers = 1
  # 9 of the 27 training problems: enough for failures, teacher replies and cards in every learned
  # tree (asserted below), a third of the solving that learning every one took
  c.learn.update(
    retries=0, attempt_tokens=10, max_cards=2, embedder_dir=bert_dir, max_sweeps=1, train_limit=9
  )
  c.ace.batch_size = 4
  c.gepa.max_metric_calls = 4
  c.retrieval.model_dir = bert_dir
  c.table.methods = ALL
  c.testbed.seeds = (0,)
  config = kace_config.KaceConfig.from_dict(c)
  measure = pipeline.testbed_gates
  # A 1-step solver fails its gates; the comparison's plumbing is tested as if it passed them.
  monkeypatch.setattr(pipeline, "testbed_gates", lambda cfg, wd: {**measure(cfg, wd), "all_passed": True})
  # run_testbed: the one entry of the launcher and the main job (workdir prepared, report's path back)
  report_path = pipeline.run_testbed(str(tmp_path / "out"), config)
  assert report_path == str(tmp_path / "out" / "report.md")
  assert json.loads((tmp_path / "out" / "config.json").read_text())["testbed"]["seeds"] == [0]
  results = json.loads((tmp_path / "out" / "results.json").read_text())["0"]
  assert set(results["testbed"]) == set(ALL)
  assert all(m["problems"] == 3 for m in results["testbed"].values())
  assert len(list((tmp_path / "cache").glob("testbed-solver-*/build.json"))) == 1
  run = tmp_path / "out" / "seed0" / "testbed"
  recorded = json.loads((run / "eval" / "config.json").read_text())
  assert recorded["data"]["name"] == "testbed" and recorded["testbed"]["oracle_teacher"]
  assert "testbed-solver-" in recorded["roles"]["solver"]["checkpoint"]
  for artifact in ("kace", "no_domain", "no_difficulty"):
    assert cards.EpistemicTree.load(run / "build" / artifact / "tree.json") is not None
    log = list(rundir.read_jsonl(run / "build" / artifact / learn.LOG))
    replies = [r for line in log for r in line.get("replies", ())]
    assert replies and all(json.loads(r)["by"] == oracle.LABEL for r in replies)
  table = (tmp_path / "out" / "seed0" / "table.md").read_text()
  assert all(f"| {name} | " in table for name in ALL)
  report = (tmp_path / "out" / "report.md").read_text()
  assert oracle.LABEL in report and "| 1 | kace > tiered" in report and "## Seed 0" in report
  assert (
    "![accuracy vs calls](accuracy_vs_calls.png)" in report
    and (tmp_path / "out" / "accuracy_vs_calls.png").exists()
  )
  # A plain rerun resumes (the eval stage records the resolved solver path; the rerun compares the same).
  assert pipeline.run_testbed(str(tmp_path / "out"), config) == report_path
  # A changed config stops at the top and, when allowed, in every stage below (seed0/testbed/eval).
  changed = dataclasses.replace(config, learn=dataclasses.replace(config.learn, attempt_tokens=11))
  with pytest.raises(rundir.ConfigFileError, match="another config"):
    pipeline.run_testbed(str(tmp_path / "out"), changed)
  pipeline.run_testbed(str(tmp_path / "out"), changed, allow_config_change=True)
  assert (tmp_path / "out" / "seed0" / "testbed" / "eval" / "config.1.json").exists()
  # Seeds in worker processes (testbed.workers): seed 0 resumes and seed 1 runs, each in a spawned
  # process; seed 1's table is the one a run of seed 1 alone, in this process, gives. Two methods
  # (one that learns a tree, one that does not): the check is of the processes, not of the methods.
  first = json.loads((tmp_path / "out" / "results.json").read_text())["0"]
  few = ("tiered", "kace")
  two = dataclasses.replace(
    changed,
    testbed=dataclasses.replace(changed.testbed, seeds=(0, 1), workers=2),
    table=dataclasses.replace(changed.table, methods=few),
  )
  assert pipeline.testbed_workers(two) == 2
  pipeline.run_testbed(str(tmp_path / "out"), two, allow_config_change=True)
  both = json.loads((tmp_path / "out" / "results.json").read_text())
  assert list(both) == ["0", "1"] and set(both["1"]["testbed"]) == set(few)
  # a method's own metrics (its comparison with the Best-of-N curve needs best_of_n_curve in the table)
  own = lambda metrics: {k: v for k, v in metrics.items() if k not in ("vs_bon", "bon_at_equal_calls")}
  assert {m: own(both["0"]["testbed"][m]) for m in few} == {m: own(first["testbed"][m]) for m in few}
  alone = dataclasses.replace(two, testbed=dataclasses.replace(two.testbed, seeds=(1,), workers=1))
  assert pipeline.testbed_workers(alone) == 1
  pipeline.run_testbed(str(tmp_path / "alone"), alone)
  assert json.loads((tmp_path / "alone" / "results.json").read_text())["1"] == both["1"]
  assert "Seeds run: 0, 1 of 0, 1." in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.integration
def test_the_launcher_refuses_a_solver_that_fails_its_gates(tmp_path):
  """`python -m launch.kace_testbed --workdir=...` (the README's command) at smoke size: a 1-step
  solver fails its gates, so the run stops with GateError before any comparison."""
  run = tmp_path / "run"
  command = [
    sys.executable, "-m", "launch.kace_testbed", f"--workdir={run}", "--verbosity=-1",
    f"--config.synthetic.cache_dir={tmp_path / 'cache'}",
    "--config.testbed.per_cell=4", "--config.testbed.test_per_cell=2",
    "--config.testbed.solver.examples=16", "--config.testbed.solver.steps=1",
    "--config.testbed.solver.curriculum_steps=1",
    "--config.testbed.solver.batch_size=4", "--config.testbed.solver.hidden_size=32",
    "--config.testbed.solver.intermediate_size=64",
    "--config.roles.solver.sampler.min_prompt_bucket=256",
    "--config.roles.solver.sampler.step_bucket=8", "--config.roles.solver.sampler.max_rows=512",
    "--config.testbed.seeds=(0, 1)",
  ]  # fmt: skip
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
  assert done.returncode != 0 and "GateError" in done.stderr, done.stderr[-3000:]
  gates = rundir.read_json(run / "gates.json")
  assert not gates["all_passed"] and set(gates["passed"]) == {
    "true_card",
    "no_card",
    "true_card_and_distractors",
  }
  # measured on every seed's own blocks; a gate passes only where it passes in every seed
  assert set(gates["seeds"]) == {"0", "1"}
  assert gates["passed"] == {
    name: all(g["passed"][name] for g in gates["seeds"].values()) for name in gates["passed"]
  }
  assert not (run / "seed0").exists()  # no comparison ran
  # --gates_only (a solver build): the cached solver's gates and its card map, no comparison
  inspect = tmp_path / "inspect"
  command = [c.replace(str(run), str(inspect)) for c in command] + ["--gates_only"]
  done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert rundir.read_json(inspect / "gates.json")["seeds"] == gates["seeds"]
  card_map = rundir.read_json(inspect / "card_map.json")
  assert len(card_map["rates"]) == 6 * len(testbed.H) and card_map["solver"] == gates["solver"]
  assert card_map["below_bound"] == sorted(c for c, r in card_map["rates"].items() if r < 0.8)
  assert not (inspect / "seed0").exists()
