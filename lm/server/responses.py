"""What `lm.server` answers: response bodies and server-sent events, in OpenAI's shapes.

A whole answer is one body (`completion_body`). A streamed one is a `ChunkStream`: OpenAI's chunk
events made as the tokens arrive (`tokens`), then the rest of each sample's text with its finish
reason, the usage and `data: [DONE]` when the batch ends (`closing`). Text goes out in pieces along
the tokens (`TextPieces`) that join to exactly the text of the whole answer, stop strings cut.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from lm.generators import Generation
from lm.server.batcher import Job
from lm.server.protocol import ApiError


def completion_body(job: Job, generations: list[list[Generation]], tokenizer) -> dict[str, Any]:
  """The OpenAI response body; choice i * n + j is sample j of prompt i."""
  choices = []
  for index, g in _samples(job, generations):
    logprobs = logprobs_block(job, tokenizer, g.token_ids, g.logprobs) if job.params.logprobs else None
    if job.chat:
      choice = {"message": {"role": "assistant", "content": g.text}, "logprobs": logprobs}
    else:
      choice = {"text": g.text, "logprobs": logprobs}
    choices.append({"index": index, "finish_reason": g.finish_reason, **choice})
  return {**_header(job), "choices": choices, "usage": _usage(generations)}


def _samples(job: Job, generations: list[list[Generation]]):
  """(choice index, sample) pairs: choice i * n + j is sample j of prompt i."""
  for i, samples in enumerate(generations):
    for j, g in enumerate(samples):
      yield i * job.n + j, g


def _header(job: Job, *, chunk: bool = False) -> dict[str, Any]:
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


def logprobs_block(job: Job, tokenizer, token_ids: Sequence[int], logprobs: Sequence[float]) -> dict:
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

Piece = tuple[str, int, int]  # (text, first token, end token)


class TextPieces:
  """A sample's text split along its tokens as they arrive: (piece, first token, end token) each.

  `add` takes the tokens as the device makes them and answers the pieces that can go out; `finish`
  takes the sample's final tokens and text (stop strings cut) and answers the rest. All pieces join
  to the final text exactly and their token ranges cover the final tokens in order. A token that
  ends inside a multi-byte character waits for the next. Text that could begin a stop string
  waits until it cannot (the last `len(longest stop) - 1` characters are held back), and once a
  stop string appears nothing more goes out before `finish`; once decoding stops matching the
  final text (a stop string cut) `finish` gives the rest as one last piece.
  """

  def __init__(self, tokenizer, stop: Sequence[str] = ()):
    self._tokenizer, self._stop = tokenizer, tuple(stop)
    self._hold = max((len(s) for s in self._stop), default=1) - 1
    self.token_ids: list[int] = []  # the tokens so far
    self._pending: list[Piece] = []  # decoded, not yet out
    self._decoded = ""  # every piece decoded so far, out or pending, joined
    self._start = 0  # tokens decoded into pieces
    self._sent, self._sent_tokens = 0, 0  # characters and tokens of the pieces out
    self._stopped = False

  def _delta(self, k: int) -> str | None:
    """The text token k adds after the pieces so far (with the tokens since them), or None while
    it ends inside a character or changes the text before it."""
    lo = max(0, self._start - _DETOKENIZE_WINDOW)
    before = self._tokenizer.decode(self.token_ids[lo : self._start])
    after = self._tokenizer.decode(self.token_ids[lo : k + 1])
    if after.endswith("\ufffd") or not after.startswith(before):
      return None
    return after[len(before) :]

  def add(self, token_ids: Sequence[int]) -> list[Piece]:
    """The pieces that can go out once `token_ids` follow the tokens so far."""
    first = len(self.token_ids)
    self.token_ids += token_ids
    for k in range(first, len(self.token_ids)):
      delta = self._delta(k)
      if delta is not None:
        self._pending.append((delta, self._start, k + 1))
        self._decoded, self._start = self._decoded + delta, k + 1
    if self._stopped:
      return []
    cuts = [i for i in (self._decoded.find(s, self._sent) for s in self._stop) if i >= 0]
    self._stopped = bool(cuts)
    limit = min(cuts) if cuts else len(self._decoded) - self._hold
    out = []
    while self._pending and self._sent + len(self._pending[0][0]) <= limit:
      piece = self._pending.pop(0)
      out.append(piece)
      self._sent, self._sent_tokens = self._sent + len(piece[0]), piece[2]
    return out

  def finish(self, token_ids: Sequence[int], text: str) -> list[Piece]:
    """The pieces after those out, given the sample's final tokens and text."""
    self.token_ids, self._start, self._pending = list(token_ids), self._sent_tokens, []
    out = []
    for k in range(self._start, len(self.token_ids)):
      delta = self._delta(k)
      if delta is None:
        continue
      if not text.startswith(delta, self._sent):
        break
      out.append((delta, self._start, k + 1))
      self._sent, self._start = self._sent + len(delta), k + 1
    if self._sent < len(text) or self._start < len(self.token_ids):
      out.append((text[self._sent :], self._start, len(self.token_ids)))
    return out


