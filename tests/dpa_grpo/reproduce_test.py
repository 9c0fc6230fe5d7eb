"""The reproduction pipeline: warm-start examples, the report's estimates, and one tiny end-to-end run."""

import os
import random

import numpy as np
import pytest

from configs import dpa_grpo as dpa_config
from dpa_grpo import game, report, reproduce, setup, theory, warm_start
from dpa_grpo.config import ExperimentConfig, rollout_config
from dpa_grpo.envs import forms, taxcalc
from lm import rundir
from lm import tokenizer as tokenizer_lib


@pytest.mark.parametrize("amount", [0.0, 7.0, 14600.0, 34977.0, -250.0, 1000000.0])
def test_corrupt_is_always_wrong(amount):
  rng = random.Random(0)
  for _ in range(300):
    wrong = warm_start.corrupt(amount, rng)
    assert wrong != amount and float(wrong).is_integer()


def test_warm_start_examples_carry_the_oracle_labels(tmp_path):
  config = dpa_config.get_config("tiny")
  config.rollout.lines = ("1a", "9", "12")
  cases = forms.generate_cases(4, seed=3, difficulty=1)
  cfg = rollout_config(config.rollout)
  tokenizer = tokenizer_lib.load_tokenizer(setup.task_tokenizer(str(tmp_path), cases, cfg, 512))
  ws = warm_start.WarmStartConfig(wrong_fraction=0.5, seed=1)
  examples = warm_start.examples(cases, tokenizer, cfg, ws)
  assert {turn: len(v) for turn, v in examples.items()} == {turn: 12 for turn in warm_start.TURNS}
  eos = tokenizer.eos_ids[0]
  verdicts = []
  for pairs in examples.values():
    for prompt, completion in pairs:
      assert completion[-1] == eos and len(prompt) > 0
  for (prompt, completion), (case, line_id) in zip(
    examples["verify"], [(c, i) for c in cases for i in cfg.lines], strict=True
  ):  # fmt: skip
    proposal = tokenizer.decode(prompt).split("The preparer answered:\n", 1)[1].split("\n", 1)[0]
    right = taxcalc.line_correct(taxcalc.parse_line_answer(proposal, line_id), case.gold[line_id])
    reply = game.parse_verifier_reply(tokenizer.decode(completion[:-1]))
    assert reply.valid and reply.action == (game.NS if right else game.SAC_ACTION)
    verdicts.append(reply.action)
  assert 0 < sum(verdicts) < len(verdicts)  # both labels occur
  units = [(c, i) for c in cases for i in cfg.lines]
  for (_, completion), (case, line_id) in zip(examples["draft"], units, strict=True):
    assert taxcalc.parse_line_answer(tokenizer.decode(completion[:-1]), line_id).value == case.gold[line_id]
  with pytest.raises(ValueError, match="turns"):
    warm_start.WarmStartConfig(turns=("draft", "critique"))


def _record(step, x_right, sac, decision, forced=False, z_right=None):
  text = game.render_decision(decision) if decision is not None else ""
  return {
    "step": step,
    "x_right": x_right,
    "verifier_action": "SAC" if sac else "NS",
    "decision": {"text": text} if sac else None,
    "forced_revise": forced,
    "z_right": z_right,
  }


def test_estimate_game_reads_the_sampled_policy_not_exploration():
  records = []
  # 10 right proposals: 2 SAC'd (both KEEP); 10 wrong: 6 SAC'd, REVISE sampled on 3, one of the
  # KEEPs forced to REVISE; revisions of wrong proposals right 4 of 6 times.
  records += [_record(1, True, False, None) for _ in range(8)]
  records += [_record(1, True, True, game.KEEP, z_right=True) for _ in range(2)]
  records += [_record(1, False, False, None) for _ in range(4)]
  records += [_record(1, False, True, game.REVISE, z_right=i < 2) for i in range(3)]
  records += [_record(1, False, True, game.KEEP, forced=i == 0, z_right=True) for i in range(3)]
  g = report.estimate_game(records, "KEEP")
  assert g.p_x_right == pytest.approx(0.5)
  assert g.verifier_ref == pytest.approx((0.6, 0.2))
  assert g.p_z_right == pytest.approx((5 / 6, 1 - report.PROB_CLIP))
  assert g.generator_ref == pytest.approx(3 / 8)
  cases = [c for _, c in report.sampled_cases(records, "KEEP")]
  assert cases.count("4") == 4 and cases.count("1") == 8 and cases.count("3") == 2
  assert cases.count("5a") == 2 and cases.count("5b") == 1 and cases.count("6b") == 3  # forced: still 6b


