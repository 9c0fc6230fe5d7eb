"""From one config to learned artefacts and the paper's table: `build(config, workdir)` learns what the
methods of `config.methods` read (KACE trees and their ablations, the ACE playbook, the GEPA prompt)
from the training half, resumably, into `workdir/<artefact>/`; `table(config, workdir)` does that and
then evaluates every method on every benchmark of `config.table`, writing one Markdown table (ours,
and the paper's reported number beside it where there is one) and one plot.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import multiprocessing
import os
import random
from collections.abc import Mapping, Sequence
from concurrent import futures
from typing import Any

from kace import (
  answers,
  baselines,
  budget,
  cards,
  data,
  embed,
  evaluate,
  learn,
  learned_teacher,
  methods,
  oracle,
  predictions,
  scripted,
  solve,
  synthetic,
)
from kace import config as config_lib
from lm import progress, rundir
from lm.gates import GateError

_log = logging.getLogger(__name__)

# The KACE paper's reported accuracies on AIME 2025 (%), from its results table and ablations; "~"
# marks a number it gives only roughly (generic retrieval, LLM router or embedding, "~56%").
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


def training_problems(config: config_lib.KaceConfig, grader: answers.Grader) -> list[data.Problem]:
  """The training half of `config.data`, a seeded sample of `learn.train_limit` when that is set."""
  problems = evaluate.load_problems(config.data, config.generated(), grader, half="train")
  if config.learn.train_limit and len(problems) > config.learn.train_limit:
    problems = random.Random(config.seed).sample(problems, config.learn.train_limit)
  return sorted(problems, key=lambda p: p.id)


def learner(
  config: config_lib.KaceConfig,
  grader: answers.Grader,
  embedder,
  distill: str = "teacher",
  universal_budget: int | None = None,
) -> learn.Learner:
  """The roles, sampling and ADD / REFINE options every artefact's learning shares."""
  roles, bed = config.roles, config.testbed
  teacher = None
  if bed.oracle_teacher:
    teacher = oracle.OracleTeacher(
      bed.oracle_noise, config.seed, form=bed.solver.form, plausible=bed.testbed().rules_of_kinds()
    )
  if bed.teacher == "learned":  # a tiny trained model, labelled learned_teacher.LABEL; trained once, cached
    teacher = learned_teacher.LearnedTeacher.build(
      config.synthetic.cache_dir, bed.learned_teacher, bed.solver.form
    )
  return learn.Learner(
    solver=methods.role(roles.get("solver")),
    teacher=teacher or methods.role(roles.get("teacher")),
    curator=(
      oracle.OracleCurator(bed.curator_deletes_idle, form=bed.solver.form)
      if bed.oracle_curator
      else methods.role(roles.get("curator"))
    ),
    grader=grader,
    embedder=embedder,
    schedule=config.schedule.schedule(),
    params=config.sampling.params(),
    role_params=config.role_sampling.params(),
    config=config.learn.learn_config(distill),
    template=config.prompt.solver,
    seed=config.seed,
    domains=tuple(config.domains),
    universal_budget=universal_budget,
  )


def tree_start(config: config_lib.KaceConfig, artifact: str) -> tuple[cards.EpistemicTree, int]:
  """The empty tree a tree artefact learns from, and its universal cards' budget.

  Every layout gets the same total card budget: `learn.budget_tokens` per (reading tier, domain)
  cell plus the same for the universal cards. A collapsed block stands for several cells (the
  tier-only tree's (MS, *) for every domain's MS cell; the monolithic block for all of them), so its
  budget is `budget_tokens` times the cells it holds; `kace`'s blocks hold one each. With the same
  cells visited by ADD (`Learner.cells`), every layout also makes the same teacher calls, so an
  ablation removes conditional reading, not storage or teaching.
  """
  layout, _ = methods.TREE_ARTIFACTS[artifact]
  axes = {"domains": tuple(config.domains), **layout}
  reading = learn.reading_tiers(config.schedule.schedule())
  probe = cards.EpistemicTree(**axes)
  cells = [(t, d) for t in reading for d in config.domains]
  per_block = len(cells) // len({probe.resolve(t, d) for t, d in cells})
  budget = config.learn.budget_tokens
  return cards.EpistemicTree(**axes, budget_tokens=budget * per_block), budget


