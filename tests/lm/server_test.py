"""The OpenAI-compatible server, driven by the official `openai` client and by OpenAIGenerator.

One server on a free loopback port serves a tiny random model for the whole module; every answer
is checked against the same `JaxGenerator` called directly.
"""

import http.client
import json
import threading

import numpy as np
import openai
import pytest

from configs import serve as serve_config
from lm.generators import GenerationParams, OpenAIGenerator
from lm.server import OpenAIServer, ServerConfig, server_from_config
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


def test_models_lists_the_served_model(client):
  assert [m.id for m in client.models.list().data] == ["tiny"]


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
  prompts = [f"problem {i}: x + y = {i}" for i in range(8)]
  answers = [None] * len(prompts)
  start = threading.Barrier(len(prompts))

  def ask(i):
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)
    start.wait()
    answers[i] = client.completions.create(
      model="tiny", prompt=prompts[i], n=N, max_tokens=MAX_TOKENS, seed=i
    )

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
    assert [c.text for c in answer.choices] == [g.text for g in want]


def _request(server, method, path, body=None, *, key=KEY):
  """A raw request (the openai client would refuse to send malformed ones): (status, JSON body)."""
  headers = {"Content-Type": "application/json"}
  if key:
    headers["Authorization"] = f"Bearer {key}"
  connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
  try:
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    return response.status, json.loads(response.read())
  finally:
    connection.close()


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
    ("/v1/completions", dict(_OK, max_tokens=17), 400, "max_tokens", "must be in [1, 16]"),
    ("/v1/completions", dict(_OK, temperature="hot"), 400, "temperature", "must be a number"),
    ("/v1/completions", dict(_OK, n=True), 400, "n", "must be an integer"),
    ("/v1/completions", dict(_OK, prompt=[1, 2]), 400, "prompt", "token ids are not accepted"),
    ("/v1/completions", dict(_OK, stream=True), 400, "stream", "not supported"),
    ("/v1/completions", dict(_OK, logprobs=3), 400, "logprobs", "only 0"),
    ("/v1/completions", dict(_OK, prompt="x" * 5000), 413, None, "exceeds the limit of 4096 bytes"),
    ("/v1/chat/completions", {"model": "tiny"}, 400, "messages", "missing required field 'messages'"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "bot", "content": "x"}]}, 400,
     "messages[0].role", "must be system, user or assistant"),
    ("/v1/chat/completions", {"model": "tiny", "messages": CHAT, "chat_template_kwargs": {"tools": 1}}, 400,
     "chat_template_kwargs", "may only hold 'enable_thinking'"),
    ("/v1/embeddings", _OK, 404, None, "no route POST /v1/embeddings"),
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
