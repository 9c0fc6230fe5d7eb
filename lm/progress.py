"""Progress lines a user sees whatever the log verbosity: phases with a heartbeat.

Long work (a warm start, a solver build, training, evaluation) runs inside `phase(name)`: a line
when it starts, a heartbeat line at least every `every` seconds while it runs (its elapsed time and
the latest `note`, printed by a daemon thread, so a loop iteration, a compile or a wait on worker
processes longer than that still shows), and a line when it ends. Lines go to stderr, flushed, not
through absl logging, so `--verbosity=-1` hides the log and keeps them. Library loops call
`note("step 120/300")`, which prints nothing by itself: outside a phase it only records the text.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator

EVERY_S = 30.0  # the longest silence inside a phase; heartbeats come at most this far apart

_lock = threading.Lock()
_stack: list[dict] = []  # open phases, innermost last: {"name", "start", "detail"}
_wake = threading.Condition(_lock)


def say(text: str) -> None:
  """One progress line on stderr, flushed."""
  sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")
  sys.stderr.flush()


def _elapsed(seconds: float) -> str:
  minutes, seconds = divmod(int(seconds), 60)
  return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def note(detail: str) -> None:
  """The innermost phase's current detail, shown by its next heartbeat."""
  with _lock:
    if _stack:
      _stack[-1]["detail"] = detail


def _beat(every: float, stop: threading.Event) -> None:
  while True:
    with _wake:
      _wake.wait(every)
      if stop.is_set():
        return
      if not _stack:
        continue
      top = _stack[-1]
      names = " > ".join(p["name"] for p in _stack)
      line = f"{names}: {_elapsed(time.monotonic() - top['start'])}"
      if top["detail"]:
        line += f", {top['detail']}"
    say(line)


@contextlib.contextmanager
def phase(name: str, expected: str = "", *, every: float = EVERY_S) -> Iterator[None]:
  """Runs the body as a named phase: a start line (with `expected`, e.g. "about 14 min on 2
  cores"), heartbeats while it runs (one thread for the outermost phase), an end line."""
  say(f"{name}: started" + (f" (expected: {expected})" if expected else ""))
  start = time.monotonic()
  stop, thread = threading.Event(), None
  with _lock:
    outermost = not _stack
    _stack.append({"name": name, "start": start, "detail": ""})
  if outermost:
    thread = threading.Thread(target=_beat, args=(every, stop), daemon=True, name="progress")
    thread.start()
  ok = False
  try:
    yield
    ok = True
  finally:
    with _wake:
      _stack.pop()
      if thread is not None:
        stop.set()
        _wake.notify_all()
    if thread is not None:
      thread.join()
    say(f"{name}: {'done' if ok else 'stopped'} after {_elapsed(time.monotonic() - start)}")
