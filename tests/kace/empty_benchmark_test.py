"""An empty benchmark file is an error naming the file, not an evaluation with NaN metrics."""

import json

import pytest

from kace import data


@pytest.mark.parametrize(
  "name, content, load",
  [
    ("AIME2025-I.jsonl", "", data.load_aime2025),
    ("AIME2025-I.jsonl", "\n\n", data.load_aime2025),
    ("OlymMATH-EN-HARD.jsonl", "", data.load_olymmath),
    ("test.json", "[]", lambda p: data.load_math(p, levels=None)),
  ],
)
def test_an_empty_benchmark_file_is_an_error_naming_it(tmp_path, name, content, load):
  path = tmp_path / name
  path.write_text(content)
  with pytest.raises(data.DataSourceError, match=f"{path}: no problems"):
    load(path)


def test_a_level_filter_that_keeps_nothing_is_an_error_too(tmp_path):
  path = tmp_path / "p.json"
  path.write_text(
    json.dumps({"problem": "1+1?", "level": "Level 2", "type": "Algebra", "solution": "\\boxed{2}"})
  )
  assert [p.answer for p in data.load_math(path, levels=(2,))] == ["2"]
  with pytest.raises(data.DataSourceError, match="every row was filtered out"):
    data.load_math(path, levels=(5,))
