"""The batch worker of `lm.server`: waiting requests answered in batches, fairly, one generate call each.

A worker thread waits `batch_window_s` after a request arrives for others (or until
`max_batch_prompts` prompts) and answers them with one `JaxGenerator.generate` call (one sampler
call for requests sharing n, max_tokens and stop). While a batch runs, new requests queue and form
the next batch, so a busy server batches more. If a batch fails, each of its requests is retried
alone, so one request's error is never another's. Scheduling is fair: the cheapest waiting request
(prompts × n × max_tokens) leads the next batch and only requests of comparable length join it, so
a few huge requests cannot hold a small one for the length of theirs; a request passed over
`fair_max_skips` times leads the next batch whatever its size, so large ones are not starved either.

A batch holding a streamed request decodes `stream_every` tokens per device call and hands each
streamed request its tokens as they are made (its `Job.listener`); the others get their whole
answer when the batch ends, as from any batch. Nothing here knows HTTP: tests drive `Batcher`
with `Job`s directly.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import logging
import threading
import time
from typing import Any

from lm.generators import Generation, GenerationParams, JaxGenerator, Prompt
from lm.sampler import TokenListener
from lm.server.config import ServerConfig
from lm.server.protocol import ApiError


@dataclasses.dataclass(frozen=True)
class Job:
  """One parsed request: its prompts (one for chat), samples per prompt and parameters.

  `generator` answers it (None: the batcher's own, the base model); it is fixed when the request
  is accepted, so an adapter reloaded meanwhile serves the requests that come after the reload.
  `listener` (a streamed request's) gets its samples' tokens as they are made, prompts numbered
  within the job; after a failed batch the job reruns alone and its tokens are handed out again
  from the first (`start` 0), which a listener that has them skips.
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
  listener: TokenListener | None = None

  @property
  def cost(self) -> int:
    """Decode budget: the most tokens this request can make the device generate."""
    return len(self.prompts) * self.n * self.params.max_tokens


@dataclasses.dataclass(eq=False)
class Entry:
  """A waiting job: its future, arrival order and how often a batch has passed it over."""

  job: Job
  future: concurrent.futures.Future
  seq: int
  arrived: float
  skipped: int = 0


class Batcher:
  """One worker thread that answers waiting jobs in batches with one `generate` call each.

  The queue is bounded (`max_queued_requests`; `submit` raises a 429 beyond it). Which jobs form
  the next batch is `_select`'s fair rule; a failed batch is rerun one job at a time so that only
  the jobs that fail alone get an error.
  """

  def __init__(self, generator: JaxGenerator, config: ServerConfig):
    self._generator = generator
    self._config = config
    self._pending: list[Entry] = []
    self._closing = False
    self._seq = itertools.count()
    self._cv = threading.Condition()
    self._thread = threading.Thread(target=self._loop, name="lm.server batcher", daemon=True)
    self._thread.start()

  def submit(self, job: Job) -> concurrent.futures.Future:
    """Queues `job`; its future gets the samples ([prompt][sample] `Generation`s) or an `ApiError`."""
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
      self._pending.append(Entry(job, future, next(self._seq), time.monotonic()))
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

  def _next_batch(self) -> list[Entry] | None:
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

  def _select(self) -> list[Entry]:
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

  def _run(self, batch: list[Entry]) -> None:
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

  def _generate(self, jobs: list[Job]) -> list[list[list[Generation]]]:
    """One `generate` call per generator among `jobs` (the base model, each adapter), streamed
    (`stream_every` tokens per device call) when one of its jobs is."""
    by_generator: dict[int, list[int]] = {}
    for index, job in enumerate(jobs):
      by_generator.setdefault(id(job.generator), []).append(index)
    results: list[list[list[Generation]]] = [[] for _ in jobs]
    for indices in by_generator.values():
      group = [jobs[i] for i in indices]
      generator = group[0].generator or self._generator
      streaming = {}
      if any(job.listener is not None for job in group):
        owners = [(job.listener, i) for job in group for i in range(len(job.prompts))]
        streaming = dict(on_tokens=_Fanout(owners), stream_every=self._config.stream_every)
      flat = generator.generate(
        [p for job in group for p in job.prompts],
        n=[job.n for job in group for _ in job.prompts],
        params=[job.params for job in group for _ in job.prompts],
        **streaming,
      )
      start = 0
      for i, job in zip(indices, group, strict=True):
        results[i] = flat[start : start + len(job.prompts)]
        start += len(job.prompts)
    return results


@dataclasses.dataclass(frozen=True)
class _Fanout:
  """A batch's `on_tokens`: prompt p of the generate call is prompt `owners[p][1]` of the job whose
  listener is `owners[p][0]` (None: a job that is not streamed)."""

  owners: list[tuple[TokenListener | None, int]]

  def __call__(self, prompt: int, *rest) -> None:
    listener, index = self.owners[prompt]
    if listener is not None:
      listener(index, *rest)
