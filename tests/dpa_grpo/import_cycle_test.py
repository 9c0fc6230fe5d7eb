"""The DPA-GRPO testbed modules import one way: runner -> report -> theory -> shared definitions."""

import ast
import pathlib

import dpa_grpo

_PACKAGE = pathlib.Path(dpa_grpo.__file__).parent


def _imports(module: str) -> set[str]:
  """The dpa_grpo modules `module` imports anywhere in its body (function-level imports too)."""
  tree = ast.parse((_PACKAGE / f"{module}.py").read_text())
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module == "dpa_grpo":
      found |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dpa_grpo."):
      found.add(node.module.split(".")[1])
    elif isinstance(node, ast.Import):
      found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("dpa_grpo.")}
  return found


def test_testbed_modules_have_no_import_cycle():
  modules = ("testbed", "testbed_report", "testbed_theory", "testbed_arms")
  graph = {m: _imports(m) & set(modules) for m in modules}
  assert graph["testbed_arms"] == set()
  assert "testbed" not in graph["testbed_report"] | graph["testbed_theory"]

  def reaches(start, target, seen=()):
    return any(n == target or (n not in seen and reaches(n, target, (*seen, n))) for n in graph[start])

  assert not [m for m in modules if reaches(m, m)], graph
