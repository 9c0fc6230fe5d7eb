"""Batched episodes of the DPA-GRPO game (and of generator-only baselines) through the sampler.

An episode drafts the 19 lines of a batch of cases in the fixed order of `taxcalc.LINE_IDS`; each
line's prompt carries the lines already submitted (`taxcalc.line_prompt`). For one line of all
cases — the decision units of a stage — every role's turn is ONE sampler call:

  1. the generator drafts x for every unit;
  2. the verifier replies NS or SAC (verdict + Claim/Argument/Evidence) for every unit;
  3. for every SAC'd unit the generator samples K revisions (default 5 at temperature 0.7), one is
     kept by `keep_rule` — never by the oracle;
  4. the generator replies KEEP or REVISE for every SAC'd unit; in training, exploration forces
     REVISE with probability ε (the sampled reply is still recorded).

The oracle (`taxcalc.line_correct`) gives S_x and S_z; the submitted amount is carried into later
prompts. Every prompt and reply is kept in the unit's record. Revisions are sampled for every
SAC'd unit before KEEP/REVISE, so S_z is known in cases 6a/6b too (a KEEP that missed a fix).

Keep rules (no oracle): "majority" (default: the most common parsed amount among the K revisions,
ties and then the sample by the generator's mean token log-prob — self-consistency, which the
reference's "best" most plausibly approximates without labels), "logprob" (the revision with the
highest mean token log-prob under the generator), "first_parseable".
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpa_grpo import game
from dpa_grpo.envs import taxcalc
from lm import sampler as sampler_lib
from lm import seeding
from lm import text as text_lib

KEEP_RULES = ("majority", "logprob", "first_parseable")
_PHASES = {"draft": 0, "verify": 1, "revise": 2, "decide": 3, "explore": 4, "group": 5}


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """How episodes are played (defaults: the paper's reference code).

  Attributes:
    lines: the decision units of a case, in drafting order (a prefix-closed subset for small runs).
    answer_format: "line" (the benchmark's) or "json" line answers.
    temperature, top_p, top_k: sampling of drafts, verdicts and decisions.
    revisions, revision_temperature: K revisions per SAC and their temperature.
    keep_rule: how one of the K revisions is kept (see the module docstring).
    explore: probability that a SAC'd unit's decision is forced to REVISE during training.
    max_new_tokens: longest draft or revision; verdict_tokens, decision_tokens: longest replies.
    tolerance: the oracle's per-line tolerance (0: strict, the paper's; 5: lenient).
    compact_forms: the short prompt style of small models: input fields as {field: value}
      without labels or names (`compact`), lines by number (`taxcalc.line_prompt(compact=True)`)
      and answers without the line's description; the real benchmark's prompt keeps everything.
    enable_thinking: Qwen3's chat-template switch (None: the template's default).
    invalid_verdict_action, invalid_decision_action: what an unreadable reply plays.
    group_size: completions per prompt of the generator-only baselines.
  """

  lines: tuple[str, ...] = taxcalc.LINE_IDS
  answer_format: str = "line"
  temperature: float = 0.2
  top_p: float = 0.9
  top_k: int = 0
  revisions: int = 5
  revision_temperature: float = 0.7
  keep_rule: str = "majority"
  explore: float = 0.4
  max_new_tokens: int = 2048
  verdict_tokens: int = 512
  decision_tokens: int = 16
  tolerance: float = taxcalc.STRICT_TOLERANCE
  compact_forms: bool = False
  enable_thinking: bool | None = False
  invalid_verdict_action: str = "SAC"
  invalid_decision_action: str = "KEEP"
  group_size: int = 8

  def __post_init__(self):
    if self.keep_rule not in KEEP_RULES:
      raise ValueError(f"keep_rule must be one of {KEEP_RULES}, got {self.keep_rule!r}")
    for line_id in self.lines:
      taxcalc.line_by_id(line_id)
    if self.invalid_verdict_action not in game.VERIFIER_ACTIONS:
      raise ValueError(f"invalid_verdict_action must be one of {game.VERIFIER_ACTIONS}")
    if self.invalid_decision_action not in game.GENERATOR_ACTIONS:
      raise ValueError(f"invalid_decision_action must be one of {game.GENERATOR_ACTIONS}")

  def show(self, case: taxcalc.TaxCase) -> taxcalc.TaxCase:
    """The case as prompts display it."""
    return compact(case) if self.compact_forms else case

  def line_prompt(self, shown: taxcalc.TaxCase, line_id: str, drafted) -> str:
    """The draft prompt of one unit of a `show`n case in this config's style."""
    return taxcalc.line_prompt(shown, line_id, drafted, self.answer_format, compact=self.compact_forms)

  def answer(self, line_id: str, amount: float, explanation: str) -> str:
    """A well-formed answer in this config's style (warm starts, the task tokenizer)."""
    return taxcalc.render_line_answer(line_id, amount, explanation, self.answer_format, self.compact_forms)


