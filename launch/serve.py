"""Serves a local JAX checkpoint over an OpenAI-compatible HTTP API. See configs/serve.py.

python -m launch.serve --config=configs/serve.py --config.model.checkpoint=/ckpt/Qwen3-0.6B
"""

from launch import common
from lm import server, sharding

_CONFIG = common.define_config("config", "configs/serve.py")


def main(_):
  sharding.initialize_distributed()
  server.serve(_CONFIG.value)


def run():
  """The console entry point (setup.py)."""
  common.run(main, required=())


if __name__ == "__main__":
  run()
