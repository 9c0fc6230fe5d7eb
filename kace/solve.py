"""The batched solver: tiered self-consistency for many problems, one generator call per stage.

`tiers.next_step` says, per problem, what to draw next; this loop asks every open problem for its
step, makes ONE `TextGenerator.generate` call for all problems at the same stage (each with its own
prompt and cards, `n` samples each), extracts answers, warms the grader's equivalence cache for
every open problem in one parallel pass, and repeats until every problem has a `Decision`. With the
paper's schedule 500 problems cost at most four generator calls (ES, MS, HS, and a fallback pool
only when it draws fresh samples), not thousands. The loop only sees the `TextGenerator`
interface, so a local `JaxGenerator` and an `OpenAIGenerator` are interchangeable.

Sampling is reproducible: the seed of a problem's stage is derived from (seed, problem id, stage),
so a problem draws the same samples alone or in any batch (the sampler keys rows independently),
and a resumed evaluation redraws exactly what a killed one would have.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence

import tqdm

from kace import answers, data, projection, tiers
from lm import generators, seeding
from lm import text as text_lib

STAGE_ORDER = (tiers.ES, tiers.MS, tiers.HS, tiers.POOL)  # easiest exit first


@dataclasses.dataclass(frozen=True, kw_only=True)
class SampleRecord:
  """One sampled completion: its text, extracted answer, grade against the gold, and cost."""

  text: str
  answer: str | None
  correct: bool
  completion_tokens: int
  finish_reason: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageRecord:
  """What one stage drew for a problem, and the cards that were in its prompt (ids, in order)."""

  stage: str
  cards_tier: str | None
  cards: tuple[str, ...]
  prompt_tokens: int  # of the one prompt the stage's samples shared
  samples: tuple[SampleRecord, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Solution:
  """A solved problem: the decision, its cost, and every stage with its samples and cards.

  Attributes:
    calls: solver calls as the schedule counts them (`Schedule.calls`, default: samples).
    num_samples, rounds: sampled completions and the stages (batched requests) they came in.
    completion_tokens: generated tokens over all samples.
    prompt_tokens: prompt tokens read over all samples (a stage's prompt counts once per sample,
      as each sample is one solver call reading it).
  """

  id: str
  domain: str
  gold: str
  answer: str | None
  correct: bool
  exit_tier: str
  votes: int
  calls: int
  num_samples: int
  rounds: int
  completion_tokens: int
  prompt_tokens: int
  stages: tuple[StageRecord, ...]


def chat(question: str, notes: str, template: str) -> list[dict[str, str]]:
  """The solver's chat: one user message (`projection.solver_prompt`)."""
  return text_lib.user_chat(projection.solver_prompt(question, notes, template))


class Progress:
  """A tqdm bar of problems done, with the current stage and the running tally of exit tiers
  (or any other labels the caller finishes problems with)."""

  def __init__(self, total: int, desc: str, done: Mapping[str, int] | None = None):
    self.counts = collections.Counter(done or {})
    self.bar = tqdm.tqdm(total=total, initial=sum(self.counts.values()), desc=desc, unit="problem")
    self._show("")

  def stage(self, name: str, open_problems: int) -> None:
    self._show(f"{name}: {open_problems} open")

  def finished(self, exit_tiers: Sequence[str]) -> None:
    self.counts.update(exit_tiers)
    self.bar.update(len(exit_tiers))
    self._show("")

  def close(self) -> None:
    self.bar.close()

  def _show(self, stage: str) -> None:
    order = lambda label: STAGE_ORDER.index(label) if label in STAGE_ORDER else len(STAGE_ORDER)
    tally = " ".join(f"{t}={self.counts[t]}" for t in sorted(self.counts, key=order) if self.counts[t])
    self.bar.set_postfix_str(" | ".join(filter(None, (stage, tally))))


def solve(
  problems: Sequence[data.Problem],
  domains: Mapping[str, str],
  *,
  generator: generators.TextGenerator,
  grader: answers.Grader,
  schedule: tiers.Schedule,
  params: generators.GenerationParams,
  context: projection.Context = projection.NO_CONTEXT,
  template: str = projection.SOLVER_TEMPLATE,
  seed: int = 0,
  progress: Progress | None = None,
) -> list[Solution]:
  """Solves `problems` with tiered self-consistency, one generator call per stage for all of them.

  Args:
    problems: the batch (ids unique).
    domains: problem id -> domain (from `projection.assign_domains`).
    generator: the solver role.
    grader: answer equivalence for voting (warmed per stage) and final grading.
    schedule: the tier ladder (`tiers.Schedule()`: the paper's; `Schedule.best_of_n(5)`: plain
      self-consistency).
    params: sampling parameters; the seed is replaced per problem and stage (`lm.seeding.derive_seed`).
    context: the cards each problem reads at a stage whose request names a cards tier.
    template: the solver prompt (`projection.SOLVER_TEMPLATE`).
    seed: base of every stage seed.
    progress: updated as problems finish.

  Returns:
    One `Solution` per problem, in input order.
  """
  rounds: dict[str, tuple[tiers.Round, ...]] = {p.id: () for p in problems}
  stages: dict[str, list[StageRecord]] = {p.id: [] for p in problems}
  decisions: dict[str, tiers.Decision] = {}
  todo = list(problems)
  while todo:
    steps = {p.id: tiers.next_step(rounds[p.id], schedule, grader.equivalent) for p in todo}
    finished = [p for p in todo if isinstance(steps[p.id], tiers.Decision)]
    decisions.update((p.id, steps[p.id]) for p in finished)
    if progress:
      progress.finished([steps[p.id].exit_tier for p in finished])
    todo = [p for p in todo if p.id not in decisions]
    groups: dict[tiers.Request, list[data.Problem]] = collections.defaultdict(list)
    for p in todo:
      groups[steps[p.id]].append(p)
    for request, group in groups.items():
      if progress:
        progress.stage(request.stage, len(group))
      _draw(request, group, domains, generator, grader, params, context, template, seed, rounds, stages)
    grader.warm([s.answer for r in rounds[p.id] for s in r.samples] for p in todo)
  return _finish(problems, domains, decisions, stages, grader)


