"""Files of a run directory: atomic JSON writes, append-only JSONL logs, the resolved config.

Every run directory in this project (KACE evaluations and tree builds, DPA-GRPO training, theory
runs, sweeps) is written through these helpers so that a process killed at any instant leaves
either the old or the new version of a file, never a torn one, and a resumed run can trust what
it reads back.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
  """Writes `data` to `path` via a temporary file in the same directory and an atomic rename."""
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
  atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> None:
  """Atomically writes `obj` as JSON (keys kept in insertion order)."""
  atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False, default=_json_default) + "\n")


def read_json(path: str | os.PathLike) -> Any:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def append_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> None:
  """Appends records, one JSON object per line, flushed and fsynced before returning.

  Appends of whole lines are what makes resumption simple: a kill can at worst leave a torn final
  line, which `read_jsonl` drops (and `repair_jsonl` truncates) instead of failing.
  """
  lines = "".join(json.dumps(r, ensure_ascii=False, default=_json_default) + "\n" for r in records)
  if not lines:
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "a", encoding="utf-8") as f:
    f.write(lines)
    f.flush()
    os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
  """Yields the complete records of a JSONL file; a torn final line (from a kill) is skipped."""
  if not os.path.exists(path):
    return
  with open(path, encoding="utf-8") as f:
    lines = f.readlines()
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      yield json.loads(line)
    except json.JSONDecodeError:
      if i == len(lines) - 1 and not line.endswith("\n"):
        return  # torn last line from an interrupted append
      raise ValueError(f"{path}: line {i + 1} is not valid JSON: {line[:200]!r}") from None


def repair_jsonl(path: str | os.PathLike) -> int:
  """Truncates a torn final line so later appends start on a fresh line. Returns bytes removed."""
  if not os.path.exists(path):
    return 0
  with open(path, "rb+") as f:
    data = f.read()
    if not data or data.endswith(b"\n"):
      return 0
    keep = data.rfind(b"\n") + 1
    f.truncate(keep)
    return len(data) - keep


def prepare_workdir(workdir: str | os.PathLike, config: Any) -> str:
  """Creates the run directory and saves the resolved config there as `config.json`.

  `config` is an `ml_collections.ConfigDict` (or anything with `to_dict()`, or a dict). An
  existing directory is reused: runs resume from what they find in it.
  """
  workdir = os.fspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  as_dict = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  write_json(os.path.join(workdir, "config.json"), as_dict)
  return workdir


def _json_default(obj: Any) -> Any:
  """Serialises numpy / jax scalars and arrays, tuples and dataclasses found in records."""
  import dataclasses

  import numpy as np

  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    return dataclasses.asdict(obj)
  if isinstance(obj, (np.generic,)):
    return obj.item()
  if hasattr(obj, "__array__"):
    return np.asarray(obj).tolist()
  if isinstance(obj, (set, frozenset)):
    return sorted(obj)
  raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")
