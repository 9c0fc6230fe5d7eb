"""Benchmark loaders — AIME 2025, MATH levels 4–5, OlymMATH-EN — from local files or the hub.

Every loader takes a `source`: a .jsonl / .json / .parquet file, a directory of such files (read
recursively, sorted), a `datasets.save_to_disk` directory, or a hub dataset name ("owner/name"),
which is fetched with `huggingface_hub.snapshot_download` and then read as a directory. Parquet
is read with `pyarrow` (pinned in setup.py); `save_to_disk` directories need `datasets`, which is
not in the pinned stack, and fail with an error saying so. Layouts and the verifiable subset are
documented in docs/kace.md ("Benchmarks").
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import os
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kace import answers

_log = logging.getLogger(__name__)

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
_HUB_NAME_RE = re.compile(r"[\w.-]+/[\w.-]+")
_SAVE_TO_DISK_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")

# The one table from dataset subject labels (lower-cased) to the tree's coarse domains
# (kace.cards.DEFAULT_DOMAINS). Precalculus (trigonometry, complex numbers, vectors) goes to algebra:
# its methods are algebraic manipulation, and a fifth domain would split scarce failed traces.
DOMAIN_OF_SUBJECT = {
  "algebra": "algebra",
  "intermediate algebra": "algebra",
  "prealgebra": "algebra",
  "precalculus": "algebra",
  "geometry": "geometry",
  "combinatorics": "combinatorics",
  "counting & probability": "combinatorics",
  "counting and probability": "combinatorics",
  "probability": "combinatorics",
  "number theory": "number_theory",
}


def domain_of(subject: str | None) -> str | None:
  """The coarse domain of a dataset subject label, or None when unlabelled or unknown."""
  if not subject:
    return None
  return DOMAIN_OF_SUBJECT.get(subject.strip().lower().replace("_", " "))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Problem:
  """A benchmark problem; `answer` is the gold final answer as a LaTeX-ish string."""

  id: str
  question: str
  answer: str
  source: str  # benchmark and file, e.g. "AIME2025", "MATH", "OlymMATH-EN-HARD"
  subject: str | None = None  # the dataset's own label, verbatim
  domain: str | None = None  # `subject` mapped by DOMAIN_OF_SUBJECT; None: classify later
  level: int | None = None  # MATH level 1-5; None elsewhere and for MATH "Level ?"


class DataSourceError(ValueError):
  """A source cannot be read; the message names the file, row or hub dataset."""


@dataclasses.dataclass(frozen=True)
class Row:
  """A raw record and where it came from: `origin` is "relative/file/stem" plus ":line" for files
  holding several records, unique within one source."""

  origin: str
  stem: str
  fields: dict[str, Any]


# ---- reading sources -------------------------------------------------------------------------------


def read_rows(source: str | os.PathLike, pattern: str = "*") -> list[Row]:
  """Raw records of a source; in directories only files whose relative path matches `pattern`."""
  path = Path(source)
  if path.is_file():
    return _read_file(path, path.stem)
  if path.is_dir():
    if any((path / m).exists() for m in _SAVE_TO_DISK_MARKERS):
      return _read_saved_dataset(path)
    files = sorted(
      p
      for p in path.rglob("*")
      if p.suffix in DATA_SUFFIXES and fnmatch.fnmatch(p.relative_to(path).as_posix(), pattern)
    )
    if not files:
      raise DataSourceError(f"{path}: no {'/'.join(DATA_SUFFIXES)} files matching {pattern!r}")
    return [row for f in files for row in _read_file(f, f.relative_to(path).with_suffix("").as_posix())]
  if _HUB_NAME_RE.fullmatch(os.fspath(source)):
    return read_rows(_download(os.fspath(source)), pattern)
  raise DataSourceError(f"{source}: no such file or directory (and not a hub name owner/name)")


def _download(name: str) -> str:
  """A local snapshot of hub dataset `name`; a clear error when the hub cannot be reached."""
  try:
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id=name, repo_type="dataset")
  except Exception as e:  # noqa: BLE001 - offline, unknown repo, auth: all mean "use a local copy"
    raise DataSourceError(
      f"could not fetch dataset {name!r} from the Hugging Face hub ({type(e).__name__}: {str(e)[:200]}); "
      "download it where the hub is reachable and pass its local path"
    ) from None


def _read_file(path: Path, stem: str) -> list[Row]:
  if path.suffix == ".jsonl":
    records = []
    with open(path, encoding="utf-8") as f:
      for i, line in enumerate(f, 1):
        if line.strip():
          try:
            records.append(json.loads(line))
          except json.JSONDecodeError as e:
            raise DataSourceError(f"{path}:{i}: not valid JSON ({e})") from None
  elif path.suffix == ".json":
    try:
      records = _json_records(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, DataSourceError) as e:
      raise DataSourceError(f"{path}: {e}") from None
  elif path.suffix == ".parquet":
    records = _parquet_records(path)
  else:
    raise DataSourceError(f"{path}: unsupported file type (expected {', '.join(DATA_SUFFIXES)})")
  for i, r in enumerate(records):
    if not isinstance(r, dict):
      raise DataSourceError(f"{path}: record {i + 1} is a {type(r).__name__}, not an object")
  if len(records) == 1:
    return [Row(stem, stem, records[0])]
  return [Row(f"{stem}:{i}", stem, r) for i, r in enumerate(records, 1)]


def _json_records(obj: Any) -> list[Any]:
  """A .json file holds a list of records, one record (Hendrycks MATH: one problem per file), or
  an object with exactly one list of records (e.g. {"data": [...]})."""
  if isinstance(obj, list):
    return obj
  if isinstance(obj, dict):
    lists = [v for v in obj.values() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
    if len(lists) == 1 and not {"problem", "question"} & obj.keys():
      return lists[0]
    return [obj]
  raise DataSourceError(f"expected a list or an object, got {type(obj).__name__}")


def _parquet_records(path: Path) -> list[dict[str, Any]]:
  try:
    import pyarrow.parquet as pq
  except ImportError:
    raise DataSourceError(
      f"{path}: reading parquet needs pyarrow (or `datasets`), and neither is installed; "
      "convert the file to jsonl or install pyarrow"
    ) from None
  return pq.read_table(path).to_pylist()


def _read_saved_dataset(path: Path) -> list[Row]:
  try:
    import datasets
  except ImportError:
    raise DataSourceError(
      f"{path} is a `datasets.save_to_disk` directory, but `datasets` is not installed"
    ) from None
  loaded = datasets.load_from_disk(os.fspath(path))
  splits = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [(path.name, loaded)]
  return [Row(f"{name}:{i}", name, dict(r)) for name, ds in splits for i, r in enumerate(ds, 1)]


def _field(row: Row, *names: str) -> Any:
  for name in names:
    if row.fields.get(name) is not None:
      return row.fields[name]
  raise DataSourceError(f"{row.origin}: none of the fields {names} (has {sorted(row.fields)})")


def _row_id(row: Row, prefix: str) -> str:
  """The dataset's own id (unique_id / id / problem_idx) when present, else the row's origin."""
  for name in ("unique_id", "id"):
    if row.fields.get(name) is not None:
      return str(row.fields[name])
  if row.fields.get("problem_idx") is not None:
    return f"{prefix}-{row.fields['problem_idx']}"
  return f"{prefix}/{row.origin}"


def _unique(problems: list[Problem], source: Any) -> list[Problem]:
  """`problems`, checked to be non-empty (an empty benchmark would score NaN) and without repeated ids."""
  if not problems:
    raise DataSourceError(
      f"{source}: no problems (the file is empty, or every row was filtered out); an evaluation "
      "over no problems has no metrics"
    )
  seen: set[str] = set()
  for p in problems:
    if p.id in seen:
      raise DataSourceError(f"{source}: duplicate problem id {p.id!r}")
    seen.add(p.id)
  return problems


# ---- benchmarks ------------------------------------------------------------------------------------


def load_aime2025(source: str | os.PathLike = "opencompass/AIME2025") -> list[Problem]:
  """AIME 2025 I and II: the opencompass layout (question, answer; files per config AIME2025-I /
  AIME2025-II) or the MathArena layout (problem_idx, problem, answer). No domain labels."""
  problems = [
    Problem(
      id=_row_id(r, "aime2025"),
      question=str(_field(r, "question", "problem")),
      answer=str(_field(r, "answer")).strip(),
      source="AIME2025",
    )
    for r in read_rows(source)
  ]
  return _unique(problems, source)


def parse_level(level: Any) -> int | None:
  """MATH's "Level 4" → 4; "Level ?" and anything unreadable → None."""
  match = re.fullmatch(r"\s*(?:level\s*)?(\d+)\s*", str(level), re.IGNORECASE)
  return int(match.group(1)) if match else None


