"""Supervised fine-tuning memorises a tiny task; batches cover every example each epoch."""

import numpy as np
import pytest
from flax import nnx

import lm
from lm import sft
from lm.config import ModelConfig


@pytest.mark.slow
def test_loss_falls_on_a_memorisation_task_and_input_model_is_untouched():
  model = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(0))
  before = np.asarray(model.embed_vd[...]).copy()
  rng = np.random.default_rng(0)
  examples = [(rng.integers(2, 64, 5).tolist(), rng.integers(2, 64, 3).tolist() + [1]) for _ in range(8)]
  config = sft.SFTConfig(steps=60, batch_size=8, learning_rate=3e-2, warmup_steps=5, log_every=5)
  trained, history = sft.train_sft(model, examples, config)
  assert [h["step"] for h in history] == list(range(5, 61, 5))
  assert history[-1]["loss"] < 0.25 * history[0]["loss"], history
  assert all(h["tokens"] == 8 * 4 for h in history)
  np.testing.assert_array_equal(np.asarray(model.embed_vd[...]), before)
  assert not np.allclose(np.asarray(trained.embed_vd[...]), before)


def test_batch_order_visits_every_example_once_per_epoch():
  order = sft.batch_order(num_examples=6, batch_size=4, steps=3, seed=1)
  assert order.shape == (3, 4)
  flat = order.reshape(-1)
  assert sorted(flat[:6]) == list(range(6)) and sorted(flat[6:]) == sorted(set(flat[6:]))


def test_bucketed_order_keeps_each_run_of_batches_and_groups_similar_lengths():
  rng = np.random.default_rng(0)
  lengths = rng.integers(10, 200, 96).tolist()
  plain = sft.batch_order(96, batch_size=8, steps=24, seed=3)
  bucketed = sft.bucketed_order(lengths, batch_size=8, steps=24, seed=3, run=6)
  assert bucketed.shape == plain.shape
  for run in range(0, 24, 6):  # the same examples within each run of 6 batches, regrouped
    assert sorted(bucketed[run : run + 6].reshape(-1)) == sorted(plain[run : run + 6].reshape(-1))
  spread = lambda order: np.mean([np.ptp(np.asarray(lengths)[rows]) for rows in order])
  assert spread(bucketed) < 0.5 * spread(plain)


@pytest.mark.slow
def test_bucketed_training_pads_each_batch_to_its_own_width_and_still_learns():
  model = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=64), rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  examples = [
    (rng.integers(2, 64, n).tolist(), rng.integers(2, 64, 3).tolist() + [1])
    for n in (3, 4, 5, 6, 30, 31, 32, 33)
  ]
  config = sft.SFTConfig(
    steps=60,
    batch_size=4,
    learning_rate=3e-2,
    warmup_steps=5,
    log_every=5,
    bucket_by_length=True,
    bucket_batches=2,
  )
  widths = []
  pack = sft.scoring.pack_pairs

  def spy(*args, **kwargs):
    packed = pack(*args, **kwargs)
    widths.append(packed["tokens"].shape[1])
    return packed

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(sft.scoring, "pack_pairs", spy)
    _, history = sft.train_sft(model, examples, config)
  # short examples (7-10 tokens) share batches padded to 16; without buckets every batch is 48 wide
  assert set(widths) == {16, 48} and widths.count(16) == 30
  assert history[-1]["loss"] < 0.25 * history[0]["loss"], history
