"""Serves a local JAX checkpoint over an OpenAI-compatible HTTP API. See configs/serve.py.

python -m launch.serve --config=configs/serve.py --config.model.checkpoint=/ckpt/Qwen3-0.6B
"""

from absl import app
from ml_collections import config_flags

from lm import server, sharding

_CONFIG = config_flags.DEFINE_config_file("config", "configs/serve.py", lock_config=True)


def main(_):
  sharding.initialize_distributed()
  server.serve(_CONFIG.value)


if __name__ == "__main__":
  app.run(main)