def load_math(
  source: str | os.PathLike = "EleutherAI/hendrycks_math",
  levels: Sequence[int] | None = (4, 5),
  pattern: str = "*",
) -> list[Problem]:
  """MATH (Hendrycks layout: problem, level "Level N", type, solution), keeping `levels`.

  The gold answer is the row's `answer` field when present (MATH-500 style), else the last
  `\\boxed{}` of the solution; rows with neither are dropped and counted in a warning. "Level ?"
  rows have level None and are dropped by any level filter (levels=None keeps every row). Point
  `source` at the test split (e.g. `MATH/test`), or select it with `pattern` (e.g. "*test*").
  """
  problems, unboxed = [], 0
  for r in read_rows(source, pattern):
    level = parse_level(r.fields.get("level"))
    if levels is not None and level not in levels:
      continue
    answer = r.fields.get("answer") or answers.last_boxed(str(_field(r, "solution")))
    if not answer:
      unboxed += 1
      continue
    subject = r.fields.get("type") or r.fields.get("subject")
    problems.append(
      Problem(
        id=_row_id(r, "math"),
        question=str(_field(r, "problem")),
        answer=str(answer),
        source="MATH",
        subject=subject,
        domain=domain_of(subject),
        level=level,
      )
    )
  if unboxed:
    _log.warning("%s: dropped %d MATH rows whose solution has no \\boxed{} answer", source, unboxed)
  return _unique(problems, source)


