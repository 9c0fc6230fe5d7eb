r"""Serves a local JAX checkpoint over an OpenAI-compatible HTTP API. See configs/serve.py.

  python -m launch.serve --config=configs/serve.py --config.model.checkpoint=/ckpt/Qwen3-0.6B
  python -m launch.serve --config=configs/serve.py:tiny --config.model.tokenizer=/tmp/tok \
      --config.server.port=8001 --config.server.max_tokens=64

The checkpoint, the tokenizer and every server limit are checked before the model loads: a missing
directory or a bad limit stops in one line, exit status 2.
"""

from typing import Any

from launch import common
from lm import server, sharding

_CONFIG = common.define_config("config", "configs/serve.py")


def typed_config(config) -> dict[str, Any]:
  """The server's typed limits and the model's fields, checked (the server itself is built later,
  by lm.server.serve): a preset without weights needs a tokenizer to be given."""
  model = config.model.to_dict()
  if not model.get("checkpoint") and not model.get("tokenizer"):
    raise ValueError(
      "model.tokenizer is empty: a preset without a checkpoint has no tokenizer; pass "
      "--config.model.tokenizer=DIR (a Hugging Face tokenizer directory, e.g. one of Qwen/Qwen3-0.6B)"
    )
  limits = {k: v for k, v in config.server.items() if k != "api_key_env"}
  return {"model": model, "server": server.ServerConfig(**limits)}


def main(_):
  common.typed(_CONFIG, typed_config)
  sharding.initialize_distributed()
  server.serve(_CONFIG.value)


def run():
  """The console entry point (setup.py)."""
  common.run(main, required=())


if __name__ == "__main__":
  run()