class LazyEmbedder:
  """Loads MiniLM on first use, so builds that never compare cards never load it."""

  def __init__(self, model_dir: str):
    self.model_dir, self.model = model_dir, None

  def embed(self, texts: Sequence[str]):
    self.model = self.model or embed.MiniLM(self.model_dir)
    return self.model.embed(texts)


def build(
  config: config_lib.KaceConfig, workdir: str, embedder: embed.Embedder | None = None
) -> dict[str, str]:
  """Learns every artefact `config.methods` needs into `workdir/<artefact>/`; returns their paths.

  Resumable: a tree or playbook build resumes from its `build_state.json`, and a finished GEPA
  prompt (`prompt.json`) is kept. `embedder` defaults to MiniLM (`config.learn.embedder_dir`).
  """
  config = evaluate.resolve(config)
  needed = list(dict.fromkeys(methods.ARTIFACT[m] for m in config.methods if m in methods.ARTIFACT))
  embedder = embedder or LazyEmbedder(config.learn.embedder_dir)
  out = {}
  with config.grader.grader() as grader:
    problems = training_problems(config, grader)
    if config.plan.dry_run:
      tests = evaluate.load_problems(config.data, config.generated(), grader)
      budget.dry_run(config, tests, workdir, train=len(problems), build=True)
      return {}
    if config.plan.check_context:
      budget.check_endpoints(config, problems, build=True)
    classifier = lambda: methods.role(config.roles.get("classifier"))
    domains = evaluate.domains_of_run(config, problems, classifier, workdir).of
    _log.info("training on %d problems; artefacts %s", len(problems), needed)
    for artifact in needed:
      target = os.path.join(workdir, artifact)
      if artifact in methods.TREE_ARTIFACTS:
        _, distill = methods.TREE_ARTIFACTS[artifact]
        start, universal_budget = tree_start(config, artifact)
        role = learner(config, grader, embedder, distill, universal_budget)
        learn.build(role, problems, domains, target, start)
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
    if "kace" in out:
      choose_k(config, workdir, problems, domains, grader)
  return out


# The methods whose cards a problem (k) can be chosen on validation, and their config sections.
K_SECTIONS = {"embedding_retrieval": "retrieval", "llm_router": "router"}


def choose_k(config: config_lib.KaceConfig, workdir: str, problems, domains, grader) -> dict[str, int]:
  """For each method of `K_SECTIONS` in `config.methods` whose section has `k_candidates`: the k
  that solves the most of the validation split — the acceptance part of the training problems
  (`learn.split`, as the kace tree's build splits them; never a test problem) — reading the kace
  tree of `workdir`; ties go to the smallest k. Each choice, with every candidate's accuracy, is
  written to `workdir/<method>_k.json` once and read back on a resume. Returns {method: k}."""
  chosen = {}
  for name, section in K_SECTIONS.items():
    candidates = getattr(config, section).k_candidates
    if name not in config.methods or not candidates:
      continue
    path = os.path.join(workdir, f"{name}_k.json")
    if not os.path.exists(path):
      _, validation = learn.split(problems, config.learn, config.seed)
      base = dataclasses.replace(config.method_options(), learn_dir=workdir, kace_tree="")
      accuracy = {}
      for k in candidates:
        method = methods.build(name, dataclasses.replace(base, retrieval_k=k, router_k=k))
        solved = solve.solve(
          validation, domains, generator=methods.role(config.roles.solver), grader=grader,
          schedule=method.schedule, params=config.sampling.params(), context=method.context,
          template=method.template, seed=config.seed,
        )  # fmt: skip
        accuracy[str(k)] = sum(s.correct for s in solved) / len(solved)
      best = min(candidates, key=lambda k: (-accuracy[str(k)], k))
      record = {
        "method": name,
        "chosen": best,
        "accuracy": accuracy,
        "validation": [p.id for p in validation],
      }
      rundir.write_json(path, record)
    chosen[name] = rundir.read_json(path)["chosen"]
  return chosen


