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


# Every `python -m launch...` command in README.md (code blocks and inline code) and the test that
# runs it: as written, or at smoke size by override when the command itself runs for minutes. A
# command no CPU test can run (a real checkpoint, a server, a GPU) says why instead. A new README
# command without an entry fails `test_every_readme_command_is_run_by_a_test`.
_RUNS = "tests/launch/readme_commands_test.py::"
# The tiny DPA-GRPO preset as the README writes it: the one-process leg of the two-process test.
_TINY = (
  "tests/multihost/two_process_test.py::test_dpa_grpo_two_processes_killed_and_resumed_match_one_process"
)
COMMANDS = {
  "python -m launch.main --workdir=runs/main":
    "tests/launch/main_test.py::test_the_main_job_at_smoke_size_reports_both_parts_stopped_at_their_gates",
  "python -m launch.kace_eval --workdir=runs/kace_cpu":
    "tests/kace/evaluate_test.py::test_a_killed_run_resumes_without_solving_anything_twice",
  "python -m launch.kace_eval --config=configs/kace.py:qwen3_4b --workdir=runs/math "
  "--config.roles.solver.checkpoint=/models/Qwen3-4B --config.roles.teacher.checkpoint=/models/Qwen3-32B "
  "--config.roles.curator.checkpoint=/models/Qwen3-32B --config.data.source=/data/MATH":
    "not CPU: Qwen3-4B and Qwen3-32B checkpoints and the MATH data",
  "python -m launch.kace_build --config=configs/kace.py:openai --workdir=runs/aime_build "
  "--config.data.source=/data/aime2025.jsonl --config.data.train_source=/data/MATH "
  "'--config.methods=(\"kace\",)'":
    "not CPU: served Qwen3-4B and Qwen3-32B and MATH (the preset at tiny size against lm.server: "
    "tests/kace/endpoint_test.py)",
  "python -m launch.kace_eval --config=configs/kace.py:openai --workdir=runs/aime "
  "--config.data.source=/data/aime2025.jsonl --config.learn.dir=runs/aime_build":
    "not CPU: an OpenAI-compatible server with Qwen3-4B (the preset at tiny size against lm.server: "
    "tests/kace/endpoint_test.py)",
  "python -m launch.dpa_grpo --config=configs/dpa_grpo.py:qwen3_4b --workdir=/runs/4b_vllm "
  "--config.model.checkpoint=/models/Qwen3-4B --config.rollout.engine=openai "
  "--config.rollout.engine_url=http://127.0.0.1:8000/v1":
    "not CPU: Qwen3-4B behind vLLM (the tiny preset against lm.server: tests/dpa_grpo/engine_test.py)",
  "python -m launch.kace_build --workdir=runs/kace_build '--config.methods=(\"kace\",)'":
    _RUNS + "test_kace_build_and_table_smoke_runs",
  "python -m launch.kace_table --workdir=runs/kace_table": _RUNS + "test_kace_build_and_table_smoke_runs",
  "python -m launch.kace_v3 --workdir=runs/kace_v3":
    "tests/kace/v3_run_test.py::test_the_launcher_as_the_readme_writes_it_stops_at_the_gates_at_smoke_size",
  "python -m launch.kace_testbed --workdir=runs/kace_testbed":
    "tests/kace/testbed_pipeline_test.py::test_the_launcher_refuses_a_solver_that_fails_its_gates",
  "python -m launch.dpa_testbed --workdir=runs/dpa_testbed":
    "tests/dpa_grpo/testbed_test.py::test_the_launcher_as_the_readme_writes_it_stops_at_the_gates_at_smoke_size",
  "python -m launch.dpa_grpo --workdir=runs/dpa_grpo": _TINY,
  "python -m launch.dpa_grpo --config=configs/dpa_grpo.py:tiny --workdir=runs/dpa_tiny": _TINY,
  "python -m launch.dpa_grpo --config=configs/dpa_grpo.py:qwen3_4b --workdir=/runs/4b "
  "--config.model.checkpoint=/models/Qwen3-4B "
  "--config.data.root=/data/tax-calc-bench/tax_calc_bench/ty24/test_data":
    "not CPU: a Qwen3-4B checkpoint and TaxCalcBench on accelerators",
  "python -m launch.dpa_grpo --config=configs/dpa_grpo.py:qwen3_8b_grpo --workdir=/runs/8b_grpo ...":
    "not CPU: a Qwen3-8B checkpoint on accelerators",
  "python -m launch.dpa_grpo --config=configs/dpa_grpo.py:qwen3_4b --workdir=runs/qwen3_4b_smoke "
  "--config.model.preset=tiny_qwen3 --config.model.dtype=float32 --config.model.tokenizer_vocab=512 "
  "--config.data.synthetic.n=6 --config.data.batch_cases=2 --config.train.steps=2 "
  "--config.train.eval_every=2 \"--config.rollout.lines=('1a','9')\" --config.rollout.compact_forms=True "
  "--config.rollout.max_new_tokens=8 "
  "--config.rollout.verdict_tokens=8 --config.rollout.decision_tokens=8 --config.rollout.revisions=2 "
  "--config.loss.skip_verifier_on_invalid_draft=False --config.loss.skip_decision_on_invalid_revision=False "
  "--config.loss.revision_filter=False":
    "tests/dpa_grpo/smoke_test.py::test_qwen3_4b_preset_code_path_runs_two_steps_on_cpu",
  "python -m launch.theory --workdir=runs/theory": _RUNS + "test_theory_smoke_run_writes_its_figures",
  "python -m launch.serve --config=configs/serve.py --config.model.checkpoint=/models/Qwen3-4B":
    _RUNS + "test_serve_tiny_answers_and_stops_on_ctrl_c",
  "python -m launch.serve --config=configs/serve.py:tiny":
    _RUNS + "test_serve_tiny_answers_and_stops_on_ctrl_c",
  ".plan_venvs/cuda/bin/python -m launch.plan --config=configs/dpa_grpo.py:qwen3_4b --target=h100x8":
    "not CI: the deviceless CUDA compiler's own venv (scripts/plan_venvs.sh, ~0.5 GB) and a 4B compile "
    "of many minutes; the same code path at tiny size on the CPU: tests/lm/plan_test.py::"
    "test_plan_compiles_the_tiny_preset_and_its_overrides_fit_and_parse_back",
  "python -m launch.sweep --config=configs/theory.py:smoke --launcher=launch.theory --sweep=loss.kl=k1,k3 "
  "--workers=2 --workdir=DIR":
    _RUNS + "test_sweep_over_theory_runs_two_points_at_once_resumes_and_summarises",
}  # fmt: skip
# `python -m benchmarks...` commands: the full runs take tens of minutes, so their test runs the same
# harness at the quick shape (a baseline commit included).
_BENCH = (
  "tests/benchmarks/sampler_bench_test.py::"
  "test_quick_run_measures_ours_transformers_and_a_baseline_commit_in_both_dtypes"
)
_RL_BENCH = (
  "tests/benchmarks/rl_bench_test.py::"
  "test_quick_run_measures_both_sides_of_a_dpa_grpo_step_in_both_dtypes_and_they_agree"
)
COMMANDS.update({
  "python -m benchmarks.sampler_bench --shapes=a,b --engines=ours,vllm --baseline=06be85b --trials=5": _BENCH,
  "python -m benchmarks.sampler_bench --quick": _BENCH,
  "python -m benchmarks.rl_bench --trials=5": _RL_BENCH,
})  # fmt: skip