@pytest.mark.slow
@pytest.mark.integration
def test_reproduce_end_to_end_writes_the_report(tmp_path):
  config = dpa_config.get_config("tiny")  # its shapes: programs the other tiny-preset tests compile
  config.train.update(steps=2, eval_every=1, checkpoint_every=1)
  config.warm_start.update(steps=3, batch_size=4)
  config.compare = ("grpo",)
  config = ExperimentConfig.from_dict(config.to_dict())
  workdir = str(tmp_path)
  summary = reproduce.run(config, workdir)
  assert set(summary["methods"]) == {"dpa_grpo", "grpo"}
  for method in ("dpa_grpo", "grpo"):
    m = summary["methods"][method]
    assert m["last_step"] == 2 and 0.0 <= m["after_ci"][0] <= m["after"] <= m["after_ci"][1] <= 1.0
    assert rundir.read_json(os.path.join(workdir, method, "config.json"))["model"][
      "checkpoint"
    ] == os.path.join(workdir, "warm_start")
  assert rundir.read_json(os.path.join(workdir, "grpo", "config.json"))["method"] == "grpo"
  ws = rundir.read_json(os.path.join(workdir, "warm_start", "warm_start.json"))
  assert ws["history"][-1]["step"] == 3 and np.isfinite(ws["history"][-1]["loss"])
  overlay = summary["theory_overlay"]
  assert overlay["kappa"] > 0 and np.allclose(np.sum(overlay["measured"], axis=1), 1.0)
  assert np.allclose(np.sum(overlay["predicted"], axis=1), 1.0, atol=1e-6)
  text = open(os.path.join(workdir, "report.md")).read()
  assert "| DPA-GRPO | 0.533 | 0.572 |" in text and "| case | before | after |" in text
  assert "(pair weighting, k1: the reference code's) is not anchored at π_ref" in text
  assert "½ā − ½β(1 − 2p)" in text and "loss.weighting=policy, loss.kl=exact" in text
  assert "a missing amount read as wrong" in text and "as 0.0 (the reference evaluator)" in text
  for name in ("per_line_accuracy.png", "theory_overlay.png"):
    assert os.path.getsize(os.path.join(workdir, "figures", name)) > 1000
  # A finished experiment is only re-reported: no stage trains again.
  logs = {m: open(os.path.join(workdir, m, "metrics.jsonl")).read() for m in ("dpa_grpo", "grpo")}
  again = reproduce.run(config, workdir)
  assert again["methods"] == summary["methods"]
  assert logs == {m: open(os.path.join(workdir, m, "metrics.jsonl")).read() for m in ("dpa_grpo", "grpo")}


def test_theory_overlay_ode_starts_at_the_estimated_game():
  g = theory.Game(p_x_right=0.3, p_z_right=(0.4, 0.9), verifier_ref=(0.7, 0.2), generator_ref=0.4)
  start = np.asarray(theory.case_probabilities(g, theory.reference_logits(g)))
  # Case 4 = wrong proposal, NS: (1 - 0.3) * (1 - 0.7); case 1 = right, NS: 0.3 * 0.8.
  assert start[game.CASES.index("4")] == pytest.approx(0.7 * 0.3)
  assert start[game.CASES.index("1")] == pytest.approx(0.3 * 0.8)
