"""An OpenAI-compatible HTTP server over a local `JaxGenerator`, so a JAX checkpoint serves any role.

Routes: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` with `n`,
`temperature`, `top_p`, `top_k` (the vLLM extension), `max_tokens` (`max_completion_tokens` for
chat), `stop`, `seed`, `logprobs` and `chat_template_kwargs` (`enable_thinking`). Anything this
server cannot honour (streaming, echo, penalties, logit bias, tools, alternatives in log-probs) is
refused with a 400 naming the field rather than silently ignored.

Requests are batched: HTTP threads parse and validate, then hand each request to one worker
thread, which waits `batch_window_s` after the first request for others (or until
`max_batch_prompts` prompts) and answers them all with one `JaxGenerator.generate` call (one
sampler call for requests sharing n, max_tokens and stop). While a batch runs, new requests queue
up and form the next batch, so a busy server batches more.

Safety: it binds 127.0.0.1 unless told otherwise, checks a Bearer API key when given one, and
limits body size (413), `max_tokens`, `n` and prompts per request (400). Errors use OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`, so the `openai` client raises its usual
exceptions with the message.

The standard library's `ThreadingHTTPServer` is enough: the device work is serialised in the
batch worker anyway, and HTTP threads only parse JSON and wait.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hmac
import http.server
import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import ml_collections

from lm import generators
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
    batch_window_s: how long the worker waits after a request for others to batch with it.
    max_batch_prompts: the most prompts in one batch (a larger single request still runs whole).
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
  batch_window_s: float = 0.01
  max_batch_prompts: int = 256

  def __post_init__(self):
    if not 1 <= self.default_max_tokens <= self.max_tokens:
      raise ValueError(
        f"ServerConfig: default_max_tokens ({self.default_max_tokens}) must be in "
        f"[1, max_tokens={self.max_tokens}]"
      )


class ApiError(Exception):
  """An error answered to the client in OpenAI's error shape."""

  def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
    super().__init__(message)
    self.status, self.message, self.param, self.code = status, message, param, code

  def body(self) -> dict[str, Any]:
    kind = {401: "authentication_error", 404: "not_found_error"}.get(self.status, "invalid_request_error")
    if self.status >= 500:
      kind = "server_error"
    return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass(frozen=True)
class _Job:
  """One parsed request: its prompts (one for chat), samples per prompt and parameters."""

  prompts: list[Prompt]
  n: int
  params: GenerationParams
  chat: bool


# Fields clients may send but this server cannot honour, with the values that mean "not used".
_UNSUPPORTED = {
  "stream": (None, False),
  "echo": (None, False),
  "suffix": (None, ""),
  "best_of": (None, 1),
  "logit_bias": (None, {}),
  "presence_penalty": (None, 0),
  "frequency_penalty": (None, 0),
  "tools": (None, []),
  "top_logprobs": (None, 0),
}


