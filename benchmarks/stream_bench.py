"""Streaming: when a streamed answer's first chunk arrives against its whole time, and what streaming costs.

  python -m benchmarks.stream_bench                                  # the tiny preset, 64 tokens
  python -m benchmarks.stream_bench --n=1,16 --stream_every=4,16 --repeats=7
  python -m benchmarks.stream_bench --n= --sampler_shapes=a,b --repeats=3   # lm.Sampler alone, larger

Serves configs/serve.py's `tiny` preset (random tiny Qwen3 weights, a byte-level BPE tokenizer
trained here; no network) on a loopback port, once per `--stream_every` (the server's
`stream_every`: decode steps per device call while a streamed request is in the batch), and asks,
greedily, for `--max_tokens` tokens (EOS may end a sample earlier: the tokens made are printed).
Each trial sends, in turn, the request whole (the `openai` client) and streamed (read raw over
HTTP, so the client's parsing of each event is not timed): the time to the first event, to
`data: [DONE]`, and the whole request's time. Then, without HTTP, the generator's call for the same
prompt whole and streamed (`on_tokens` a no-op): the chunked decode's own cost.

Reported per (stream_every, n), median [min–max] over the trials: the first event's time, the
streamed total, first ÷ total (the issue's bar: under 0.5), streamed ÷ whole over HTTP, and
streamed ÷ whole for the generator call alone (ratios within each trial, so a slow moment of the
machine cancels).
"""

from __future__ import annotations

import http.client
import json
import pathlib
import statistics
import tempfile
import time

import openai
from absl import app, flags

from configs import serve as serve_config
from lm import generators
from lm import server as server_lib
from lm import tokenizer as tokenizer_lib

