"""The OpenAI-compatible server, driven by the official `openai` client and by OpenAIGenerator.

One server on a free loopback port serves a tiny random model for the whole module; every answer
is checked against the same `JaxGenerator` called directly.
"""

import http.client
import json
import socket
import threading
import time

import jax.numpy as jnp
import numpy as np
import openai
import pytest

from configs import serve as serve_config
from lm import lora, scoring
from lm.generators import GenerationParams, OpenAIGenerator
from lm.sampler import _cut_stop_strings
from lm.server import ApiError, OpenAIServer, ServerConfig, server_from_config, text_pieces
from lm.server.batcher import Batcher, Entry, Job
from lm.server.responses import TextPieces
from tests.lm.generator_helpers import CHAT_WORDS, MAX_TOKENS, N, make_tiny_generator, single_token_stop
from tests.lm.tokenizer_helpers import make_tiny_tokenizer

KEY = "secret-key"
CHAT = [{"role": "user", "content": "Solve 2n + 5 = 17."}]


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
  return make_tiny_generator(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def server(generator):
  # A long batching window makes batching of concurrent requests certain on a busy test machine.
  config = ServerConfig(
    model_name="tiny",
    port=0,
    api_key=KEY,
    max_tokens=16,
    default_max_tokens=MAX_TOKENS,
    max_body_bytes=4096,
    batch_window_s=0.2,
  )
  with OpenAIServer(generator, config).start() as running:
    yield running


@pytest.fixture(scope="module")
def client(server):
  return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)


def _assert_matches(text, finish_reason, logprobs, expected):
  assert (text, finish_reason) == (expected.text, expected.finish_reason)
  np.testing.assert_allclose(logprobs, expected.logprobs, atol=1e-5)


def test_models_lists_the_served_model_with_its_context_limit_and_health_is_200(client, server, generator):
  (model,) = client.models.list().data
  assert model.id == "tiny" and abs(model.created - time.time()) < 3600
  assert model.max_model_len == generator.sampler.model.config.max_position_embeddings
  status, body = _request_raw(server, "GET", "/health", key=None)
  assert status == 200 and body == b""


def test_a_wrong_or_missing_api_key_gets_401(server):
  bad = openai.OpenAI(base_url=server.base_url, api_key="wrong", max_retries=0)
  with pytest.raises(openai.AuthenticationError, match="API key"):
    bad.models.list()
  status, body = _post(server, "/v1/completions", {"model": "tiny", "prompt": "x"}, key=None)
  assert status == 401 and body["error"]["code"] == "invalid_api_key"