@dataclasses.dataclass(frozen=True)
class Sample:
  """One sampled completion: its text, token ids, the model's mean token log-prob, why it ended."""

  text: str
  tokens: tuple[int, ...]
  mean_logprob: float
  finish: str


class RolePolicy:
  """One role's text sampler: chat-formats prompts and samples through an `lm.sampler.Sampler`.

  The sampler's model is the role's view (backbone + that role's adapter); call `sampler.refresh()`
  after its parameters change.
  """

  def __init__(self, sampler: sampler_lib.Sampler, tokenizer, enable_thinking: bool | None = False):
    self.sampler = sampler
    self.tokenizer = tokenizer
    self.enable_thinking = enable_thinking

  def prompt_ids(self, prompt: str) -> list[int]:
    return self.tokenizer.encode_chat(text_lib.user_chat(prompt), enable_thinking=self.enable_thinking)

  def generate(
    self,
    prompts: Sequence[str],
    *,
    n: int,
    temperature: float,
    top_p: float,
    top_k: int,
    max_new_tokens: int,
    seeds: Sequence[int],
  ) -> tuple[list[list[int]], list[list[Sample]]]:
    """Prompt token ids and n samples per prompt; no prompts, no sampler call."""
    ids = [self.prompt_ids(p) for p in prompts]
    if not ids:
      return [], []
    out = self.sampler.generate(
      ids,
      max_new_tokens=max_new_tokens,
      n=n,
      temperature=temperature,
      top_p=top_p,
      top_k=top_k,
      eos_ids=self.tokenizer.eos_ids,
      seed=list(seeds),
    )
    samples = [
      [
        Sample(text, tuple(tokens), float(np.mean(logprobs)) if logprobs else 0.0, finish)
        for text, tokens, logprobs, finish in zip(texts, toks, lps, fins, strict=True)
      ]
      for texts, toks, lps, fins in zip(out.texts, out.tokens, out.logprobs, out.finish_reasons, strict=True)
    ]
    return ids, samples


@dataclasses.dataclass
class Unit:
  """Everything about one played decision unit (the records keep all but the token ids)."""

  case_id: str
  line_id: str
  gold: float
  draft_prompt: str
  x: Sample
  x_amount: float | None
  x_right: bool
  verifier_prompt: str
  verifier: game.VerifierReply
  verifier_reply: Sample
  revision_prompt: str = ""
  revisions: tuple[Sample, ...] = ()
  revision_amounts: tuple[float | None, ...] = ()
  kept: int = -1
  z_amount: float | None = None
  z_right: bool | None = None
  decision_prompt: str = ""
  decision: game.GeneratorDecision | None = None
  decision_reply: Sample | None = None
  forced_revise: bool = False
  generator_action: int | None = None
  case: str = ""
  submitted: float | None = None
  submitted_right: bool = False
  prompt_ids: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # by turn: draft, ...

  @property
  def z(self) -> Sample | None:
    return self.revisions[self.kept] if self.kept >= 0 else None

  def record(self) -> dict[str, Any]:
    """The JSONL record: every text, parsed value, action and oracle result (no token ids)."""
    sample = lambda s: (
      None if s is None else {"text": s.text, "mean_logprob": s.mean_logprob, "finish": s.finish}
    )
    return {
      "case_id": self.case_id,
      "line": self.line_id,
      "gold": self.gold,
      "draft_prompt": self.draft_prompt,
      "x": sample(self.x),
      "x_amount": self.x_amount,
      "x_right": self.x_right,
      "verifier_prompt": self.verifier_prompt,
      "verifier": sample(self.verifier_reply),
      "verdict": self.verifier.verdict,
      "verifier_action": game.VERIFIER_ACTIONS[self.verifier.action],
      "verifier_valid": self.verifier.valid,
      "verifier_error": self.verifier.error,
      "sac": None if self.verifier.sac is None else self.verifier.sac.to_dict(),
      "revision_prompt": self.revision_prompt,
      "revisions": [sample(s) for s in self.revisions],
      "revision_amounts": list(self.revision_amounts),
      "kept": self.kept,
      "z_amount": self.z_amount,
      "z_right": self.z_right,
      "decision_prompt": self.decision_prompt,
      "decision": sample(self.decision_reply),
      "decision_valid": None if self.decision is None else self.decision.valid,
      "decision_error": None if self.decision is None else self.decision.error,
      "forced_revise": self.forced_revise,
      "generator_action": None
      if self.generator_action is None
      else game.GENERATOR_ACTIONS[self.generator_action],
      "case": self.case,
      "submitted": self.submitted,
      "submitted_right": self.submitted_right,
    }


