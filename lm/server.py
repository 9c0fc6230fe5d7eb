"""An OpenAI-compatible HTTP server over a local `JaxGenerator`, so a JAX checkpoint serves any role.

Routes: `GET /health`, `GET /v1/models` (each served model with its `max_model_len`, as vLLM),
`POST /v1/completions`, `POST /v1/chat/completions` with `n`, `temperature`, `top_p`, `top_k` (the
vLLM extension), `max_tokens` (`max_completion_tokens` for chat), `stop`, `seed`, `logprobs`,
`return_tokens_as_token_ids` (vLLM's: log-prob tokens as "token_id:<id>"), `stream` with
`stream_options.include_usage` (server-sent events in OpenAI's chunk format, sent once the sample is
whole: the sampler makes whole completions), `response_format` `{"type": "text"}` and
`chat_template_kwargs` (`enable_thinking`); `POST /v1/load_lora_adapter` and
`/v1/unload_lora_adapter` (vLLM's bodies) serve PEFT LoRA adapters by name: a request whose `model`
names an adapter is answered by the base model with it. Anything this server cannot honour (JSON
modes, echo, penalties, logit bias, tools, guided decoding, alternatives in log-probs) is refused
with a 400 naming the field rather than silently ignored. docs/serving.md has the details.

The HTTP side is FastAPI (Starlette) on uvicorn, the stack vLLM and SGLang serve on: one asyncio
loop holds every connection, so a thousand idle or slow clients cost sockets, not threads. Bodies
are validated by pydantic request models (types, strictly: `true` is not an integer), then by the
checks that depend on this server's limits, and each prompt is tokenised in its own request before
it can join a batch, so a prompt the tokenizer rejects (a lone surrogate) is a 400 for that request
alone, and prompts longer than the model's positions (or `max_context_tokens`) are refused.

Requests are batched: a worker thread waits `batch_window_s` after a request arrives for others (or
until `max_batch_prompts` prompts) and answers them with one `JaxGenerator.generate` call (one
sampler call for requests sharing n, max_tokens and stop). While a batch runs, new requests queue
and form the next batch, so a busy server batches more. If a batch fails, each of its requests is
retried alone, so one request's error is never another's. Scheduling is fair: the cheapest waiting
request (prompts × n × max_tokens) leads the next batch and only requests of comparable length join
it, so a few huge requests cannot hold a small one for the length of theirs; a request passed over
`fair_max_skips` times leads the next batch whatever its size, so large ones are not starved either.

Safety: it binds 127.0.0.1 unless told otherwise, checks a Bearer API key when given one, limits
body size (413), JSON nesting (400), `max_tokens`, `n`, prompts per request and their product
(`max_request_tokens`, 400), gives up on clients that do not finish their headers or body in time
(`header_timeout_s`, `body_timeout_s`: 408 or a closed connection), answers 429 with `Retry-After`
when `max_queued_requests` are waiting and 503 with `Retry-After` past `max_connections`. Every
error, 404 and 405 included, uses OpenAI's shape `{"error": {"message", "type", "param", "code"}}`,
so the `openai` client raises its usual exceptions with the message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hmac
import itertools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import fastapi
import jax
import ml_collections
import pydantic
import uvicorn
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from lm import generators, lora, progress
from lm.generators import Generation, GenerationParams, JaxGenerator, Prompt


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
    ):
      if getattr(self, name) < 1:
        raise ValueError(f"ServerConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.max_context_tokens is not None and self.max_context_tokens < 2:
      raise ValueError(f"ServerConfig.max_context_tokens must be >= 2 or None, got {self.max_context_tokens}")


class ApiError(Exception):
  """An error answered to the client in OpenAI's error shape."""

  def __init__(
    self,
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
  ):
    super().__init__(message)
    self.status, self.message, self.param, self.code = status, message, param, code
    self.headers = headers or {}

  def body(self) -> dict[str, Any]:
    return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
  """OpenAI's error object; `type` as OpenAI names it for the status."""
  kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
    status, "invalid_request_error"
  )
  if status >= 500:
    kind = "server_error"
  return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclasses.dataclass(frozen=True)
class _Job:
  """One parsed request: its prompts (one for chat), samples per prompt and parameters.

  `generator` answers it (None: the batcher's own, the base model); it is fixed when the request
  is accepted, so an adapter reloaded meanwhile serves the requests that come after the reload.
  """

  prompts: list[Prompt]
  n: int
  params: GenerationParams
  chat: bool
  model: str = ""
  generator: Any = None
  stream: bool = False
  include_usage: bool = False
  token_ids_as_tokens: bool = False

  @property
  def cost(self) -> int:
    """Decode budget: the most tokens this request can make the device generate."""
    return len(self.prompts) * self.n * self.params.max_tokens


# Fields clients may send but this server cannot honour, with the values that mean "not used"
# (OpenAI's and vLLM's extensions that change what is sampled or returned).
_UNSUPPORTED = {
  "echo": (None, False),
  "suffix": (None, ""),
  "best_of": (None, 1),
  "logit_bias": (None, {}),
  "presence_penalty": (None, 0),
  "frequency_penalty": (None, 0),
  "tools": (None, []),
  "tool_choice": (None, "none"),
  "functions": (None, []),
  "function_call": (None, "none"),
  "top_logprobs": (None, 0),
  "guided_json": (None,),
  "guided_regex": (None,),
  "guided_choice": (None,),
  "guided_grammar": (None,),
  "structured_outputs": (None,),
  "logits_processors": (None, []),
  "min_tokens": (None, 0),
  "min_p": (None, 0),
  "repetition_penalty": (None, 1),
  "use_beam_search": (None, False),
  "prompt_logprobs": (None,),
  "ignore_eos": (None, False),
  "stop_token_ids": (None, []),
  "bad_words": (None, []),
  "allowed_token_ids": (None,),
  "include_stop_str_in_output": (None, False),
  "skip_special_tokens": (None, True),
  "add_generation_prompt": (None, True),
  "continue_final_message": (None, False),
  "return_token_ids": (None, False),
  "truncate_prompt_tokens": (None,),
}