def test_completions_with_n_logprobs_and_seed_match_the_generator(client, generator):
  prompts = ["The answer is", "Claim: the form is correct."]
  request = dict(model="tiny", prompt=prompts, n=N, max_tokens=MAX_TOKENS, seed=7, logprobs=0)
  response = client.completions.create(**request)
  expected = generator.generate(prompts, n=N, params=GenerationParams(max_tokens=MAX_TOKENS, seed=7))
  assert [c.index for c in response.choices] == list(range(len(prompts) * N))
  for choice in response.choices:
    want = expected[choice.index // N][choice.index % N]
    _assert_matches(choice.text, choice.finish_reason, choice.logprobs.token_logprobs, want)
    assert choice.logprobs.tokens == [generator.tokenizer.decode([t]) for t in want.token_ids]
  assert response.usage.prompt_tokens == sum(s[0].prompt_tokens for s in expected)
  assert response.usage.completion_tokens == sum(g.completion_tokens for s in expected for g in s)
  again = client.completions.create(**request)
  assert [c.text for c in again.choices] == [c.text for c in response.choices]
  other_seed = client.completions.create(**dict(request, seed=8))
  assert [c.text for c in other_seed.choices] != [c.text for c in response.choices]


def test_chat_completions_with_stop_and_logprobs(client, generator):
  params = GenerationParams(max_tokens=MAX_TOKENS, seed=9)
  free = generator.generate([CHAT], n=N, params=params)[0][0]
  stop = single_token_stop(free, generator.tokenizer)
  response = client.chat.completions.create(
    model="tiny", messages=CHAT, n=N, max_tokens=MAX_TOKENS, seed=9, stop=[stop], logprobs=True
  )
  expected = generator.generate(
    [CHAT], n=N, params=GenerationParams(max_tokens=MAX_TOKENS, seed=9, stop=[stop])
  )[0]
  first = response.choices[0]
  assert first.message.content == free.text[: free.text.find(stop)] and first.finish_reason == "stop"
  for choice, want in zip(response.choices, expected, strict=True):
    logprobs = [t.logprob for t in choice.logprobs.content]
    _assert_matches(choice.message.content, choice.finish_reason, logprobs, want)


def test_openai_generator_against_the_server(server, generator, monkeypatch):
  monkeypatch.setenv("TEST_SERVER_KEY", KEY)
  remote = OpenAIGenerator(server.base_url, "tiny", api_key_env="TEST_SERVER_KEY", max_retries=0)
  prompts = ["Compute the sum", [{"role": "user", "content": "hi"}]]
  params = GenerationParams(max_tokens=MAX_TOKENS, seed=11, logprobs=True, enable_thinking=False)
  got = remote.generate(prompts, n=N, params=params)
  expected = generator.generate(prompts, n=N, params=params)
  for got_samples, want_samples in zip(got, expected, strict=True):
    for g, want in zip(got_samples, want_samples, strict=True):
      _assert_matches(g.text, g.finish_reason, g.logprobs, want)
      assert (g.prompt_tokens, g.completion_tokens) == (want.prompt_tokens, want.completion_tokens)
  thinking_default = generator.generate(prompts[1:], n=N, params=GenerationParams(max_tokens=MAX_TOKENS))
  assert got[1][0].prompt_tokens != thinking_default[0][0].prompt_tokens  # enable_thinking arrived


def test_concurrent_clients_are_batched_and_each_gets_its_own_answer(server, generator):
  # Half the clients stream: they share the batches of the others, and nobody loses an answer.
  prompts = [f"problem {i}: x + y = {i}" for i in range(8)]
  answers = [None] * len(prompts)
  start = threading.Barrier(len(prompts))

  def ask(i):
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)
    start.wait()
    request = dict(model="tiny", prompt=prompts[i], n=N, max_tokens=MAX_TOKENS, seed=i)
    if i % 2 == 0:
      answers[i] = [c.text for c in client.completions.create(**request).choices]
      return
    answers[i] = [""] * N
    for chunk in client.completions.create(**request, stream=True):
      answers[i][chunk.choices[0].index] += chunk.choices[0].text

  calls = generator.sampler_calls
  threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert generator.sampler_calls - calls < len(prompts) / 2
  params = [GenerationParams(max_tokens=MAX_TOKENS, seed=i) for i in range(len(prompts))]
  expected = generator.generate(prompts, n=N, params=params)
  for answer, want in zip(answers, expected, strict=True):
    assert answer == [g.text for g in want]


def _request_raw(server, method, path, body=None, *, key=KEY):
  """A raw request (the openai client would refuse to send malformed ones): (status, body bytes)."""
  headers = {"Content-Type": "application/json"}
  if key:
    headers["Authorization"] = f"Bearer {key}"
  connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
  try:
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    return response.status, response.read()
  finally:
    connection.close()


def _request(server, method, path, body=None, *, key=KEY):
  status, raw = _request_raw(server, method, path, body, key=key)
  return status, json.loads(raw)


def _post_raw(server, path, body, *, key=KEY):
  return _request_raw(server, "POST", path, json.dumps(body).encode(), key=key)


def _post(server, path, body, *, key=KEY):
  return _request(
    server, "POST", path, body if isinstance(body, bytes) else json.dumps(body).encode(), key=key
  )


def _get(server, path, *, key=KEY):
  return _request(server, "GET", path, key=key)


_OK = {"model": "tiny", "prompt": "hi", "max_tokens": 4}


