"""The app of `lm.server`: its routes, the HTTP server, and the server a config describes.

Routes: `GET /health`, `GET /v1/models` (each served model with its `max_model_len`, as vLLM),
`POST /v1/completions`, `POST /v1/chat/completions` (the fields `lm.server.protocol` declares),
`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (vLLM's bodies), which serve PEFT LoRA
adapters by name: a request whose `model` names an adapter is answered by the base model with it.

The HTTP side is FastAPI (Starlette) on uvicorn, the stack vLLM and SGLang serve on: one asyncio
loop holds every connection, so a thousand idle or slow clients cost sockets, not threads. A body is
validated by its request model (`lm.server.protocol`), its prompts are tokenised in its own request
before it can join a batch (so a prompt the tokenizer rejects, a lone surrogate, is a 400 for that
request alone, as is one longer than the model's positions or `max_context_tokens`), and it then
waits for its batch (`lm.server.batcher`). A streamed request's response begins with its first
tokens and its chunks leave as the batch makes them (`lm.server.responses.ChunkStream`).

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
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

import fastapi
import jax
import ml_collections
import uvicorn
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from lm import generators, lora, progress
from lm.generators import GenerationParams, JaxGenerator
from lm.server import protocol, responses
from lm.server.batcher import Batcher, Job
from lm.server.config import ServerConfig
from lm.server.protocol import ApiError, ChatCompletionRequest, CompletionRequest, error_body


class OpenAIServer:
  """Serves a `JaxGenerator` over HTTP; `start()` runs it in a background thread.

  Use as a context manager (or call `close()`) to stop the HTTP server and the batch worker.
  """

  def __init__(self, generator: JaxGenerator, config: ServerConfig | None = None):
    config = config or ServerConfig()
    self.generator = generator
    self.config = config
    self.context_limit = _context_limit(generator, config)
    self.created = int(time.time())
    # Adapter name -> (its PEFT directory, the generator serving the base model with it).
    self._adapters: dict[str, tuple[str, JaxGenerator]] = {}
    self._adapters_lock = threading.Lock()
    self._batcher = Batcher(generator, config)
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
    """Reads, validates and tokenises one request, then waits for its batch: the whole answer, or
    (streamed) a response that begins once its first tokens (or its end) arrive."""
    body = protocol.parse_json(await _read_body(request, self.config))
    parsed = protocol.parse(ChatCompletionRequest if chat else CompletionRequest, body, self.config)
    loop = asyncio.get_running_loop()
    updates: asyncio.Queue | None = asyncio.Queue() if parsed.stream else None
    listener = None
    if updates is not None:

      def listener(*update):  # called by the batch worker as tokens are made
        loop.call_soon_threadsafe(updates.put_nowait, update)

    job = self.job(parsed, listener=listener)
    await loop.run_in_executor(None, self.check_prompts, job)
    future = asyncio.wrap_future(self._batcher.submit(job))
    if updates is None:
      return responses.completion_body(job, await future, self.generator.tokenizer)
    future.add_done_callback(lambda _: updates.put_nowait(None))  # after every update (one loop)
    first = await updates.get()
    if first is None and future.exception() is not None:  # failed before any token: a plain error
      raise future.exception()
    return fastapi.responses.StreamingResponse(
      self._stream(job, first, updates, future),
      media_type="text/event-stream",
      headers={"Cache-Control": "no-cache"},
    )

  async def _stream(self, job: Job, update, updates: asyncio.Queue, future: asyncio.Future):
    """The events of a streamed job: chunks as its tokens arrive (`update`, then `updates` until
    None, the batch's end), then its ending (or its error)."""
    stream = responses.ChunkStream(job, self.generator.tokenizer)
    # The events of one update leave in one write: an update holds up to `stream_every` tokens of
    # a sample, and a write per event would cost a send per token.
    if opening := b"".join(stream.opening()):
      yield opening
    while update is not None:
      if events := b"".join(stream.tokens(*update)):
        yield events
      update = await updates.get()
    error = future.exception()
    if error is not None:
      error = (
        error if isinstance(error, ApiError) else ApiError(500, f"internal error: {type(error).__name__}")
      )
      yield b"".join(stream.failed(error))
      return
    yield b"".join(stream.closing(future.result()))

  def job(self, request: CompletionRequest | ChatCompletionRequest, *, listener=None) -> Job:
    """The batcher's job for a validated request (404 for a model not served here). A streamed
    request without a seed gets one here, so that a rerun of its batch (after a failure) makes
    the tokens it has already sent again."""
    generator = self._generator_for(request.model)
    chat = isinstance(request, ChatCompletionRequest)
    seed = request.seed
    if seed is None and request.stream:
      seed = secrets.randbits(32)
    params = GenerationParams(
      max_tokens=request.max_new_tokens(self.config),
      temperature=request.temperature,
      top_p=request.top_p,
      top_k=max(0, request.top_k),
      stop=request.stop,
      seed=seed,
      enable_thinking=request.chat_template_kwargs.enable_thinking if chat else None,
      logprobs=request.logprobs if chat else request.logprobs == 0,
    )
    prompts = [[m.model_dump() for m in request.messages]] if chat else list(request.prompt)
    return Job(
      prompts,
      request.n,
      params,
      chat,
      model=request.model,
      generator=generator,
      stream=request.stream,
      include_usage=request.include_usage,
      token_ids_as_tokens=request.return_tokens_as_token_ids,
      listener=listener,
    )

  # ---- LoRA adapters (vLLM's runtime endpoints) ---------------------------------------------------

  async def load_adapter(self, request: fastapi.Request) -> str:
    body = protocol.parse_json(await _read_body(request, self.config))
    parsed = protocol.parse(protocol.LoadLoraAdapterRequest, body, self.config)
    name, path = parsed.lora_name, parsed.lora_path
    self._check_room(name)  # before the work of loading, and again (under the lock) after it
    generator = await asyncio.get_running_loop().run_in_executor(None, self._adapter_generator, path)
    with self._adapters_lock:
      self._check_room(name)
      replaced = name in self._adapters
      self._adapters[name] = (path, generator)
    logging.info("%s LoRA adapter %r from %s", "replaced" if replaced else "loaded", name, path)
    return f"Success: LoRA adapter '{name}' added successfully."

  async def unload_adapter(self, request: fastapi.Request) -> str:
    body = protocol.parse_json(await _read_body(request, self.config))
    name = protocol.parse(protocol.UnloadLoraAdapterRequest, body, self.config).lora_name
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

  def check_prompts(self, job: Job) -> None:
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