# Deeper JSON than this is refused before validation (a 100k-deep body must be a 400, not a 500).
_MAX_JSON_DEPTH = 32


class _RequestModel(pydantic.BaseModel):
  """Fields common to both routes, typed strictly; unknown fields are kept and checked by name."""

  model_config = pydantic.ConfigDict(strict=True, extra="allow")

  model: str
  n: int | None = None
  max_tokens: int | None = None
  temperature: float | None = None
  top_p: float | None = None
  top_k: int | None = None
  seed: int | None = None
  stop: str | list[str] | None = None


class CompletionRequest(_RequestModel):
  """`POST /v1/completions`; `prompt` is checked by `_prompts` (its error names token ids)."""

  prompt: Any
  logprobs: int | None = None


class ChatCompletionRequest(_RequestModel):
  """`POST /v1/chat/completions`; `messages` is checked by `_messages` (each error names the index)."""

  messages: Any
  max_completion_tokens: int | None = None
  logprobs: bool | None = None
  chat_template_kwargs: dict[str, Any] | None = None


_EXPECTED = {
  "int": "an integer",
  "float": "a number",
  "str": "a string",
  "bool": "a boolean",
  "dict": "an object",
  "list": "a list",
}


def _validation_error(error: pydantic.ValidationError) -> ApiError:
  """The first of pydantic's errors as a 400 naming the field, in this server's wording."""
  first = error.errors()[0]
  name = ".".join(str(part) for part in first["loc"][:1])
  if first["type"] == "missing":
    return ApiError(400, f"missing required field '{name}'", param=name)
  expected = _EXPECTED.get(first["type"].split("_")[0], None)
  if name == "stop":
    return ApiError(
      400, f"'stop' must be a non-empty string or a list of at most 16, got {first['input']!r}", param="stop"
    )
  message = f"'{name}' must be {expected}" if expected else f"'{name}': {first['msg']}"
  return ApiError(400, f"{message}, got {first['input']!r}", param=name)