def with_chosen_k(config: config_lib.KaceConfig, build_dir: str) -> config_lib.KaceConfig:
  """`config` with each k `choose_k` recorded in `build_dir` (the others as configured)."""
  for name, section in K_SECTIONS.items():
    path = os.path.join(build_dir, f"{name}_k.json")
    if getattr(config, section).k_candidates and os.path.exists(path):
      k = rundir.read_json(path)["chosen"]
      config = dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), k=k)})
  return config


def table(
  config: config_lib.KaceConfig,
  workdir: str,
  embedder: embed.Embedder | None = None,
  *,
  allow_config_change: bool = False,
) -> dict:
  """Every method of `config.table.methods` on every benchmark of `config.table.benchmarks`: builds
  into `workdir/<bench>/build`, evaluates into `workdir/<bench>/eval`, then writes `table.md` and
  `table.png`. Returns {bench: {method: metrics}}."""
  results = {}
  for bench in config.table.benchmarks:
    c = config.benchmark(bench)
    built = build(c, os.path.join(workdir, bench, "build"), embedder)
    if config.plan.dry_run:  # build printed the benchmark's plan, its evaluation included
      continue
    c = dataclasses.replace(
      c,
      learn=dataclasses.replace(c.learn, dir=os.path.join(workdir, bench, "build")),
      kace=dataclasses.replace(c.kace, tree=built["kace"]) if "kace" in built else c.kace,
    )
    c = with_chosen_k(c, os.path.join(workdir, bench, "build"))
    # Resolved before the run directory compares configs: evaluate.run records the resolved one
    # (the solver's cached path), so an unresolved config would never match it on a resume.
    c = evaluate.resolve(c)
    eval_dir = rundir.prepare_workdir(
      os.path.join(workdir, bench, "eval"), c, allow_changes=allow_config_change
    )
    results[bench] = evaluate.run(c, eval_dir)
  if config.plan.dry_run:
    return {}
  rundir.write_json(os.path.join(workdir, "table.json"), results)
  rundir.atomic_write_text(os.path.join(workdir, "table.md"), table_markdown(results, config.table.methods))
  evaluate.plot_accuracy_vs_calls(results, os.path.join(workdir, "table.png"))
  return results


def _cell(m: Mapping[str, Any] | None) -> str:
  if not m or not m["problems"]:
    return "–"
  half = 100 * (m["ci_high"] - m["ci_low"]) / 2
  return f"{100 * m['accuracy']:.1f} ± {half:.1f} ({m['mean_calls']:.2f} calls)"


