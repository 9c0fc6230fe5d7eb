"""lm.code_digest: a cache key follows the code an artefact's build imports, and nothing else."""

import pytest

from kace import learned_teacher, synthetic
from lm import code_digest


def _package(root):
  """pkg/a.py imports pkg.b (inside a function, as a lazy import) and pkg.b imports pkg.c relatively;
  pkg/unrelated.py is imported by none of them."""
  pkg = root / "pkg"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "a.py").write_text('"""A."""\n\ndef f():\n  from pkg import b\n  return b.g()\n')
  (pkg / "b.py").write_text('"""B."""\nfrom . import c\n\ndef g():\n  """Doc."""\n  return c.K + 1\n')
  (pkg / "c.py").write_text("K = 1\n")
  (pkg / "unrelated.py").write_text("Z = 0\n")
  return pkg


def test_key_changes_with_a_dependency_and_not_with_an_unrelated_file_or_a_docstring(tmp_path):
  pkg = _package(tmp_path)
  digest = lambda: code_digest.source_digest(["pkg.a"], packages=("pkg",), search_path=[str(tmp_path)])
  closure = code_digest.import_closure(["pkg.a"], packages=("pkg",), search_path=[str(tmp_path)])
  assert list(closure) == ["pkg", "pkg.a", "pkg.b", "pkg.c"]
  before = digest()
  (pkg / "unrelated.py").write_text("Z = 1  # changed\n")
  assert digest() == before
  reworded = '"""B, reworded."""\nfrom . import c\n\n\ndef g():  # a comment\n  return c.K + 1\n'
  (pkg / "b.py").write_text(reworded)
  assert digest() == before  # docstrings, comments and layout are not code
  (pkg / "c.py").write_text("K = 2\n")  # reached only through b's relative import
  assert digest() != before


def test_solver_keys_follow_config_and_code():
  closure = code_digest.import_closure(synthetic.BUILD_MODULES)
  assert {"kace.synthetic", "kace.testbed", "lm.sft", "lm.model", "lm.tokenizer"} <= set(closure)
  assert "kace.methods" not in closure and "kace.evaluate" not in closure
  base = synthetic.TestbedSolverConfig()
  assert base.key() != synthetic.TestbedSolverConfig(variant="conflict").key()
  assert base.key() != synthetic.TinySolverConfig().key() != learned_teacher.LearnedTeacherConfig().key()
  with pytest.raises(ValueError, match="no source file for module 'kace.nope'"):
    code_digest.source_digest(["kace.nope"])


def test_no_import_cycle_between_kace_config_and_kace_methods():
  """A static check of the import graph (every import statement, in-function ones included, followed
  transitively): kace.config imports kace.methods, and nothing kace.methods imports leads back."""
  assert "kace.methods" in code_digest.import_closure(["kace.config"])
  assert "kace.config" not in code_digest.import_closure(["kace.methods"])