def text_pieces(tokenizer, token_ids: Sequence[int], text: str) -> list[Piece]:
  """`text` split along its `token_ids` at once (`TextPieces` given the whole sample)."""
  return TextPieces(tokenizer).finish(token_ids, text)


class ChunkStream:
  """One streamed response as server-sent events in OpenAI's chunk format.

  Per choice: (chat) a first chunk with the role, chunks of text pieces as the tokens arrive (with
  the log-probs of their tokens), then at the end the rest of the text and a chunk with the finish
  reason. With `include_usage` every chunk has `"usage": null` and a last chunk has no choices and
  the usage, as OpenAI sends them; `data: [DONE]` ends the stream.
  """

  def __init__(self, job: Job, tokenizer):
    self._job, self._tokenizer = job, tokenizer
    self._header = _header(job, chunk=True)
    self._extra = {"usage": None} if job.include_usage else {}
    self._pieces: dict[tuple[int, int], TextPieces] = {}
    self._logprobs: dict[tuple[int, int], list[float]] = {}

  def _event(self, choice: dict[str, Any]) -> bytes:
    return sse({**self._header, "choices": [choice], **self._extra})

  def _piece(self, index: int, piece: Piece, token_ids: Sequence[int], logprobs: Sequence[float]) -> bytes:
    text, lo, hi = piece
    job = self._job
    block = (
      logprobs_block(job, self._tokenizer, token_ids[lo:hi], logprobs[lo:hi]) if job.params.logprobs else None
    )
    body = {"delta": {"content": text}} if job.chat else {"text": text}
    return self._event({"index": index, **body, "logprobs": block, "finish_reason": None})

  def opening(self) -> list[bytes]:
    """The chunks before any token: each chat choice's role."""
    if not self._job.chat:
      return []
    role = {"delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    return [self._event({"index": i, **role}) for i in range(len(self._job.prompts) * self._job.n)]

  def tokens(
    self, prompt: int, sample: int, start: int, token_ids: list[int], logprobs: list[float]
  ) -> list[bytes]:
    """The chunks for a sample's tokens `start`, `start + 1`, ... (a `TokenListener`'s update;
    tokens it has had before, from a rerun batch, are skipped)."""
    key = (prompt, sample)
    pieces = self._pieces.setdefault(key, TextPieces(self._tokenizer, self._job.params.stop))
    seen = self._logprobs.setdefault(key, [])
    skip = len(seen) - start
    if skip >= len(token_ids):
      return []
    seen += logprobs[skip:]
    index = prompt * self._job.n + sample
    return [self._piece(index, p, pieces.token_ids, seen) for p in pieces.add(token_ids[skip:])]

  def closing(self, generations: list[list[Generation]]) -> list[bytes]:
    """The rest of every sample, its finish reason, the usage (if asked) and `[DONE]`."""
    events = []
    for index, g in _samples(self._job, generations):
      pieces = self._pieces.get((index // self._job.n, index % self._job.n)) or TextPieces(self._tokenizer)
      events += [self._piece(index, p, g.token_ids, g.logprobs) for p in pieces.finish(g.token_ids, g.text)]
      body = {"delta": {}} if self._job.chat else {"text": ""}
      events.append(self._event({"index": index, **body, "logprobs": None, "finish_reason": g.finish_reason}))
    if self._job.include_usage:
      events.append(sse({**self._header, "choices": [], "usage": _usage(generations)}))
    return events + [DONE]

  def failed(self, error: ApiError) -> list[bytes]:
    """A stream whose batch failed after it began: the error (OpenAI's shape), then `[DONE]`."""
    return [sse(error.body()), DONE]


DONE = b"data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> bytes:
  """One server-sent event; text the client sent that is not valid Unicode is escaped, not a 500."""
  try:
    payload = json.dumps(data, ensure_ascii=False).encode("utf-8")
  except UnicodeEncodeError:
    payload = json.dumps(data).encode("ascii")
  return b"data: " + payload + b"\n\n"
