"""A digest of the code a cached artefact depends on, for cache keys that change when that code does.

Why: a cache key made of a config and a hand-bumped version string goes stale silently when someone
changes the build (a prompt format, a data generator, the trainer) and forgets to bump it; the cached
model is then reused for code it was not built by (issue 47, item 9). `source_digest(modules)` instead
hashes the source of `modules` and of every first-party module they import, directly or not
(`import_closure`), so any change to what the build can run changes the key.

What counts as a change: each file is parsed and hashed as its syntax tree with docstrings removed
(`normalized_source`), so comments, docstrings, blank lines and line breaks do not invalidate a build
(a 17-minute solver build should not rerun for a doc edit), while any change to code does. The closure
follows every `import` statement in a module, including imports inside functions, and is limited to
the first-party `packages`: third-party code is pinned by constraints.txt, not hashed here.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
from collections.abc import Sequence

FIRST_PARTY = ("kace", "lm", "dpa_grpo")

_PARSED: dict[str, str] = {}  # sha256 of a file's bytes -> its normalized source


def module_file(name: str, search_path: Sequence[str] | None = None) -> str | None:
  """The source file of module `name` ("kace.testbed" -> .../kace/testbed.py; a package gives its
  __init__.py), found on `search_path` (default `sys.path`) without importing it; None if absent."""
  parts = name.split(".")
  for root in sys.path if search_path is None else search_path:
    base = os.path.join(root or os.getcwd(), *parts)
    for path in (base + ".py", os.path.join(base, "__init__.py")):
      if os.path.isfile(path):
        return os.path.abspath(path)
  return None


def _imports(tree: ast.AST, name: str, is_package: bool) -> set[str]:
  """Module names `tree` (the source of module `name`) may import: `import a.b` gives a.b (and its
  parent a), `from a import b` gives a and a.b (b may be a module or a name in a; `import_closure`
  keeps only those with a file); relative imports are resolved against `name`."""
  package = name if is_package else name.rpartition(".")[0]
  out: set[str] = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        parts = alias.name.split(".")
        out.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join(anchor + ([node.module] if node.module else []))
      else:
        base = node.module or ""
      if base:
        out.add(base)
      out.update(f"{base}.{alias.name}" if base else alias.name for alias in node.names)
  return out


_IMPORTS: dict[tuple[str, str], frozenset[str]] = {}  # (sha256 of the bytes, module name) -> imports


def _module_imports(path: str, name: str) -> frozenset[str]:
  """`_imports` of the file at `path` as module `name`, parsed once per content."""
  with open(path, "rb") as f:
    raw = f.read()
  key = (hashlib.sha256(raw).hexdigest(), name)
  if key not in _IMPORTS:
    _IMPORTS[key] = frozenset(_imports(ast.parse(raw, filename=path), name, path.endswith("__init__.py")))
  return _IMPORTS[key]


def normalized_source(path: str) -> str:
  """`path`'s syntax tree without docstrings or positions (`ast.dump`): equal for two files that
  differ only in comments, docstrings and layout."""
  with open(path, "rb") as f:
    raw = f.read()
  key = hashlib.sha256(raw).hexdigest()
  if key not in _PARSED:
    tree = ast.parse(raw, filename=path)
    for node in ast.walk(tree):
      body = getattr(node, "body", None)
      if (
        isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
      ):
        node.body = body[1:] or [ast.Pass()]
    _PARSED[key] = ast.dump(tree, include_attributes=False)
  return _PARSED[key]


def import_closure(
  modules: Sequence[str], packages: Sequence[str] = FIRST_PARTY, search_path: Sequence[str] | None = None
) -> dict[str, str]:
  """{module name: source file} of `modules` and every module of `packages` they import, directly or
  through others, sorted by name. A module of `modules` that has no file fails, naming it."""
  found: dict[str, str] = {}
  todo = list(modules)
  for name in modules:
    if module_file(name, search_path) is None:
      raise ValueError(f"no source file for module {name!r} on the search path")
  while todo:
    name = todo.pop()
    if name in found or name.split(".")[0] not in packages:
      continue
    path = module_file(name, search_path)
    if path is None:  # `from a import b` where b is a name in a, not a module
      continue
    found[name] = path
    todo.extend(_module_imports(path, name))
  return dict(sorted(found.items()))


def source_digest(
  modules: Sequence[str], packages: Sequence[str] = FIRST_PARTY, search_path: Sequence[str] | None = None
) -> str:
  """sha256 (hex) over the module names and normalized sources of `import_closure(modules)`."""
  h = hashlib.sha256()
  for name, path in import_closure(modules, packages, search_path).items():
    h.update(f"{name}\n{normalized_source(path)}\n".encode())
  return h.hexdigest()


def cache_key(config_json: str, modules: Sequence[str], packages: Sequence[str] = FIRST_PARTY) -> str:
  """A 12-hex-digit cache key of an artefact built by `modules` from a config (its JSON, with every
  data-generation parameter in it): changes with the config and with the code, nothing else."""
  blob = config_json + "\n" + source_digest(modules, packages)
  return hashlib.sha256(blob.encode()).hexdigest()[:12]
