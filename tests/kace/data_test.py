"""Benchmark loaders on the real OlymMATH files and on tiny AIME / MATH files written here."""

import json
from pathlib import Path

import pytest

from kace import cards, data
from kace.data import DataSourceError, Problem

OLYMMATH = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "olymmath"


def write_jsonl(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


@pytest.fixture(scope="module")
def olymmath():
  if not OLYMMATH.is_dir():
    pytest.skip(f"OlymMATH copy not found at {OLYMMATH.resolve()} (shared data directory absent)")
  return data.load_olymmath(OLYMMATH)


def test_olymmath_loads_both_english_splits(olymmath):
  assert len(olymmath) == 200 and len({p.id for p in olymmath}) == 200
  by_split = {s: [p for p in olymmath if p.source == f"OlymMATH-{s}"] for s in data.OLYMMATH_EN}
  assert [len(v) for v in by_split.values()] == [100, 100]
  first = by_split["EN-EASY"][0]
  assert (first.id, first.answer, first.subject, first.domain) == (
    "OlymMATH-EASY-0-EN",
    "948",
    "Combinatorics",
    "combinatorics",
  )
  assert {p.domain for p in olymmath} == set(cards.DEFAULT_DOMAINS)
  assert all(p.question and p.answer for p in olymmath)
  assert data.load_olymmath(OLYMMATH, splits=["EN-HARD"]) == by_split["EN-HARD"]
  assert data.load_olymmath(OLYMMATH / "OlymMATH-EN-EASY.jsonl") == by_split["EN-EASY"]


def test_verifiable_subset(olymmath, grader):
  sample = olymmath[:8] + olymmath[100:108]
  unverifiable = [
    Problem(id=f"bad-{i}", question="q", answer=answer, source="made-up")
    for i, answer in enumerate([r"\text{no solution}", r"x=3 \text{ or } x=5", "x^2+1", r"5\text{ cm}", ""])
  ]
  assert data.verifiable(sample + unverifiable, grader) == sample


def test_aime_opencompass_layout(tmp_path):
  rows = [{"question": f"Q{i}", "answer": str(i)} for i in (1, 2)]
  write_jsonl(tmp_path / "aime2025-I.jsonl", rows)
  write_jsonl(tmp_path / "aime2025-II.jsonl", rows)
  problems = data.load_aime2025(tmp_path)
  assert [p.id for p in problems] == [
    "aime2025/aime2025-I:1",
    "aime2025/aime2025-I:2",
    "aime2025/aime2025-II:1",
    "aime2025/aime2025-II:2",
  ]
  assert problems[2] == Problem(id="aime2025/aime2025-II:1", question="Q1", answer="1", source="AIME2025")


def test_aime_matharena_layout(tmp_path):
  rows = [
    {"problem_idx": 1, "problem": "Find it.", "answer": 70},
    {"problem_idx": 2, "problem": "P2", "answer": 588},
  ]
  problems = data.load_aime2025(write_jsonl(tmp_path / "test.jsonl", rows))
  assert problems == [
    Problem(id="aime2025-1", question="Find it.", answer="70", source="AIME2025"),
    Problem(id="aime2025-2", question="P2", answer="588", source="AIME2025"),
  ]


def write_math(root):
  """Hendrycks layout: one JSON file per problem under <split>/<subject>/."""
  rows = {
    "test/algebra/1.json": dict(level="Level 5", type="Algebra", solution=r"so $\boxed{\frac{1}{2}}$"),
    "test/algebra/2.json": dict(level="Level 3", type="Algebra", solution=r"\boxed{3}"),
    "test/counting_and_probability/7.json": dict(
      level="Level 4", type="Counting & Probability", solution=r"\boxed{\{1,2\}} then \boxed{\dbinom{5}{2}}"
    ),
    "test/geometry/9.json": dict(level="Level ?", type="Geometry", solution=r"\boxed{9}"),
    "test/precalculus/4.json": dict(level="Level 5", type="Precalculus", solution="no box here"),
    "train/algebra/5.json": dict(level="Level 5", type="Algebra", solution=r"\boxed{5}"),
  }
  for rel, row in rows.items():
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(json.dumps(dict(problem=f"problem {rel}", **row)))


def test_math_hendrycks_layout_levels_and_boxed_answers(tmp_path):
  write_math(tmp_path)
  problems = data.load_math(tmp_path, pattern="test/*")
  assert [(p.id, p.answer, p.level, p.domain) for p in problems] == [
    ("math/test/algebra/1", r"\frac{1}{2}", 5, "algebra"),
    ("math/test/counting_and_probability/7", r"\dbinom{5}{2}", 4, "combinatorics"),
  ]  # level 3, "Level ?", the unboxed solution and the train split are dropped
  all_levels = data.load_math(tmp_path / "test", levels=None)
  assert {p.level for p in all_levels} == {3, 4, 5, None} and len(all_levels) == 4
  assert data.parse_level("Level ?") is None and data.parse_level("level 4") == 4


def test_math_jsonl_with_answer_field(tmp_path):
  rows = [
    dict(problem="p", solution="s", answer="7", level=5, type="Number Theory", unique_id="test/nt/1.json")
  ]
  (p,) = data.load_math(write_jsonl(tmp_path / "math500.jsonl", rows))
  assert (p.id, p.answer, p.level, p.domain) == ("test/nt/1.json", "7", 5, "number_theory")


def test_json_file_with_a_list_under_one_key(tmp_path):
  path = tmp_path / "aime.json"
  path.write_text(
    json.dumps({"data": [{"question": "q1", "answer": "1"}, {"question": "q2", "answer": "2"}]})
  )
  assert [p.id for p in data.load_aime2025(path)] == ["aime2025/aime:1", "aime2025/aime:2"]


def test_parquet_needs_pyarrow(tmp_path):
  try:
    import pyarrow as pa
    import pyarrow.parquet as pq
  except ImportError:
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(DataSourceError, match="x.parquet: reading parquet needs pyarrow"):
      data.load_aime2025(tmp_path / "x.parquet")
  else:
    pq.write_table(
      pa.Table.from_pylist([{"problem": "q", "answer": 5}, {"problem": "r", "answer": 6}]),
      tmp_path / "x.parquet",
    )
    assert [p.answer for p in data.load_aime2025(tmp_path / "x.parquet")] == ["5", "6"]


@pytest.mark.parametrize(
  "setup, message",
  [
    (lambda d: d / "missing.jsonl", "missing.jsonl: no such file or directory"),
    (
      lambda d: (d / "bad.jsonl").write_text('{"question": "q"}\n{oops\n') and d / "bad.jsonl",
      r"bad.jsonl:2: not valid JSON",
    ),
    (
      lambda d: write_jsonl(d / "f.jsonl", [{"question": "q"}, {"question": "r"}]),
      r"f:1: none of the fields \('answer',\)",
    ),
    (
      lambda d: write_jsonl(d / "dup.jsonl", [{"id": "a", "question": "q", "answer": "1"}] * 2),
      "duplicate problem id 'a'",
    ),
    (lambda d: write_jsonl(d / "n.jsonl", [[1, 2], [3]]), "record 1 is a list"),
  ],
)
def test_source_errors_name_the_problem(tmp_path, setup, message):
  with pytest.raises(DataSourceError, match=message):
    data.load_aime2025(setup(tmp_path))


def test_empty_directory_and_unreachable_hub(tmp_path):
  with pytest.raises(DataSourceError, match="no .* files matching"):
    data.load_aime2025(tmp_path)
  with pytest.raises(
    DataSourceError, match="could not fetch dataset 'no-such-owner/no-such-set'.*local path"
  ):
    data.load_aime2025("no-such-owner/no-such-set")  # tests run with HF_HUB_OFFLINE=1


def test_domain_table_targets_the_tree_domains():
  assert set(data.DOMAIN_OF_SUBJECT.values()) <= set(cards.DEFAULT_DOMAINS)
  assert (
    data.domain_of("Number_Theory") == "number_theory"
    and data.domain_of("Counting & Probability") == "combinatorics"
  )
  assert data.domain_of("Topology") is None and data.domain_of(None) is None


def test_train_test_split_is_deterministic_disjoint_and_order_free():
  problems = [Problem(id=f"p{i:02d}", question="q", answer="1", source="s") for i in range(20)]
  train, test = data.train_test_split(problems, 0.25, seed=3)
  assert len(test) == 5 and len(train) == 15 and not {p.id for p in train} & {p.id for p in test}
  assert data.train_test_split(problems[::-1], 0.25, seed=3) == (train, test)
  assert data.train_test_split(problems, 0.25, seed=4)[1] != test
  with pytest.raises(ValueError, match="test_fraction"):
    data.train_test_split(problems, 1.5, seed=0)