OLYMMATH_EN = ("EN-EASY", "EN-HARD")


def load_olymmath(source: str | os.PathLike, splits: Iterable[str] = OLYMMATH_EN) -> list[Problem]:
  """OlymMATH (jsonl: problem, answer, subject, unique_id), from the files `OlymMATH-<split>.jsonl`
  of a directory (or one such file). `source` records the file, e.g. "OlymMATH-EN-HARD"."""
  path = Path(source)
  if path.is_file():
    rows = read_rows(path)
  else:
    rows = [r for split in splits for r in read_rows(source, f"*OlymMATH-{split}.jsonl")]
  problems = []
  for r in rows:
    subject = r.fields.get("subject")
    question, answer = str(_field(r, "problem")), str(_field(r, "answer"))
    problems.append(
      Problem(
        id=_row_id(r, "olymmath"),
        question=question,
        answer=answer,
        source=Path(r.stem).name,
        subject=subject,
        domain=domain_of(subject),
      )
    )
  return _unique(problems, source)


def verifiable(problems: Sequence[Problem], grader: answers.Grader) -> list[Problem]:
  """The verifiable subset: problems whose gold answer math-verify can check.

  A gold answer is verifiable when, within the grader's time bound, math-verify parses it (as
  `$answer$`) (1) into a SymPy object — a number, closed-form constant, interval, set or tuple —
  (2) from the whole answer (its matched text equals the answer up to `normalize_answer`, so no
  fragment such as one root of "x=3 or x=5" stands in for it), (3) with no free symbols (a definite
  value, not text, units or an expression in unknowns), and (4) that object verifies against
  itself. Anything else — and any timeout — is excluded: a correct solution could not be recognised.
  """
  flags = grader.verifiable_many([p.answer for p in problems])
  return [p for p, ok in zip(problems, flags, strict=True) if ok]


def train_test_split(
  problems: Sequence[Problem], test_fraction: float, seed: int
) -> tuple[list[Problem], list[Problem]]:
  """Deterministic split by seed, independent of input order (problems are ordered by id first).

  Returns (train, test), each in id order; test has round(len * test_fraction) problems.
  """
  if not 0 <= test_fraction <= 1:
    raise ValueError(f"test_fraction must be in [0, 1], got {test_fraction}")
  ordered = sorted(problems, key=lambda p: p.id)
  shuffled = list(ordered)
  random.Random(seed).shuffle(shuffled)
  test_ids = {p.id for p in shuffled[: round(len(ordered) * test_fraction)]}
  return [p for p in ordered if p.id not in test_ids], [p for p in ordered if p.id in test_ids]
