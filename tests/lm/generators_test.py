"""JaxGenerator against the sampler, the response cache, OpenAIGenerator's retries, make_generator.

OpenAIGenerator's requests and parsing are tested end to end against the real server in
server_test.py; here its retry policy (the `openai` client's own, configured by OpenAIGenerator)
meets a real local HTTP server that fails on purpose.
"""

import http.server
import json
import multiprocessing
import os
import threading
import time

import numpy as np
import openai
import pytest

import lm
from lm import generators
from lm.generators import CachedGenerator, Generation, GenerationParams, OpenAIGenerator
from lm.sampler import Sampler
from tests.lm.generator_helpers import MAX_TOKENS, N, make_tiny_generator, tiny_config

PROMPTS = [
  "The answer is",
  [{"role": "user", "content": "Solve 2n + 5 = 17."}],
  [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x + y?"}],
  "Claim: the form is correct.",
]
PARAMS = GenerationParams(max_tokens=MAX_TOKENS, seed=5)


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
  return make_tiny_generator(tmp_path_factory.mktemp("tokenizer"))


def _texts(results):
  return [[g.text for g in samples] for samples in results]


def assert_same_generations(a, b):
  """Equal samples; log-probs to float tolerance (a row's numerics may vary with its batch)."""
  strip = lambda results: [[dict(vars(g), logprobs=None) for g in s] for s in results]  # noqa: E731
  assert strip(a) == strip(b)
  for ga, gb in zip([g for s in a for g in s], [g for s in b for g in s], strict=True):
    np.testing.assert_allclose(ga.logprobs, gb.logprobs, atol=1e-5)


# ---- JaxGenerator ------------------------------------------------------------------------------


def test_jax_generator_equals_the_sampler_it_wraps(generator):
  tok = generator.tokenizer
  out = generator.generate(PROMPTS, n=N, params=PARAMS)
  ids = [tok.encode(p) if isinstance(p, str) else tok.encode_chat(p) for p in PROMPTS]
  sampler = generator.sampler
  direct = Sampler(sampler.model, tokenizer=tok, mesh=sampler.mesh, config=sampler.config).generate(
    ids, max_new_tokens=MAX_TOKENS, n=N, seed=5, eos_ids=tok.eos_ids
  )
  assert [[g.token_ids for g in s] for s in out] == direct.tokens
  assert _texts(out) == direct.texts
  assert [[g.finish_reason for g in s] for s in out] == direct.finish_reasons
  for samples, logprobs in zip(out, direct.logprobs, strict=True):
    for g, lp in zip(samples, logprobs, strict=True):
      np.testing.assert_allclose(g.logprobs, lp, atol=1e-6)
  assert [s[0].prompt_tokens for s in out] == [len(x) for x in ids]
  assert all(g.completion_tokens == len(g.token_ids) for s in out for g in s)


def test_per_prompt_params_share_one_sampler_call_and_match_separate_calls(generator):
  params = [
    GenerationParams(max_tokens=MAX_TOKENS, temperature=0.0, seed=1),
    GenerationParams(max_tokens=MAX_TOKENS, temperature=1.0, top_k=20, seed=2),
    GenerationParams(max_tokens=MAX_TOKENS, temperature=0.7, top_p=0.9, seed=3),
    GenerationParams(max_tokens=4, seed=4),  # a different max_tokens: its own sampler call
  ]
  calls = generator.sampler_calls
  together = generator.generate(PROMPTS, n=N, params=params)
  assert generator.sampler_calls - calls == 2
  for prompt, p, result in zip(PROMPTS, params, together, strict=True):
    assert_same_generations(generator.generate([prompt], n=N, params=p), [result])
  assert together[0][0].text == together[0][1].text  # greedy samples agree
  assert all(len(g.token_ids) <= 4 for g in together[3])


def test_seed_none_draws_fresh_samples(generator):
  params = GenerationParams(max_tokens=MAX_TOKENS)
  assert _texts(generator.generate(PROMPTS[:1], n=N, params=params)) != _texts(
    generator.generate(PROMPTS[:1], n=N, params=params)
  )


def test_generation_params_validate_and_normalise():
  assert GenerationParams(stop="\n").stop == ("\n",)
  assert GenerationParams(stop=["a", "b"]).stop == ("a", "b")
  for bad in [
    dict(max_tokens=0),
    dict(temperature=-1),
    dict(top_p=0),
    dict(top_k=-1),
    dict(stop=[""]),
    dict(seed=-1),
  ]:
    with pytest.raises(ValueError, match=next(iter(bad))):
      GenerationParams(**bad)
  with pytest.raises(ValueError, match="n has 3 values for 2 prompts"):
    generators.per_prompt([1, 2, 3], 2, "n")


# ---- CachedGenerator ---------------------------------------------------------------------------


class _Recording:
  """Passes calls to a real generator and records the prompts of each call."""

  def __init__(self, inner):
    self.inner, self.calls = inner, []

  def generate(self, prompts, n=1, params=PARAMS):
    self.calls.append(list(prompts))
    return self.inner.generate(prompts, n=n, params=params)


def test_cache_resumes_after_partial_completion_and_replays_with_zero_inner_calls(generator, tmp_path):
  recording = _Recording(generator)
  cached = CachedGenerator(recording, tmp_path, "tiny")
  first = cached.generate(PROMPTS[:2], n=N, params=PARAMS)  # an interrupted run got this far
  resumed = cached.generate(PROMPTS, n=N, params=PARAMS)
  assert recording.calls == [PROMPTS[:2], PROMPTS[2:]]  # only the misses, in one call
  assert resumed[:2] == first
  assert_same_generations(resumed, generator.generate(PROMPTS, n=N, params=PARAMS))
  replay = CachedGenerator(recording, tmp_path, "tiny").generate(PROMPTS, n=N, params=PARAMS)
  assert replay == resumed and len(recording.calls) == 2
  # The key covers the model, the seed, every parameter and n.
  CachedGenerator(recording, tmp_path, "other").generate(PROMPTS[:1], n=N, params=PARAMS)
  cached.generate(PROMPTS[:1], n=N, params=GenerationParams(max_tokens=MAX_TOKENS, seed=6))
  cached.generate(PROMPTS[:1], n=N, params=GenerationParams(max_tokens=MAX_TOKENS, seed=5, top_k=3))
  assert len(recording.calls) == 5
  assert len(list(tmp_path.rglob("*.json"))) == 7


def test_cache_sends_identical_missing_requests_once(generator, tmp_path):
  recording = _Recording(generator)
  out = CachedGenerator(recording, tmp_path, "tiny").generate([PROMPTS[0], PROMPTS[0]], n=N, params=PARAMS)
  assert recording.calls == [[PROMPTS[0]]] and out[0] == out[1]


class _EchoGenerator:
  """A deterministic stand-in for the cache's inner generator where what it says does not matter:
  in subprocesses, which should not compile a model."""

  def generate(self, prompts, n=1, params=PARAMS):
    ns = generators.per_prompt(n, len(prompts), "n")
    ps = generators.per_prompt(params, len(prompts), "params")
    return [
      [Generation(f"{p}|{q.seed}|{j}", [j], [-1.0], "stop", len(p), 1) for j in range(k)]
      for p, k, q in zip(prompts, ns, ps, strict=True)
    ]


_SHARED_PROMPTS = [f"problem {i}" for i in range(300)]


def _fill_cache(cache_dir, barrier):
  barrier.wait()  # both processes write the same keys at the same time
  CachedGenerator(_EchoGenerator(), cache_dir, "echo").generate(_SHARED_PROMPTS, n=N, params=PARAMS)


@pytest.mark.integration
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_two_processes_sharing_a_cache_do_not_corrupt_it(tmp_path):
  # Forked, not spawned: a spawned child would spend longer importing JAX than the test takes,
  # and these children run no JAX (the only hazard of forking a process that has started it).
  ctx = multiprocessing.get_context("fork")
  barrier = ctx.Barrier(2)
  workers = [ctx.Process(target=_fill_cache, args=(str(tmp_path), barrier)) for _ in range(2)]
  for w in workers:
    w.start()
  for w in workers:
    w.join(timeout=120)
  assert [w.exitcode for w in workers] == [0, 0]
  files = list(tmp_path.rglob("*"))
  assert not [f for f in files if f.name.endswith(".tmp")]
  assert len([f for f in files if f.suffix == ".json"]) == len(_SHARED_PROMPTS)

  class Refuse:
    def generate(self, *args, **kwargs):
      raise AssertionError("every entry should be a cache hit")

  out = CachedGenerator(Refuse(), tmp_path, "echo").generate(_SHARED_PROMPTS, n=N, params=PARAMS)
  assert out == _EchoGenerator().generate(_SHARED_PROMPTS, n=N, params=PARAMS)


# ---- OpenAIGenerator retries -------------------------------------------------------------------

_COMPLETION = {
  "id": "cmpl-1",
  "object": "text_completion",
  "created": 0,
  "model": "m",
  "choices": [{"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}],
  "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


class _FlakyServer:
  """A real HTTP server on 127.0.0.1 that follows a script of failures, then succeeds.

  Script steps: an HTTP status (answered with an error body; 429 and 503, the statuses RFC 9110
  pairs with it, carry Retry-After) or "slow" (answers after the client has timed out).
  """

  def __init__(self, script, retry_after="0.01"):
    self.hits = []
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        step = script[len(outer.hits)] if len(outer.hits) < len(script) else 200
        outer.hits.append(step)
        if step == "slow":
          time.sleep(1.0)
          step = 200
        body = _COMPLETION if step == 200 else {"error": {"message": f"scripted {step}", "type": "x"}}
        data = json.dumps(body).encode()
        self.send_response(step)
        if step in (429, 503):
          self.send_header("Retry-After", retry_after)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def log_message(self, *args):
        pass

    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.httpd.handle_error = lambda *args: None  # the "slow" answer meets a closed socket
    threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
    self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.httpd.shutdown()
    self.httpd.server_close()


def _client(base_url, **kwargs):
  return OpenAIGenerator(base_url, "m", **dict(dict(max_retries=5, timeout=0.3), **kwargs))


@pytest.mark.integration
def test_openai_generator_retries_timeouts_429_and_5xx_with_backoff():
  # The 500 comes first: it has no Retry-After, so the client's own backoff (0.5 s before the
  # first retry, less up to 25% jitter) applies while it is still short.
  with _FlakyServer([500, "slow", 429, 503], retry_after="0.5") as server:
    start = time.monotonic()
    out = _client(server.base_url).generate(["hi"], params=GenerationParams(max_tokens=2))
    elapsed = time.monotonic() - start
  assert server.hits == [500, "slow", 429, 503, 200]
  assert out == [[Generation("ok", None, None, "stop", 3, 1)]]
  # The 500's backoff, the timeout (then a backoff not counted here), the server's Retry-After twice.
  assert elapsed >= 0.5 * 0.75 + 0.3 + 0.5 + 0.5


@pytest.mark.integration
def test_openai_generator_does_not_retry_other_4xx():
  with _FlakyServer([400, 400]) as server:
    with pytest.raises(openai.BadRequestError, match="scripted 400"):
      _client(server.base_url).generate(["hi"])
  assert server.hits == [400]


@pytest.mark.integration
def test_openai_generator_gives_up_after_max_retries():
  with _FlakyServer([503] * 5) as server:
    with pytest.raises(openai.InternalServerError):
      _client(server.base_url, max_retries=2).generate(["hi"])
  assert server.hits == [503] * 3


# ---- make_generator ----------------------------------------------------------------------------


@pytest.mark.slow
def test_make_generator_loads_a_checkpoint_that_generates_like_the_original(generator, tmp_path):
  lm.save_hf(generator.sampler.model, tmp_path / "ckpt")
  config = tiny_config(tmp_path / "tokenizer")
  config.update(preset="", checkpoint=str(tmp_path / "ckpt"), cache_dir=str(tmp_path / "cache"))
  loaded = generators.make_generator(config)
  assert isinstance(loaded, CachedGenerator) and loaded.model_id == config.checkpoint
  assert_same_generations(
    loaded.generate(PROMPTS, n=N, params=PARAMS), generator.generate(PROMPTS, n=N, params=PARAMS)
  )


def test_random_preset_covers_the_tokenizer_and_is_cached_under_its_seed(generator, tmp_path):
  assert generator.sampler.model.config.vocab_size == generator.tokenizer.vocab_size > 256
  config = tiny_config(tmp_path / "tokenizer")
  config.update(cache_dir=str(tmp_path / "cache"), seed=3)
  assert generators.make_generator(config).model_id == "random:tiny_qwen3:seed=3"


def test_make_generator_openai_and_errors(monkeypatch):
  monkeypatch.setenv("MY_KEY", "sk-test")
  config = generators.default_config(
    kind="openai", base_url="http://127.0.0.1:9/v1", model="m", api_key_env="MY_KEY"
  )
  client = generators.make_generator(config)
  assert isinstance(client, OpenAIGenerator) and client.client.api_key == "sk-test"
  assert str(client.client.base_url).rstrip("/") == "http://127.0.0.1:9/v1"
  with pytest.raises(ValueError, match="needs `model`"):
    generators.make_generator(generators.default_config(kind="openai"))
  with pytest.raises(ValueError, match="kind must be"):
    generators.make_generator(generators.default_config(kind="vllm"))
  with pytest.raises(ValueError, match="needs `tokenizer` or `checkpoint`"):
    generators.make_generator(generators.default_config(kind="jax"))
  with pytest.raises(FileNotFoundError):
    generators.make_generator(generators.default_config(kind="jax", checkpoint=os.devnull + "/missing"))


def test_jax_generator_refuses_a_prompt_past_the_context(generator):
  limit = generator.sampler.model.config.max_position_embeddings
  calls = generator.sampler_calls
  with pytest.raises(ValueError, match=r"prompt 1: .*exceeds the context limit"):
    generator.generate(
      ["hi", "hello there"], params=[GenerationParams(max_tokens=4), GenerationParams(max_tokens=limit)]
    )
  assert generator.sampler_calls == calls  # refused before any sampling
