"""`ServerConfig`: where `lm.server` listens, what it accepts, how it batches and streams."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ServerConfig:
  """Where to listen, what to accept, how to batch.

  Attributes:
    model_name: the name clients pass as `model` (others get 404) and `/v1/models` lists.
    host: bind address; the default keeps the server private to this machine.
    port: TCP port; 0 picks a free one (see `OpenAIServer.port`).
    api_key: when set, requests need `Authorization: Bearer <api_key>` (401 otherwise).
    max_body_bytes: larger request bodies get 413.
    max_tokens: the most `max_tokens` a request may ask for.
    default_max_tokens: used when a request gives none.
    max_n: the most samples per prompt.
    max_prompts: the most prompts in one /v1/completions request.
    max_request_tokens: the most prompts × n × max_tokens one request may ask for (its decode
      budget); a larger request gets 400 instead of holding the device for minutes.
    max_context_tokens: the most prompt + max_tokens tokens per prompt; None uses the model's
      `max_position_embeddings` (a smaller value is always capped by it).
    batch_window_s: how long the worker waits after a request for others to batch with it.
    max_batch_prompts: the most prompts in one batch (a larger single request still runs whole).
    max_batch_tokens: the most decode budget (sum of prompts × n × max_tokens) in one batch beyond
      its first request: a batch cannot be interrupted, so this bounds how long a request that
      arrives while one runs waits for the device (large requests run in separate batches).
    max_queued_requests: requests waiting for the worker beyond this get 429 with Retry-After.
    fair_max_skips: a waiting request passed over this many times leads the next batch.
    retry_after_s: the `Retry-After` sent with 429 and 503.
    max_connections: open connections beyond this are answered 503 and closed.
    backlog: the listen backlog (connections the kernel holds before accept).
    header_timeout_s: a connection that has not sent a whole request head within this is closed.
    body_timeout_s: a body not received whole within this gets 408 (e.g. shorter than its
      Content-Length).
    keep_alive_s: an idle kept-alive connection is closed after this.
    max_loras: the most LoRA adapters loaded at once (`/v1/load_lora_adapter` refuses more).
    stream_every: a batch holding a streamed request decodes this many tokens per device call, then
      hands them to the streams (`lm.Sampler.generate`'s `stream_every`): a stream's first chunk
      leaves after the prefill and at most this many tokens. Batches without a streamed request
      decode in one device call, as before. docs/serving.md has its cost.
  """

  model_name: str = "local"
  host: str = "127.0.0.1"
  port: int = 8000
  api_key: str | None = None
  max_body_bytes: int = 1 << 20
  max_tokens: int = 4096
  default_max_tokens: int = 256
  max_n: int = 64
  max_prompts: int = 64
  max_request_tokens: int = 1 << 16
  max_context_tokens: int | None = None
  batch_window_s: float = 0.01
  max_batch_prompts: int = 256
  max_batch_tokens: int = 1 << 16
  max_queued_requests: int = 1024
  fair_max_skips: int = 4
  retry_after_s: int = 1
  max_connections: int = 2048
  backlog: int = 2048
  header_timeout_s: float = 10.0
  body_timeout_s: float = 30.0
  keep_alive_s: float = 5.0
  max_loras: int = 8
  stream_every: int = 16

  def __post_init__(self):
    if not 1 <= self.default_max_tokens <= self.max_tokens:
      raise ValueError(
        f"ServerConfig: default_max_tokens ({self.default_max_tokens}) must be in "
        f"[1, max_tokens={self.max_tokens}]"
      )
    for name in (
      "max_request_tokens",
      "max_batch_tokens",
      "max_queued_requests",
      "max_connections",
      "backlog",
      "max_loras",
      "stream_every",
    ):
      if getattr(self, name) < 1:
        raise ValueError(f"ServerConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.max_context_tokens is not None and self.max_context_tokens < 2:
      raise ValueError(f"ServerConfig.max_context_tokens must be >= 2 or None, got {self.max_context_tokens}")
