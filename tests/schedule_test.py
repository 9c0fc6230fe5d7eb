"""The suite's longest-first schedule (tests/conftest.py) names tests that exist: a renamed test
left in the table loses its early start silently (two did, and ran last on one worker)."""

import importlib

from tests import conftest


def test_every_test_in_the_longest_first_table_exists():
  for test_id in conftest._SLOWEST:
    path, name = test_id.split("::")
    module = importlib.import_module("tests." + path.removesuffix(".py").replace("/", "."))
    assert callable(getattr(module, name.split("[")[0], None)), test_id
