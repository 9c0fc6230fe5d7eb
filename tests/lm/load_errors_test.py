"""Damaged model files and over-long contexts are errors that name the file or the limit."""

import os

import pytest
from flax import nnx

from lm.config import ModelConfig
from lm.hf import load_hf, save_hf
from lm.model import Qwen


@pytest.fixture
def checkpoint_dir(tmp_path):
  save_hf(Qwen(ModelConfig.tiny_qwen3(), rngs=nnx.Rngs(0)), tmp_path / "ckpt", dtype="float32")
  return tmp_path / "ckpt"


def _truncate(path, keep):
  with open(path, "r+b") as f:
    f.truncate(keep if keep >= 0 else os.path.getsize(path) + keep)


def test_a_truncated_config_json_names_the_file(checkpoint_dir):
  path = checkpoint_dir / "config.json"
  _truncate(path, 30)
  with pytest.raises(ValueError, match=f"{path} is not valid JSON"):
    load_hf(checkpoint_dir, dtype="float32")


@pytest.mark.parametrize("keep", [4, 200, -1000], ids=["header", "metadata", "data"])
def test_a_truncated_safetensors_file_names_the_file(checkpoint_dir, keep):
  path = checkpoint_dir / "model.safetensors"
  _truncate(path, keep)
  with pytest.raises(ValueError, match=f"{path}"):
    load_hf(checkpoint_dir, dtype="float32")


def test_prompts_beyond_the_context_are_refused_naming_the_limit():
  config = ModelConfig.tiny_qwen3()
  config.check_context(40_000, 960)  # exactly the 40,960 positions
  with pytest.raises(ValueError, match="exceeds the context limit of 40960 tokens"):
    config.check_context(40_000, 961)
  with pytest.raises(ValueError, match="context limit of 64 tokens"):
    config.check_context(60, 5, limit=64)
  assert config.context_limit(1 << 20) == 40_960
