"""One math-verify grader (worker subprocesses) shared by the whole KACE test session."""

import pytest

from kace import answers


@pytest.fixture(scope="session")
def grader():
  with answers.Grader(workers=2, timeout_s=10.0) as g:
    yield g
