"""Streaming: when a streamed answer's first chunk arrives against its whole time, and what streaming costs.

  python -m benchmarks.stream_bench                                  # the tiny preset, 64 tokens
  python -m benchmarks.stream_bench --n=1,16 --stream_every=8,16 --trials=7

Serves configs/serve.py's `tiny` preset (random tiny Qwen3 weights, a byte-level BPE tokenizer
trained here; no network) on a loopback port, once per `--stream_every` (the server's
`stream_every`: decode steps per device call while a streamed request is in the batch), and asks
with the official `openai` client, greedily, for `--max_tokens` tokens (EOS may end a sample
earlier: the tokens made are printed). Each trial sends, in turn, the request whole and streamed:
time to the first chunk that carries text, time to the stream's end, and the whole request's time.
Reported per (stream_every, n), median [min–max] over the trials: the first chunk's time, the
streamed total, the ratio first ÷ total (the issue's bar: under 0.5), and streamed ÷ whole total
(what the chunked decode costs, within each trial so a slow moment of the machine cancels).
"""

from __future__ import annotations

import pathlib
import statistics
import tempfile
import time

import openai
from absl import app, flags

from configs import serve as serve_config
from lm import server as server_lib
from lm import tokenizer as tokenizer_lib

_N = flags.DEFINE_list("n", ["1", "16"], "Samples per request (n), each measured.")
_EVERY = flags.DEFINE_list("stream_every", ["16"], "Server stream_every values, each its own server.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 64, "Tokens asked for per sample.")
_TRIALS = flags.DEFINE_integer("trials", 5, "Timed trials per (stream_every, n), after one warm-up.")

PROMPT = "Claim: the form is correct. Argument: every line adds up. Evidence:"
_CORPUS = [
  "The quick brown fox jumps over the lazy dog.",
  "Claim: the form is correct. Argument: every line adds up. Evidence: line 11 equals 9 + 2.",
  "A tax return lists wages, deductions and the total tax owed.",
] * 4


def _timed(client: openai.OpenAI, request: dict) -> tuple[float, float, float, int]:
  """(first text chunk s, streamed total s, whole request s, tokens made) of one streamed and one
  whole request."""
  start = time.perf_counter()
  whole = client.completions.create(**request)
  whole_s = time.perf_counter() - start
  start, first = time.perf_counter(), None
  for chunk in client.completions.create(**request, stream=True):
    if first is None and chunk.choices and chunk.choices[0].text:
      first = time.perf_counter() - start
  total = time.perf_counter() - start
  return first if first is not None else total, total, whole_s, whole.usage.completion_tokens


def _summary(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
  return (
    f"{statistics.median(values) * scale:.{digits}f} "
    f"[{min(values) * scale:.{digits}f}–{max(values) * scale:.{digits}f}]"
  )


def main(argv):
  del argv
  workdir = pathlib.Path(tempfile.mkdtemp(prefix="stream_bench_"))
  config = serve_config.get_config("tiny")
  config.model.tokenizer = tokenizer_lib.train_bpe_tokenizer(workdir / "tokenizer", _CORPUS, vocab_size=320)
  config.server.update(port=0, max_n=64)
  generator = None
  for every in map(int, _EVERY.value):
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
        _timed(client, request)  # warm-up: compiles the whole and the streamed decode
        rows = [_timed(client, request) for _ in range(_TRIALS.value)]
        first, total, whole, made = (list(column) for column in zip(*rows, strict=True))
        print(
          f"stream_every={every} n={n} tokens made per request {made[0]} (max_tokens {_MAX_TOKENS.value}): "
          f"first chunk {_summary(first, 1e3, 1)} ms, streamed total {_summary(total, 1e3, 1)} ms, "
          f"first/total {_summary([f / t for f, t in zip(first, total, strict=True)])}, "
          f"whole request {_summary(whole, 1e3, 1)} ms, "
          f"streamed/whole {_summary([t / w for t, w in zip(total, whole, strict=True)])}",
          flush=True,
        )


if __name__ == "__main__":
  app.run(main)