class OpenAIServer:
  """Serves a `JaxGenerator` over HTTP; `start()` runs it in a background thread.

  Use as a context manager (or call `close()`) to stop the HTTP server and the batch worker.
  """

  def __init__(self, generator: JaxGenerator, config: ServerConfig = ServerConfig()):
    self.generator = generator
    self.config = config
    self.context_limit = _context_limit(generator, config)
    self.created = int(time.time())
    # Adapter name -> (its PEFT directory, the generator serving the base model with it).
    self._adapters: dict[str, tuple[str, JaxGenerator]] = {}
    self._adapters_lock = threading.Lock()
    self._batcher = _Batcher(generator, config)
    self.app = _make_app(self)
    # Bound here (not by uvicorn) so `port` is known at once, also for port 0.
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    self._socket = socket.socket(family, socket.SOCK_STREAM)
    self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    self._socket.bind((config.host, config.port))
    self._socket.listen(config.backlog)
    self._socket.set_inheritable(True)
    uvicorn_config = uvicorn.Config(
      self.app,
      http=_protocol_class(config),
      lifespan="off",
      log_level="warning",
      access_log=False,
      backlog=config.backlog,
      timeout_keep_alive=max(1, int(config.keep_alive_s)),
      timeout_graceful_shutdown=1,
    )
    self._uvicorn = uvicorn.Server(uvicorn_config)
    self._thread: threading.Thread | None = None

  @property
  def port(self) -> int:
    return self._socket.getsockname()[1]

  @property
  def base_url(self) -> str:
    return f"http://{self.config.host}:{self.port}/v1"

  def serve_forever(self) -> None:
    """Serves in this thread until interrupted (Ctrl-C) or `close()`d."""
    logging.info("serving %r at %s", self.config.model_name, self.base_url)
    self._uvicorn.run(sockets=[self._socket])

  def start(self) -> OpenAIServer:
    self._thread = threading.Thread(target=self.serve_forever, name="lm.server http", daemon=True)
    self._thread.start()
    deadline = time.monotonic() + 60
    while not self._uvicorn.started and self._thread.is_alive() and time.monotonic() < deadline:
      time.sleep(0.01)
    if not self._uvicorn.started:
      raise RuntimeError(f"the HTTP server did not start at {self.base_url}")
    return self

  def close(self) -> None:
    self._uvicorn.should_exit = True
    if self._thread is not None:
      self._thread.join()
    self._socket.close()
    self._batcher.close()

  def __enter__(self) -> OpenAIServer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # ---- request handling --------------------------------------------------------------------------

  def check_auth(self, request: fastapi.Request) -> None:
    if self.config.api_key is None:
      return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {self.config.api_key}".encode()):
      raise ApiError(
        401, "missing or wrong API key (send 'Authorization: Bearer <key>')", code="invalid_api_key"
      )

  def models(self) -> dict[str, Any]:
    """The base model and every loaded adapter, each with its context limit (vLLM's fields) and the
    most `max_tokens` a request may ask (`max_tokens`, this server's own field: vLLM has no such cap)."""

    def entry(name: str, root: str, parent: str | None) -> dict[str, Any]:
      return {
        "id": name,
        "object": "model",
        "created": self.created,
        "owned_by": "lm.server",
        "root": root,
        "parent": parent,
        "max_model_len": self.context_limit,
        "max_tokens": self.config.max_tokens,
      }

    with self._adapters_lock:
      adapters = sorted((name, path) for name, (path, _) in self._adapters.items())
    base = self.config.model_name
    return {"object": "list", "data": [entry(base, base, None)] + [entry(n, p, base) for n, p in adapters]}

  def healthy(self) -> bool:
    return self._batcher.alive()

  async def complete(self, request: fastapi.Request, *, chat: bool):
    """Reads, validates and tokenises one request, then waits for its batch."""
    body = _json_object(await _read_body(request, self.config))
    job = self.parse(body, chat=chat)
    await asyncio.get_running_loop().run_in_executor(None, self.check_prompts, job)
    generations = await asyncio.wrap_future(self._batcher.submit(job))
    if job.stream:
      events = _stream_events(job, generations, self.generator.tokenizer)
      return fastapi.responses.StreamingResponse(
        iter(events), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
      )
    return _response(job, generations, self.generator.tokenizer)

  # ---- LoRA adapters (vLLM's runtime endpoints) ---------------------------------------------------

  async def load_adapter(self, request: fastapi.Request) -> str:
    body = _json_object(await _read_body(request, self.config))
    name = self._adapter_name(body)
    path = _field(body, "lora_path", str, None)
    if not path:
      raise ApiError(400, "missing required field 'lora_path' (a PEFT LoRA directory)", param="lora_path")
    _field(body, "load_inplace", bool, None)  # vLLM's switch to replace; this server always replaces
    self._check_room(name)  # before the work of loading, and again (under the lock) after it
    generator = await asyncio.get_running_loop().run_in_executor(None, self._adapter_generator, path)
    with self._adapters_lock:
      self._check_room(name)
      replaced = name in self._adapters
      self._adapters[name] = (path, generator)
    logging.info("%s LoRA adapter %r from %s", "replaced" if replaced else "loaded", name, path)
    return f"Success: LoRA adapter '{name}' added successfully."

  async def unload_adapter(self, request: fastapi.Request) -> str:
    body = _json_object(await _read_body(request, self.config))
    name = self._adapter_name(body)
    with self._adapters_lock:
      if self._adapters.pop(name, None) is None:
        raise ApiError(404, f"the LoRA adapter {name!r} is not loaded", param="lora_name")
    return f"Success: LoRA adapter '{name}' removed successfully."

  def _check_room(self, name: str) -> None:
    """A new name beyond `max_loras` loaded adapters is a 400 (replacing a loaded one is not)."""
    if name not in self._adapters and len(self._adapters) >= self.config.max_loras:
      raise ApiError(
        400,
        f"{len(self._adapters)} adapters are loaded, the limit (max_loras); unload one first",
        param="lora_name",
      )

  def _adapter_name(self, body: dict[str, Any]) -> str:
    name = _field(body, "lora_name", str, None)
    if not name:
      raise ApiError(400, "missing required field 'lora_name'", param="lora_name")
    if name == self.config.model_name:
      raise ApiError(400, f"'lora_name' {name!r} is the base model's name", param="lora_name")
    return name

  def _adapter_generator(self, path: str) -> JaxGenerator:
    """A generator for the base model with the PEFT adapter at `path` (400 naming `lora_path`)."""
    sampler = self.generator.sampler
    try:
      adapter = lora.load_peft(path, sampler.model.config)
    except Exception as e:  # load_peft's ValueErrors name the file; safetensors raises its own types
      raise ApiError(
        400, f"'lora_path' {path!r}: {type(e).__name__}: {ascii(str(e))[1:-1][:500]}", param="lora_path"
      ) from None
    if sampler.mesh is not None:  # beside the base weights on every device
      replicated = jax.sharding.NamedSharding(sampler.mesh, jax.sharding.PartitionSpec())
      for var in vars(adapter).values():
        if isinstance(var, lora.LoRAParam):
          var[...] = jax.device_put(var[...], replicated)
    view = lora.with_adapter(sampler.model, adapter)
    return JaxGenerator(view, self.generator.tokenizer, sampler_config=sampler.config, mesh=sampler.mesh)

  def _generator_for(self, model: str) -> JaxGenerator | None:
    """None for the base model, else the adapter's generator (404 naming what is served)."""
    if model == self.config.model_name:
      return None
    with self._adapters_lock:
      entry = self._adapters.get(model)
      served = [self.config.model_name, *sorted(self._adapters)]
    if entry is None:
      raise ApiError(404, f"model {model!r} is not served here (this server has {served})", param="model")
    return entry[1]

  def parse(self, body: dict[str, Any], *, chat: bool) -> _Job:
    """Validates a request body into a `_Job`; every error names the offending field."""
    try:
      request = (ChatCompletionRequest if chat else CompletionRequest).model_validate(body)
    except pydantic.ValidationError as e:
      raise _validation_error(e) from None
    generator = self._generator_for(request.model)
    for name, allowed in _UNSUPPORTED.items():
      if body.get(name) not in allowed:
        raise ApiError(400, f"'{name}' = {body[name]!r} is not supported by this server", param=name)
    _response_format(body)
    stream, include_usage = _stream(body)
    c = self.config
    prompts = [_messages(body)] if chat else _prompts(body, c.max_prompts)
    max_tokens_field = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = _field(body, max_tokens_field, int, c.default_max_tokens)
    if not 1 <= max_tokens <= c.max_tokens:
      raise ApiError(
        400,
        f"'{max_tokens_field}' must be in [1, {c.max_tokens}] (this server's limit is {c.max_tokens} "
        f"tokens), got {max_tokens}",
        param=max_tokens_field,
      )
    params = GenerationParams(
      max_tokens=max_tokens,
      temperature=_ranged(body, "temperature", float, 1.0, 0.0, 2.0),
      top_p=_ranged(body, "top_p", float, 1.0, 1e-9, 1.0),
      top_k=max(0, _ranged(body, "top_k", int, 0, -1, 1 << 30)),  # vLLM's -1 also means "off"
      stop=_stop(body),
      seed=_ranged(body, "seed", int, None, 0, 2**32 - 1),
      enable_thinking=_enable_thinking(body) if chat else None,
      logprobs=_logprobs(body, chat),
    )
    job = _Job(
      prompts,
      _ranged(body, "n", int, 1, 1, c.max_n),
      params,
      chat,
      model=request.model,
      generator=generator,
      stream=stream,
      include_usage=include_usage,
      token_ids_as_tokens=_field(body, "return_tokens_as_token_ids", bool, False),
    )
    if job.cost > c.max_request_tokens:
      raise ApiError(
        400,
        f"the request asks for up to {job.cost} tokens ({len(prompts)} prompts x n={job.n} x "
        f"{max_tokens_field}={max_tokens}); at most {c.max_request_tokens} per request",
        param="n" if job.n > 1 else max_tokens_field,
      )
    return job

  def check_prompts(self, job: _Job) -> None:
    """Tokenises every prompt of `job` alone: a prompt the tokenizer rejects, or too long for the
    context with `max_tokens` added, is this request's 400 (before it can join a batch)."""
    param = "messages" if job.chat else "prompt"
    for i, prompt in enumerate(job.prompts):
      try:
        length = len(self.generator.encode(prompt, job.params))
      except Exception as e:  # tokenizers raise assorted types for text they cannot encode
        where = param if job.chat or len(job.prompts) == 1 else f"{param}[{i}]"
        reason = ascii(str(e))[1:-1][:300]
        raise ApiError(
          400, f"'{where}' cannot be tokenised: {type(e).__name__}: {reason}", param=param
        ) from None
      if length == 0:
        raise ApiError(400, f"'{param}' encodes to no tokens", param=param)
      if length + job.params.max_tokens > self.context_limit:
        raise ApiError(
          400,
          f"'{param}' has {length} tokens; with max_tokens={job.params.max_tokens} that exceeds the "
          f"context limit of {self.context_limit} tokens",
          param=param,
          code="context_length_exceeded",
        )