class OpenAIServer:
  """Serves a `JaxGenerator` over HTTP; `start()` runs it in a background thread.

  Use as a context manager (or call `close()`) to stop the HTTP server and the batch worker.
  """

  def __init__(self, generator: JaxGenerator, config: ServerConfig = ServerConfig()):
    self.generator = generator
    self.config = config
    self._batcher = _Batcher(generator, config.batch_window_s, config.max_batch_prompts)
    self._httpd = http.server.ThreadingHTTPServer((config.host, config.port), _Handler)
    self._httpd.app = self
    self._thread: threading.Thread | None = None

  @property
  def port(self) -> int:
    return self._httpd.server_address[1]

  @property
  def base_url(self) -> str:
    return f"http://{self.config.host}:{self.port}/v1"

  def serve_forever(self) -> None:
    logging.info("serving %r at %s", self.config.model_name, self.base_url)
    self._httpd.serve_forever()

  def start(self) -> OpenAIServer:
    self._thread = threading.Thread(target=self.serve_forever, name="lm.server http", daemon=True)
    self._thread.start()
    return self

  def close(self) -> None:
    if self._thread is not None:
      self._httpd.shutdown()
      self._thread.join()
    self._httpd.server_close()
    self._batcher.close()

  def __enter__(self) -> OpenAIServer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # ---- request handling (called from HTTP threads) --------------------------------------------

  def handle(self, method: str, path: str, headers, read_body) -> tuple[int, dict[str, Any]]:
    """Answers one HTTP request: (status, JSON body). `read_body(limit)` returns the raw body."""
    try:
      self._check_auth(headers)
      route = (method, urlsplit(path).path.rstrip("/"))
      if route == ("GET", "/v1/models"):
        return 200, self._models()
      if route in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions")):
        chat = route[1].endswith("/chat/completions")
        job = self._parse(_json_object(read_body(self.config.max_body_bytes)), chat=chat)
        generations = self._batcher.submit(job).result()
        return 200, _response(job, generations, self.config.model_name, self.generator.tokenizer)
      raise ApiError(404, f"no route {method} {urlsplit(path).path}")
    except ApiError as e:
      return e.status, e.body()
    except Exception as e:
      logging.exception("request failed")
      return 500, ApiError(500, f"internal error: {type(e).__name__}: {e}").body()

  def _check_auth(self, headers) -> None:
    if self.config.api_key is None:
      return
    given = headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {self.config.api_key}".encode()):
      raise ApiError(
        401, "missing or wrong API key (send 'Authorization: Bearer <key>')", code="invalid_api_key"
      )

  def _models(self) -> dict[str, Any]:
    entry = {"id": self.config.model_name, "object": "model", "created": 0, "owned_by": "lm.server"}
    return {"object": "list", "data": [entry]}

  def _parse(self, body: dict[str, Any], *, chat: bool) -> _Job:
    """Validates a request body into a `_Job`; every error names the offending field."""
    model = _field(body, "model", str, None)
    if model is None:
      raise ApiError(400, "missing required field 'model'", param="model")
    if model != self.config.model_name:
      raise ApiError(
        404, f"model {model!r} is not served here (this server has {self.config.model_name!r})", param="model"
      )
    for name, allowed in _UNSUPPORTED.items():
      if body.get(name) not in allowed:
        raise ApiError(400, f"'{name}' = {body[name]!r} is not supported by this server", param=name)
    c = self.config
    prompts = [_messages(body)] if chat else _prompts(body, c.max_prompts)
    max_tokens_field = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = _field(body, max_tokens_field, int, c.default_max_tokens)
    if not 1 <= max_tokens <= c.max_tokens:
      raise ApiError(
        400, f"'{max_tokens_field}' must be in [1, {c.max_tokens}], got {max_tokens}", param=max_tokens_field
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
    return _Job(prompts, _ranged(body, "n", int, 1, 1, c.max_n), params, chat)


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
  if not isinstance(body, dict):
    raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
  return body


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


def _response(job: _Job, generations: list[list[Generation]], model: str, tokenizer) -> dict[str, Any]:
  """The OpenAI response body; choice i * n + j is sample j of prompt i."""
  choices = []
  for i, samples in enumerate(generations):
    for j, g in enumerate(samples):
      tokens = [tokenizer.decode([t]) for t in g.token_ids] if job.params.logprobs else None
      if job.chat:
        logprobs = _chat_logprobs(tokens, g.logprobs) if tokens is not None else None
        choice = {"message": {"role": "assistant", "content": g.text}, "logprobs": logprobs}
      else:
        logprobs = (
          {"tokens": tokens, "token_logprobs": g.logprobs, "top_logprobs": None}
          if tokens is not None
          else None
        )
        choice = {"text": g.text, "logprobs": logprobs}
      choices.append({"index": i * job.n + j, "finish_reason": g.finish_reason, **choice})
  prompt_tokens = sum(samples[0].prompt_tokens for samples in generations)
  completion_tokens = sum(g.completion_tokens for samples in generations for g in samples)
  return {
    "id": f"{'chatcmpl' if job.chat else 'cmpl'}-{uuid.uuid4().hex}",
    "object": "chat.completion" if job.chat else "text_completion",
    "created": int(time.time()),
    "model": model,
    "choices": choices,
    "usage": {
      "prompt_tokens": prompt_tokens,
      "completion_tokens": completion_tokens,
      "total_tokens": prompt_tokens + completion_tokens,
    },
  }


def _chat_logprobs(tokens: Sequence[str], logprobs: Sequence[float]) -> dict[str, Any]:
  content = [
    {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
    for t, lp in zip(tokens, logprobs, strict=True)
  ]
  return {"content": content, "refusal": None}


# ---- batching -----------------------------------------------------------------------------------


class _Batcher:
  """One worker thread that answers queued jobs in batches with one `generate` call each."""

  def __init__(self, generator: JaxGenerator, window_s: float, max_prompts: int):
    self._generator = generator
    self._window_s = window_s
    self._max_prompts = max_prompts
    self._queue: queue.Queue = queue.Queue()
    self._thread = threading.Thread(target=self._loop, name="lm.server batcher", daemon=True)
    self._thread.start()

  def submit(self, job: _Job) -> concurrent.futures.Future:
    future = concurrent.futures.Future()
    self._queue.put((job, future))
    return future

  def close(self) -> None:
    self._queue.put(None)
    self._thread.join()

  def _loop(self) -> None:
    while (first := self._queue.get()) is not None:
      batch, closing = self._collect(first)
      self._run(batch)
      if closing:
        return

  def _collect(self, first) -> tuple[list, bool]:
    """`first` plus what arrives within the window, up to the prompt limit; (batch, closing)."""
    batch, size = [first], len(first[0].prompts)
    deadline = time.monotonic() + self._window_s
    while size < self._max_prompts:
      try:
        item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
      except queue.Empty:
        break
      if item is None:
        return batch, True
      batch.append(item)
      size += len(item[0].prompts)
    return batch, False

  def _run(self, batch: list) -> None:
    jobs = [job for job, _ in batch]
    logging.info("batch of %d requests, %d prompts", len(jobs), sum(len(j.prompts) for j in jobs))
    try:
      results = self._generate(jobs)
    except Exception as e:  # every request of the batch learns why (its HTTP thread answers 500)
      for _, future in batch:
        future.set_exception(e)
      return
    for (_, future), result in zip(batch, results, strict=True):
      future.set_result(result)

  def _generate(self, jobs: list[_Job]) -> list[list[list[Generation]]]:
    prompts = [p for job in jobs for p in job.prompts]
    flat = self._generator.generate(
      prompts,
      n=[job.n for job in jobs for _ in job.prompts],
      params=[job.params for job in jobs for _ in job.prompts],
    )
    results, start = [], 0
    for job in jobs:
      results.append(flat[start : start + len(job.prompts)])
      start += len(job.prompts)
    return results


class _Handler(http.server.BaseHTTPRequestHandler):
  """Adapts `http.server` to `OpenAIServer.handle`; keeps connections alive like real servers."""

  protocol_version = "HTTP/1.1"

  def do_GET(self) -> None:
    self._answer("GET")

  def do_POST(self) -> None:
    self._answer("POST")

  def _answer(self, method: str) -> None:
    status, body = self.server.app.handle(method, self.path, self.headers, self._read_body)
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    if status != 200:
      self.close_connection = True  # an unread request body must not be taken for the next request
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    if self.close_connection:
      self.send_header("Connection", "close")
    self.end_headers()
    self.wfile.write(data)

  def _read_body(self, limit: int) -> bytes:
    length = self.headers.get("Content-Length")
    if length is None or not length.isdigit():
      raise ApiError(411, "the request needs a Content-Length header")
    if int(length) > limit:
      raise ApiError(413, f"request body of {length} bytes exceeds the limit of {limit} bytes")
    return self.rfile.read(int(length))

  def log_message(self, fmt: str, *args) -> None:
    logging.debug("%s " + fmt, self.address_string(), *args)


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
  """Serves the model of configs/serve.py until interrupted."""
  with server_from_config(config) as server:
    server.serve_forever()