_N = flags.DEFINE_list("n", ["1", "16"], "Samples per request (n), each measured.")
_EVERY = flags.DEFINE_list("stream_every", ["16"], "Server stream_every values, each its own server.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 64, "Tokens asked for per sample.")
_SAMPLER_SHAPES = flags.DEFINE_list(
  "sampler_shapes",
  [],
  "Also time lm.Sampler whole against streamed at these shapes of benchmarks/sampler_bench.py (a, b).",
)
_TRIALS = flags.DEFINE_integer("repeats", 5, "Timed trials per (stream_every, n), after one warm-up.")

PROMPT = "Claim: the form is correct. Argument: every line adds up. Evidence:"
_CORPUS = [
  "The quick brown fox jumps over the lazy dog.",
  "Claim: the form is correct. Argument: every line adds up. Evidence: line 11 equals 9 + 2.",
  "A tax return lists wages, deductions and the total tax owed.",
] * 4


def _streamed(port: int, request: dict) -> tuple[float, float]:
  """(first event s, `[DONE]` s) of a streamed request, read raw."""
  connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
  body = json.dumps({**request, "stream": True}).encode()
  start, first = time.perf_counter(), None
  connection.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
  response = connection.getresponse()
  while line := response.readline():
    if line.startswith(b"data: ") and first is None:
      first = time.perf_counter() - start
    if line.startswith(b"data: [DONE]"):
      break
  total = time.perf_counter() - start
  connection.close()
  return first, total


def _trial(server, client: openai.OpenAI, request: dict) -> tuple[float, ...]:
  """(first event s, streamed total s, whole request s, generator whole s, generator streamed s,
  tokens made) of one trial."""
  start = time.perf_counter()
  whole = client.completions.create(**request)
  whole_s = time.perf_counter() - start
  first, total = _streamed(server.port, request)
  params = generators.GenerationParams(max_tokens=request["max_tokens"], temperature=0.0, seed=0)
  timed = []
  for streaming in ({}, dict(on_tokens=lambda *update: None, stream_every=server.config.stream_every)):
    start = time.perf_counter()
    server.generator.generate([request["prompt"]], n=request["n"], params=params, **streaming)
    timed.append(time.perf_counter() - start)
  return first, total, whole_s, *timed, whole.usage.completion_tokens


def _summary(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
  return (
    f"{statistics.median(values) * scale:.{digits}f} "
    f"[{min(values) * scale:.{digits}f}–{max(values) * scale:.{digits}f}]"
  )


def sampler_shape(name: str, workdir: pathlib.Path) -> None:
  """`lm.Sampler` at shape `name` of benchmarks/sampler_bench.py (random float32 weights, greedy, EOS
  ignored): the whole decode (one device program) against the streamed one (`on_tokens`, a device
  call per `stream_every` steps), interleaved; and when the streamed call handed out its first
  tokens, against its whole time."""
  import lm
  from benchmarks import sampler_bench
  from lm.sampler import Sampler

  shape = sampler_bench.SHAPES[name]
  path = workdir / f"shape_{name}"
  sampler_bench.write_checkpoint(shape, path)
  prompts = json.loads((path / "prompts.json").read_text())
  sampler = Sampler(lm.load_hf(path, dtype="float32"))
  for every in map(int, _EVERY.value):
    timings = []
    for trial in range(_TRIALS.value + 1):  # the first compiles both
      start, first = time.perf_counter(), []

      def on_tokens(*update, start=start, first=first):
        if not first:
          first.append(time.perf_counter() - start)

      sampler.generate(
        prompts, max_new_tokens=shape.new_tokens, temperature=0.0, on_tokens=on_tokens, stream_every=every
      )
      streamed = time.perf_counter() - start
      start = time.perf_counter()
      sampler.generate(prompts, max_new_tokens=shape.new_tokens, temperature=0.0)
      if trial:
        timings.append((first[0], streamed, time.perf_counter() - start))
    first, streamed, whole = (list(column) for column in zip(*timings, strict=True))
    ratio = lambda a, b: _summary([x / y for x, y in zip(a, b, strict=True)])
    print(
      f"{shape.name}, batch {shape.batch}, {shape.new_tokens} new tokens, stream_every={every}: "
      f"whole {_summary(whole)} s, streamed {_summary(streamed)} s, "
      f"streamed/whole {ratio(streamed, whole)}, first tokens {_summary(first)} s, "
      f"first/streamed {ratio(first, streamed)}",
      flush=True,
    )


def main(argv):
  del argv
  workdir = pathlib.Path(tempfile.mkdtemp(prefix="stream_bench_"))
  config = serve_config.get_config("tiny")
  config.model.tokenizer = tokenizer_lib.train_bpe_tokenizer(workdir / "tokenizer", _CORPUS, vocab_size=320)
  config.server.update(port=0, max_n=64)
  generator = None
  for every in map(int, _EVERY.value if _N.value else []):
    config.server.stream_every = every
    if generator is None:
      server = server_lib.server_from_config(config)
      generator = server.generator
    else:  # the same model and compiled programs, another stream_every
      fields = {k: v for k, v in config.server.items() if k != "api_key_env"}
      server = server_lib.OpenAIServer(generator, server_lib.ServerConfig(**fields))
    with server.start():
      client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0, timeout=600)
      for n in map(int, _N.value):
        request = dict(model="local", prompt=PROMPT, n=n, max_tokens=_MAX_TOKENS.value, temperature=0)
        _trial(server, client, request)  # warm-up: compiles the whole and the streamed decode
        rows = [_trial(server, client, request) for _ in range(_TRIALS.value)]
        first, total, whole, gen_whole, gen_streamed, made = (
          list(column) for column in zip(*rows, strict=True)
        )
        ratio = lambda a, b: _summary([x / y for x, y in zip(a, b, strict=True)])
        print(
          f"stream_every={every} n={n} tokens made per request {made[0]} (max_tokens {_MAX_TOKENS.value}): "
          f"first event {_summary(first, 1e3, 1)} ms, streamed total {_summary(total, 1e3, 1)} ms, "
          f"first/total {ratio(first, total)}, whole request {_summary(whole, 1e3, 1)} ms, "
          f"streamed/whole {ratio(total, whole)}; generator call whole {_summary(gen_whole, 1e3, 1)} ms, "
          f"streamed/whole {ratio(gen_streamed, gen_whole)}",
          flush=True,
        )
  for name in _SAMPLER_SHAPES.value:
    sampler_shape(name, workdir)


if __name__ == "__main__":
  app.run(main)