def _context_limit(generator: JaxGenerator, config: ServerConfig) -> int:
  """prompt + max_tokens allowed: the model's positions, or `max_context_tokens` if smaller."""
  model = getattr(getattr(generator, "sampler", None), "model", None)
  if model is None:  # a stand-in generator without a local model: only the configured limit
    return config.max_context_tokens or 1 << 62
  return model.config.context_limit(config.max_context_tokens)


async def _read_body(request: fastapi.Request, config: ServerConfig) -> bytes:
  """The whole body, refused early when too large (413) and given up on when slow (408)."""
  length = request.headers.get("content-length")
  if length is None or not length.isdigit():
    raise ApiError(411, "the request needs a Content-Length header")
  if int(length) > config.max_body_bytes:
    raise ApiError(413, f"request body of {length} bytes exceeds the limit of {config.max_body_bytes} bytes")
  try:
    return await asyncio.wait_for(request.body(), timeout=config.body_timeout_s)
  except TimeoutError:
    raise ApiError(
      408, f"the request body did not arrive within {config.body_timeout_s} s (Content-Length {length})"
    ) from None


class _JSONResponse(fastapi.responses.JSONResponse):
  """UTF-8 JSON as before; text the client sent that is not valid Unicode is escaped, not a 500."""

  def render(self, content: Any) -> bytes:
    try:
      return json.dumps(content, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
      return json.dumps(content, ensure_ascii=True).encode("ascii")


def _error_response(error: ApiError) -> _JSONResponse:
  return _JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _make_app(server: OpenAIServer) -> fastapi.FastAPI:
  """The FastAPI app: its routes, and one error shape (OpenAI's) for every status."""
  app = fastapi.FastAPI(openapi_url=None, docs_url=None, redoc_url=None, default_response_class=_JSONResponse)

  @app.exception_handler(ApiError)
  async def api_error(request, error: ApiError):
    return _error_response(error)

  @app.exception_handler(StarletteHTTPException)
  async def http_error(request, error: StarletteHTTPException):
    if error.status_code == 404:
      message = f"no route {request.method} {request.url.path}"
    elif error.status_code == 405:
      message = f"method {request.method} is not allowed on {request.url.path}"
    else:
      message = str(error.detail)
    return _error_response(ApiError(error.status_code, message, headers=dict(error.headers or {})))

  @app.exception_handler(Exception)
  async def internal_error(request, error: Exception):
    logging.error("request failed", exc_info=error)
    return _error_response(ApiError(500, f"internal error: {type(error).__name__}: {error}"))

  @app.get("/health")
  async def health():
    if not server.healthy():
      raise ApiError(503, "the batch worker has stopped")
    return fastapi.responses.Response(status_code=200)

  @app.get("/v1/models")
  async def models(request: fastapi.Request):
    server.check_auth(request)
    return server.models()

  @app.post("/v1/load_lora_adapter")
  async def load_lora_adapter(request: fastapi.Request):
    server.check_auth(request)
    return fastapi.responses.PlainTextResponse(await server.load_adapter(request))

  @app.post("/v1/unload_lora_adapter")
  async def unload_lora_adapter(request: fastapi.Request):
    server.check_auth(request)
    return fastapi.responses.PlainTextResponse(await server.unload_adapter(request))

  @app.post("/v1/completions")
  async def completions(request: fastapi.Request):
    server.check_auth(request)
    return await server.complete(request, chat=False)

  @app.post("/v1/chat/completions")
  async def chat_completions(request: fastapi.Request):
    server.check_auth(request)
    return await server.complete(request, chat=True)

  return app


def _protocol_class(config: ServerConfig) -> type[H11Protocol]:
  """uvicorn's HTTP/1.1 protocol with a deadline for each request head and a connection cap.

  uvicorn times out idle kept-alive connections but not a client that opens a connection and
  sends its head slowly or never (slowloris); this closes such a connection `header_timeout_s`
  after it opened or after its last response, and answers connections beyond `max_connections`
  with a 503 at once.
  """
  overloaded = json.dumps(error_body(503, "too many open connections; retry later")).encode()

  class Protocol(H11Protocol):
    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
      super().connection_made(transport)
      if len(self.connections) > config.max_connections:
        transport.write(
          b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
          + f"retry-after: {config.retry_after_s}\r\ncontent-length: {len(overloaded)}\r\n".encode()
          + b"connection: close\r\n\r\n"
          + overloaded
        )
        transport.close()
        return
      self._arm_head_deadline()

    def _arm_head_deadline(self) -> None:
      self._cancel_head_deadline()
      self._head_deadline = self.loop.call_later(config.header_timeout_s, self._head_timed_out)

    def _cancel_head_deadline(self) -> None:
      if self._head_deadline is not None:
        self._head_deadline.cancel()
        self._head_deadline = None

    def _head_timed_out(self) -> None:
      self._head_deadline = None
      if self.cycle is None or self.cycle.response_complete:  # no request in progress
        if not self.transport.is_closing():
          self.transport.close()

    def handle_events(self) -> None:
      cycle = self.cycle
      super().handle_events()
      if self.cycle is not cycle:  # a request head arrived: the body has its own timeout
        self._cancel_head_deadline()

    def on_response_complete(self) -> None:
      super().on_response_complete()
      if not self.transport.is_closing():
        self._arm_head_deadline()

    def connection_lost(self, exc) -> None:
      self._cancel_head_deadline()
      super().connection_lost(exc)

  return Protocol


# ---- field validation ---------------------------------------------------------------------------

_TYPE_NAMES = {
  str: "a string",
  int: "an integer",
  float: "a number",
  bool: "a boolean",
  list: "a list",
  dict: "an object",
}


def _field(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
  """body[name] checked to be of `kind` (null or absent → default; ints pass as floats, bools not)."""
  value = body.get(name)
  if value is None:
    return default
  ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
  if kind is float and isinstance(value, int) and not isinstance(value, bool):
    ok, value = True, float(value)
  if not ok:
    raise ApiError(400, f"'{name}' must be {_TYPE_NAMES[kind]}, got {value!r}", param=name)
  return value


def _ranged(body: dict[str, Any], name: str, kind: type, default: Any, lo: float, hi: float) -> Any:
  value = _field(body, name, kind, default)
  if value is not None and not lo <= value <= hi:
    raise ApiError(400, f"'{name}' must be in [{lo}, {hi}], got {value}", param=name)
  return value


def _json_object(raw: bytes) -> dict[str, Any]:
  try:
    body = json.loads(raw)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ApiError(400, f"request body is not valid JSON: {e}") from None
  except RecursionError:
    raise ApiError(400, f"request body is nested deeper than {_MAX_JSON_DEPTH} levels") from None
  if not isinstance(body, dict):
    raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
  if _depth(body) > _MAX_JSON_DEPTH:
    raise ApiError(400, f"request body is nested deeper than {_MAX_JSON_DEPTH} levels")
  return body


def _depth(value: Any) -> int:
  """Nesting depth of parsed JSON, without recursion (a deep body must not overflow the stack)."""
  deepest, stack = 0, [(value, 1)]
  while stack:
    item, depth = stack.pop()
    deepest = max(deepest, depth)
    if deepest > _MAX_JSON_DEPTH:
      return deepest
    children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
    stack.extend((child, depth + 1) for child in children)
  return deepest


def _prompts(body: dict[str, Any], max_prompts: int) -> list[str]:
  prompt = body.get("prompt")
  if prompt is None:
    raise ApiError(400, "missing required field 'prompt'", param="prompt")
  prompts = [prompt] if isinstance(prompt, str) else prompt
  if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p for p in prompts):
    raise ApiError(
      400,
      "'prompt' must be a non-empty string or a non-empty list of them (token ids are not accepted)",
      param="prompt",
    )
  if len(prompts) > max_prompts:
    raise ApiError(400, f"'prompt' has {len(prompts)} prompts; at most {max_prompts}", param="prompt")
  return prompts


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
  messages = body.get("messages")
  if messages is None:
    raise ApiError(400, "missing required field 'messages'", param="messages")
  if not isinstance(messages, list) or not messages:
    raise ApiError(400, "'messages' must be a non-empty list", param="messages")
  return [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]


def _message(message: Any, where: str) -> dict[str, str]:
  if not isinstance(message, dict):
    raise ApiError(400, f"'{where}' must be an object with 'role' and 'content'", param=where)
  role = message.get("role")
  if role not in ("system", "user", "assistant"):
    raise ApiError(
      400, f"'{where}.role' must be system, user or assistant, got {role!r}", param=f"{where}.role"
    )
  content = message.get("content")
  if isinstance(content, list):  # content parts: only text is understood
    if not all(
      isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
      raise ApiError(
        400, f"'{where}.content' parts must all be {{'type': 'text', 'text': ...}}", param=f"{where}.content"
      )
    content = "".join(p["text"] for p in content)
  if not isinstance(content, str):
    raise ApiError(400, f"'{where}.content' must be a string, got {content!r}", param=f"{where}.content")
  return {"role": role, "content": content}


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
  stop = body.get("stop")
  stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
  if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 16:
    raise ApiError(
      400, f"'stop' must be a non-empty string or a list of at most 16, got {stop!r}", param="stop"
    )
  return tuple(stops)


def _enable_thinking(body: dict[str, Any]) -> bool | None:
  kwargs = _field(body, "chat_template_kwargs", dict, {})
  unknown = sorted(set(kwargs) - {"enable_thinking"})
  if unknown:
    raise ApiError(
      400,
      f"'chat_template_kwargs' may only hold 'enable_thinking', got {unknown}",
      param="chat_template_kwargs",
    )
  return _field(kwargs, "enable_thinking", bool, None)


def _response_format(body: dict[str, Any]) -> None:
  """Only plain text: JSON modes are refused by name, never ignored."""
  value = body.get("response_format")
  if value is None:
    return
  if not isinstance(value, dict) or not isinstance(value.get("type"), str):
    raise ApiError(
      400, f"'response_format' must be an object with a string 'type', got {value!r}", param="response_format"
    )
  if value["type"] != "text":
    raise ApiError(
      400,
      f"'response_format.type' = {value['type']!r} is not supported by this server (only 'text'; "
      "constrained JSON decoding is not implemented)",
      param="response_format.type",
    )


def _stream(body: dict[str, Any]) -> tuple[bool, bool]:
  """(stream, include_usage) from `stream` and `stream_options`."""
  stream = _field(body, "stream", bool, False)
  options = _field(body, "stream_options", dict, None)
  if options is None:
    return stream, False
  if not stream:
    raise ApiError(400, "'stream_options' is only allowed with 'stream': true", param="stream_options")
  # OpenAI's include_obfuscation pads chunks against side channels; none is added here either way.
  unknown = sorted(set(options) - {"include_usage", "continuous_usage_stats", "include_obfuscation"})
  if unknown:
    raise ApiError(
      400, f"'stream_options' may hold 'include_usage', got {unknown}", param=f"stream_options.{unknown[0]}"
    )
  if _field(options, "continuous_usage_stats", bool, False):
    raise ApiError(
      400,
      "'stream_options.continuous_usage_stats' is not supported",
      param="stream_options.continuous_usage_stats",
    )
  try:
    include_usage = _field(options, "include_usage", bool, False)
  except ApiError as e:
    raise ApiError(
      400,
      e.message.replace("'include_usage'", "'stream_options.include_usage'"),
      param="stream_options.include_usage",
    ) from None
  return stream, include_usage


def _logprobs(body: dict[str, Any], chat: bool) -> bool:
  """Chat: a boolean. Completions: the number of alternatives, of which only 0 is supported."""
  if chat:
    return _field(body, "logprobs", bool, False)
  alternatives = _field(body, "logprobs", int, None)
  if alternatives not in (None, 0):
    raise ApiError(
      400,
      f"'logprobs' = {alternatives}: only 0 (the sampled token's log-prob) is supported",
      param="logprobs",
    )
  return alternatives == 0


# ---- responses ----------------------------------------------------------------------------------


def _response(job: _Job, generations: list[list[Generation]], tokenizer) -> dict[str, Any]:
  """The OpenAI response body; choice i * n + j is sample j of prompt i."""
  choices = []
  for index, g in _samples(job, generations):
    logprobs = _logprobs_block(job, tokenizer, g.token_ids, g.logprobs) if job.params.logprobs else None
    if job.chat:
      choice = {"message": {"role": "assistant", "content": g.text}, "logprobs": logprobs}
    else:
      choice = {"text": g.text, "logprobs": logprobs}
    choices.append({"index": index, "finish_reason": g.finish_reason, **choice})
  return {**_header(job), "choices": choices, "usage": _usage(generations)}


def _samples(job: _Job, generations: list[list[Generation]]):
  """(choice index, sample) pairs: choice i * n + j is sample j of prompt i."""
  for i, samples in enumerate(generations):
    for j, g in enumerate(samples):
      yield i * job.n + j, g


def _header(job: _Job, *, chunk: bool = False) -> dict[str, Any]:
  kind = ("chat.completion.chunk" if chunk else "chat.completion") if job.chat else "text_completion"
  return {
    "id": f"{'chatcmpl' if job.chat else 'cmpl'}-{uuid.uuid4().hex}",
    "object": kind,
    "created": int(time.time()),
    "model": job.model,
  }


def _usage(generations: list[list[Generation]]) -> dict[str, int]:
  prompt_tokens = sum(samples[0].prompt_tokens for samples in generations)
  completion_tokens = sum(g.completion_tokens for samples in generations for g in samples)
  return {
    "prompt_tokens": prompt_tokens,
    "completion_tokens": completion_tokens,
    "total_tokens": prompt_tokens + completion_tokens,
  }


def _logprobs_block(job: _Job, tokenizer, token_ids: Sequence[int], logprobs: Sequence[float]) -> dict:
  """The `logprobs` of a choice (or a streamed chunk) covering `token_ids`: the sampler's own
  log-probs (of the model's unscaled distribution, as vLLM's default); tokens as text, or as
  "token_id:<id>" with `return_tokens_as_token_ids` (vLLM's extension)."""
  if job.token_ids_as_tokens:
    tokens = [f"token_id:{t}" for t in token_ids]
  else:
    tokens = [tokenizer.decode([t]) for t in token_ids]
  if not job.chat:
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None}
  content = [
    {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8", "surrogatepass")), "top_logprobs": []}
    for t, lp in zip(tokens, logprobs, strict=True)
  ]
  return {"content": content, "refusal": None}


_DETOKENIZE_WINDOW = 6  # tokens decoded before the new ones, so a piece's leading space is right


def text_pieces(tokenizer, token_ids: Sequence[int], text: str) -> list[tuple[str, int, int]]:
  """`text` split along `token_ids` for streaming: (piece, first token, end token) per chunk.

  The pieces join to `text` exactly (stop strings already cut) and their token ranges cover
  `token_ids` in order. A token that ends inside a multi-byte character waits for the next; once
  decoding stops matching `text` (a cut stop string) the rest is one last piece.
  """
  pieces, sent, start = [], 0, 0
  for k in range(len(token_ids)):
    lo = max(0, start - _DETOKENIZE_WINDOW)
    before = tokenizer.decode(token_ids[lo:start])
    after = tokenizer.decode(token_ids[lo : k + 1])
    if after.endswith("\ufffd") or not after.startswith(before):
      continue
    delta = after[len(before) :]
    if not text.startswith(delta, sent):
      break
    pieces.append((delta, start, k + 1))
    sent, start = sent + len(delta), k + 1
  if sent < len(text) or start < len(token_ids):
    pieces.append((text[sent:], start, len(token_ids)))
  return pieces


def _stream_events(job: _Job, generations: list[list[Generation]], tokenizer) -> list[bytes]:
  """The response as server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.

  Per choice: (chat) a first chunk with the role, then one chunk per text piece (`text_pieces`, with
  the log-probs of its tokens), then one with the finish reason; with `include_usage` every chunk
  has `"usage": null` and a last chunk has no choices and the usage, as OpenAI sends them.
  """
  header = _header(job, chunk=True)
  extra = {"usage": None} if job.include_usage else {}

  def event(choice: dict[str, Any]) -> bytes:
    return _sse({**header, "choices": [choice], **extra})

  events = []
  for index, g in _samples(job, generations):
    if job.chat:
      events.append(event({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                           "finish_reason": None}))  # fmt: skip
    for piece, lo, hi in text_pieces(tokenizer, g.token_ids, g.text):
      logprobs = (
        _logprobs_block(job, tokenizer, g.token_ids[lo:hi], g.logprobs[lo:hi])
        if job.params.logprobs
        else None
      )
      body = {"delta": {"content": piece}} if job.chat else {"text": piece}
      events.append(event({"index": index, **body, "logprobs": logprobs, "finish_reason": None}))
    body = {"delta": {}} if job.chat else {"text": ""}
    events.append(event({"index": index, **body, "logprobs": None, "finish_reason": g.finish_reason}))
  if job.include_usage:
    events.append(_sse({**header, "choices": [], "usage": _usage(generations)}))
  events.append(b"data: [DONE]\n\n")
  return events


def _sse(data: dict[str, Any]) -> bytes:
  try:
    payload = json.dumps(data, ensure_ascii=False).encode("utf-8")
  except UnicodeEncodeError:  # text the client sent that is not valid Unicode: escaped, as _JSONResponse
    payload = json.dumps(data).encode("ascii")
  return b"data: " + payload + b"\n\n"


# ---- batching -----------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Entry:
  """A waiting job: its future, arrival order and how often a batch has passed it over."""

  job: _Job
  future: concurrent.futures.Future
  seq: int
  arrived: float
  skipped: int = 0


class _Batcher:
  """One worker thread that answers waiting jobs in batches with one `generate` call each.

  The queue is bounded (`max_queued_requests`; `submit` raises a 429 beyond it). Which jobs form
  the next batch is `_select`'s fair rule; a failed batch is rerun one job at a time so that only
  the jobs that fail alone get an error.
  """

  def __init__(self, generator: JaxGenerator, config: ServerConfig):
    self._generator = generator
    self._config = config
    self._pending: list[_Entry] = []
    self._closing = False
    self._seq = itertools.count()
    self._cv = threading.Condition()
    self._thread = threading.Thread(target=self._loop, name="lm.server batcher", daemon=True)
    self._thread.start()

  def submit(self, job: _Job) -> concurrent.futures.Future:
    future = concurrent.futures.Future()
    with self._cv:
      if self._closing:
        raise ApiError(503, "the server is shutting down", headers=self._retry_after())
      if len(self._pending) >= self._config.max_queued_requests:
        raise ApiError(
          429,
          f"{len(self._pending)} requests are already waiting; retry later",
          code="queue_full",
          headers=self._retry_after(),
        )
      self._pending.append(_Entry(job, future, next(self._seq), time.monotonic()))
      self._cv.notify()
    return future

  def _retry_after(self) -> dict[str, str]:
    return {"Retry-After": str(self._config.retry_after_s)}

  def alive(self) -> bool:
    return self._thread.is_alive() and not self._closing

  def close(self) -> None:
    with self._cv:
      self._closing = True
      self._cv.notify()
    self._thread.join()

  def _loop(self) -> None:
    while (batch := self._next_batch()) is not None:
      self._run(batch)

  def _next_batch(self) -> list[_Entry] | None:
    """Waits for a job, then `batch_window_s` after the oldest for company; None when closed."""
    with self._cv:
      while not self._pending and not self._closing:
        self._cv.wait()
      if not self._pending:
        return None
      deadline = min(e.arrived for e in self._pending) + self._config.batch_window_s
      while (
        not self._closing and sum(len(e.job.prompts) for e in self._pending) < self._config.max_batch_prompts
      ):
        left = deadline - time.monotonic()
        if left <= 0:
          break
        self._cv.wait(timeout=left)
      return self._select()

  def _select(self) -> list[_Entry]:
    """Removes and returns the next batch (called holding the lock).

    The lead job is the longest-waiting one passed over `fair_max_skips` times, else the cheapest
    (prompts × n × max_tokens, then arrival). Jobs join it, cheapest first, while the batch stays
    within `max_batch_prompts` and `max_batch_tokens` and their `max_tokens` is within 2x of the
    lead's, so no job waits in its own batch for a decode much longer than it asked for, and a job
    arriving during a batch waits for at most one batch's budget. Every job left behind counts a skip.
    """
    by_cost = sorted(self._pending, key=lambda e: (e.job.cost, e.seq))
    starved = [e for e in self._pending if e.skipped >= self._config.fair_max_skips]
    lead = min(starved, key=lambda e: e.seq) if starved else by_cost[0]
    batch, size, cost = [lead], len(lead.job.prompts), lead.job.cost
    lead_tokens = lead.job.params.max_tokens
    for entry in by_cost:
      if entry is lead:
        continue
      tokens = entry.job.params.max_tokens
      fits = size + len(entry.job.prompts) <= self._config.max_batch_prompts
      fits = fits and cost + entry.job.cost <= self._config.max_batch_tokens
      if fits and max(tokens, lead_tokens) <= 2 * min(tokens, lead_tokens):
        batch.append(entry)
        size, cost = size + len(entry.job.prompts), cost + entry.job.cost
    chosen = set(map(id, batch))
    self._pending = [e for e in self._pending if id(e) not in chosen]
    for entry in self._pending:
      entry.skipped += 1
    return batch

  def _run(self, batch: list[_Entry]) -> None:
    jobs = [e.job for e in batch]
    logging.info("batch of %d requests, %d prompts", len(jobs), sum(len(j.prompts) for j in jobs))
    try:
      results = self._generate(jobs)
    except Exception as e:
      if len(batch) == 1:
        logging.exception("request failed")
        message = f"internal error: {type(e).__name__}: {ascii(str(e))[1:-1][:500]}"
        batch[0].future.set_exception(ApiError(500, message))
        return
      logging.warning("a batch of %d requests failed; answering each alone", len(batch), exc_info=True)
      for entry in batch:
        self._run([entry])
      return
    for entry, result in zip(batch, results, strict=True):
      entry.future.set_result(result)

  def _generate(self, jobs: list[_Job]) -> list[list[list[Generation]]]:
    """One `generate` call per generator among `jobs` (the base model, each adapter)."""
    by_generator: dict[int, list[int]] = {}
    for index, job in enumerate(jobs):
      by_generator.setdefault(id(job.generator), []).append(index)
    results: list[list[list[Generation]]] = [[] for _ in jobs]
    for indices in by_generator.values():
      group = [jobs[i] for i in indices]
      generator = group[0].generator or self._generator
      flat = generator.generate(
        [p for job in group for p in job.prompts],
        n=[job.n for job in group for _ in job.prompts],
        params=[job.params for job in group for _ in job.prompts],
      )
      start = 0
      for i, job in zip(indices, group, strict=True):
        results[i] = flat[start : start + len(job.prompts)]
        start += len(job.prompts)
    return results


def server_from_config(config: ml_collections.ConfigDict) -> OpenAIServer:
  """The (not yet started) server that configs/serve.py describes: model, tokenizer, limits, key."""
  fields = {k: v for k, v in config.server.items() if k != "api_key_env"}
  api_key = None
  if config.server.api_key_env:
    api_key = os.environ.get(config.server.api_key_env)
    if not api_key:
      raise ValueError(f"server.api_key_env names ${config.server.api_key_env}, which is not set")
  server_config = ServerConfig(api_key=api_key, **fields)
  if server_config.host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
    logging.warning(
      "serving on %s without an API key: anyone who can reach it can use it", server_config.host
    )
  return OpenAIServer(generators.load_jax_generator(config.model), server_config)


def serve(config: ml_collections.ConfigDict) -> None:
  """Serves the model of configs/serve.py until interrupted (Ctrl-C: a clean stop, exit status 0)."""
  with server_from_config(config) as server:
    # printed whatever the log level (the launchers are quiet by default): where to send requests
    progress.say(f"serving {server.config.model_name!r} at {server.base_url}")
    try:
      server.serve_forever()
    except KeyboardInterrupt:  # uvicorn re-raises the signal it caught once it has shut down
      pass
  progress.say("server stopped")