def compact(case: taxcalc.TaxCase) -> taxcalc.TaxCase:
  """The case with every `{label, value}` input field shown as its value alone, names dropped
  (`*_name` fields: people, employers and payers never enter a Form 1040 amount) and empty
  lists and objects left out."""

  def strip(node):
    if isinstance(node, dict):
      if set(node) == {"label", "value"}:
        return node["value"]
      kept = {k: strip(v) for k, v in node.items() if not k.endswith("_name")}
      return {k: v for k, v in kept.items() if v not in ([], {})}  # "no 1099s" = no list
    if isinstance(node, list):
      return [strip(v) for v in node]
    return node

  return dataclasses.replace(case, forms=strip(case.forms))


def gold_episodes(cases: Sequence[taxcalc.TaxCase], cfg: RolloutConfig):
  """(case, line id, draft prompt) of every unit of `cases` in drafting order, every earlier line
  drafted right: the texts a task tokenizer is fitted to and a warm start is trained on."""
  for case in cases:
    shown = cfg.show(case)
    drafted: dict[str, float | None] = {}
    for line_id in cfg.lines:
      yield case, line_id, cfg.line_prompt(shown, line_id, drafted)
      drafted[line_id] = case.gold[line_id]


def keep_revision(samples: Sequence[Sample], amounts: Sequence[float | None], rule: str) -> int:
  """The index of the kept revision under `rule` (see the module docstring); never the oracle."""
  by_logprob = sorted(range(len(samples)), key=lambda i: (-samples[i].mean_logprob, i))
  if rule == "logprob":
    return by_logprob[0]
  parsed = [i for i in range(len(samples)) if amounts[i] is not None]
  if rule == "first_parseable":
    return parsed[0] if parsed else 0
  if not parsed:
    return by_logprob[0]
  votes = collections.Counter(amounts[i] for i in parsed)
  top = max(votes.values())
  winners = {a for a, c in votes.items() if c == top}
  return next(i for i in by_logprob if amounts[i] in winners)


def _amount(text: str, line_id: str) -> float | None:
  return taxcalc.parse_line_answer(text, line_id).value


