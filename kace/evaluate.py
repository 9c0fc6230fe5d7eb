"""Resumable KACE evaluation: per-problem records, metrics with bootstrap CIs, a table, plots.

`run(config, workdir)` (a typed `kace.config.KaceConfig`) loads the problems, assigns domains,
samples the empirical solve rates, solves every problem with every method in `config.methods` (batch
by batch, each finished batch appended to `records.jsonl`), then computes the metrics from the
records on disk and writes `metrics.json`, `results.md` and two plots. A killed run restarted on the
same workdir skips every (method, problem) already recorded, so nothing is solved twice. The record
format and the metric definitions are in docs/kace.md ("Evaluation").
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import math
import os
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kace import answers, budget, data, methods, projection, scripted, solve, synthetic, tiers
from kace import config as config_lib
from lm import generators, rundir, stats
from lm.plotting import plt  # noqa: E402

_log = logging.getLogger(__name__)

RECORDS, SOLVE_RATES, DOMAINS = "records.jsonl", "solve_rates.jsonl", "domains.json"
TIER_RANK = {t: i for i, t in enumerate(solve.STAGE_ORDER)}


# ---- setup -------------------------------------------------------------------------------------------


def resolve(config: config_lib.KaceConfig) -> config_lib.KaceConfig:
  """`config` with the CPU-scale solver filled in: when `synthetic.build_solver` is set, the tiny
  solver is built (or found in its cache) and becomes the solver checkpoint, and its demonstration
  tree the `kace` tree unless one is given; when `testbed.build_solver` is set, the testbed's
  context-using solver becomes the solver checkpoint (its trees are learned, none is given)."""
  if config.testbed.build_solver and config.testbed.solver_kind == "scripted":  # kace.scripted: no model
    solver = dataclasses.replace(config.roles.solver, kind="scripted", model=scripted.MODEL, checkpoint="")
    return dataclasses.replace(config, roles=dataclasses.replace(config.roles, solver=solver))
  if config.testbed.build_solver:
    path = synthetic.ensure_testbed_solver(
      os.path.expanduser(config.synthetic.cache_dir), config.testbed.solver
    )
    solver = dataclasses.replace(config.roles.solver, checkpoint=path)
    return dataclasses.replace(config, roles=dataclasses.replace(config.roles, solver=solver))
  if not config.synthetic.build_solver:
    return config
  path = synthetic.ensure_tiny_solver(
    os.path.expanduser(config.synthetic.cache_dir), config.synthetic.tiny_solver()
  )
  solver = dataclasses.replace(config.roles.solver, checkpoint=path)
  return dataclasses.replace(
    config,
    roles=dataclasses.replace(config.roles, solver=solver),
    kace=dataclasses.replace(config.kace, tree=config.kace.tree or os.path.join(path, "tree.json")),
  )


def _load(d: config_lib.DataConfig, tiny_solver, half: str) -> list[data.Problem]:
  """Every problem of benchmark `d.name` from `d.source` (the synthetic set and the testbed: the
  `half` of `tiny_solver.problems()`, `KaceConfig.generated()`)."""
  if d.name in ("synthetic", "testbed"):
    return tiny_solver.problems()[half == "test"]
  if d.name == "aime2025":
    return data.load_aime2025(d.source or "opencompass/AIME2025")
  if d.name == "math":
    return data.load_math(d.source, levels=tuple(d.levels))
  if d.name == "olymmath":
    return data.load_olymmath(d.source, splits=tuple(d.splits))
  raise ValueError(f"config.data.name must be synthetic, aime2025, math or olymmath, got {d.name!r}")


def load_problems(
  data_config: config_lib.DataConfig,
  tiny_solver: synthetic.TinySolverConfig,
  grader: answers.Grader,
  half: str = "test",
) -> list[data.Problem]:
  """The evaluation problems `data_config` names, filtered and limited as configured; `half="train"`
  gives what kace.learn trains on instead: the other part of the split, or, with `train_name`, every
  problem of that benchmark from `train_source` (less any id the test part holds). `tiny_solver`
  says which synthetic problems there are."""
  d = data_config
  if half not in ("train", "test"):
    raise ValueError(f"half must be 'train' or 'test', got {half!r}")
  if half == "train" and d.train_name:  # learned on other data: every problem of that set
    if not d.train_source and d.train_name not in ("synthetic", "testbed", "aime2025"):
      raise data.DataSourceError(
        f"config.data.train_source is empty: data.train_name={d.train_name!r} learns on that benchmark's "
        "files; set --config.data.train_source=/path (e.g. MATH's train split)"
      )
    other = dataclasses.replace(d, name=d.train_name, source=d.train_source, train_name="", test_fraction=0.0)
    problems = _load(other, tiny_solver, "train")
    if d.verifiable_only:
      problems = data.verifiable(problems, grader)
    test_ids = {p.id for p in load_problems(d, tiny_solver, grader, "test")}
    return sorted((p for p in problems if p.id not in test_ids), key=lambda p: p.id)
  problems = _load(d, tiny_solver, half)
  if d.verifiable_only:
    problems = data.verifiable(problems, grader)
  if d.test_fraction:
    problems = data.train_test_split(problems, d.test_fraction, d.split_seed)[half == "test"]
  elif half == "train" and d.name not in ("synthetic", "testbed"):
    raise ValueError(
      f"training on {d.name} needs config.data.test_fraction > 0 (a train/test split) or "
      "config.data.train_name (learn on other data)"
    )
  problems = sorted(problems, key=lambda p: p.id)
  return problems[: d.limit] if d.limit and half == "test" else problems


def load_domains(
  problems: Sequence[data.Problem],
  classifier,
  workdir: str,
  *,
  domains: Sequence[str],
  params: generators.GenerationParams,
  fallback: str = "",
) -> projection.Domains:
  """Domains of `problems` (one of `domains` each), assigned once per run and kept in `domains.json`
  (a resumed run reuses them, so a classifier's replies cannot change between the halves of a run).
  `classifier()` gives the classifier, called only when a problem's own label is not a domain;
  `params` is its sampling, and `fallback` the domain of an unusable reply ("" = the first)."""
  path = os.path.join(workdir, DOMAINS)
  saved = rundir.read_json(path) if os.path.exists(path) else {"of": {}, "source": {}, "replies": {}}
  todo = [p for p in problems if p.id not in saved["of"]]
  if todo:
    unlabelled = any(p.domain not in domains for p in todo)
    new = projection.assign_domains(
      todo, tuple(domains), classifier() if unlabelled else None, params, fallback=fallback or None
    )
    for key in ("of", "source", "replies"):
      saved[key].update(getattr(new, key))
    rundir.write_json(path, saved)
  pick = lambda key: {p.id: saved[key][p.id] for p in problems if p.id in saved[key]}
  return projection.Domains(pick("of"), pick("source"), pick("replies"))


def domains_of_run(
  config: config_lib.KaceConfig, problems: Sequence[data.Problem], classifier, workdir: str
) -> projection.Domains:
  """`load_domains` with the run's domains, classifier sampling and fallback."""
  return load_domains(
    problems,
    classifier,
    workdir,
    domains=config.domains,
    params=config.classifier_sampling.params(),
    fallback=config.fallback_domain,
  )


# ---- the run ---------------------------------------------------------------------------------------


def run(config: config_lib.KaceConfig, workdir: str) -> dict[str, dict[str, Any]]:
  """Evaluates every method of `config.methods` into `workdir`; returns the metrics per method."""
  config = resolve(config)
  if rundir.is_writer():  # several hosts: process 0 writes the run directory (docs/multihost.md)
    rundir.write_json(os.path.join(workdir, "config.json"), config.to_dict())  # with the resolved paths
  options = config.method_options()
  with config.grader.grader() as grader:
    problems = load_problems(config.data, config.generated(), grader)
    if config.plan.dry_run:  # before the methods load their artefacts: a plan needs none
      budget.dry_run(config, problems, workdir, train=train_count(config, grader), build=False)
      return {}
    built = [methods.build(name, options) for name in config.methods]
    if config.plan.check_context:
      budget.check_endpoints(config, problems)
    _log.info("%d problems, methods %s", len(problems), list(config.methods))
    solver = generators.make_generator(config.roles.solver)
    classifier = lambda: (
      generators.make_generator(config.roles.classifier) if config.roles.classifier else solver
    )
    domains = domains_of_run(config, problems, classifier, workdir)
    sampling = config.sampling.params()
    if config.eval.solve_rate_k:
      run_solve_rates(
        problems, solver, grader, workdir,
        k=config.eval.solve_rate_k, batch_size=config.eval.batch_size, params=sampling,
        template=config.prompt.solver, seed=config.seed,
      )  # fmt: skip
    for method in built:
      run_method(
        method, problems, domains, solver, grader, workdir,
        batch_size=config.eval.batch_size, params=sampling, seed=config.seed,
      )  # fmt: skip
    return report(config, problems, workdir, grader.equivalent)


def train_count(config: config_lib.KaceConfig, grader: answers.Grader) -> int | None:
  """How many training problems `config.data` names (None when it names none: no split, no
  `train_source`), for the dry run."""
  try:
    return len(load_problems(config.data, config.generated(), grader, half="train"))
  except ValueError as e:  # data.DataSourceError is a ValueError
    _log.info("no training split: %s", e)
    return None


def _batches(items: Sequence, size: int) -> list[Sequence]:
  return [items[i : i + size] for i in range(0, len(items), size)]


def _recorded(path: str, key) -> set:
  rundir.repair_jsonl(path)  # a kill mid-append leaves a torn last line; later appends start clean
  return {key(r) for r in rundir.read_jsonl(path)}


def run_solve_rates(
  problems: Sequence[data.Problem],
  solver: generators.TextGenerator,
  grader: answers.Grader,
  workdir: str,
  *,
  k: int,
  batch_size: int,
  params: generators.GenerationParams,
  template: str,
  seed: int,
) -> None:
  """Appends `solve_rates.jsonl` for problems without one (k samples each, batch by batch)."""
  path = os.path.join(workdir, SOLVE_RATES)
  done = _recorded(path, lambda r: r["id"])
  todo = [p for p in problems if p.id not in done]
  progress = solve.Progress(len(problems), "solve rates", {"sampled": len(problems) - len(todo)})
  for batch in _batches(todo, batch_size):
    progress.stage(f"k={k}", len(batch))
    rates = solve.solve_rates(
      batch, generator=solver, grader=grader, k=k, params=params, template=template, seed=seed
    )
    rundir.append_jsonl(path, rates)
    progress.finished(["sampled"] * len(batch))
  progress.close()


def run_method(
  method: methods.Method,
  problems: Sequence[data.Problem],
  domains: projection.Domains,
  solver: generators.TextGenerator,
  grader: answers.Grader,
  workdir: str,
  *,
  batch_size: int,
  params: generators.GenerationParams,
  seed: int,
) -> None:
  """Appends a record per problem not yet solved by `method`, one batch of problems at a time."""
  path = os.path.join(workdir, RECORDS)
  done = {i for m, i in _recorded(path, lambda r: (r["method"], r["id"])) if m == method.name}
  todo = [p for p in problems if p.id not in done]
  tally = collections.Counter(r["exit_tier"] for r in rundir.read_jsonl(path) if r["method"] == method.name)
  progress = solve.Progress(len(problems), method.name, tally)
  for batch in _batches(todo, batch_size):
    solutions = solve.solve(
      batch,
      domains.of,
      generator=solver,
      grader=grader,
      schedule=method.schedule,
      params=params,
      context=method.context,
      template=method.template,
      seed=seed,
      progress=progress,
    )
    rundir.append_jsonl(
      path, [record(method.name, p, s, domains) for p, s in zip(batch, solutions, strict=True)]
    )
  progress.close()


def record(method: str, problem: data.Problem, solution: solve.Solution, domains: projection.Domains) -> dict:
  """One `records.jsonl` line: the method, the problem's labels, and the whole solution."""
  meta = {"method": method, "source": problem.source, "subject": problem.subject, "level": problem.level}
  return {**meta, "domain_source": domains.source[problem.id], **dataclasses.asdict(solution)}


# ---- metrics -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OrderPreservation:
  """Pairwise concordance between exit tier and empirical solve rate.

  Over all pairs of problems whose solve rates differ AND whose exit tiers differ, a pair is
  concordant when the problem with the higher solve rate exited at the easier (earlier) tier. Pairs
  tied on either side carry no order information and are left out (as in Goodman–Kruskal's gamma);
  `tied` counts them. `rate` is concordant / compared (None when no pair can be compared).
  """

  concordant: int
  compared: int
  tied: int

  @property
  def rate(self) -> float | None:
    return self.concordant / self.compared if self.compared else None


def order_preservation(exit_tiers: Sequence[str], solve_rates: Sequence[float]) -> OrderPreservation:
  """Concordance of exit tier (ES < MS < HS < POOL) with solve rate; see `OrderPreservation`."""
  ranks = [TIER_RANK[t] for t in exit_tiers]
  concordant = compared = tied = 0
  for i in range(len(ranks)):
    for j in range(i + 1, len(ranks)):
      if ranks[i] == ranks[j] or solve_rates[i] == solve_rates[j]:
        tied += 1
        continue
      compared += 1
      concordant += (ranks[i] < ranks[j]) == (solve_rates[i] > solve_rates[j])
  return OrderPreservation(concordant, compared, tied)


def method_metrics(
  records: Sequence[Mapping[str, Any]], rates: Mapping[str, float], *, bootstrap: int = 2000, seed: int = 0
) -> dict[str, Any]:
  """Metrics of one method's records (see docs/kace.md, "Metrics")."""
  correct = [float(r["correct"]) for r in records]
  low, high = stats.bootstrap_ci(correct, samples=bootstrap, seed=seed)
  exits = collections.Counter(r["exit_tier"] for r in records)
  rated = [r for r in records if r["id"] in rates]
  order = order_preservation([r["exit_tier"] for r in rated], [rates[r["id"]] for r in rated])
  mean = lambda key: float(np.mean([r[key] for r in records])) if records else float("nan")
  return {
    "problems": len(records),
    "accuracy": mean("correct"),
    "ci_low": low,
    "ci_high": high,
    "mean_calls": mean("calls"),
    "mean_completion_tokens": mean("completion_tokens"),
    "mean_prompt_tokens": mean("prompt_tokens"),
    "exit_tiers": {t: exits[t] for t in solve.STAGE_ORDER if exits[t]},
    "order_preservation": order.rate,
    "order_pairs": {"concordant": order.concordant, "compared": order.compared, "tied": order.tied},
  }


CURVE = "best_of_n_curve"  # the method whose samples give the Best-of-N curve
MAX_SUBSETS = 2000  # subsets of one size voted per problem; beyond this, a seeded sample of them


def _subset_votes(answers_: Sequence[str | None], right: Sequence[bool], n: int, equivalent, rng) -> float:
  """The share of size-`n` subsets of one problem's samples whose plurality vote is right.

  Clusters are formed once over all samples (`tiers.cluster`); a subset's vote is the cluster with
  the most of its samples, a tie going to the cluster that reached that count at the earliest
  sample (as `tiers.vote` breaks it); a cluster is right when its first sample is."""
  clusters = tiers.cluster(answers_, equivalent)
  of = {i: k for k, c in enumerate(clusters) for i in c.members}
  index = range(len(answers_))
  subsets = list(itertools.combinations(index, n)) if math.comb(len(answers_), n) <= MAX_SUBSETS else [
    tuple(sorted(rng.sample(index, n))) for _ in range(MAX_SUBSETS)
  ]  # fmt: skip
  wins = 0
  for subset in subsets:
    counts: dict[int, int] = collections.Counter()
    reached: dict[int, int] = {}
    for i in subset:
      if i in of:
        counts[of[i]] += 1
        reached[of[i]] = i  # the sample at which the cluster reached its current count
    if counts:
      top = max(counts.values())
      winner = min((k for k in counts if counts[k] == top), key=lambda k: reached[k])
      wins += right[clusters[winner].members[0]]
  return wins / len(subsets)


def best_of_n_curve(
  records: Sequence[Mapping[str, Any]], equivalent, seed: int = 0
) -> list[dict[str, float]]:
  """Best-of-N accuracy for N = 1 … M from one draw of M samples per problem (the `best_of_n_curve`
  records): for each N, the mean over problems of the share of size-N subsets of its M samples whose
  plurality vote is right — the expected accuracy of Best-of-N given those samples, without the
  noise of picking one subset. Each sample is one solver call, so N is the mean calls."""
  if not records:
    return []
  rng = random.Random(seed)
  samples = [[x for st in r["stages"] for x in st["samples"]] for r in records]
  m = min(len(s) for s in samples)
  curve = []
  for n in range(1, m + 1):
    per = [
      _subset_votes([x["answer"] for x in s[:m]], [x["correct"] for x in s[:m]], n, equivalent, rng)
      for s in samples
    ]
    curve.append({"n": n, "mean_calls": float(n), "accuracy": float(np.mean(per))})
  return curve


def at_equal_calls(curve: Sequence[Mapping[str, float]], mean_calls: float) -> float | None:
  """Best-of-N accuracy at `mean_calls`, linearly interpolated between the curve's points; None
  outside the curve's range of calls (no extrapolation)."""
  if not curve or not curve[0]["mean_calls"] <= mean_calls <= curve[-1]["mean_calls"]:
    return None
  xs, ys = [c["mean_calls"] for c in curve], [c["accuracy"] for c in curve]
  return float(np.interp(mean_calls, xs, ys))


def report(
  config: config_lib.KaceConfig, problems: Sequence[data.Problem], workdir: str, equivalent=None
) -> dict:
  """Metrics from the records on disk (for `problems` only) → metrics.json, results.md, plots.

  With `best_of_n_curve` among the methods, the Best-of-N curve is computed from its records
  (answers grouped by `equivalent`, default: equal `answers.normalize_answer` strings) and every
  method gets `bon_at_equal_calls` (the curve at its mean calls) and `vs_bon` (its accuracy minus
  that)."""
  ids = {p.id for p in problems}
  records = [r for r in rundir.read_jsonl(os.path.join(workdir, RECORDS)) if r["id"] in ids]
  rates = {r["id"]: r["correct"] / r["k"] for r in rundir.read_jsonl(os.path.join(workdir, SOLVE_RATES))}
  by_method = {name: [r for r in records if r["method"] == name] for name in config.methods}
  metrics = {
    name: method_metrics(rs, rates, bootstrap=config.eval.bootstrap, seed=config.seed)
    for name, rs in by_method.items()
  }
  equivalent = equivalent or (lambda a, b: answers.normalize_answer(a) == answers.normalize_answer(b))
  curve = best_of_n_curve(by_method.get(CURVE, ()), equivalent, config.seed)
  for m in metrics.values():
    bon = at_equal_calls(curve, m["mean_calls"]) if m["problems"] else None
    m.update(bon_at_equal_calls=bon, vs_bon=None if bon is None else m["accuracy"] - bon)
  if CURVE in metrics:
    metrics[CURVE]["curve"] = curve
  if not rundir.is_writer():  # several hosts: process 0 writes the report (docs/multihost.md)
    return metrics
  rundir.write_json(os.path.join(workdir, "metrics.json"), metrics)
  table = results_table(
    metrics,
    benchmark=config.data.name,
    problems=len(problems),
    solve_rate_k=config.eval.solve_rate_k,
    bootstrap=config.eval.bootstrap,
  )
  rundir.atomic_write_text(os.path.join(workdir, "results.md"), table)
  plot_accuracy_vs_calls({"": metrics}, os.path.join(workdir, "accuracy_vs_calls.png"))
  plot_tier_vs_solve_rate(by_method, rates, os.path.join(workdir, "exit_tier_vs_solve_rate.png"))
  return metrics


def results_table(
  metrics: Mapping[str, Mapping[str, Any]],
  *,
  benchmark: str,
  problems: int,
  solve_rate_k: int,
  bootstrap: int,
) -> str:
  """The Markdown results table (one row per method) of `problems` problems of `benchmark`."""
  k = solve_rate_k
  lines = [
    f"# KACE evaluation: {benchmark}, {problems} problems",
    "",
    f"Accuracy with a percentile-bootstrap 95% CI ({bootstrap} resamples); calls = sampled "
    f"completions per problem; order preservation = pairwise concordance of exit tier with the solve "
    f"rate from k={k} samples (pairs tied on either side left out); vs Best-of-N = accuracy minus "
    f"Best-of-N's at the same mean calls (linear interpolation on the {CURVE} curve; – outside it).",
    "",
    "| method | accuracy | 95% CI | mean calls | mean tokens (completion / prompt) | exit tiers "
    "| order preservation | vs Best-of-N at equal calls |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for name, m in metrics.items():
    tiers_text = " ".join(f"{t}:{c}" for t, c in m["exit_tiers"].items())
    order = (
      "–"
      if m["order_preservation"] is None
      else f"{100 * m['order_preservation']:.1f}% ({m['order_pairs']['compared']} pairs)"
    )
    lines.append(
      f"| {name} | {100 * m['accuracy']:.1f}% | [{100 * m['ci_low']:.1f}, {100 * m['ci_high']:.1f}] "
      f"| {m['mean_calls']:.2f} | {m['mean_completion_tokens']:.1f} / {m['mean_prompt_tokens']:.1f} "
      f"| {tiers_text} | {order} | {vs_bon(m)} |"
    )
  curve = metrics.get(CURVE, {}).get("curve")
  if curve:
    points = ", ".join(f"N={c['n']}: {100 * c['accuracy']:.1f}%" for c in curve)
    lines += ["", f"Best-of-N curve ({CURVE}, every subset of its samples voted): {points}."]
  return "\n".join(lines) + "\n"


def vs_bon(m: Mapping[str, Any]) -> str:
  """ "+3.1 pts (BoN 41.2%)": a method's accuracy against Best-of-N's at its mean calls."""
  if m.get("vs_bon") is None:
    return "–"
  return f"{100 * m['vs_bon']:+.1f} pts (BoN {100 * m['bon_at_equal_calls']:.1f}%)"


_MARKERS = "osD^v<>pPX*hH"


def plot_accuracy_vs_calls(panels: Mapping[str, Mapping[str, Mapping[str, Any]]], path: str) -> None:
  """Accuracy (with its 95% CI) against mean solver calls, one point per method and the Best-of-N
  curve (when `best_of_n_curve` ran), one panel per benchmark (`panels`: {title: {method: metrics}};
  the evaluation draws one untitled panel, the table one per benchmark). Methods with no problems
  are left out."""
  titled = any(panels)  # the table's: wider panels, smaller caps and legend
  size, capsize = ((5.5 * len(panels), 4.5), 3) if titled else ((5, 4), 4)
  fig, axes = plt.subplots(1, len(panels), figsize=size, squeeze=False)
  for ax, (title, by_method) in zip(axes[0], panels.items(), strict=True):
    curve = by_method.get(CURVE, {}).get("curve")
    if curve:
      ax.plot([c["mean_calls"] for c in curve], [c["accuracy"] for c in curve], "-", color="0.6", zorder=0,
              label=f"Best-of-N, N=1…{curve[-1]['n']}")  # fmt: skip
    for i, (name, m) in enumerate(by_method.items()):
      if m["problems"] and not math.isnan(m["accuracy"]):
        err = [[m["accuracy"] - m["ci_low"]], [m["ci_high"] - m["accuracy"]]]
        # a marker per method as well as a colour: 13 methods outrun the 10-colour cycle, and
        # methods that tie (the testbed's ablations) would hide one another behind one dot
        marker, size = _MARKERS[i % len(_MARKERS)], 9 - 4 * i / max(1, len(by_method))
        ax.errorbar([m["mean_calls"]], [m["accuracy"]], yerr=err, fmt=marker, ms=size, mfc="none",
                    capsize=capsize, label=name)  # fmt: skip
    if title:
      ax.set_title(title)
    ax.set_xlabel("mean solver calls per problem")
    ax.set_ylabel("accuracy (95% bootstrap CI)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(**({"fontsize": 7} if titled else {}))
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_tier_vs_solve_rate(
  by_method: Mapping[str, Sequence[Mapping]], rates: Mapping[str, float], path: str
) -> None:
  """Solve rate of the problems exiting at each tier, one panel per method (jittered points + mean)."""
  names = [n for n, rs in by_method.items() if rs] or list(by_method)
  fig, axes = plt.subplots(
    1, max(1, len(names)), figsize=(3.2 * max(1, len(names)), 3.4), sharey=True, squeeze=False
  )
  rng = np.random.default_rng(0)
  for ax, name in zip(axes[0], names, strict=False):
    for rank, tier in enumerate(solve.STAGE_ORDER):
      ys = [rates[r["id"]] for r in by_method[name] if r["exit_tier"] == tier and r["id"] in rates]
      if ys:
        ax.scatter(rank + rng.uniform(-0.15, 0.15, len(ys)), ys, s=10, alpha=0.5)
        ax.hlines(np.mean(ys), rank - 0.3, rank + 0.3, color="k")
    ax.set_xticks(range(len(solve.STAGE_ORDER)), solve.STAGE_ORDER)
    ax.set_title(name)
    ax.set_xlabel("exit tier")
  axes[0][0].set_ylabel("empirical solve rate")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
