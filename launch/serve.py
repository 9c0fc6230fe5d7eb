r"""Serves a local JAX checkpoint over an OpenAI-compatible HTTP API. See configs/serve.py.

  python -m launch.serve --config=configs/serve.py --config.model.checkpoint=/ckpt/Qwen3-0.6B
  python -m launch.serve --config=configs/serve.py:tiny       # on a CPU: random weights, no download
  python -m launch.serve --config=configs/serve.py:tiny --config.model.tokenizer=/tmp/tok \
      --config.server.port=8001 --config.server.max_tokens=64
  python -m launch.serve --config=configs/serve.py:tiny --dry_run  # the sampler's memory plan at the
                                                 # largest batch, for this host's devices; no server

The checkpoint, the tokenizer and every server limit are checked before the model loads: a missing
directory or a bad limit stops in one line, exit status 2.
"""

import os
from typing import Any

from launch import common
from lm import progress, server, sharding, tokenizer

_CONFIG = common.define_config("config", "configs/serve.py")
_DRY_RUN = common.define_dry_run()


def typed_config(config) -> dict[str, Any]:
  """The server's typed limits and the model's fields, checked (the server itself is built later,
  by lm.server.serve): a preset without weights needs a tokenizer to be given."""
  model = config.model.to_dict()
  if not model.get("checkpoint") and not model.get("tokenizer") and not config.build_tokenizer:
    raise ValueError(
      "model.tokenizer is empty: a model without a checkpoint needs a tokenizer; pass "
      "--config.model.tokenizer=DIR (a Hugging Face tokenizer directory, e.g. one of Qwen/Qwen3-0.6B) "
      "or --config.build_tokenizer=DIR"
    )
  limits = {k: v for k, v in config.server.items() if k != "api_key_env"}
  return {"model": model, "server": server.ServerConfig(**limits)}


# What the built tokenizer's merges are learnt from: enough English for short words to be one token.
_CORPUS = (
  "Hello! How are you today? I am a tiny model served on a CPU, answering with random weights. "
  "The quick brown fox jumps over the lazy dog. What is the capital of France? Paris is the answer."
)


def build_tokenizer(path: str) -> str:
  """A byte-level BPE tokenizer (Qwen's kind, ChatML template) at `path`, built once and reused."""
  path = os.path.expanduser(path)
  if not os.path.exists(os.path.join(path, "tokenizer.json")):
    tokenizer.train_bpe_tokenizer(path, [_CORPUS] * 4, vocab_size=384)
  return path


def main(_):
  common.typed(_CONFIG, typed_config)
  config = _CONFIG.value
  if _DRY_RUN.value:  # before the tokenizer is built: a dry run writes nothing
    from lm import plan as plan_lib

    common.dry_run(plan_lib.check_server, config)
  if not config.model.checkpoint and not config.model.tokenizer:
    config.model.tokenizer = build_tokenizer(config.build_tokenizer)
    progress.say(f"random weights; the byte-level tokenizer is {config.model.tokenizer}")
  sharding.initialize_distributed()
  server.serve(config)


def run():
  """The console entry point (setup.py)."""
  common.run(main, required=())


if __name__ == "__main__":
  run()