@pytest.mark.parametrize(
  "path, body, status, param, message",
  [
    ("/v1/completions", b"{not json", 400, None, "not valid JSON"),
    ("/v1/completions", b"[1, 2]", 400, None, "must be a JSON object"),
    ("/v1/completions", {"model": "tiny"}, 400, "prompt", "missing required field 'prompt'"),
    ("/v1/completions", {"prompt": "hi"}, 400, "model", "missing required field 'model'"),
    ("/v1/completions", dict(_OK, model="gpt-9"), 404, "model", "not served here"),
    ("/v1/completions", dict(_OK, max_tokens=17), 400, "max_tokens", "this server's limit is 16 tokens"),
    ("/v1/completions", dict(_OK, temperature="hot"), 400, "temperature", "must be a number"),
    ("/v1/completions", dict(_OK, n=True), 400, "n", "must be an integer"),
    ("/v1/completions", dict(_OK, prompt=[1, 2]), 400, "prompt", "token ids are not accepted"),
    ("/v1/completions", dict(_OK, stream="yes"), 400, "stream", "must be a boolean"),
    ("/v1/completions", dict(_OK, stream_options={"include_usage": True}), 400, "stream_options",
     "only allowed with 'stream': true"),
    ("/v1/completions", dict(_OK, stream=True, stream_options={"include_usage": 1}), 400,
     "stream_options.include_usage", "must be a boolean"),
    ("/v1/completions", dict(_OK, response_format={"type": "json_object"}), 400, "response_format.type",
     "'json_object' is not supported"),
    ("/v1/chat/completions", {"model": "tiny", "messages": CHAT, "response_format": {"type": "json_schema",
     "json_schema": {"name": "x", "schema": {}}}}, 400, "response_format.type", "'json_schema'"),
    ("/v1/completions", dict(_OK, response_format="json"), 400, "response_format", "must be an object"),
    ("/v1/chat/completions", {"model": "tiny", "messages": CHAT, "tools": [{"type": "function"}]}, 400,
     "tools", "not supported"),
    ("/v1/completions", dict(_OK, guided_json={"type": "object"}), 400, "guided_json", "not supported"),
    ("/v1/completions", dict(_OK, repetition_penalty=1.2), 400, "repetition_penalty", "not supported"),
    ("/v1/completions", dict(_OK, n=65), 400, "n", "must be in [1, 64]"),
    ("/v1/completions", dict(_OK, return_tokens_as_token_ids=1), 400, "return_tokens_as_token_ids",
     "must be a boolean"),
    ("/v1/load_lora_adapter", {"lora_name": "x"}, 400, "lora_path", "missing required field 'lora_path'"),
    ("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/no"}, 400, "lora_path", "does not exist"),
    ("/v1/load_lora_adapter", {"lora_name": "tiny", "lora_path": "/x"}, 400, "lora_name", "base model's"),
    ("/v1/unload_lora_adapter", {"lora_name": "never"}, 404, "lora_name", "is not loaded"),
    ("/v1/completions", dict(_OK, logprobs=3), 400, "logprobs", "only 0"),
    ("/v1/completions", dict(_OK, prompt="x" * 5000), 413, None, "exceeds the limit of 4096 bytes"),
    ("/v1/chat/completions", {"model": "tiny"}, 400, "messages", "missing required field 'messages'"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "bot", "content": "x"}]}, 400,
     "messages[0].role", "must be system, user or assistant"),
    ("/v1/chat/completions", {"model": "tiny", "messages": CHAT, "chat_template_kwargs": {"tools": 1}}, 400,
     "chat_template_kwargs", "may only hold 'enable_thinking'"),
    ("/v1/embeddings", _OK, 404, None, "no route POST /v1/embeddings"),
    ("/v1/completions", dict(_OK, temprature=0.5), 400, "temprature",
     "unknown field 'temprature' (did you mean 'temperature'?)"),
    ("/v1/chat/completions", {"model": "tiny", "messages": CHAT, "stream_options": {"include_usage": True},
     "stream": True, "top_n": 2}, 400, "top_n", "unknown field 'top_n'"),
  ],
)  # fmt: skip
def test_malformed_requests_get_a_4xx_naming_the_field(server, path, body, status, param, message):
  got_status, got = _post(server, path, body)
  assert got_status == status
  assert set(got["error"]) == {"message", "type", "param", "code"}
  assert message in got["error"]["message"] and got["error"]["param"] == param


def test_the_serve_config_builds_a_server_that_requires_its_key(tmp_path, monkeypatch):
  config = serve_config.get_config("tiny")
  config.model.tokenizer = make_tiny_tokenizer(tmp_path, vocab_words=CHAT_WORDS)
  config.server.update(port=0, api_key_env="TEST_SERVE_KEY")
  with pytest.raises(ValueError, match="TEST_SERVE_KEY"):
    server_from_config(config)
  monkeypatch.setenv("TEST_SERVE_KEY", KEY)
  with server_from_config(config).start() as running:
    assert running.base_url.startswith("http://127.0.0.1:")
    assert _get(running, "/v1/models", key=KEY)[0] == 200
    assert _get(running, "/v1/models", key="wrong")[0] == 401
  with pytest.raises(ValueError, match="default_max_tokens"):
    ServerConfig(max_tokens=8, default_max_tokens=16)


# ---- one bad request, limits, timeouts, error shapes, fair batching ------------------------------


