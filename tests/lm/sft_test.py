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
