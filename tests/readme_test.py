"""The README's Python API example runs as written (in a temporary directory)."""

import pathlib
import re


def test_readme_python_example_runs(tmp_path, monkeypatch):
  readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
  code = re.findall(r"```python\n(.*?)```", readme, re.S)[0].replace("/tmp/", f"{tmp_path}/")
  namespace = {}
  exec(compile(code, "README.md", "exec"), namespace)
  assert namespace["logits"].shape == (1, 4, 256)
  assert len(namespace["out"].tokens[1][0]) <= 8
  assert (tmp_path / "tiny_qwen3_bf16" / "model.safetensors").exists()
