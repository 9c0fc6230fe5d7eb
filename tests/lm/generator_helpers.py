"""A tiny tokenizer and a random tiny Qwen3 behind a `JaxGenerator`, for generator and server tests.

Every test shares one sampler compilation: the model is replicated on an 8-device data mesh (so
batches of up to 8 prompts pad to the same 8 rows), prompts fit the 32-token bucket, `max_tokens`
stays within one 16-step bucket, and tests use N samples per prompt. Models built here have equal
graph definitions, so the compiled sampler is reused across test modules.
"""

import ml_collections

from lm import generators
from tests.lm.tokenizer_helpers import make_tiny_tokenizer

N = 2  # samples per prompt in every test (n is static in the compiled sampler)
MAX_TOKENS = 12
CHAT_WORDS = ("system", "user", "assistant")  # learnt as single tokens: chat prompts stay short


def tiny_config(path) -> ml_collections.ConfigDict:
  """A `generators.default_config` for a random tiny Qwen3 over a tiny tokenizer written to `path`."""
  config = generators.default_config(
    kind="jax",
    preset="tiny_qwen3",
    tokenizer=make_tiny_tokenizer(path, vocab_words=CHAT_WORDS),
    dtype="float32",
  )
  config.mesh.data = 8
  config.sampler.update(min_prompt_bucket=32, step_bucket=16)
  return config


def make_tiny_generator(path) -> generators.JaxGenerator:
  return generators.load_jax_generator(tiny_config(path))


def single_token_stop(generation, tokenizer) -> str:
  """A stop string found inside a sample after its first token and encoding to one token.

  One token keeps the sampler's stop table the same shape as without stops (no recompile).
  """
  for token in generation.token_ids[1:]:
    piece = tokenizer.decode([token])
    if piece.strip() and "\ufffd" not in piece and tokenizer.encode(piece) == [token]:
      if generation.text.find(piece) > 0:
        return piece
  raise AssertionError(f"no usable stop string in {generation.text!r}")