def table_markdown(results: Mapping[str, Mapping[str, Mapping]], method_names: Sequence[str]) -> str:
  """Methods (rows, `method_names`) × benchmarks: accuracy % ± half the 95% bootstrap CI, mean
  solver calls, and the paper's reported accuracy beside ours where it reports one."""
  benches = list(results)
  head = "| method | " + " | ".join(f"{b} (ours) | {b} (paper) | {b} vs Best-of-N" for b in benches) + " |"
  lines = [
    "# KACE: methods × benchmarks",
    "",
    "Accuracy % ± half-width of the 95% percentile-bootstrap CI, and mean solver calls (sampled "
    "completions) per problem. Paper: the KACE paper's reported accuracy (AIME 2025 only; '~' = "
    "reported approximately). vs Best-of-N: our accuracy minus Best-of-N's at the same mean calls, "
    "linearly interpolated on the best_of_n_curve curve (N = 1 … 10 from one draw of 10 samples per "
    "problem; – outside its range or without it). Problems per benchmark: "
    + ", ".join(f"{b} {max((m['problems'] for m in results[b].values()), default=0)}" for b in benches)
    + ".",
    "",
    head,
    "|---|" + "---|---|---|" * len(benches),
  ]
  for method in method_names:
    cells = [
      f"{_cell(results[b].get(method))} | {PAPER.get(b, {}).get(method, '–')} | "
      f"{evaluate.vs_bon(results[b].get(method) or {})}"
      for b in benches
    ]
    lines.append(f"| {method} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


SOLVER_LABEL = {
  "trained": "the trained tiny solver",
  "scripted": f"{scripted.LABEL} (kace.scripted, no model)",
}


def testbed_gates(config: config_lib.KaceConfig, workdir: str) -> dict:
  """Builds (or finds) the testbed solver and measures its gates (`synthetic.testbed_gates`) on the
  held-out problems of every seed of `config.testbed.seeds`; writes `workdir/gates.json` and returns
  it: each seed's rates and verdicts under `seeds`, and a gate `passed` only where every seed passes.

  Why every seed: a seed draws its own conventions, so its evaluated blocks hold other cards than
  seed 0's. Gates measured on seed 0 alone passed a solver that could not read two cards seeds 1 and
  2 evaluate ("addthree=total" 0.125, "addnine=total" 0.083 with the true card; docs/kace.md)."""
  config = evaluate.resolve(config)
  solver = methods.role(config.roles.solver)
  params = config.sampling.params()
  testbeds = {str(s): dataclasses.replace(config.testbed, seed=s).testbed() for s in config.testbed.seeds}
  per_seed = {seed: synthetic.testbed_gates(solver, tb, params) for seed, tb in testbeds.items()}
  passed = {name: all(g["passed"][name] for g in per_seed.values()) for name in synthetic.GATES}
  gates = {
    "seeds": per_seed,
    "passed": passed,
    "all_passed": all(passed.values()),
    "solver": config.roles.solver.checkpoint or SOLVER_LABEL[config.testbed.solver_kind],
    "bounds": synthetic.GATES,
  }
  rundir.write_json(os.path.join(workdir, "gates.json"), gates)
  return gates


def testbed_card_map(config: config_lib.KaceConfig, workdir: str) -> dict:
  """The testbed solver's solve rate with each card alone, every level >= 2 kind × every member of H
  (`synthetic.card_rates`; not a gate: the map of the cards a seed or a control could evaluate);
  writes `workdir/card_map.json` and returns it, with the cards below the true-card gate's bound."""
  config = evaluate.resolve(config)
  rates = synthetic.card_rates(
    methods.role(config.roles.solver), config.testbed.solver.form, config.sampling.params(), seed=config.seed
  )
  bound = synthetic.GATES["true_card"][1]
  card_map = {
    "rates": rates,
    "below_bound": sorted(card for card, rate in rates.items() if rate < bound),
    "bound": bound,
    "solver": config.roles.solver.checkpoint,
  }
  rundir.write_json(os.path.join(workdir, "card_map.json"), card_map)
  return card_map


def run_testbed(
  workdir: str,
  config: config_lib.KaceConfig | None = None,
  *,
  allow_config_change: bool = False,
  gates_only: bool = False,
) -> str:
  """The testbed as `python -m launch.kace_testbed` runs it, for any caller (that launcher, the main
  job): `workdir` created or resumed for `config` (`lm.rundir.prepare_workdir`; default
  configs/kace.py:testbed), then the comparison (`testbed_comparison`), or with `gates_only` only the
  solver's build, its gates and its card map (`testbed_card_map`). Returns the path of `report.md`
  (`gates.json` with `gates_only`); raises GateError, after writing `gates.json`, when the solver
  fails a gate."""
  if config is None:
    import configs.kace  # the project's presets; imported here so the library does not need them

    config = config_lib.KaceConfig.from_dict(configs.kace.get_config("testbed"))
  workdir = rundir.prepare_workdir(workdir, config, allow_changes=allow_config_change)
  if gates_only:
    testbed_gates(config, workdir)
    testbed_card_map(config, workdir)
    return os.path.join(workdir, "gates.json")
  testbed_comparison(config, workdir, allow_config_change=allow_config_change)
  return os.path.join(workdir, "report.md")


def testbed_comparison(
  config: config_lib.KaceConfig, workdir: str, embedder=None, *, allow_config_change: bool = False
) -> dict:
  """The testbed comparison: the gates first (GateError if one fails), then `table` once per seed of
  `config.testbed.seeds` into `workdir/seed<s>/` (the testbed's conventions and the run's seeds
  both follow it), `testbed_workers` of them at once in their own processes, then the pre-registered
  predictions judged on every seed's records (`kace.predictions`; the control's own predictions
  under a control) into `workdir/report.md`, rewritten as each seed finishes. A seed that fails
  does not stop the others; the error is raised once they are done."""
  os.makedirs(workdir, exist_ok=True)
  gates = testbed_gates(config, workdir)
  _log.info("testbed gates: %s", gates)
  if not gates["all_passed"]:
    raise GateError(f"the testbed solver fails its gates ({gates['passed']}); see {workdir}/gates.json")
  seeds = config.testbed.seeds
  workers = testbed_workers(config, embedder)
  _log.info("testbed seeds %s, %d at once", seeds, workers)
  results, errors = {}, {}

  def finish(seed: int, result) -> None:
    """Records a finished seed (`result()` gives its table or raises) and rewrites the report."""
    try:
      results[seed] = result()
    except Exception as e:  # one seed's failure never loses another's: the rest run first
      _log.error("testbed seed %s failed: %r", seed, e)
      errors[seed] = e
      return
    ordered = {s: results[s] for s in seeds if s in results}  # seed order, whatever finished first
    progress.note(f"testbed seeds done: {len(results)} of {len(seeds)}")
    _testbed_report(config, workdir, gates, ordered)

  if workers == 1:
    for seed in seeds:
      finish(seed, functools.partial(_seed_table, config, workdir, seed, embedder, allow_config_change))
  else:
    # spawn, not fork: a forked child would inherit this process's XLA threads mid-flight.
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
      running = {
        pool.submit(_seed_table, config, workdir, seed, None, allow_config_change): seed for seed in seeds
      }
      for future in futures.as_completed(running):
        finish(running[future], future.result)
  if errors:
    _log.error("testbed seeds %s failed; raising the first one's error", sorted(errors))
    raise errors[min(errors)]
  return {"gates": gates, "results": {s: results[s] for s in seeds}}


def testbed_workers(config: config_lib.KaceConfig, embedder=None) -> int:
  """How many of the testbed's seeds run at once, each in its own process (`testbed.workers`; 0:
  every seed at once on a single-process CPU run, else one). A seed's run is a loop of small jitted
  calls that keeps about one core busy on XLA:CPU, so on the 2-core machine three seeds in three
  processes take about two thirds of the wall time of one after another (13.8 against 20.5 min;
  docs/kace.md). An accelerator, or a
  multi-host run, belongs to one process, and an embedder object passed in cannot cross into another
  process: both run the seeds one after another."""
  import jax

  n = config.testbed.workers
  if embedder is not None:
    return 1
  if n == 0:
    n = len(config.testbed.seeds) if jax.default_backend() == "cpu" and jax.process_count() == 1 else 1
  return max(1, min(n, len(config.testbed.seeds)))


def _seed_table(
  config: config_lib.KaceConfig, workdir: str, seed: int, embedder, allow_config_change: bool
) -> dict:
  """One seed's `table` into `workdir/seed<seed>/` (the testbed's conventions and the run's seeds
  both follow it); module-level so that a worker process can run it."""
  c = dataclasses.replace(config, seed=seed, testbed=dataclasses.replace(config.testbed, seed=seed))
  return table(c, os.path.join(workdir, f"seed{seed}"), embedder, allow_config_change=allow_config_change)


def _testbed_report(config: config_lib.KaceConfig, workdir: str, gates: dict, results: dict) -> None:
  benches = config.table.benchmarks
  evals = [os.path.join(workdir, f"seed{s}", bench, "eval") for s in results for bench in benches]
  control, bed = config.testbed.control, config.testbed
  judged = predictions.MAIN if control == "none" else predictions.CONTROLS[control]
  subsets, facts = {}, ""
  if bed.variant == "conflict":
    v2 = predictions.V2 if bed.oracle_noise == 0 else predictions.V2_NOISE
    judged = v2 if control == "none" else predictions.V2_CONTROLS.get(control, ())
    subsets["null"] = set()
    for s, bench in ((s, b) for s in results for b in benches):
      tb = dataclasses.replace(bed, seed=s).testbed()
      subsets["null"] |= {(os.path.join(workdir, f"seed{s}", bench, "eval"), i) for i in tb.null_ids()}
      built = predictions.v2_build_facts(
        os.path.join(workdir, f"seed{s}", bench, "build"), tb.conventions(), tb.kinds()
      )
      facts += f"- seed {s}: `{json.dumps(built, sort_keys=True)}`\n"
    facts = f"## Builds (cards right / misplaced / wrong, ADD, REFINE, k chosen on validation)\n\n{facts}\n"
  seeds = list(gates["seeds"])
  conditions = next(iter(gates["seeds"].values()))["rates"]
  rates = "\n".join(
    f"| {k} | " + " | ".join(f"{gates['seeds'][s]['rates'][k]:.3f}" for s in seeds) + " |" for k in conditions
  )
  text = (
    f"# The latent-convention testbed (variant: {config.testbed.variant}; control: {control}; solver: "
    f"{SOLVER_LABEL[config.testbed.solver_kind]}; teacher and curator: {oracle.LABEL})\n\n"
    f"Seeds run: {', '.join(map(str, results))} of {', '.join(map(str, config.testbed.seeds))}.\n\n"
    f"## Gates (level 2: true card >= 0.8, no card <= 0.3, true card + distractors >= 0.7)\n\n"
    f"Measured on every seed's held-out problems; a gate passes when it passes in every seed.\n\n"
    f"| condition / level | {' | '.join(f'seed {s}' for s in seeds)} |\n"
    f"|---|{'---|' * len(seeds)}\n{rates}\n\n"
    f"## Pre-registered predictions (docs/kace.md)\n\n{predictions.report(evals, judged, subsets=subsets)}\n"
    + facts
    + "".join(
      f"## Seed {seed}\n\n{table_markdown(res, config.table.methods).split(chr(10), 2)[2]}\n"
      for seed, res in results.items()
    )
  )
  if config.testbed.teacher == "learned":
    text = text.replace(
      f"teacher and curator: {oracle.LABEL}", f"teacher: {learned_teacher.LABEL}; curator: {oracle.LABEL}"
    )
  panels = {
    f"seed {seed}" + (f", {b}" if len(res) > 1 else ""): m
    for seed, res in results.items()
    for b, m in res.items()
  }
  evaluate.plot_accuracy_vs_calls(panels, os.path.join(workdir, "accuracy_vs_calls.png"))
  text += (
    "\n## Accuracy against solver calls, one panel per seed\n\n![accuracy vs calls](accuracy_vs_calls.png)\n"
  )
  rundir.atomic_write_text(os.path.join(workdir, "report.md"), text)
  rundir.write_json(os.path.join(workdir, "results.json"), {str(s): r for s, r in results.items()})
