"""The reference-faithful training path run whole: the qwen3_4b preset's settings with all three of
the reference code's skips on (no verifier update on an unparsable draft, unparsable revisions out
of the revise group, no KEEP / REVISE update on an unparsable kept revision), on a tiny model whose
replies parse. The README smoke command (`smoke_test.py`) turns the skips off, because a random
model's replies never parse; here a short supervised warm start teaches the draft and revise turns
the answer format (the verifier's and the decision's unreadable replies fall back to SAC and KEEP,
as the preset says), so every kind of update happens under the skips."""

import os

import jax
import numpy as np
import pytest

from configs import dpa_grpo as dpa_config
from dpa_grpo import setup, train, warm_start
from dpa_grpo.config import ExperimentConfig
from lm import checkpoint as ckpt_lib
from lm import rundir

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _config(checkpoint: str = "") -> ExperimentConfig:
  c = dpa_config.get_config("qwen3_4b")
  c.model.update(preset="tiny_qwen3", dtype="float32", tokenizer_vocab=512, checkpoint=checkpoint)
  c.data.synthetic.n = 6
  c.data.batch_cases = 2
  # 8 pairs a gradient-accumulation chunk (the tiny preset's; the preset's 32 padded each case's
  # few pairs to 64 rows a chunk)
  c.train.update(steps=2, eval_every=2, checkpoint_every=1, progress=False, pairs_per_chunk=8)
  # Lines 34 and 37 (overpaid, owed): one of them is 0 on every case, so sampled revisions are
  # right and wrong within a group; 16 tokens hold "Line 34: from the forms | 1234". The warm
  # start leaves the revise turn near-deterministic: revisions are sampled at T 1.5 (the
  # reference: 0.7) so that a group of five holds both.
  c.rollout.update(
    lines=("34", "37"),
    compact_forms=True,
    max_new_tokens=16,
    verdict_tokens=40,
    decision_tokens=8,
    revisions=5,
    revision_temperature=1.5,
  )
  c.loss.vocab_chunk = 512
  # The verifier learns the reply format with its verdict a coin (verify_flip 0.5), so it
  # challenges right drafts too and revise prompts carry a SAC, as the revise turn learnt them.
  c.warm_start.update(
    steps=200,
    batch_size=8,
    learning_rate=1e-2,
    turns=("draft", "verify", "revise"),
    verify_flip=0.5,
    revise_wrong=0.3,
  )
  return ExperimentConfig.from_dict(c.to_dict())


def test_reference_settings_with_their_skips_train_every_kind_of_update(tmp_path):
  config = _config()
  loss = config.loss
  assert (
    loss.skip_verifier_on_invalid_draft and loss.skip_decision_on_invalid_revision and loss.revision_filter
  )
  train_cases, _ = setup.load_data(config.data)
  checkpoint = warm_start.run(config, str(tmp_path / "warm_start"), train_cases)
  run_config = config.for_method("dpa_grpo", checkpoint)
  workdir = rundir.prepare_workdir(str(tmp_path / "dpa_grpo"), run_config)
  train.run(run_config, workdir)

  records = list(rundir.read_jsonl(os.path.join(workdir, "records", "train.jsonl")))
  assert any(r["x_amount"] is not None for r in records)  # drafts parse: verifier updates are not skipped
  assert any(r["z_amount"] is not None for r in records)  # kept revisions parse: decisions train
  steps = [r for r in rundir.read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "eval" not in r]
  assert [r["step"] for r in steps] == [1, 2] and all(r["updates"] == 2 for r in steps)
  # Each kind of update had units with a reward contrast in some step (a component without units
  # reports prob_action1 0.0; a revise group without contrast is skipped, its loss term 0.0).
  trained = lambda kind: any(
    r.get(f"{kind}/prob_action1", 0.0) > 0 and r[f"{kind}/tie_fraction"] < 1 for r in steps
  )
  assert trained("verifier/verdict"), steps
  assert trained("generator/decision"), steps
  assert any(r.get("generator/revision/loss", 0.0) != 0.0 for r in steps), steps
  # ... and moved each role's adapter from its initial state (a fresh trainer's, same seed).
  manager = ckpt_lib.CheckpointManager(os.path.join(workdir, "checkpoints"))
  trainer = train.Trainer(run_config, str(tmp_path / "probe"))
  target = ckpt_lib.abstract_like({"params": trainer.trainable, "opt_state": trainer.opt_state})
  last, _ = manager.restore(2, target)
  manager.close()
  for role in ("generator", "verifier"):
    moved = jax.tree.map(
      lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
      trainer.trainable[role],
      last["params"][role],
    )
    assert max(jax.tree.leaves(moved)) > 0, role
