"""Final-answer extraction and math-verify grading, time-bounded in worker processes.

Extraction is ours (so the solver, the vote and the grader agree on what "the answer" of a sample
is); equivalence is math-verify's. math-verify bounds its own time with `signal.alarm`, which only
works on the main thread and cannot interrupt every sympy loop, so here it runs with its timeouts
disabled inside worker subprocesses that the parent kills when a call overruns its deadline.
A timeout, a crashed worker or any exception grades as wrong and is counted; nothing raises into
the solver. See docs/kace.md ("Grading") for the rules.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import itertools
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from lm import text as text_lib

# --------------------------------------------------------------------------------------------------
# Extraction

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\b\s*")
_PHRASE_RE = re.compile(r"(?:final\s+answer|answer)\s*(?:is\b|:)\s*(?P<tail>[^\n]*)", re.IGNORECASE)
# Math spans, in the order a regex alternation `$$..$$ | $..$ | \(..\) | \[..\]` (lazy, DOTALL)
# tries them at each position: (opener, closer).
_MATH_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_MATH_OPENER_RE = re.compile(r"\$|\\[(\[]")
_NUMBER_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|-?\d+(?:\.\d+)?(?:/\d+)?")


_BARE_RE = re.compile(r"[^\s$]*")
_BRACE_OR_ESCAPE_RE = re.compile(r"[\\{}]")


def _closing_braces(text: str, start: int = 0) -> dict[int, int]:
  r"""{index of each `{`: index of its matching `}`} for the brace groups of `text` that close.

  One pass with a stack, so finding every box's content costs O(len(text)) in all; scanning from
  each `\boxed{` to its closing brace instead is quadratic when boxes never close (a degenerate
  sample repeating `\boxed{` 20,000 times took minutes). `\{` and `\}` are literal braces, not
  grouping; a `{` preceded by a box command is never the second character of such a pair, so each
  box's group is the one a scan starting at it would find. Braces before `start` (an unescaped
  position) are not read: they cannot change which `}` closes a `{` after it.
  """
  closing, stack = {}, []
  i = start
  while (found := _BRACE_OR_ESCAPE_RE.search(text, i)) is not None:
    i = found.start()
    ch = text[i]
    if ch == "\\":
      i += 2
      continue
    if ch == "{":
      stack.append(i)
    elif stack:
      closing[stack.pop()] = i
    i += 1
  return closing


def last_boxed(text: str) -> str | None:
  r"""The content of the last complete `\boxed{...}` / `\fbox{...}` (or `\boxed 5`), else None.

  Braces nest; a box cut off before its closing brace (a truncated sample) is skipped in favour of
  an earlier complete one. MATH gold answers are read with this alone. Linear in the text length.
  """
  matches = list(_BOX_RE.finditer(text))
  if not matches:
    return None
  closing = None
  for match in reversed(matches):
    end = match.end()
    if end < len(text) and text[end] == "{":
      if closing is None:
        closing = _closing_braces(text, start=matches[0].end())
      close = closing.get(end)
      content = text[end + 1 : close] if close is not None else None
    else:
      content = _BARE_RE.match(text, end).group(0)
    if content and content.strip():
      return content.strip()
  return None


def _math_spans(text: str) -> Iterator[str]:
  r"""The contents of the math spans of `text`, left to right, as
  `re.finditer(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", text, re.DOTALL)` finds them.

  In linear time: that regex rescans to the end of the text from every opener that never closes
  (`\(` repeated 20,000 times took seconds); here a closer that does not occur after a position
  is known from its last occurrence, so a failed attempt costs O(1) and a successful one reads
  only the span it returns.
  """
  last = {closer: text.rfind(closer) for _, closer in _MATH_DELIMITERS}
  i = 0
  while (found := _MATH_OPENER_RE.search(text, i)) is not None:
    i = found.start()
    for opener, closer in _MATH_DELIMITERS:
      if not text.startswith(opener, i):
        continue
      begin = i + len(opener)
      if last[closer] >= begin + 1:  # a closer after at least one character of content
        end = text.find(closer, begin + 1)
        yield text[begin:end]
        i = end + len(closer)
        break
    else:
      i += 1


def _clean(candidate: str) -> str | None:
  """Strips math delimiters, bold markers and trailing punctuation; keeps the right side of `x = 5`."""
  s = candidate.strip().strip("*").strip()
  math = next(_math_spans(s), None)
  if math is not None:
    s = math
  s = s.strip().rstrip(".;,").strip()
  if "=" in s and "," not in s:
    s = s.rsplit("=", 1)[1].strip()
  return s or None


LENGTH = "length"  # the finish reason of a reply cut off by max_tokens (servers and lm.Sampler alike)
# What a reply cut off by max_tokens answers (`Grader.truncated`, config `grader.truncated`):
# "unanswered" (default, the maths benchmarks' rule): only a complete \boxed{} in its final part;
# "extract": every rule of `extract_answer`, as for a reply that stopped (the pre-2026-12 behaviour).
TRUNCATED_RULES = ("unanswered", "extract")


def extract_answer(
  text: str, finish_reason: str | None = None, *, truncated: str = "unanswered"
) -> str | None:
  r"""The final answer of a model response, or None when it has none.

  In order: (1) the last `\boxed{}` / `\fbox{}`; (2) the last "final answer is X" / "answer: X"
  phrase (rest of that line); (3) the last `$...$`, `$$...$$`, `\(...\)` or `\[...\]`; (4) the
  last number. With a reasoning trace only the text after the last `</think>` is read, and a
  response cut off inside `<think>` has no answer: a draft number from unfinished reasoning must
  not vote. Candidates are cleaned by `_clean` (math delimiters, trailing punctuation, `x =`).

  A reply that stopped for length (`finish_reason == "length"`) answers only with a complete
  `\boxed{}` in its final part under `truncated="unanswered"` (the default): rules 2-4 would read
  the last number of a chain of thought cut off mid-way (Qwen3's template opens `<think>` in the
  prompt, so such a reply may hold no think tag at all). `truncated="extract"` reads it like any
  other reply.
  """
  if truncated not in TRUNCATED_RULES:
    raise ValueError(f"truncated must be one of {TRUNCATED_RULES}, got {truncated!r}")
  text = text_lib.after_think(text)
  if not text:
    return None
  boxed = last_boxed(text)
  if boxed is not None:
    return boxed
  if finish_reason == LENGTH and truncated == "unanswered":
    return None
  phrases = [m.group("tail") for m in _PHRASE_RE.finditer(text)]
  maths = list(_math_spans(text))
  for candidate in phrases[-1:] + maths[-1:]:
    cleaned = _clean(candidate)
    if cleaned is not None:
      return cleaned
  numbers = _NUMBER_RE.findall(text)
  return numbers[-1] if numbers else None


_NORMALISE = [
  (re.compile(r"\\[dt]frac"), r"\\frac"),
  (re.compile(r"\\(?:left|right)(?![a-zA-Z])|\\[,;:! ]|\\q?quad|\s+"), ""),
  (re.compile(r"\^\{?\\circ\}?|°"), ""),
  (re.compile(r"\\text\{([^{}]*)\}"), r"\1"),
]
_GROUPED_INT_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+")


def normalize_answer(answer: str) -> str:
  r"""A canonical string for cheap equality: `\dfrac`→`\frac`, no spacing commands, `\left`/`\right`,
  degree marks, `\text{}` wrappers or outer `$`, and `1,234` → `1234`.

  Used only to short-cut grading and `equivalent` to True, so every rewrite must preserve the
  answer's value (degree marks go because graders, math-verify included, read 30° and 30 alike).
  """
  s = answer.strip().strip("$").strip().rstrip(".").replace("{,}", ",")
  if _GROUPED_INT_RE.fullmatch(s):  # before spaces go: "1, 234" is a pair, not 1234
    s = s.replace(",", "")
  for pattern, repl in _NORMALISE:
    s = pattern.sub(repl, s)
  return s


# --------------------------------------------------------------------------------------------------
# math-verify, run in worker processes


def _as_latex(answer: str) -> str:
  """Wraps an extracted answer so math-verify reads it as LaTeX (a bare `[7, 47]` would not be)."""
  return "$" + answer.strip().strip("$") + "$"


def _worker_ops():
  """Imports math-verify inside the worker and returns its operations by name."""
  import logging

  import sympy
  from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

  logging.getLogger("math_verify").setLevel(logging.ERROR)
  config = [LatexExtractionConfig(), ExprExtractionConfig()]

  def parsed(answer):
    return parse(_as_latex(answer), extraction_config=config, parsing_timeout=None, raise_on_error=True)

  def check(gold, pred):
    return verify(gold, pred, timeout_seconds=None, raise_on_error=True)

  def grade(gold, pred):
    return check(parsed(gold), parsed(pred))

  def equivalent(a, b):
    pa, pb = parsed(a), parsed(b)
    return check(pa, pb) or check(pb, pa)

  def verifiable(answer):
    result = parsed(answer)
    if len(result) != 2 or not isinstance(result[0], (sympy.Basic, sympy.MatrixBase)):
      return False
    value, matched = result
    whole = normalize_answer(matched) == normalize_answer(answer)
    return whole and not value.free_symbols and check(value, value)

  return {"grade": grade, "equivalent": equivalent, "verifiable": verifiable}


def _die_with_parent() -> None:
  """Asks Linux to SIGKILL this worker when its parent dies, so a killed run never leaves a worker
  spinning in sympy (a watchdog thread would not do: big-integer arithmetic holds the GIL).
  Elsewhere, workers exit when their stdin closes, once their current call ends."""
  try:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    return
  if os.getppid() == 1:  # the parent died before the request took effect
    os._exit(0)


def serve() -> None:
  """Worker main loop over stdin/stdout: `[op, args]` lines in, `[status, result]` lines out.

  status is "ok" (result: bool) or "error" (result: message). Run by `_Worker`, never directly.
  """
  _die_with_parent()
  ops = _worker_ops()
  print(json.dumps("ready"), flush=True)
  for line in sys.stdin:
    try:
      op, args = json.loads(line)
      reply = ["ok", bool(ops[op](*args))]
    except Exception as e:  # noqa: BLE001 - any failure of the grader is a wrong answer, counted
      reply = ["error", f"{type(e).__name__}: {str(e)[:200]}"]
    print(json.dumps(reply), flush=True)


# Workers are started from this one long-lived thread: Linux delivers the parent-death signal when
# the *thread* that started a child exits, so starting them from a caller's short-lived thread
# would kill them with it.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kace-grader-spawn")


class _Worker:
  """One math-verify subprocess talking JSON lines over pipes.

  A plain `python -c` subprocess, not `multiprocessing`: it never re-imports the caller's main
  module (so scripts without a `__main__` guard, notebooks and stdin work) and never forks JAX.
  """

  def __init__(self):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    command = [sys.executable, "-c", "from kace.answers import serve; serve()"]
    popen = functools.partial(
      subprocess.Popen, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
    )
    self.process = _SPAWNER.submit(popen, command).result()

  def fileno(self) -> int:
    return self.process.stdout.fileno()

  def send(self, task: tuple[str, tuple]) -> None:
    self.process.stdin.write(json.dumps(task) + "\n")
    self.process.stdin.flush()

  def receive(self) -> Any:
    """The next reply; raises EOFError when the worker has died."""
    line = self.process.stdout.readline()
    if not line:
      raise EOFError("grader worker died")
    return json.loads(line)

  def wait_ready(self, timeout_s: float) -> None:
    ready, _, _ = select.select([self], [], [], timeout_s)
    try:
      started = bool(ready) and self.receive() == "ready"
    except (EOFError, ValueError):
      started = False
    if not started:
      self.kill()
      raise RuntimeError(f"math-verify worker did not start within {timeout_s:.0f}s (see its stderr)")

  def kill(self) -> None:
    self.process.kill()
    self.process.wait()
    for pipe in (self.process.stdin, self.process.stdout):
      with contextlib.suppress(OSError):  # a dead reader makes flushing stdin raise
        pipe.close()


class _Pool:
  """Runs tasks on a few workers, each with a deadline; an overrunning worker is killed and replaced."""

  def __init__(self, size: int, start_timeout_s: float):
    self._size = size
    self._start_timeout_s = start_timeout_s
    self._workers: list[_Worker] = []

  def _spawn(self, count: int) -> list[_Worker]:
    workers = [_Worker() for _ in range(count)]  # all start importing at once, then we wait
    for w in workers:
      w.wait_ready(self._start_timeout_s)
    return workers

  def run(self, tasks: Sequence[tuple[str, tuple]], timeout_s: float) -> list[tuple[str, Any]]:
    """Results in task order: `("ok", bool)`, `("error", message)` or `("timeout", None)`."""
    if not self._workers:
      self._workers = self._spawn(self._size)
    for worker in [w for w in self._workers if w.process.poll() is not None]:
      self._replace(worker)  # died between calls (killed from outside): no task is charged
    results: list[tuple[str, Any] | None] = [None] * len(tasks)
    queue = collections.deque(enumerate(tasks))
    idle = list(self._workers)
    busy: dict[_Worker, tuple[int, float]] = {}
    while queue or busy:
      while queue and idle:
        index, task = queue.popleft()
        worker = idle.pop()
        busy[worker] = (index, time.monotonic() + timeout_s)
        try:
          worker.send(task)
        except OSError:  # died between tasks; the read below reports it
          pass
      next_deadline = min(deadline for _, deadline in busy.values())
      ready, _, _ = select.select(list(busy), [], [], max(0.0, next_deadline - time.monotonic()))
      for worker in ready:
        index, _ = busy.pop(worker)
        try:
          results[index] = tuple(worker.receive())
          idle.append(worker)
        except (EOFError, ValueError):
          results[index] = ("error", "grader worker died")
          idle.append(self._replace(worker))
      now = time.monotonic()
      for worker, (index, deadline) in list(busy.items()):
        if deadline <= now:
          del busy[worker]
          results[index] = ("timeout", None)
          idle.append(self._replace(worker))
    return results

  def _replace(self, worker: _Worker) -> _Worker:
    worker.kill()
    (fresh,) = self._spawn(1)
    self._workers[self._workers.index(worker)] = fresh
    return fresh

  def close(self) -> None:
    for w in self._workers:
      w.kill()
    self._workers = []


@dataclasses.dataclass(frozen=True)
class Verdict:
  """A grade: `correct`, and how it was reached (`status`).

  status: "string" (normalised strings equal), "verified" (math-verify ran), "no_answer",
  "timeout" or "error" (the last two always grade as wrong, and are counted by the Grader).
  """

  correct: bool
  status: str


class Grader:
  """Grading and answer equivalence with math-verify, cached, time-bounded, thread-safe.

  One Grader owns `workers` subprocesses (started on first use; each imports math-verify, about a
  second) — create one per run (or test session) and share it. Every call is bounded by
  `timeout_s` of worker wall time; overrunning workers are killed and replaced.

  Attributes:
    counts: how many math-verify calls ended in each status ("verified", "timeout", "error").
    truncated: what a reply cut off by max_tokens answers (`TRUNCATED_RULES`; `extract`).
  """

  def __init__(
    self,
    workers: int = 2,
    timeout_s: float = 5.0,
    start_timeout_s: float = 120.0,
    truncated: str = "unanswered",
  ):
    if truncated not in TRUNCATED_RULES:
      raise ValueError(f"Grader: truncated must be one of {TRUNCATED_RULES}, got {truncated!r}")
    self.timeout_s = timeout_s
    self.truncated = truncated
    self.counts: collections.Counter[str] = collections.Counter()
    self._pool = _Pool(workers, start_timeout_s)
    self._cache: dict[tuple[str, ...], Verdict] = {}
    self._lock = threading.Lock()

  def __enter__(self) -> Grader:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Stops the workers; a later call starts fresh ones."""
    with self._lock:
      self._pool.close()

  def _run(self, keys: Sequence[tuple[str, ...]]) -> list[Verdict]:
    """Verdicts for `(op, *args)` keys: cache hits, then one parallel pass over the misses."""
    with self._lock:
      todo = list(dict.fromkeys(k for k in keys if k not in self._cache))
      if todo:
        replies = self._pool.run([(k[0], k[1:]) for k in todo], self.timeout_s)
        for key, (status, value) in zip(todo, replies, strict=True):
          status = "verified" if status == "ok" else status
          self.counts[status] += 1
          self._cache[key] = Verdict(status == "verified" and value, status)
      return [self._cache[k] for k in keys]

  def extract(self, text: str, finish_reason: str | None = None) -> str | None:
    """The answer of one reply under this grader's rule for replies cut off by max_tokens
    (`extract_answer` with `truncated=self.truncated`)."""
    return extract_answer(text, finish_reason, truncated=self.truncated)

  def grade_many(self, items: Sequence[tuple[str, str | None]]) -> list[Verdict]:
    """Grades `(gold, predicted answer)` pairs; gold comes first (math-verify is not symmetric)."""
    verdicts: list[Verdict | None] = [None] * len(items)
    keys, where = [], []
    for i, (gold, pred) in enumerate(items):
      if pred is None or not pred.strip():
        verdicts[i] = Verdict(False, "no_answer")
      elif normalize_answer(gold) == normalize_answer(pred):
        verdicts[i] = Verdict(True, "string")
      else:
        keys.append(("grade", gold, pred))
        where.append(i)
    for i, verdict in zip(where, self._run(keys), strict=True):
      verdicts[i] = verdict
    return verdicts

  def grade(self, gold: str, pred: str | None) -> Verdict:
    """Grades one extracted answer against the gold answer."""
    return self.grade_many([(gold, pred)])[0]

  def warm(self, groups: Iterable[Sequence[str | None]]) -> None:
    """Computes `equivalent` for every pair within each group in one parallel pass.

    A batched solver calls this once per tier with the answers of all open problems, so the
    votes that follow read only the cache instead of making many sequential worker round trips.
    """
    keys = [
      self._equivalence_key(a, b)
      for group in groups
      for a, b in itertools.combinations({x for x in group if x is not None and x.strip()}, 2)
      if normalize_answer(a) != normalize_answer(b)
    ]
    self._run(keys)

  def equivalent(self, a: str, b: str) -> bool:
    """Whether two answers are the same mathematical object (for voting: symmetric, cached).

    Normalised strings first; otherwise math-verify in either direction. Timeouts and errors read
    as "not equivalent", so a pathological answer forms a cluster of its own.
    """
    if not a.strip() or not b.strip():
      return False
    if normalize_answer(a) == normalize_answer(b):
      return True
    return self._run([self._equivalence_key(a, b)])[0].correct

  @staticmethod
  def _equivalence_key(a: str, b: str) -> tuple[str, str, str]:
    return ("equivalent", *sorted((a, b)))

  def verifiable_many(self, answers: Sequence[str]) -> list[bool]:
    """Whether each gold answer is machine-checkable; see `kace.data.verifiable` for the definition."""
    return [v.correct for v in self._run([("verifiable", a) for a in answers])]
