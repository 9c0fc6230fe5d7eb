"""An OpenAI-compatible server over a local checkpoint (lm/server/, docs/generators.md).

  python -m launch.serve --config=configs/serve.py --config.model.checkpoint=/ckpt/Qwen3-0.6B

Presets: default (a checkpoint you name), tiny (random tiny Qwen3 weights and a byte-level tokenizer
built once into `build_tokenizer`), for trying the server out on a CPU in one command.
"""

import ml_collections

from configs.generators import generator_config

# Each preset with one line (lm-serve --help lists them; an unknown one is refused naming the closest).
PRESETS = {
  "default": "a local HF checkpoint you name: --config.model.checkpoint=/path/Qwen3-0.6B",
  "tiny": "random tiny Qwen3 weights and a byte-level tokenizer built once: the server on a CPU, one command",
}


def get_config(arg: str = "default") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # The local model: an HF checkpoint directory (tokenizer in it unless model.tokenizer is set).
  c.model = generator_config(kind="jax", checkpoint="", dtype="bfloat16")
  # Where launch/serve.py builds a small byte-level BPE tokenizer (once) when the model has neither a
  # checkpoint nor `model.tokenizer`; "" builds none (then one of them is required).
  c.build_tokenizer = ""
  # Fields of lm.server.ServerConfig, except api_key_env: the environment variable holding the
  # API key clients must send ("" = no key; a named but unset variable is an error).
  c.server = ml_collections.ConfigDict(
    dict(
      model_name="local",
      host="127.0.0.1",
      port=8000,
      api_key_env="",
      max_body_bytes=1 << 20,
      max_tokens=4096,
      default_max_tokens=256,
      max_n=64,
      max_prompts=64,
      max_request_tokens=1 << 16,  # prompts x n x max_tokens per request
      # prompt + max_tokens per prompt; unset (None): the model's max_position_embeddings.
      max_context_tokens=ml_collections.config_dict.placeholder(int),
      batch_window_s=0.01,
      max_batch_prompts=256,
      max_batch_tokens=1 << 16,  # decode budget of a batch beyond its first request
      max_queued_requests=1024,  # beyond: 429 with Retry-After
      fair_max_skips=4,
      retry_after_s=1,
      max_connections=2048,  # beyond: 503 with Retry-After
      backlog=2048,
      header_timeout_s=10.0,
      body_timeout_s=30.0,
      keep_alive_s=5.0,
      max_loras=8,  # LoRA adapters loaded at once through /v1/load_lora_adapter
      stream_every=16,  # decode steps per device call while a streamed request is in the batch
    )
  )
  if arg == "tiny":
    c.model.update(preset="tiny_qwen3", dtype="float32")
    c.build_tokenizer = "~/.cache/lm_serve/byte_tokenizer"
    c.server.update(max_tokens=256)
  elif arg != "default":
    raise ValueError(f"configs/serve.py: unknown preset {arg!r}")
  return c


def required_weights(preset: str, config: ml_collections.ConfigDict) -> dict[str, str]:
  """{field: Hugging Face id} of the weights the preset serves (launch/common.py refuses it empty)."""
  return {} if preset == "tiny" else {"model.checkpoint": "Qwen/Qwen3-0.6B"}