def test_a_prompt_the_tokenizer_rejects_fails_alone_and_its_batch_is_served(server):
  """A lone surrogate passes JSON parsing; it must be this request's 400, not its batch's 500."""
  bodies = [dict(_OK, prompt=f"good {i}", seed=i) for i in range(6)]
  bodies.insert(
    3, {"model": "tiny", "messages": [{"role": "user", "content": "bad \ud800"}], "max_tokens": 4}
  )
  results = [None] * len(bodies)
  start = threading.Barrier(len(bodies))

  def ask(i):
    start.wait()
    path = "/v1/chat/completions" if "messages" in bodies[i] else "/v1/completions"
    results[i] = _post(server, path, json.dumps(bodies[i]).encode())

  threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  statuses = [status for status, _ in results]
  assert statuses == [200, 200, 200, 400, 200, 200, 200]
  assert "cannot be tokenised" in results[3][1]["error"]["message"]
  assert results[3][1]["error"]["param"] == "messages"


class _FlakyGenerator:
  """Fails any generate call that contains the prompt "poison"; records every call's prompts."""

  def __init__(self, inner, gate=None):
    self.inner, self.gate, self.calls = inner, gate, []

  def generate(self, prompts, n=1, params=None):
    if self.gate is not None:
      self.gate.wait(timeout=60)
    self.calls.append(list(prompts))
    if "poison" in prompts:
      raise RuntimeError("poisoned batch")
    return self.inner.generate(prompts, n=n, params=params or GenerationParams())


def _batcher(generator, **overrides):
  return Batcher(generator, ServerConfig(**{"batch_window_s": 0.2, **overrides}))


def _job(prompt, max_tokens=MAX_TOKENS, n=N):
  return Job([prompt], n, GenerationParams(max_tokens=max_tokens, seed=1), False)


def test_a_failing_batch_is_rerun_per_request_so_only_the_failing_one_errs(generator):
  flaky = _FlakyGenerator(generator)
  batcher = _batcher(flaky)
  try:
    futures = [batcher.submit(_job(p)) for p in ("a", "poison", "b")]
    ok_a, bad, ok_b = (f.exception(timeout=120) for f in futures)
    assert ok_a is None and ok_b is None
    assert bad.status == 500 and "poisoned batch" in bad.message
    assert flaky.calls[0] == ["a", "poison", "b"] and sorted(map(tuple, flaky.calls[1:])) == [
      ("a",),
      ("b",),
      ("poison",),
    ]
  finally:
    batcher.close()


def test_fair_batches_put_small_requests_before_and_apart_from_large_ones(generator):
  """A large request queued first does not lead the batch of small ones, nor join it; after
  `fair_max_skips` passes it leads a batch anyway (no starvation)."""
  gate = threading.Event()
  flaky = _FlakyGenerator(generator, gate)
  batcher = _batcher(flaky, fair_max_skips=2, batch_window_s=0.05)
  try:
    first = batcher.submit(_job("warm"))  # occupies the worker until the gate opens
    time.sleep(0.3)
    large = batcher.submit(_job("large", max_tokens=16))
    small = [batcher.submit(_job(f"small {i}", max_tokens=4)) for i in range(3)]
    gate.set()
    for f in [first, large, *small]:
      f.result(timeout=120)
    assert flaky.calls[0] == ["warm"]
    assert sorted(flaky.calls[1]) == ["small 0", "small 1", "small 2"]  # large did not join nor lead
    assert flaky.calls[2] == ["large"]
  finally:
    batcher.close()
  starved = _batcher(_FlakyGenerator(generator), fair_max_skips=1)
  try:
    with starved._cv:  # queue directly, then select as the worker would: cost order, then starvation
      for job in (_job("large", max_tokens=16), _job("s1", max_tokens=2), _job("s2", max_tokens=2)):
        starved._pending.append(Entry(job, None, len(starved._pending), 0.0))
      assert [e.job.prompts for e in starved._select()] == [["s1"], ["s2"]]
      starved._pending.append(Entry(_job("s3", max_tokens=2), None, 3, 0.0))  # cheaper, but newer
      assert [e.job.prompts for e in starved._select()] == [["large"]]  # passed over once: it leads
      assert [e.job.prompts for e in starved._select()] == [["s3"]]
  finally:
    starved.close()


