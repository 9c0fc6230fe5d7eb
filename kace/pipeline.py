"""From one config to learned artefacts and the paper's table: `build(config, workdir)` learns what the
methods of `config.methods` read (KACE trees and their ablations, the ACE playbook, the GEPA prompt)
from the training half, resumably, into `workdir/<artefact>/`; `table(config, workdir)` does that and
then evaluates every method on every benchmark of `config.table`, writing one Markdown table (ours,
and the paper's reported number beside it where there is one) and one plot.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from kace import answers, baselines, cards, data, embed, evaluate, learn, methods
from lm import rundir
from lm.plotting import plt  # noqa: E402

_log = logging.getLogger(__name__)

# REFERENCE.md §1: the KACE paper's accuracies on AIME 2025 (%); "~" marks a number it gives roughly
# (generic retrieval, LLM router or embedding, "~56%").
PAPER = {
  "aime2025": {
    "best_of_n": "51.8",
    "kace": "62.2",
    "tiered_gepa": "56.6",
    "no_domain": "54.4",
    "no_difficulty": "51.6",
    "raw_reflections": "59.3",
    "llm_router": "~56",
    "embedding_retrieval": "~56",
  }
}


def training_problems(config: ml_collections.ConfigDict, grader: answers.Grader) -> list[data.Problem]:
  """The training half of `config.data`, a seeded sample of `learn.train_limit` when that is set."""
  problems = evaluate.load_problems(config, grader, half="train")
  if config.learn.train_limit and len(problems) > config.learn.train_limit:
    problems = random.Random(config.seed).sample(problems, config.learn.train_limit)
  return sorted(problems, key=lambda p: p.id)


def learn_config(config: ml_collections.ConfigDict, distill: str) -> learn.LearnConfig:
  fields = set(learn.LearnConfig.__dataclass_fields__)
  return learn.LearnConfig(
    **{**{k: v for k, v in config.learn.to_dict().items() if k in fields}, "distill": distill}
  )


def learner(config, grader, embedder, distill: str = "teacher") -> learn.Learner:
  return learn.Learner(
    solver=methods.role(config, "solver"),
    teacher=methods.role(config, "teacher"),
    curator=methods.role(config, "curator"),
    grader=grader,
    embedder=embedder,
    schedule=methods.schedule(config),
    params=evaluate.params(config.sampling),
    role_params=methods.role_params(config),
    config=learn_config(config, distill),
    template=methods.template(config),
    seed=config.seed,
  )


class LazyEmbedder:
  """Loads MiniLM on first use, so builds that never compare cards never load it."""

  def __init__(self, model_dir: str):
    self.model_dir, self.model = model_dir, None

  def embed(self, texts: Sequence[str]):
    self.model = self.model or embed.MiniLM(self.model_dir)
    return self.model.embed(texts)


def build(
  config: ml_collections.ConfigDict, workdir: str, embedder: embed.Embedder | None = None
) -> dict[str, str]:
  """Learns every artefact `config.methods` needs into `workdir/<artefact>/`; returns their paths.

  Resumable: a tree or playbook build resumes from its `build_state.json`, and a finished GEPA
  prompt (`prompt.json`) is kept. `embedder` defaults to MiniLM (`config.learn.embedder_dir`).
  """
  config = evaluate.resolve(config)
  needed = list(dict.fromkeys(methods.ARTIFACT[m] for m in config.methods if m in methods.ARTIFACT))
  embedder = embedder or LazyEmbedder(config.learn.embedder_dir)
  out = {}
  with answers.Grader(workers=config.grader.workers, timeout_s=config.grader.timeout_s) as grader:
    problems = training_problems(config, grader)
    domains = evaluate.load_domains(problems, config, lambda: methods.role(config, "classifier"), workdir).of
    _log.info("training on %d problems; artefacts %s", len(problems), needed)
    for artifact in needed:
      target = os.path.join(workdir, artifact)
      if artifact in methods.TREE_ARTIFACTS:
        layout, distill = methods.TREE_ARTIFACTS[artifact]
        axes = {"domains": tuple(config.domains), **layout}
        start = cards.EpistemicTree(**axes, budget_tokens=config.learn.budget_tokens)
        learn.build(learner(config, grader, embedder, distill), problems, domains, target, start)
        out[artifact] = os.path.join(target, learn.TREE)
      elif artifact == "ace_playbook":
        a = config.ace
        baselines.build_playbook(
          learner(config, grader, embedder), problems, domains, target,
          epochs=a.epochs, batch_size=a.batch_size, budget_tokens=a.budget_tokens,
        )  # fmt: skip
        out[artifact] = os.path.join(target, learn.TREE)
      else:  # gepa
        out[artifact] = os.path.join(target, "prompt.json")
        if not os.path.exists(out[artifact]):
          cut = max(1, int(len(problems) * (1 - config.gepa.val_fraction)))
          baselines.optimize_instruction(
            learner(config, grader, embedder), problems[:cut], problems[cut:] or problems[:cut], target,
            max_metric_calls=config.gepa.max_metric_calls,
          )  # fmt: skip
  return out


def benchmark_config(config: ml_collections.ConfigDict, bench: str) -> ml_collections.ConfigDict:
  """`config` with `config.benchmarks[bench]` applied to `config.data` and `config.table.methods`
  as the methods."""
  if bench not in config.benchmarks:
    raise ValueError(f"benchmark {bench!r} is not in config.benchmarks ({', '.join(config.benchmarks)})")
  c = ml_collections.ConfigDict(config.to_dict())
  c.data.update(config.benchmarks[bench].to_dict())
  c.methods = tuple(config.table.methods)
  return c


def table(config: ml_collections.ConfigDict, workdir: str, embedder: embed.Embedder | None = None) -> dict:
  """Every method of `config.table.methods` on every benchmark of `config.table.benchmarks`: builds
  into `workdir/<bench>/build`, evaluates into `workdir/<bench>/eval`, then writes `table.md` and
  `table.png`. Returns {bench: {method: metrics}}."""
  results = {}
  for bench in config.table.benchmarks:
    c = benchmark_config(config, bench)
    built = build(c, os.path.join(workdir, bench, "build"), embedder)
    c.learn.dir = os.path.join(workdir, bench, "build")
    if "kace" in built:
      c.kace.tree = built["kace"]
    eval_dir = rundir.prepare_workdir(os.path.join(workdir, bench, "eval"), c)
    results[bench] = evaluate.run(c, eval_dir)
  rundir.write_json(os.path.join(workdir, "table.json"), results)
  rundir.atomic_write_text(os.path.join(workdir, "table.md"), table_markdown(results, config))
  plot_table(results, os.path.join(workdir, "table.png"))
  return results


def _cell(m: Mapping[str, Any] | None) -> str:
  if not m or not m["problems"]:
    return "–"
  half = 100 * (m["ci_high"] - m["ci_low"]) / 2
  return f"{100 * m['accuracy']:.1f} ± {half:.1f} ({m['mean_calls']:.2f} calls)"


def table_markdown(results: Mapping[str, Mapping[str, Mapping]], config: ml_collections.ConfigDict) -> str:
  """Methods × benchmarks: accuracy % ± half the 95% bootstrap CI, mean solver calls, and the
  paper's reported accuracy beside ours where it reports one."""
  benches = list(results)
  head = "| method | " + " | ".join(f"{b} (ours) | {b} (paper)" for b in benches) + " |"
  lines = [
    "# KACE: methods × benchmarks",
    "",
    "Accuracy % ± half-width of the 95% percentile-bootstrap CI, and mean solver calls (sampled "
    "completions) per problem. Paper: the KACE paper's reported accuracy (AIME 2025 only; '~' = "
    "reported approximately). Problems per benchmark: "
    + ", ".join(f"{b} {max((m['problems'] for m in results[b].values()), default=0)}" for b in benches)
    + ".",
    "",
    head,
    "|---|" + "---|---|" * len(benches),
  ]
  for method in config.table.methods:
    cells = [f"{_cell(results[b].get(method))} | {PAPER.get(b, {}).get(method, '–')}" for b in benches]
    lines.append(f"| {method} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def plot_table(results: Mapping[str, Mapping[str, Mapping]], path: str) -> None:
  """Accuracy vs mean calls, one panel per benchmark, one point (with its CI) per method."""
  fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4.5), squeeze=False)
  for ax, (bench, by_method) in zip(axes[0], results.items(), strict=True):
    for name, m in by_method.items():
      if m["problems"] and not math.isnan(m["accuracy"]):
        err = [[m["accuracy"] - m["ci_low"]], [m["ci_high"] - m["accuracy"]]]
        ax.errorbar([m["mean_calls"]], [m["accuracy"]], yerr=err, fmt="o", capsize=3, label=name)
    ax.set_title(bench)
    ax.set_xlabel("mean solver calls per problem")
    ax.set_ylabel("accuracy (95% bootstrap CI)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
