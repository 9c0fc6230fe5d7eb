"""Answer extraction is linear in the response length and answers exactly as the regex rules did.

A degenerate sample (`\\boxed{` or `\\(` repeated 20,000 times) took minutes to extract from when
each unclosed box or math opener was rescanned to the end of the text. The cost is checked by
counting the Python lines executed over a size sweep (deterministic, unlike wall-clock), the
answers by comparison with the original definitions on fuzzed text.
"""

import re
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kace import answers

SIZES = (7_000, 14_000, 28_000, 56_000)  # characters, as measured before the fix
UNITS = ("\\boxed{", "\\fbox{", "\\(", "\\[", "$$x", "\\boxed 1 ", "answer: \\(", "{" * 3 + "\\boxed{")


def _lines_executed(fn, *args) -> int:
  """Lines of `kace.answers` that `fn(*args)` executes. Only that module's: a regular expression
  compiled on a cache miss (`re`'s cache is shared with every other test in the process, so a miss
  depends on the order the tests ran in) executes hundreds of lines of `re`'s own compiler, which
  once failed this test on a clean clone (counts [29, 40, 62, 345] for `\\boxed 1 `)."""
  count = 0

  def local(frame, event, arg):
    nonlocal count
    if event == "line":
      count += 1
    return local

  sys.settrace(lambda frame, event, arg: local if frame.f_code.co_filename == answers.__file__ else None)
  try:
    fn(*args)
  finally:
    sys.settrace(None)
  return count


@pytest.mark.parametrize("unit", UNITS)
def test_extraction_work_grows_linearly_with_the_text(unit):
  counts = [_lines_executed(answers.extract_answer, unit * (size // len(unit))) for size in SIZES]
  for smaller, larger in zip(counts, counts[1:], strict=False):
    assert larger <= 2.2 * smaller + 100, counts  # doubling the text at most doubles the work
  began = time.perf_counter()
  answers.extract_answer(unit * (56_000 // len(unit)))
  assert time.perf_counter() - began < 5.0  # safety net only: it took 22 s for `\boxed{` before


def _old_braced(text, start):
  depth, i = 0, start
  while i < len(text):
    ch = text[i]
    if ch == "\\":
      i += 2
      continue
    if ch == "{":
      depth += 1
    elif ch == "}":
      depth -= 1
      if depth == 0:
        return text[start + 1 : i]
    i += 1
  return None


def _old_last_boxed(text):
  """The definition before linearisation (rescans from every box)."""
  for match in reversed(list(answers._BOX_RE.finditer(text))):
    end = match.end()
    if end < len(text) and text[end] == "{":
      content = _old_braced(text, end)
    else:
      content = re.match(r"[^\s$]*", text[end:]).group(0)
    if content and content.strip():
      return content.strip()
  return None


_OLD_MATH_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_PIECES = [
  "\\boxed",
  "\\fbox",
  "\\",
  "{",
  "}",
  "$",
  "$$",
  "\\(",
  "\\)",
  "\\[",
  "\\]",
  " ",
  "\n",
  "a",
  "7",
  "x=",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=40).map("".join))
def test_linear_extraction_answers_as_the_original_rules(text):
  assert answers.last_boxed(text) == _old_last_boxed(text)
  old_spans = [next(g for g in m.groups() if g is not None) for m in _OLD_MATH_RE.finditer(text)]
  assert list(answers._math_spans(text)) == old_spans