def play(
  cases: Sequence[taxcalc.TaxCase],
  generator: RolePolicy,
  verifier: RolePolicy,
  cfg: RolloutConfig,
  *,
  seed: int,
  step: int,
  greedy: bool = False,
) -> list[Unit]:
  """Plays every line of `cases` and returns the units in (line, case) order.

  `greedy` is evaluation: temperature 0 everywhere, one revision, no exploration.
  """
  temperature = 0.0 if greedy else cfg.temperature
  revision_temperature = 0.0 if greedy else cfg.revision_temperature
  k = 1 if greedy else cfg.revisions
  explore = 0.0 if greedy else cfg.explore
  sampling = dict(top_p=cfg.top_p, top_k=cfg.top_k)
  fallback_verdict = game.VERIFIER_ACTIONS.index(cfg.invalid_verdict_action)
  fallback_decision = game.GENERATOR_ACTIONS.index(cfg.invalid_decision_action)
  shown = [cfg.show(c) for c in cases]
  drafted: list[dict[str, float | None]] = [{} for _ in cases]
  units: list[Unit] = []
  for li, line_id in enumerate(cfg.lines):
    seeds = lambda phase, n: seeding.derive_seeds(seed, step, li, _PHASES[phase], n=n)  # noqa: B023
    prompts = [cfg.line_prompt(c, line_id, d) for c, d in zip(shown, drafted, strict=True)]
    ids, drafts = generator.generate(
      prompts,
      n=1,
      temperature=temperature,
      max_new_tokens=cfg.max_new_tokens,
      seeds=seeds("draft", len(prompts)),
      **sampling,
    )
    stage = []
    for case, prompt, prompt_ids, (x,) in zip(cases, prompts, ids, drafts, strict=True):
      amount = _amount(x.text, line_id)
      gold = case.gold[line_id]
      unit = Unit(
        case.case_id,
        line_id,
        gold,
        prompt,
        x,
        amount,
        taxcalc.line_correct(amount, gold, cfg.tolerance),
        game.verifier_prompt(prompt, x.text),
        None,
        None,
      )
      unit.prompt_ids["draft"] = prompt_ids
      stage.append(unit)
    ids, replies = verifier.generate(
      [u.verifier_prompt for u in stage],
      n=1,
      temperature=temperature,
      max_new_tokens=cfg.verdict_tokens,
      seeds=seeds("verify", len(stage)),
      **sampling,
    )
    for unit, prompt_ids, (reply,) in zip(stage, ids, replies, strict=True):
      unit.verifier_reply = reply
      unit.verifier = game.parse_verifier_reply(reply.text, fallback_verdict)
      unit.prompt_ids["verify"] = prompt_ids
    challenged = [u for u in stage if u.verifier.action == game.SAC_ACTION]
    for u in challenged:
      u.revision_prompt = game.revision_prompt(u.draft_prompt, u.x.text, u.verifier.sac)
    ids, revisions = generator.generate(
      [u.revision_prompt for u in challenged],
      n=k,
      temperature=revision_temperature,
      max_new_tokens=cfg.max_new_tokens,
      seeds=seeds("revise", len(challenged)),
      **sampling,
    )
    for unit, prompt_ids, samples in zip(challenged, ids, revisions, strict=True):
      unit.prompt_ids["revise"] = prompt_ids
      unit.revisions = tuple(samples)
      unit.revision_amounts = tuple(_amount(s.text, line_id) for s in samples)
      unit.kept = keep_revision(samples, unit.revision_amounts, cfg.keep_rule)
      unit.z_amount = unit.revision_amounts[unit.kept]
      unit.z_right = taxcalc.line_correct(unit.z_amount, unit.gold, cfg.tolerance)
      unit.decision_prompt = game.decision_prompt(
        unit.draft_prompt, unit.x.text, unit.verifier.sac, unit.z.text
      )
    ids, decisions = generator.generate(
      [u.decision_prompt for u in challenged],
      n=1,
      temperature=temperature,
      max_new_tokens=cfg.decision_tokens,
      seeds=seeds("decide", len(challenged)),
      **sampling,
    )
    forced = np.random.default_rng(seeds("explore", 1)).random(len(challenged)) < explore
    for unit, prompt_ids, (reply,), force in zip(challenged, ids, decisions, forced, strict=True):
      unit.prompt_ids["decide"] = prompt_ids
      unit.decision_reply = reply
      unit.decision = game.parse_decision(reply.text, fallback_decision)
      unit.forced_revise = bool(force)
      unit.generator_action = game.REVISE if force else unit.decision.action
    for unit, d in zip(stage, drafted, strict=True):
      args = (unit.x_right, unit.verifier.action, unit.generator_action, unit.z_right)
      unit.case = game.classify_case(*args)
      unit.submitted_right = game.submitted_right(*args)
      revised = unit.generator_action == game.REVISE
      unit.submitted = unit.z_amount if revised else unit.x_amount
      d[line_id] = unit.submitted
    units.extend(stage)
  return units


@dataclasses.dataclass
class Group:
  """G completions of one line prompt (generator-only baselines) with their 0/1 rewards."""

  case_id: str
  line_id: str
  gold: float
  prompt: str
  prompt_ids: list[int]
  samples: tuple[Sample, ...]
  amounts: tuple[float | None, ...]
  rewards: tuple[float, ...]

  def record(self) -> dict[str, Any]:
    return {
      "case_id": self.case_id,
      "line": self.line_id,
      "gold": self.gold,
      "prompt": self.prompt,
      "completions": [
        {"text": s.text, "mean_logprob": s.mean_logprob, "finish": s.finish} for s in self.samples
      ],
      "amounts": list(self.amounts),
      "rewards": list(self.rewards),
    }


def sample_groups(
  cases: Sequence[taxcalc.TaxCase], generator: RolePolicy, cfg: RolloutConfig, *, seed: int, step: int
) -> list[Group]:
  """Generator-only episodes: G completions per line prompt; the first one is carried forward."""
  shown = [cfg.show(c) for c in cases]
  drafted: list[dict[str, float | None]] = [{} for _ in cases]
  groups = []
  for li, line_id in enumerate(cfg.lines):
    prompts = [cfg.line_prompt(c, line_id, d) for c, d in zip(shown, drafted, strict=True)]
    ids, samples = generator.generate(
      prompts,
      n=cfg.group_size,
      temperature=cfg.temperature,
      top_p=cfg.top_p,
      top_k=cfg.top_k,
      max_new_tokens=cfg.max_new_tokens,
      seeds=seeding.derive_seeds(seed, step, li, _PHASES["group"], n=len(prompts)),
    )
    for case, prompt, prompt_ids, group, d in zip(cases, prompts, ids, samples, drafted, strict=True):
      amounts = tuple(_amount(s.text, line_id) for s in group)
      gold = case.gold[line_id]
      rewards = tuple(float(taxcalc.line_correct(a, gold, cfg.tolerance)) for a in amounts)
      groups.append(Group(case.case_id, line_id, gold, prompt, prompt_ids, tuple(group), amounts, rewards))
      d[line_id] = amounts[0]
  return groups