def _draw(
  request, group, domains, generator, grader, params, context, template, seed, rounds, stages
) -> None:
  """One generator call: `request.n` samples for every problem of `group`, with its own cards."""
  group_domains = [domains[p.id] for p in group]
  if request.cards_tier is None:
    views = [projection.NO_CARDS] * len(group)
  else:
    views = context.project(group, group_domains, request.cards_tier)
  prompts = [chat(p.question, v.notes, template) for p, v in zip(group, views, strict=True)]
  per_prompt = [
    dataclasses.replace(params, seed=seeding.derive_seed(seed, p.id, request.stage)) for p in group
  ]
  outputs = generator.generate(prompts, n=request.n, params=per_prompt)
  for p, view, generations in zip(group, views, outputs, strict=True):
    extracted = [grader.extract(g.text, g.finish_reason) for g in generations]
    samples = tuple(tiers.Sample(a, g.completion_tokens) for a, g in zip(extracted, generations, strict=True))
    rounds[p.id] += (tiers.Round(request.stage, samples),)
    records = tuple(
      SampleRecord(
        text=g.text,
        answer=a,
        correct=False,  # graded with the final answers in `_finish`
        completion_tokens=g.completion_tokens,
        finish_reason=g.finish_reason,
      )
      for a, g in zip(extracted, generations, strict=True)
    )
    prompt_tokens = generations[0].prompt_tokens if generations else 0
    stage = StageRecord(
      stage=request.stage,
      cards_tier=request.cards_tier,
      cards=view.card_ids,
      prompt_tokens=prompt_tokens,
      samples=records,
    )
    stages[p.id].append(stage)


def _finish(problems, domains, decisions, stages, grader: answers.Grader) -> list[Solution]:
  """Grades every final answer and every sample in one pass and assembles the solutions."""
  items = [(p.answer, decisions[p.id].answer) for p in problems]
  items += [(p.answer, s.answer) for p in problems for st in stages[p.id] for s in st.samples]
  verdicts = iter(grader.grade_many(items))
  finals = [next(verdicts).correct for _ in problems]
  solutions = []
  for p, correct in zip(problems, finals, strict=True):
    d = decisions[p.id]
    graded = tuple(
      dataclasses.replace(
        st, samples=tuple(dataclasses.replace(s, correct=next(verdicts).correct) for s in st.samples)
      )
      for st in stages[p.id]
    )
    prompt_tokens = sum(st.prompt_tokens * len(st.samples) for st in graded)
    solutions.append(
      Solution(
        id=p.id,
        domain=domains[p.id],
        gold=p.answer,
        answer=d.answer,
        correct=correct,
        exit_tier=d.exit_tier,
        votes=d.votes,
        calls=d.calls,
        num_samples=d.samples,
        rounds=d.rounds,
        completion_tokens=d.tokens,
        prompt_tokens=prompt_tokens,
        stages=graded,
      )
    )
  return solutions


@dataclasses.dataclass(frozen=True)
class SolveRate:
  """The empirical solve rate of a problem: `correct` of `k` independent samples without cards."""

  id: str
  k: int
  correct: int
  answers: tuple[str | None, ...]
  finish_reasons: tuple[str, ...] = ()  # per sample: "stop", or "length" when cut off by max_tokens

  @property
  def rate(self) -> float:
    return self.correct / self.k


def solve_rates(
  problems: Sequence[data.Problem],
  *,
  generator: generators.TextGenerator,
  grader: answers.Grader,
  k: int,
  params: generators.GenerationParams,
  template: str = projection.SOLVER_TEMPLATE,
  seed: int = 0,
) -> list[SolveRate]:
  """k samples per problem (no cards) in ONE generator call, graded: the difficulty reference that
  exit tiers are compared against (order preservation)."""
  prompts = [chat(p.question, "", template) for p in problems]
  per_prompt = [
    dataclasses.replace(params, seed=seeding.derive_seed(seed, p.id, "solve_rate")) for p in problems
  ]
  outputs = generator.generate(prompts, n=k, params=per_prompt)
  extracted = [[grader.extract(g.text, g.finish_reason) for g in gens] for gens in outputs]
  verdicts = iter(
    grader.grade_many([(p.answer, a) for p, ans in zip(problems, extracted, strict=True) for a in ans])
  )
  return [
    SolveRate(
      p.id, k, sum(next(verdicts).correct for _ in ans), tuple(ans), tuple(g.finish_reason for g in gens)
    )
    for p, ans, gens in zip(problems, extracted, outputs, strict=True)
  ]
