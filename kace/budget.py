"""What a KACE run will ask of its endpoints, before it asks: the dry run and the context check.

`plan(config, problems, ...)` counts, without a single generation call, what `kace.evaluate.run`
(and, for the learned methods, `kace.pipeline.build`) will request: problems per split, solver
samples per method and stage — worst case and expected — classifier, teacher and curator calls,
prompt and completion tokens, a cost at a per-token price and a time at a tokens/s rate when the
config gives them (`config.plan`, docs/kace.md "Running against an endpoint").

Worst case is exact: every problem climbs every tier and the pool draws its fresh samples. The
expected count rests on one stated assumption, `plan.p_correct`: each sample is right with
probability p, independently, and wrong answers never agree (each is its own cluster). Under it a
tier exits when at least `min_votes` of its samples are right (ties as `Schedule.tie` says), which
gives each problem's exit-tier distribution in closed form (`exit_distribution`). Given the exit
tiers a run actually reached, the samples drawn are exact (`samples_given_exit`), which is how the
integration test checks the plan against the calls a server saw.

`check_endpoints` reads each served role's context from `GET {base_url}/models` (`max_model_len`,
as vLLM and `lm.server` report it) and stops, in one line naming the config field, when a request
could need more (prompt estimate + max_tokens).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from kace import config as config_lib
from kace import data, learn, methods, projection, tiers
from lm import generators, rundir


class EndpointError(ValueError):
  """A served role cannot take the run's requests (too long for its context, or unreachable); the
  launchers print it as one line."""


CHAT_TOKENS = 16  # the chat template's own tokens around one user message (Qwen3's: about 10)


# ---- the tier ladder under the assumption --------------------------------------------------------------


def _exits(right: int, drawn: int, tier: tiers.Tier, schedule: tiers.Schedule) -> bool:
  """Whether a vote over `drawn` answers, `right` of them right and the rest distinct wrong answers,
  exits `tier` (as `tiers.vote` and `tiers.next_step` decide)."""
  sizes = ([right] if right else []) + [1] * (drawn - right)
  if not sizes:
    return False
  top = max(sizes)
  tied = sizes.count(top) > 1
  return top >= tier.min_votes and (not tied or schedule.tie == "earliest")


def _binomial(n: int, p: float) -> list[float]:
  return [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]


def exit_distribution(schedule: tiers.Schedule, p: float) -> dict[str, float]:
  """{exit tier (each tier's name, then POOL): probability} under `plan.p_correct = p` (module doc)."""
  out = {}
  states = {(0, 0): 1.0}  # (right, drawn) of the samples the next vote reads -> probability
  for tier in schedule.tiers:
    exited, going = 0.0, {}
    for (right, drawn), mass in states.items():
      base = (right, drawn) if schedule.carry_over else (0, 0)
      for k, q in enumerate(_binomial(tier.samples, p)):
        state = (base[0] + k, base[1] + tier.samples)
        if _exits(*state, tier, schedule):
          exited += mass * q
        else:
          going[state] = going.get(state, 0.0) + mass * q
    out[tier.name] = exited
    states = going
  out[tiers.POOL] = sum(states.values())
  return out


def pool_fresh(schedule: tiers.Schedule) -> int:
  """Fresh samples the fallback pool draws (0 when it reuses enough earlier ones)."""
  drawn = sum(t.samples for t in schedule.tiers)
  return max(0, schedule.pool_size - drawn) if schedule.pool_reuse else schedule.pool_size


def stage_samples(schedule: tiers.Schedule) -> dict[str, int]:
  """{stage: samples it draws for a problem that reaches it}, in ladder order (the pool last)."""
  return {**{t.name: t.samples for t in schedule.tiers}, tiers.POOL: pool_fresh(schedule)}


def samples_given_exit(schedule: tiers.Schedule, exit_tier: str) -> int:
  """Samples drawn by a problem that exited at `exit_tier`: every stage up to and including it."""
  total = 0
  for stage, n in stage_samples(schedule).items():
    total += n
    if stage == exit_tier:
      return total
  stages = list(stage_samples(schedule))
  raise ValueError(f"exit tier {exit_tier!r} is not a stage of the schedule ({stages})")


def expected_stage_samples(schedule: tiers.Schedule, p: float) -> dict[str, float]:
  """{stage: expected samples per problem}: a stage's samples times the chance a problem reaches it."""
  exits = exit_distribution(schedule, p)
  reach, out = 1.0, {}
  for stage, n in stage_samples(schedule).items():
    out[stage] = reach * n
    reach -= exits[stage]
  return out


# ---- the whole run ---------------------------------------------------------------------------------------


def prompt_tokens(question: str, template: str, notes_tokens: int, chars_per_token: float) -> int:
  """An estimate of a solver prompt's tokens: its characters / `chars_per_token`, the chat template,
  and `notes_tokens` of cards."""
  text = projection.solver_prompt(question, "", template)
  return math.ceil(len(text) / chars_per_token) + CHAT_TOKENS + notes_tokens


def notes_tokens(method: str, config: config_lib.KaceConfig) -> int:
  """The most card tokens a method's prompt carries: a tree block and the universal cards (each
  `learn.budget_tokens`), the ACE playbook's budget, or the retrieved / routed cards."""
  if method in methods.TREE_ARTIFACTS:
    return 2 * config.learn.budget_tokens
  if method == "ace_playbook":
    return config.ace.budget_tokens
  if method in ("llm_router", "embedding_retrieval"):
    k = config.router.k if method == "llm_router" else config.retrieval.k
    return math.ceil(k * config.learn.max_card_chars / config.plan.chars_per_token)
  return 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Line:
  """One row of the plan: a role's requests and samples, worst case and expected, and tokens."""

  what: str
  role: str
  requests: int
  samples_worst: int
  samples_expected: float
  prompt_tokens_worst: int
  completion_tokens_worst: int
  completion_tokens_expected: float
  stages: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def plan(
  config: config_lib.KaceConfig,
  problems: Sequence[data.Problem],
  *,
  train_problems: int | None = None,
  build: bool = False,
  limits: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
  """The dry run's plan for evaluating `problems` with `config.methods` (and, with `build`, learning
  their artefacts from `train_problems` problems). Returns a JSON-able dict; `format_plan` prints it."""
  pc = config.plan
  p, sampling = pc.p_correct, config.sampling
  mean_completion = pc.completion_tokens or sampling.max_tokens
  options = config.method_options()
  lines: list[Line] = []
  asked = [q for q in problems if q.domain not in config.domains]
  if asked:
    n, count = config.classifier_sampling.max_tokens, len(asked)
    lines.append(
      Line(
        what="classify domains",
        role="classifier" if config.roles.classifier else "solver",
        requests=count,
        samples_worst=count,
        samples_expected=count,
        prompt_tokens_worst=sum(math.ceil(len(q.question) / pc.chars_per_token) + 64 for q in asked),
        completion_tokens_worst=count * n,
        completion_tokens_expected=count * n,
      )
    )
  solver_prompts = [prompt_tokens(q.question, config.prompt.solver, 0, pc.chars_per_token) for q in problems]
  k = config.eval.solve_rate_k
  if k:
    lines.append(
      Line(
        what="solve rates",
        role="solver",
        requests=len(problems),
        samples_worst=len(problems) * k,
        samples_expected=len(problems) * k,
        prompt_tokens_worst=k * sum(solver_prompts),
        completion_tokens_worst=len(problems) * k * sampling.max_tokens,
        completion_tokens_expected=len(problems) * k * mean_completion,
      )
    )
  for name in config.methods:
    schedule = methods.schedule(name, options)
    stages = stage_samples(schedule)
    expected = expected_stage_samples(schedule, p)
    worst = sum(stages.values())
    prompts = sum(solver_prompts) + len(problems) * notes_tokens(name, config)
    per_stage = {
      s: {"samples": n, "worst": len(problems) * n, "expected": len(problems) * expected[s]}
      for s, n in stages.items()
    }
    lines.append(
      Line(
        what=f"method {name}",
        role="solver",
        requests=len(problems) * sum(1 for n in stages.values() if n),
        samples_worst=len(problems) * worst,
        samples_expected=len(problems) * sum(expected.values()),
        prompt_tokens_worst=worst * prompts,
        completion_tokens_worst=len(problems) * worst * sampling.max_tokens,
        completion_tokens_expected=len(problems) * sum(expected.values()) * mean_completion,
        stages={**per_stage, "exit_tiers": exit_distribution(schedule, p)},
      )
    )
  if build:
    lines += _build_lines(config, train_problems or 0)
  total = lambda key: sum(getattr(line, key) for line in lines)
  out: dict[str, Any] = {
    "problems": {"test": len(problems), "train": train_problems},
    "assumption": {
      "p_correct": p,
      "completion_tokens_per_sample": mean_completion,
      "completion_tokens_source": "plan.completion_tokens" if pc.completion_tokens else "sampling.max_tokens",
      "chars_per_token": pc.chars_per_token,
    },
    "lines": [dataclasses.asdict(line) for line in lines],
    "totals": {
      key: total(key)
      for key in (
        "requests",
        "samples_worst",
        "samples_expected",
        "prompt_tokens_worst",
        "completion_tokens_worst",
        "completion_tokens_expected",
      )
    },
    "limits": dict(limits or {}),
  }
  if pc.price_in or pc.price_out:
    cost = lambda completion: (total("prompt_tokens_worst") * pc.price_in + completion * pc.price_out) / 1e6
    out["cost_usd"] = {
      "worst": cost(total("completion_tokens_worst")),
      "expected": cost(total("completion_tokens_expected")),
    }
  if pc.tokens_per_s:
    out["hours"] = {
      "worst": total("completion_tokens_worst") / pc.tokens_per_s / 3600,
      "expected": total("completion_tokens_expected") / pc.tokens_per_s / 3600,
    }
  return out


def learn_prompt_tokens(lc: config_lib.LearnSection) -> tuple[int, int]:
  """Estimates of the longest teacher and curator prompts: the failed attempts shown (each within
  `attempt_tokens`) and the block's cards; the lowest-credit cards with their examples (~200 tokens
  each); 512 tokens of instructions each."""
  teacher = lc.failures_per_prompt * lc.attempt_tokens + lc.budget_tokens + 512
  curator = lc.curator_cards * (math.ceil(lc.max_card_chars / 4) + lc.curator_examples * 200) + 512
  return teacher, curator


def _build_lines(config: config_lib.KaceConfig, train: int) -> list[Line]:
  """Teacher and curator calls of learning each tree artefact the methods read: one teacher call per
  cell (reading tier x domain, + universal) per ADD sweep, `learn.max_sweeps` sweeps, `1 +
  learn.retries` asks each when replies are malformed (worst); one curator call per REFINE round.
  The solver's own samples during a build (re-solving the training split) are not counted."""
  lc, rs = config.learn, config.role_sampling
  artefacts = sorted({methods.ARTIFACT[m] for m in config.methods if m in methods.TREE_ARTIFACTS})
  cells = len(learn.reading_tiers(config.schedule.schedule())) * len(config.domains) + int(lc.universal)
  teacher_prompt, curator_prompt = learn_prompt_tokens(lc)
  asks = 1 + lc.retries
  calls = lambda what, role, expected, prompt: Line(
    what=what,
    role=role,
    requests=expected * asks,
    samples_worst=expected * asks,
    samples_expected=expected,
    prompt_tokens_worst=expected * asks * prompt,
    completion_tokens_worst=expected * asks * rs.max_tokens,
    completion_tokens_expected=expected * rs.max_tokens,
  )
  out = []
  for artefact in artefacts:
    sweeps, rounds = lc.max_sweeps, lc.refine_rounds
    what = f"teach {artefact} ({cells} cells x {sweeps} sweeps, {train} training problems)"
    out.append(calls(what, "teacher", cells * sweeps, teacher_prompt))
    out.append(calls(f"curate {artefact} ({rounds} REFINE rounds)", "curator", rounds, curator_prompt))
  return out


def format_plan(p: Mapping[str, Any]) -> str:
  """The plan as the dry run prints it."""
  a, t = p["assumption"], p["totals"]
  train = p["problems"]["train"]
  rows = [
    f"KACE dry run: no generation call was made. Problems: test {p['problems']['test']}, "
    f"train {'- (no training split configured)' if train is None else train}.",
    f"Expected counts assume each sample is right with p = {a['p_correct']} (wrong answers never "
    f"agree) and {a['completion_tokens_per_sample']:,} completion tokens a sample "
    f"({a['completion_tokens_source']}); worst case: every problem climbs every tier and every sample "
    "runs to max_tokens.",
    "",
    "| what | role | requests | samples worst | samples expected | prompt tokens (worst) | "
    "completion tokens worst | completion tokens expected |",
    "|---|---|---|---|---|---|---|---|",
  ]
  cells = lambda x: (
    f"{x['requests']:,} | {x['samples_worst']:,} | {x['samples_expected']:,.1f} | "
    f"{x['prompt_tokens_worst']:,} | {x['completion_tokens_worst']:,} | "
    f"{x['completion_tokens_expected']:,.0f} |"
  )
  rows += [f"| {line['what']} | {line['role']} | {cells(line)}" for line in p["lines"]]
  rows += [f"| total | | {cells(t)}", ""]
  for line in p["lines"]:
    if line["stages"]:
      stages = {k: v for k, v in line["stages"].items() if k != "exit_tiers"}
      per = ", ".join(f"{s} {v['samples']} (expected {v['expected']:,.1f})" for s, v in stages.items())
      exits = ", ".join(f"{s} {q:.3f}" for s, q in line["stages"]["exit_tiers"].items())
      rows.append(f"- {line['what']}: samples a stage {per}; exit-tier probabilities {exits}")
  if "cost_usd" in p:
    rows.append(
      f"- cost at plan.price_in / price_out ($ a million tokens): "
      f"expected ${p['cost_usd']['expected']:,.2f}, "
      f"worst ${p['cost_usd']['worst']:,.2f}"
    )
  if "hours" in p:
    rows.append(
      f"- time at plan.tokens_per_s generated: expected {p['hours']['expected']:,.1f} h, "
      f"worst {p['hours']['worst']:,.1f} h"
    )
  for role, limit in p["limits"].items():
    rows.append(f"- endpoint of {role}: {json.dumps(limit)}")
  return "\n".join(rows)


# ---- the endpoints' context ------------------------------------------------------------------------------


def served_limits(role: generators.GeneratorConfig, timeout: float = 10.0) -> dict[str, Any]:
  """What `GET {base_url}/models` says of `role.model`: `max_model_len` (vLLM, `lm.server`),
  `context_length` and `max_tokens` where the server reports them. Raises OSError when the server
  cannot be read or does not serve the model."""
  request = urllib.request.Request(role.base_url.rstrip("/") + "/models")
  key = os.environ.get(role.api_key_env, "")
  if key:
    request.add_header("Authorization", f"Bearer {key}")
  with urllib.request.urlopen(request, timeout=timeout) as response:  # a configured URL
    listing = json.load(response)
  entries = listing.get("data") or []
  entry = next((e for e in entries if e.get("id") == role.model), None)
  if entry is None:
    raise OSError(f"model {role.model!r} is not served (it serves {[e.get('id') for e in entries]})")
  out: dict[str, Any] = {"url": role.base_url, "model": role.model}
  for field in ("max_model_len", "context_length", "max_tokens"):
    if isinstance(entry.get(field), int):
      out[field] = entry[field]
  return out


ROLE_SAMPLING = {"solver": "sampling", "classifier": "classifier_sampling", "router": "role_sampling"}
ROLE_SAMPLING_BUILD = {"teacher": "role_sampling", "curator": "role_sampling"}


def check_endpoints(
  config: config_lib.KaceConfig, problems: Sequence[data.Problem], *, build: bool = False, strict: bool = True
) -> dict[str, dict[str, Any]]:
  """Reads every served role's limits; raises EndpointError, in one line naming the config field, when
  its longest request (prompt estimate + max_tokens) exceeds the server's `max_model_len` (or its
  max_tokens a reported `max_tokens`). Returns {role: limits}. With `strict` False (the dry run) an
  unreadable server or a request too long is reported in the limits, not raised."""
  pc, lc = config.plan, config.learn
  longest = max(
    (prompt_tokens(q.question, config.prompt.solver, 0, pc.chars_per_token) for q in problems), default=0
  )
  longest += max((notes_tokens(m, config) for m in config.methods), default=0)
  prompts = {
    "solver": longest,
    "classifier": longest + 64,
    "router": longest + 2 * lc.budget_tokens,
  }
  prompts["teacher"], prompts["curator"] = learn_prompt_tokens(lc)
  wanted = dict(ROLE_SAMPLING, **(ROLE_SAMPLING_BUILD if build else {}))
  unused = {
    "router": "llm_router" not in config.methods,
    "classifier": all(q.domain in config.domains for q in problems),
  }
  out: dict[str, dict[str, Any]] = {}
  seen: dict[tuple[str, str], dict[str, Any]] = {}
  for role, section in wanted.items():
    if unused.get(role):
      continue
    rc = config.roles.get(role)
    if rc.kind != "openai":
      continue
    if (rc.base_url, rc.model) not in seen:
      try:
        seen[rc.base_url, rc.model] = served_limits(rc)
      except (OSError, ValueError) as e:
        if strict:
          where = f"config.roles.{role}.base_url"
          raise EndpointError(f"{where}: cannot read {rc.base_url}/models ({e})") from None
        seen[rc.base_url, rc.model] = {"url": rc.base_url, "model": rc.model, "error": str(e)}
    limits = out[role] = dict(seen[rc.base_url, rc.model])
    max_tokens = getattr(config, section).max_tokens
    need = limits["needs"] = prompts[role] + max_tokens
    context = limits.get("max_model_len", limits.get("context_length"))
    if context is not None and need > context:
      limits["problem"] = (
        f"config.{section}.max_tokens={max_tokens} + a prompt of ~{prompts[role]} tokens = {need} exceeds "
        f"max_model_len={context} of {rc.model!r} at {rc.base_url} (GET /models); set "
        f"--config.{section}.max_tokens={max(1, context - prompts[role])} or less, or serve a longer context"
      )
    elif "max_tokens" in limits and max_tokens > limits["max_tokens"]:
      limits["problem"] = (
        f"config.{section}.max_tokens={max_tokens} exceeds max_tokens={limits['max_tokens']} of "
        f"{rc.model!r} at {rc.base_url} (GET /models); set --config.{section}.max_tokens="
        f"{limits['max_tokens']} or less"
      )
    if strict and "problem" in limits:
      raise EndpointError(limits["problem"])
  return out


def dry_run(
  config: config_lib.KaceConfig,
  problems: Sequence[data.Problem],
  workdir: str | None,
  *,
  train: int | None,
  build: bool,
) -> dict[str, Any]:
  """Prints the plan and writes `plan.json` / `plan.md` into `workdir`; makes no generation call
  (it reads each served role's `GET /models`, which costs nothing)."""
  limits = check_endpoints(config, problems, build=build, strict=False)
  result = plan(config, problems, train_problems=train, build=build, limits=limits)
  text = format_plan(result)
  print(text, flush=True)
  if workdir:
    rundir.write_json(os.path.join(workdir, "plan.json"), result)
    rundir.atomic_write_text(os.path.join(workdir, "plan.md"), text + "\n")
  return result
