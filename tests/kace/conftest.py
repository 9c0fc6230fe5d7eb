"""One math-verify grader (worker subprocesses) shared by the whole KACE test session."""

import pytest

from kace import answers


@pytest.fixture(scope="session")
def grader():
  with answers.Grader(workers=2, timeout_s=10.0) as g:
    yield g


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
  """A random tiny Qwen3 saved as an HF checkpoint directory with a tiny byte-level tokenizer."""
  from flax import nnx

  import lm
  from lm.config import ModelConfig
  from lm.tokenizer import load_tokenizer
  from tests.lm.tokenizer_helpers import make_tiny_tokenizer

  path = make_tiny_tokenizer(tmp_path_factory.mktemp("tiny_solver"))
  model = lm.Qwen(ModelConfig.tiny_qwen3(vocab_size=load_tokenizer(path).vocab_size), rngs=nnx.Rngs(0))
  lm.save_hf(model, path)
  return path


@pytest.fixture(scope="session")
def tiny_generator(tiny_checkpoint):
  """A JaxGenerator over `tiny_checkpoint` whose row and prompt buckets are floored, so batches of
  any size up to 8 problems and prompts with or without cards share compiled shapes."""
  from lm import generators

  sampler = dict(min_prompt_bucket=256, min_rows=8, step_bucket=8, max_rows=512)
  return generators.make_generator(
    generators.GeneratorConfig(checkpoint=tiny_checkpoint, dtype="float32", sampler=sampler)
  )