def test_large_requests_run_in_separate_batches_so_a_newcomer_waits_for_one(generator):
  """Two requests each over half of `max_batch_tokens` never share a batch: a request arriving
  while the first runs is answered before the second starts."""
  batcher = _batcher(_FlakyGenerator(generator), max_batch_tokens=100)
  try:
    with batcher._cv:
      for i, job in enumerate((_job("big a", max_tokens=16, n=4), _job("big b", max_tokens=16, n=4))):
        batcher._pending.append(Entry(job, None, i, 0.0))  # cost 64 each
      assert [e.job.prompts for e in batcher._select()] == [["big a"]]
      batcher._pending.append(Entry(_job("newcomer", max_tokens=4), None, 2, 0.0))
      assert [e.job.prompts for e in batcher._select()] == [["newcomer"]]
      assert [e.job.prompts for e in batcher._select()] == [["big b"]]
  finally:
    batcher.close()


def test_the_queue_is_bounded_with_429_and_retry_after(generator):
  gate = threading.Event()
  batcher = _batcher(_FlakyGenerator(generator, gate), max_queued_requests=2, retry_after_s=3)
  try:
    futures = [batcher.submit(_job("a"))]
    time.sleep(0.5)  # the worker holds "a"; the queue is empty again
    futures += [batcher.submit(_job("b")), batcher.submit(_job("c"))]
    with pytest.raises(ApiError) as refused:
      batcher.submit(_job("d"))
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "3"}
    gate.set()
    for f in futures:
      f.result(timeout=120)
  finally:
    gate.set()
    batcher.close()


@pytest.fixture(scope="module")
def strict_server(generator):
  """Small limits and short timeouts, to test them without waiting."""
  config = ServerConfig(
    model_name="tiny",
    port=0,
    max_tokens=16,
    default_max_tokens=MAX_TOKENS,
    max_request_tokens=64,
    max_context_tokens=24,
    max_loras=1,
    header_timeout_s=0.5,
    body_timeout_s=0.5,
  )
  with OpenAIServer(generator, config).start() as running:
    yield running


@pytest.mark.parametrize(
  "path, body, param, message",
  [
    ("/v1/completions", dict(_OK, n=8, max_tokens=16), "n", "at most 64 per request"),
    ("/v1/completions", dict(_OK, prompt=list("abcde"), max_tokens=16), "max_tokens", "at most 64"),
    ("/v1/completions", dict(_OK, prompt="word " * 30), "prompt", "exceeds the context limit of 24 tokens"),
    ("/v1/completions", dict(_OK, prompt="a b c d e f g h i", max_tokens=16), "prompt", "limit of 24"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x " * 40}]},
     "messages", "context limit of 24"),
  ],
)  # fmt: skip
def test_budgets_and_the_context_limit_are_400s_naming_the_limit(strict_server, path, body, param, message):
  status, got = _post(strict_server, path, body, key=None)
  assert status == 400 and got["error"]["param"] == param and message in got["error"]["message"]


def test_the_context_limit_defaults_to_the_models_positions(generator):
  server = OpenAIServer(generator, ServerConfig(port=0))
  try:
    assert server.context_limit == generator.sampler.model.config.max_position_embeddings
    assert OpenAIServer(generator, ServerConfig(port=0, max_context_tokens=100)).context_limit == 100
  finally:
    server._socket.close()
    server._batcher.close()


def test_every_status_has_the_openai_error_shape(server):
  cases = [
    ("GET", "/v1/completions", None, 405, "not allowed"),
    ("DELETE", "/v1/models", None, 405, "not allowed"),
    ("GET", "/nowhere", None, 404, "no route GET /nowhere"),
    ("POST", "/v1/completions", b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     None, None),
    ("POST", "/v1/completions", json.dumps(dict(_OK, prompt=[[[[["x"]]]]])).encode(), 400, "token ids"),
  ]  # fmt: skip
  for method, path, body, status, message in cases:
    got_status, got = _request(server, method, path, body)
    if status is None:  # the 100k-deep body is over the 4096-byte limit of this server: 413
      assert got_status == 413
    else:
      assert got_status == status and message in got["error"]["message"]
    assert set(got["error"]) == {"message", "type", "param", "code"}


def test_a_deeply_nested_body_is_a_400(strict_server):
  body = b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
  status, got = _post(strict_server, "/v1/completions", body, key=None)
  assert status == 400 and "nested deeper than" in got["error"]["message"]
  status, got = _post(
    strict_server, "/v1/completions", json.dumps(dict(_OK, stop={"a": [[[[[[1]]]]]]})).encode()
  )
  assert status == 400


