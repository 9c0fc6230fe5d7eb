"""Files of a run directory: atomic JSON writes, append-only JSONL logs, the resolved config.

Every run directory in this project (KACE evaluations and tree builds, DPA-GRPO training, theory
runs, sweeps) is written through these helpers so that a process killed at any instant leaves
either the old or the new version of a file, never a torn one, and a resumed run can trust what
it reads back.

On several hosts (docs/multihost.md) one process writes the run directory's logs: `append_jsonl` and
`repair_jsonl` do nothing on the others (`is_writer`), and callers write reports, plots and exports
only `if rundir.is_writer()`. Files a process reads back after writing them (a fitted tokenizer, a
cached build) are written by every process, atomically, with identical contents.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def is_writer() -> bool:
  """Whether this process writes run-directory files: JAX's process 0, or any process that has not
  started JAX's multi-host runtime (one host, a spawned worker). Imports nothing."""
  jax = sys.modules.get("jax")
  if jax is None or not jax.distributed.is_initialized():
    return True
  return jax.process_index() == 0


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
  """The parsed file; a truncated or garbled one is an error that names the file."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise ConfigFileError(f"{os.fspath(path)} is not valid JSON ({len(text)} chars): {e}") from e


def build_once(target: str | os.PathLike, build: Callable[[str], Any], marker: str) -> str:
  """`target`, built once: `build(staging)` fills a fresh sibling directory, which is then renamed
  into place, so a killed build leaves nothing that looks finished and two processes building the
  same target publish one of their identical results. `marker` is the file a finished build writes
  last (its presence means done). Returns `target` as an absolute path."""
  target = os.path.abspath(os.path.expanduser(os.fspath(target)))
  if os.path.exists(os.path.join(target, marker)):
    return target
  os.makedirs(os.path.dirname(target), exist_ok=True)
  staging = tempfile.mkdtemp(dir=os.path.dirname(target), prefix=".building-")
  try:
    build(staging)
    if not os.path.exists(os.path.join(staging, marker)):
      raise RuntimeError(f"the build of {target} finished without writing {marker}")
    try:
      os.rename(staging, target)
    except OSError:  # another process published it first; theirs is identical
      if not os.path.exists(os.path.join(target, marker)):
        raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return target


def append_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> None:
  """Appends records, one JSON object per line, flushed and fsynced before returning.

  Appends of whole lines are what makes resumption simple: a kill can at worst leave a torn final
  line, which `read_jsonl` drops (and `repair_jsonl` truncates) instead of failing.
  """
  lines = "".join(json.dumps(r, ensure_ascii=False, default=_json_default) + "\n" for r in records)
  if not lines or not is_writer():
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
  if not os.path.exists(path) or not is_writer():
    return 0
  with open(path, "rb+") as f:
    data = f.read()
    if not data or data.endswith(b"\n"):
      return 0
    keep = data.rfind(b"\n") + 1
    f.truncate(keep)
    return len(data) - keep


class ConfigFileError(ValueError):
  """A run file that cannot be read (truncated JSON) or a config that does not match the run's."""


# Dotted config keys (fnmatch patterns) a rerun may change without mixing two experiments in one
# directory: how long to run and how often to log, evaluate or checkpoint, and how requests are
# transported. Anything else (a learning rate, a temperature, a seed, data) makes results that
# cannot be combined with the ones already there.
SAFE_CONFIG_KEYS = (
  "train.steps",
  "train.progress",
  "train.eval_every",
  "train.checkpoint_every",
  "train.keep_checkpoints",
  "train.export_hf",
  "*.max_concurrency",
  "*.max_retries",
  "*.timeout",
  "grader.workers",
  "testbed.workers",
  "sampler.max_rows",  # rows a sampler call: per-row keys give every sample alike in any batch
  "plan.*",  # KACE: the dry run and its assumptions, and the endpoint check (results do not depend on them)
)


def prepare_workdir(
  workdir: str | os.PathLike,
  config: Any,
  *,
  allow_changes: bool = False,
  safe_keys: tuple[str, ...] = SAFE_CONFIG_KEYS,
) -> str:
  """Creates the run directory and saves the resolved config there as `config.json`.

  `config` is an `ml_collections.ConfigDict` (or anything with `to_dict()`, or a dict). An
  existing directory is reused: runs resume from what they find in it, so a directory belongs to
  one resolved config once a run has written records there (`has_records`). A rerun whose config
  differs from the saved one in a key outside `safe_keys` raises `ConfigFileError` naming every
  differing key, unless `allow_changes`; then the old config is kept beside as `config.<n>.json`
  and a warning names the keys. A directory holding only its config (a start that stopped before
  writing anything) takes the new config without a question.
  """
  workdir = os.fspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  as_dict = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  as_dict = json.loads(json.dumps(as_dict, default=_json_default))  # as it reads back from disk
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path) and has_records(workdir):
    try:
      saved = read_json(path)
    except ConfigFileError as e:
      if not allow_changes:
        raise ConfigFileError(f"{e}; pass the flag that allows config changes to replace it") from e
      saved = None
    changed = sorted(_differences(saved, as_dict)) if isinstance(saved, dict) else ["<unreadable>"]
    unsafe = [k for k in changed if not any(fnmatch.fnmatchcase(k, p) for p in safe_keys)]
    if unsafe and not allow_changes:
      raise ConfigFileError(
        f"{workdir} holds a run of another config: {', '.join(unsafe)} differ from {path} "
        f"(only {', '.join(safe_keys)} may change on a rerun). Use a new --workdir, or allow "
        "config changes to resume this run under the new config."
      )
    if unsafe and is_writer():
      kept = _next_free(workdir)
      with open(path, "rb") as f:
        atomic_write_bytes(kept, f.read())
      logging.warning(
        "%s: config changed in %s; resuming under the new config (the old one is kept as %s)",
        workdir,
        ", ".join(unsafe),
        kept,
      )
  if is_writer():
    write_json(path, as_dict)
  return workdir


def has_records(workdir: str | os.PathLike) -> bool:
  """Whether a run wrote anything into `workdir` besides its config files (`config.json`,
  `config.<n>.json`) and hidden temporaries: metrics, records, checkpoints, a sub-run."""
  for name in os.listdir(workdir):
    if name.startswith(".") or name == "config.json" or fnmatch.fnmatchcase(name, "config.[0-9]*.json"):
      continue
    return True
  return False


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
  """Dotted keys whose values differ (added and removed keys included)."""
  if isinstance(old, dict) and isinstance(new, dict):
    keys = sorted(set(old) | set(new))
    return [
      d for k in keys for d in _differences(old.get(k, _MISSING), new.get(k, _MISSING), f"{prefix}{k}.")
    ]
  return [] if old == new else [prefix.rstrip(".")]


_MISSING = object()


def _next_free(workdir: str) -> str:
  n = 1
  while os.path.exists(os.path.join(workdir, f"config.{n}.json")):
    n += 1
  return os.path.join(workdir, f"config.{n}.json")


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
