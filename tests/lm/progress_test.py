"""lm.progress: a phase prints a start line, heartbeats with the latest note while it runs, an end line."""

import time

import pytest

from lm import progress


def test_a_phase_beats_with_its_latest_note_and_says_how_it_ended(capsys):
  with progress.phase("build", "about 1 min", every=0.05):
    progress.note("step 3/10")
    time.sleep(0.3)
    with progress.phase("inner", every=0.05):  # nested: the outer thread reports the innermost
      progress.note("row 1")
      time.sleep(0.2)
  lines = capsys.readouterr().err.splitlines()
  assert lines[0].endswith("build: started (expected: about 1 min)")
  assert any(line.endswith(", step 3/10") and "build: " in line for line in lines)
  assert any("build > inner: " in line and line.endswith(", row 1") for line in lines)
  assert "inner: done after" in lines[-2] and "build: done after" in lines[-1]
  with pytest.raises(KeyError), progress.phase("fails", every=10):
    raise KeyError("x")
  assert "fails: stopped after" in capsys.readouterr().err.splitlines()[-1]
  progress.note("outside any phase")  # records nothing, prints nothing
  assert capsys.readouterr().err == ""