def readme_commands(text: str) -> list[str]:
  """`python -m launch...` and `python -m benchmarks...` commands of fenced blocks (continuations
  joined, comments dropped) and of inline code spans, whitespace normalised."""
  found = []
  for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():
      line = line.split("  #")[0].strip()
      if re.match(r"(\S*/bin/)?python -m (launch|benchmarks)", line):
        found.append(" ".join(line.split()))
  for span in re.findall(
    r"`((?:\S*/bin/)?python -m (?:launch|benchmarks)[^`]*)`", re.sub(r"```.*?```", "", text, flags=re.S)
  ):
    found.append(" ".join(span.split()))
  return found


def test_every_readme_command_is_run_by_a_test():
  root = pathlib.Path(__file__).parents[1]
  commands = readme_commands((root / "README.md").read_text())
  assert len(commands) >= 10
  missing = [c for c in commands if c not in COMMANDS]
  assert not missing, f"README commands no test runs (add a smoke test and an entry in COMMANDS): {missing}"
  stale = [c for c in COMMANDS if c not in commands]
  assert not stale, f"COMMANDS entries no longer in the README: {stale}"
  for command, runner in COMMANDS.items():
    if runner.startswith(("not CPU: ", "not CI: ")):
      assert "--config=" in command and any(s in command for s in ("qwen3_", "openai")), command
      continue
    path, name = runner.split("::")
    assert re.search(rf"^def {name}\(", (root / path).read_text(), re.M), f"{runner} (for {command}) is gone"


# The README is a user guide: its history of runs lives in dated files under docs/results/, so it
# stays short enough to read (tunix, TRL and maxtext keep theirs under 16 KB).
README_MAX_LINES = 250
# Files the README may link before they are committed (another change of the same issue writes them).
_PENDING_LINKS = {"docs/scale.md"}


def _slug(heading: str) -> str:
  """GitHub's anchor for a Markdown heading."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
  text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
  return {_slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_readme_is_a_short_guide_and_every_dated_result_is_indexed():
  root = pathlib.Path(__file__).parents[1]
  lines = (root / "README.md").read_text().splitlines()
  assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; history goes to docs/results/"
  results = root / "docs" / "results"
  dated = sorted(p.name for p in results.glob("*.md") if re.match(r"\d{4}-\d{2}-\d{2}-[\w-]+\.md$", p.name))
  assert len(dated) >= 10
  index = (results / "README.md").read_text()
  assert not [name for name in dated if f"]({name})" not in index], "docs/results/README.md misses a file"


def test_relative_links_of_the_readme_and_the_results_resolve():
  """Every relative link (file and #anchor) of README.md and docs/results/*.md points at a file that
  exists and, for an anchor, at one of its headings."""
  root = pathlib.Path(__file__).parents[1]
  broken = []
  for page in [root / "README.md", *sorted((root / "docs" / "results").glob("*.md"))]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"[a-z]+:", target):
        continue
      file, _, anchor = target.partition("#")
      path = (page.parent / file).resolve() if file else page
      if str(path.relative_to(root)) in _PENDING_LINKS:
        continue
      if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
        broken.append(f"{page.relative_to(root)}: {target}")
  assert not broken, broken