def _raw(server, data: bytes, *, wait_s: float) -> bytes:
  """Sends raw bytes, then reads until the server closes or `wait_s` passes."""
  sock = socket.create_connection(("127.0.0.1", server.port), timeout=wait_s)
  try:
    sock.sendall(data)
    received, deadline = b"", time.monotonic() + wait_s
    while time.monotonic() < deadline:
      try:
        chunk = sock.recv(65536)
      except (TimeoutError, ConnectionResetError):
        break
      if not chunk:
        return received + b"<closed>"
      received += chunk
    return received
  finally:
    sock.close()


def test_half_sent_heads_are_closed_and_short_bodies_get_408(strict_server):
  assert _raw(strict_server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", wait_s=10).endswith(b"<closed>")
  short = b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"model":'
  answer = _raw(strict_server, short, wait_s=10)
  assert answer.startswith(b"HTTP/1.1 408") and b'"type": "invalid_request_error"' in answer
  idle = _raw(strict_server, b"", wait_s=10)  # connects and sends nothing
  assert idle == b"<closed>"


def test_the_serve_config_sets_a_context_limit(tmp_path):
  config = serve_config.get_config("tiny")
  config.model.tokenizer = make_tiny_tokenizer(tmp_path, vocab_words=CHAT_WORDS)
  config.server.port = 0
  assert config.server.max_context_tokens is None  # unset: the model's positions
  config.server.max_context_tokens = 32  # an int placeholder: settable from the command line too
  server = server_from_config(config)
  try:
    assert server.context_limit == 32
  finally:
    server.close()


# ---- streaming, token ids and log-probs, LoRA adapters -------------------------------------------


def test_streamed_completions_and_chat_join_to_the_whole_answer_with_usage_last(client, server):
  request = dict(
    model="tiny", prompt=["The answer is", "x + y ="], n=N, max_tokens=MAX_TOKENS, seed=3, logprobs=0
  )
  whole = client.completions.create(**request)
  chunks = list(client.completions.create(**request, stream=True, stream_options={"include_usage": True}))
  assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
  assert all(c.usage is None for c in chunks[:-1])
  for want in whole.choices:
    mine = [c.choices[0] for c in chunks[:-1] if c.choices[0].index == want.index]
    assert "".join(c.text for c in mine) == want.text
    assert [c.finish_reason for c in mine][-1] == want.finish_reason
    assert {c.finish_reason for c in mine[:-1]} == {None}
    streamed = [lp for c in mine if c.logprobs for lp in c.logprobs.token_logprobs]
    assert streamed == want.logprobs.token_logprobs
  chat = dict(model="tiny", messages=CHAT, n=N, max_tokens=MAX_TOKENS, seed=4, logprobs=True)
  whole = client.chat.completions.create(**chat)
  chunks = list(client.chat.completions.create(**chat, stream=True))
  assert all(c.object == "chat.completion.chunk" and c.created > 0 for c in chunks)
  for want in whole.choices:
    mine = [c.choices[0] for c in chunks if c.choices[0].index == want.index]
    assert mine[0].delta.role == "assistant" and mine[-1].finish_reason == want.finish_reason
    assert "".join(c.delta.content or "" for c in mine) == want.message.content
    streamed = [t.logprob for c in mine if c.logprobs for t in c.logprobs.content]
    assert streamed == [t.logprob for t in want.logprobs.content]
  status, raw = _post_raw(server, "/v1/completions", dict(_OK, stream=True))
  assert status == 200 and raw.startswith(b"data: {") and raw.endswith(b"\n\ndata: [DONE]\n\n")


class _PausedGenerator:
  """The generator, paused in a streamed decode as it hands out its first chunk of decode steps
  after the first token, until `resume` is set: whatever a client has read by then left the server
  before the generation finished."""

  def __init__(self, inner):
    self.inner, self.tokenizer, self.sampler = inner, inner.tokenizer, inner.sampler
    self.paused, self.resume, self.finished = threading.Event(), threading.Event(), threading.Event()
    self.made_before_pause = 0  # tokens the paused sample had made when it paused

  def encode(self, prompt, params):
    return self.inner.encode(prompt, params)

  def generate(self, prompts, n, params, *, on_tokens, stream_every):
    def pausing(prompt, sample, start, token_ids, logprobs):
      on_tokens(prompt, sample, start, token_ids, logprobs)
      if start > 0 and not self.paused.is_set():
        self.made_before_pause = start + len(token_ids)
        self.paused.set()
        self.resume.wait(timeout=60)

    result = self.inner.generate(prompts, n, params, on_tokens=pausing, stream_every=stream_every)
    self.finished.set()
    return result


def test_a_streamed_answer_begins_before_its_generation_ends(generator):
  paused = _PausedGenerator(generator)
  config = ServerConfig(
    model_name="tiny", port=0, max_tokens=16, default_max_tokens=MAX_TOKENS, stream_every=2
  )
  request = dict(model="tiny", prompt="The answer is", n=1, max_tokens=MAX_TOKENS, seed=12, logprobs=0)
  with OpenAIServer(paused, config).start() as running:
    client = openai.OpenAI(base_url=running.base_url, api_key="EMPTY", max_retries=0, timeout=60)
    chunks = iter(client.completions.create(**request, stream=True))
    first = next(chunks)
    assert paused.paused.wait(timeout=60) and not paused.finished.is_set()
    assert 1 <= len(first.choices[0].logprobs.token_logprobs) <= paused.made_before_pause <= 1 + 2
    paused.resume.set()
    rest = list(chunks)
  whole = generator.generate(["The answer is"], n=1, params=GenerationParams(max_tokens=MAX_TOKENS, seed=12))
  assert whole[0][0].completion_tokens > paused.made_before_pause  # the pause was before the end
  assert "".join(c.choices[0].text for c in [first, *rest]) == whole[0][0].text
  assert rest[-1].choices[0].finish_reason == whole[0][0].finish_reason


def test_text_pieces_join_to_the_text_and_cover_the_tokens(generator):
  tokenizer = generator.tokenizer
  for text in ("plain words here", "héllo wörld — ∑ 😀 ok", "日本語のテキスト"):
    ids = tokenizer.encode(text)
    pieces = text_pieces(tokenizer, ids, text)
    assert "".join(p for p, _, _ in pieces) == text
    assert [lo for _, lo, _ in pieces] == [0] + [hi for _, _, hi in pieces[:-1]] and pieces[-1][2] == len(ids)
    assert "\ufffd" not in "".join(p for p, _, _ in pieces)
  ids = tokenizer.encode("stop here please")
  cut = text_pieces(tokenizer, ids, "stop he")  # a stop string cut inside a token
  assert "".join(p for p, _, _ in cut) == "stop he" and cut[-1][2] == len(ids)
  # Streamed a token at a time with the stop string "re p": nothing of it goes out before the end,
  # which gives the rest of the sample as the sampler cuts it.
  tokens, _, text, hit = _cut_stop_strings(tokenizer, ids, [0.0] * len(ids), ["re p"])
  streamed = TextPieces(tokenizer, stop=["re p"])
  early = [piece for token in ids for piece in streamed.add([token])]
  pieces = early + streamed.finish(tokens, text)
  sent_early = "".join(p for p, _, _ in early)
  assert hit and text == "stop he" and sent_early and text.startswith(sent_early)
  assert "".join(p for p, _, _ in pieces) == text and pieces[-1][2] == len(tokens)
  assert [lo for _, lo, _ in pieces] == [0] + [hi for _, _, hi in pieces[:-1]]


def _score(generator, model, prompt_ids, completion_ids):
  """lm.scoring's log-probs of the completion tokens: what a trainer computes for them."""
  rows = 8  # the model's activations are sharded over the 8-device data axis
  batch = scoring.pack_pairs([prompt_ids] * rows, [completion_ids] * rows)
  per_token, _ = scoring.sequence_logprobs(model, {k: jnp.asarray(v) for k, v in batch.items()})
  return np.asarray(per_token)[0][batch["completion_mask"][0] > 0]


def _token_ids(tokens):
  assert all(t.startswith("token_id:") for t in tokens)
  return [int(t.removeprefix("token_id:")) for t in tokens]


def test_token_ids_and_logprobs_are_the_samplers_and_match_scoring(client, generator):
  prompt = "Claim: the form is correct."
  response = client.completions.create(
    model="tiny", prompt=prompt, n=N, max_tokens=MAX_TOKENS, seed=5, logprobs=0,
    extra_body={"return_tokens_as_token_ids": True},
  )  # fmt: skip
  expected = generator.generate([prompt], n=N, params=GenerationParams(max_tokens=MAX_TOKENS, seed=5))[0]
  prompt_ids = generator.encode(prompt, GenerationParams())
  for choice, want in zip(response.choices, expected, strict=True):
    ids = _token_ids(choice.logprobs.tokens)
    assert ids == want.token_ids
    scored = _score(generator, generator.sampler.model, prompt_ids, ids)
    np.testing.assert_allclose(choice.logprobs.token_logprobs, scored, atol=2e-4)
  chat = client.chat.completions.create(
    model="tiny", messages=CHAT, n=N, max_tokens=MAX_TOKENS, seed=6, logprobs=True,
    extra_body={"return_tokens_as_token_ids": True},
  )  # fmt: skip
  assert all(t.token.startswith("token_id:") for c in chat.choices for t in c.logprobs.content)


def _peft_adapter(generator, directory, seed):
  """A PEFT directory holding a random adapter with non-zero B (so it changes the model)."""
  model = generator.sampler.model
  config = lora.LoRAConfig(rank=4, alpha=8.0)
  adapter = lora.init_adapters(model, config, ("role",), seed=seed)["role"]
  rng = np.random.RandomState(seed)
  for name, var in vars(adapter).items():
    if isinstance(var, lora.LoRAParam) and name.endswith("_lora_b"):
      var[...] = jnp.asarray(0.5 * rng.randn(*var.shape), var.dtype)
  lora.save_peft(adapter, directory, rank=4, alpha=8.0, target_modules=config.targets, base_model_name="tiny")
  return lora.with_adapter(model, lora.load_peft(directory, model.config))


@pytest.mark.slow  # compiles the sampler for the adapted model
@pytest.mark.integration
def test_lora_adapters_load_by_name_change_only_their_model_and_reload_in_place(
  client, server, generator, tmp_path
):
  prompt = "The answer is"
  greedy = dict(prompt=prompt, n=N, max_tokens=MAX_TOKENS, temperature=0, logprobs=0,
                extra_body={"return_tokens_as_token_ids": True})  # fmt: skip
  base = client.completions.create(model="tiny", **greedy).choices[0]
  adapted_model = _peft_adapter(generator, tmp_path / "one", seed=1)
  status, raw = _post_raw(
    server, "/v1/load_lora_adapter", {"lora_name": "role", "lora_path": str(tmp_path / "one")}
  )
  assert status == 200 and b"role" in raw
  assert [m.id for m in client.models.list().data] == ["tiny", "role"]
  assert client.models.list().data[1].parent == "tiny"
  first = client.completions.create(model="role", **greedy).choices[0]
  assert not np.allclose(first.logprobs.token_logprobs, base.logprobs.token_logprobs, atol=1e-3)
  again = client.completions.create(model="tiny", **greedy).choices[0]
  assert again.logprobs.tokens == base.logprobs.tokens
  assert again.logprobs.token_logprobs == base.logprobs.token_logprobs
  # The engine's log-probs are the trainer's for the adapted model (the RL engine-vs-trainer gap).
  prompt_ids = generator.encode(prompt, GenerationParams())
  scored = _score(generator, adapted_model, prompt_ids, _token_ids(first.logprobs.tokens))
  np.testing.assert_allclose(first.logprobs.token_logprobs, scored, atol=2e-4)
  reloaded_model = _peft_adapter(generator, tmp_path / "two", seed=2)
  body = {"lora_name": "role", "lora_path": str(tmp_path / "two"), "load_inplace": True}
  assert _post_raw(server, "/v1/load_lora_adapter", body)[0] == 200
  second = client.completions.create(model="role", **greedy).choices[0]
  assert not np.allclose(second.logprobs.token_logprobs, first.logprobs.token_logprobs, atol=1e-3)
  scored = _score(generator, reloaded_model, prompt_ids, _token_ids(second.logprobs.tokens))
  np.testing.assert_allclose(second.logprobs.token_logprobs, scored, atol=2e-4)
  status, _ = _post_raw(server, "/v1/unload_lora_adapter", {"lora_name": "role"})
  assert status == 200
  with pytest.raises(openai.NotFoundError, match="'role' is not served here"):
    client.completions.create(model="role", **greedy)


def test_adapters_beyond_max_loras_are_refused_but_a_loaded_name_is_replaced(
  strict_server, generator, tmp_path
):
  _peft_adapter(generator, tmp_path, seed=1)

  def load(name):
    return _post_raw(strict_server, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(tmp_path)})

  assert load("a") == (200, b"Success: LoRA adapter 'a' added successfully.")
  status, raw = load("b")
  error = json.loads(raw)["error"]
  assert status == 400 and error["param"] == "lora_name" and "max_loras" in error["message"]
  assert load("a")[0] == 200
  status, body = _get(strict_server, "/v1/models", key=None)
  assert [(m["id"], m["max_model_len"]) for m in body["data"]] == [("tiny", 24), ("a", 24)]
  assert _post_raw(strict_server, "/v1/unload_lora_adapter", {"lora_name": "a"})[0] == 200
