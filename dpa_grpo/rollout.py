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

The oracle (`RolloutConfig.correct`) gives S_x and S_z; the submitted amount (or, with
`context="draft"`, the original draft x, as the reference code does) is carried into later
prompts. Every prompt and reply is kept in the unit's record. Revisions are sampled for every SAC'd
unit before KEEP/REVISE, so S_z is known in cases 6a/6b too (a KEEP that missed a fix).

Keep rules (no oracle): "majority" (default: the most common parsed amount among the K revisions,
ties and then the sample by the generator's mean token log-prob — self-consistency, which the
reference's "best" most plausibly approximates without labels), "logprob" (the revision with the
highest mean token log-prob under the generator), "first_parseable", "first" (the first sample, as the
reference code's later version shows the approver; its earlier version showed the oracle's best of
K, which no rule here does: the oracle never chooses).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from dpa_grpo import game
from dpa_grpo.envs import copycheck, taxcalc
from lm import rundir, scoring, seeding, sharding
from lm import sampler as sampler_lib
from lm import text as text_lib

KEEP_RULES = ("majority", "logprob", "first_parseable", "first")
CONTEXTS = ("submitted", "draft")
GROUP_CARRIES = ("first", "best")
UNPARSED_REVISIONS = ("missing", "keep_draft")
ENGINES = ("jax", "openai")
TRUNCATED = ("unanswered", "extract")  # what a reply cut off by max_new_tokens answers
_PHASES = {"draft": 0, "verify": 1, "revise": 2, "decide": 3, "explore": 4, "group": 5}


@dataclasses.dataclass(frozen=True, kw_only=True)
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
    missing_as_zero: score a missing or unparsable amount as 0.0 (the reference evaluator's
      reading: right on lines whose gold is 0) instead of wrong.
    context: what later lines' prompts show of an earlier line — "submitted" (the amount the
      unit submitted) or "draft" (the original draft x, as the reference code does).
    group_carry: the generator-only baselines' amount carried to later lines — "first" (the
      first completion) or "best" (the oracle-best completion, as the reference code does).
    unparsed_revision: an unparsable revision — "missing": scored like any missing amount
      (`missing_as_zero`) and submitted by REVISE; "keep_draft" (the reference code's
      `dual_rollout.py`): scored wrong (S_z = 0), and a REVISE on it submits the draft x.
    decision_note: the copy-and-check family's KEEP / REVISE prompt ends with which of the draft
      and the revision equals the field (`copycheck.decision_note`); off: the prompt as before.
    engine: who samples — "jax" (the in-process `lm.Sampler`) or "openai" (a serving engine at
      `engine_url` — vLLM, SGLang, `lm.server` — each role served as its LoRA adapter by name,
      `EngineRolePolicy`; the trainer syncs the adapters after every update and rescores what
      was sampled itself; on several hosts process 0 is the engine's one client and sends the
      samples to the others).
    engine_url: the engine's OpenAI base URL ("http://host:port/v1") with engine="openai".
    engine_adapter_dir: where the trainer writes the roles' PEFT adapters for the engine to load
      (a path the engine can read); "": `<workdir>/engine_adapters`.
    truncated: what a draft or revision cut off by `max_new_tokens` answers — "unanswered" (the
      benchmark's rule: only its complete lines count, so an amount cut mid-number is never read,
      `taxcalc.complete_part`) or "extract" (the whole text is parsed, the reference code's reading).
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
  missing_as_zero: bool = False
  context: str = "submitted"
  group_carry: str = "first"
  unparsed_revision: str = "missing"
  decision_note: bool = False
  engine: str = "jax"
  engine_url: str = ""
  engine_adapter_dir: str = ""
  truncated: str = "unanswered"

  def __post_init__(self):
    if self.truncated not in TRUNCATED:
      raise ValueError(f"rollout.truncated must be one of {TRUNCATED}, got {self.truncated!r}")
    if self.engine not in ENGINES:
      raise ValueError(f"rollout.engine must be one of {ENGINES}, got {self.engine!r}")
    if self.engine == "openai" and not self.engine_url:
      raise ValueError("rollout.engine='openai' needs rollout.engine_url (e.g. http://127.0.0.1:8000/v1)")
    if self.unparsed_revision not in UNPARSED_REVISIONS:
      raise ValueError(
        f"unparsed_revision must be one of {UNPARSED_REVISIONS}, got {self.unparsed_revision!r}"
      )
    if self.context not in CONTEXTS:
      raise ValueError(f"context must be one of {CONTEXTS}, got {self.context!r}")
    if self.group_carry not in GROUP_CARRIES:
      raise ValueError(f"group_carry must be one of {GROUP_CARRIES}, got {self.group_carry!r}")
    if self.keep_rule not in KEEP_RULES:
      raise ValueError(f"keep_rule must be one of {KEEP_RULES}, got {self.keep_rule!r}")
    for line_id in self.lines:
      taxcalc.line_by_id(line_id)
    if self.invalid_verdict_action not in game.VERIFIER_ACTIONS:
      raise ValueError(f"invalid_verdict_action must be one of {game.VERIFIER_ACTIONS}")
    if self.invalid_decision_action not in game.GENERATOR_ACTIONS:
      raise ValueError(f"invalid_decision_action must be one of {game.GENERATOR_ACTIONS}")

  def correct(self, amount: float | None, gold: float) -> bool:
    """The oracle of one line: `taxcalc.line_correct`, reading a missing amount as 0.0 when
    `missing_as_zero`."""
    if amount is None and self.missing_as_zero:
      amount = 0.0
    return taxcalc.line_correct(amount, gold, self.tolerance)

  def revision_correct(self, amount: float | None, gold: float) -> bool:
    """The oracle on one revision: `correct`, except that an unparsable one is wrong under
    `unparsed_revision="keep_draft"`."""
    if amount is None and self.unparsed_revision == "keep_draft":
      return False
    return self.correct(amount, gold)

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

  def set_model(self, model) -> None:
    """Samples from `model` (the role's view) from now on."""
    self.sampler.model = model
    self.sampler.refresh()

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


@functools.partial(jax.jit, static_argnames=("graphdef", "chunk"))
def _rescore(graphdef, state, tokens, attention_mask, *, chunk: int):
  return scoring.token_logprobs(nnx.merge(graphdef, state), tokens, attention_mask, chunk=chunk)


def rescore(
  model,
  prompts: Sequence[Sequence[int]],
  completions: Sequence[Sequence[int]],
  *,
  pad_id: int,
  chunk: int = 8192,
) -> list[np.ndarray]:
  """log π(completion token | prompt, earlier tokens) under `model` for every (prompt, completion):
  one array per completion. Rows are padded to a power of two and columns to a multiple of 64, so
  calls of similar sizes share a compiled program."""
  batch = scoring.pack_pairs(prompts, completions, pad_id=pad_id, length_multiple=64)
  rows = len(prompts)
  padded = 1 << max(rows - 1, 0).bit_length()
  if padded > rows:  # dummy rows: one pad token, attended to, scored and dropped
    extra = {k: np.zeros((padded - rows, v.shape[1]), v.dtype) for k, v in batch.items()}
    extra["attention_mask"][:, -1] = 1
    batch = {k: np.concatenate([v, extra[k]]) for k, v in batch.items()}
  graphdef, state = nnx.split(model)
  logp = np.asarray(
    sharding.to_host(_rescore(graphdef, state, batch["tokens"], batch["attention_mask"], chunk=chunk))
  )
  width = batch["tokens"].shape[1]
  return [logp[i, width - len(c) :] if len(c) else logp[i, :0] for i, c in enumerate(completions)]


def load_adapter(engine_url: str, name: str, path: str, timeout: float = 600.0) -> None:
  """Has the engine (re)load the PEFT adapter at `path` as model `name` (`/v1/load_lora_adapter`,
  vLLM's endpoint, which `lm.server` implements too). `load_inplace` replaces an adapter already
  loaded under the name; a vLLM without it answers 400, and the adapter is unloaded and loaded."""

  def post(route: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
      f"{engine_url.rstrip('/')}/{route}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
      response.read()

  try:
    post("load_lora_adapter", {"lora_name": name, "lora_path": path, "load_inplace": True})
  except urllib.error.HTTPError as error:
    detail = error.read().decode(errors="replace")
    if error.code != 400 or "already" not in detail:
      raise RuntimeError(
        f"{engine_url}: load_lora_adapter {name!r} from {path}: {error.code} {detail}"
      ) from error
    post("unload_lora_adapter", {"lora_name": name})
    post("load_lora_adapter", {"lora_name": name, "lora_path": path})


@dataclasses.dataclass
class LogprobGap:
  """|engine log-prob − trainer log-prob| over the sampled tokens since the last `take`: the
  engine and the trainer drifting apart (other weights, other numerics) is a known RL failure."""

  total: float = 0.0
  worst: float = 0.0
  tokens: int = 0

  def add(self, engine: Sequence[float], trainer: np.ndarray) -> None:
    diff = np.abs(np.asarray(engine, np.float64) - np.asarray(trainer, np.float64))
    self.total += float(diff.sum())
    self.worst = max(self.worst, float(diff.max(initial=0.0)))
    self.tokens += diff.size

  def take(self) -> dict[str, float]:
    """{"mean_abs", "max", "tokens"} and a reset; empty when nothing was sampled."""
    out = (
      {"mean_abs": self.total / self.tokens, "max": self.worst, "tokens": self.tokens} if self.tokens else {}
    )
    self.total, self.worst, self.tokens = 0.0, 0.0, 0
    return out


class EngineRolePolicy:
  """One role's text sampler on a serving engine: the role's LoRA adapter served by name.

  `generate` sends every prompt (chat-formatted here, as text) to the engine's /v1/completions
  with model=`name`, asking for each sampled token's id and log-prob; the trainer rescores those
  ids under its own view of the role (`rescore`), and the sample's `mean_logprob` is the
  trainer's. `gap` (shared by the roles) collects the engine-vs-trainer difference. `set_model`
  writes the view's adapter in PEFT format under `adapter_dir/name` and has the engine load it
  (`load_adapter`), so the engine samples the parameters the trainer holds.
  """

  def __init__(
    self,
    generator,
    tokenizer,
    enable_thinking: bool | None,
    *,
    name: str,
    engine_url: str,
    adapter_dir: str,
    peft: Mapping[str, Any],
    gap: LogprobGap,
    chunk: int = 8192,
  ):
    self.generator = generator  # an lm.generators.OpenAIGenerator(model=name, token_ids=True)
    self.tokenizer = tokenizer
    self.enable_thinking = enable_thinking
    self.name = name
    self.engine_url = engine_url
    self.adapter_dir = adapter_dir
    self.peft = dict(peft)  # rank, alpha, target_modules, base_model_name of lora.save_peft
    self.chunk = chunk
    self.model = None
    self.gap = gap  # shared by the roles: the trainer reads it once per step

  def prompt_text(self, prompt: str) -> str:
    return self.tokenizer.apply_chat_template(
      text_lib.user_chat(prompt), enable_thinking=self.enable_thinking
    )

  def set_model(self, model) -> None:
    from lm import lora

    if model.lora is None:
      raise ValueError(f"rollout.engine='openai' serves role {self.name!r} as a LoRA adapter: it has none")
    path = os.path.abspath(os.path.join(self.adapter_dir, self.name))
    lora.save_peft(model.lora, path, **self.peft)  # every process gathers; process 0 writes
    if rundir.is_writer():  # one client of the engine: process 0 (`generate`)
      load_adapter(self.engine_url, self.name, path)
    self.model = model

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
    """As `RolePolicy.generate`, from the engine."""
    from lm import generators

    if not prompts:
      return [], []
    texts = [self.prompt_text(p) for p in prompts]
    ids = [self.tokenizer.encode(t) for t in texts]
    params = [
      generators.GenerationParams(
        max_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=int(s),
        logprobs=True,
      )
      for s in seeds
    ]
    # Process 0 asks the engine; every process trains on its samples (one batch on every host).
    out = sharding.broadcast_object(self.generator.generate(texts, n, params) if rundir.is_writer() else None)
    flat = [(i, g) for i, gens in enumerate(out) for g in gens]
    trainer = rescore(
      self.model,
      [ids[i] for i, _ in flat],
      [g.token_ids for _, g in flat],
      pad_id=self.tokenizer.pad_id,
      chunk=self.chunk,
    )
    samples: list[list[Sample]] = [[] for _ in prompts]
    for (i, g), logp in zip(flat, trainer, strict=True):
      self.gap.add(g.logprobs, logp)
      mean = float(np.mean(logp)) if len(logp) else 0.0
      samples[i].append(Sample(g.text, tuple(g.token_ids), mean, g.finish_reason))
    return ids, samples


@dataclasses.dataclass(frozen=True, kw_only=True)
class Draft:
  """Phase 1 of a unit: the generator's draft x of one line and the oracle's S_x."""

  case_id: str
  line_id: str
  gold: float
  prompt: str
  prompt_ids: list[int]
  x: Sample
  amount: float | None
  right: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
  """Phase 2: the verifier's reply to the draft (NS, or SAC with its Claim/Argument/Evidence).

  `group`, `group_parsed`: every reply sampled on the prompt when the verifier samples a group
  (`play(verdicts=G)`, testbed v3's trained verifier under a generator-only method), the played
  `reply` first; empty when it samples the played reply alone."""

  prompt: str
  prompt_ids: list[int]
  reply: Sample
  parsed: game.VerifierReply
  group: tuple[Sample, ...] = ()
  group_parsed: tuple[game.VerifierReply, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Revision:
  """Phase 3, after a SAC: K revisions, the kept one (`keep_rule`, never the oracle) and S_z."""

  prompt: str
  prompt_ids: list[int]
  samples: tuple[Sample, ...]
  amounts: tuple[float | None, ...]
  kept: int
  z_amount: float | None
  z_right: bool
  rights: tuple[bool, ...] = ()  # the oracle on each of the K revisions (the revise group's rewards)

  @property
  def z(self) -> Sample:
    return self.samples[self.kept]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
  """Phase 4, after a SAC: the generator's KEEP / REVISE reply and the action played (REVISE when
  exploration forced it; the sampled reply is still recorded)."""

  prompt: str
  prompt_ids: list[int]
  reply: Sample
  parsed: game.GeneratorDecision
  forced_revise: bool
  action: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Unit:
  """One played decision unit: its phases' records and the outcome (revision and decision only
  after a SAC). The JSONL record keeps every text but no token ids."""

  draft: Draft
  verdict: Verdict
  revision: Revision | None = None
  decision: Decision | None = None
  case: str
  submitted: float | None
  submitted_right: bool

  @property
  def line_id(self) -> str:
    return self.draft.line_id

  @property
  def x_right(self) -> bool:
    return self.draft.right

  @property
  def z_right(self) -> bool | None:
    return None if self.revision is None else self.revision.z_right

  @property
  def challenged(self) -> bool:
    return self.verdict.parsed.action == game.SAC_ACTION

  @property
  def generator_action(self) -> int | None:
    return None if self.decision is None else self.decision.action

  def record(self) -> dict[str, Any]:
    """The JSONL record: every text, parsed value, action and oracle result (no token ids)."""
    sample = lambda s: (
      None if s is None else {"text": s.text, "mean_logprob": s.mean_logprob, "finish": s.finish}
    )
    d, v, r, c = self.draft, self.verdict, self.revision, self.decision
    # A verifier group's replies only where there is one: every other arm's records as before.
    group = [_group_reply(s, p) for s, p in zip(v.group, v.group_parsed, strict=True)]
    return {
      "case_id": d.case_id,
      "line": d.line_id,
      "gold": d.gold,
      "draft_prompt": d.prompt,
      "x": sample(d.x),
      "x_amount": d.amount,
      "x_right": d.right,
      "verifier_prompt": v.prompt,
      "verifier": sample(v.reply),
      "verdict": v.parsed.verdict,
      "verifier_action": game.VERIFIER_ACTIONS[v.parsed.action],
      "verifier_valid": v.parsed.valid,
      "verifier_error": v.parsed.error,
      "sac": None if v.parsed.sac is None else v.parsed.sac.to_dict(),
      "revision_prompt": "" if r is None else r.prompt,
      "revisions": [] if r is None else [sample(s) for s in r.samples],
      "revision_amounts": [] if r is None else list(r.amounts),
      "kept": -1 if r is None else r.kept,
      "z_amount": None if r is None else r.z_amount,
      "z_right": None if r is None else r.z_right,
      "decision_prompt": "" if c is None else c.prompt,
      "decision": None if c is None else sample(c.reply),
      "decision_valid": None if c is None else c.parsed.valid,
      "decision_error": None if c is None else c.parsed.error,
      "forced_revise": False if c is None else c.forced_revise,
      "generator_action": None if c is None else game.GENERATOR_ACTIONS[c.action],
      "case": self.case,
      "submitted": self.submitted,
      "submitted_right": self.submitted_right,
      **({"verifier_group": group} if group else {}),
    }


def _group_reply(sample: Sample, parsed: game.VerifierReply) -> dict[str, Any]:
  """One reply of a verifier group as the unit's record keeps it."""
  return {
    "text": sample.text,
    "mean_logprob": sample.mean_logprob,
    "finish": sample.finish,
    "verdict": parsed.verdict,
    "action": game.VERIFIER_ACTIONS[parsed.action],
    "valid": parsed.valid,
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
  if rule == "first":
    return 0
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


def _amount(sample: Sample, line_id: str, cfg: RolloutConfig) -> float | None:
  """The sample's amount for the line; a sample cut off by max_new_tokens answers by `cfg.truncated`."""
  finish = sample.finish if cfg.truncated == "unanswered" else None
  return taxcalc.parse_line_answer(sample.text, line_id, finish).value


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Play:
  """How one `play` samples: training (the config's temperatures, K revisions, exploration, G
  verdicts per unit) or greedy evaluation (temperature 0 everywhere, one revision, no
  exploration, one verdict)."""

  temperature: float
  revision_temperature: float
  revisions: int
  verdicts: int
  explore: float
  fallback_verdict: int
  fallback_decision: int

  @classmethod
  def of(cls, cfg: RolloutConfig, greedy: bool, verdicts: int = 1) -> _Play:
    return cls(
      temperature=0.0 if greedy else cfg.temperature,
      revision_temperature=0.0 if greedy else cfg.revision_temperature,
      revisions=1 if greedy else cfg.revisions,
      verdicts=1 if greedy else verdicts,
      explore=0.0 if greedy else cfg.explore,
      fallback_verdict=game.VERIFIER_ACTIONS.index(cfg.invalid_verdict_action),
      fallback_decision=game.GENERATOR_ACTIONS.index(cfg.invalid_decision_action),
    )


def _draft_phase(
  cases, prompts, line_id: str, generator: RolePolicy, cfg: RolloutConfig, how: _Play, seeds
) -> list[Draft]:
  """The generator drafts x for every case (one sampler call); the oracle gives S_x."""
  ids, drafts = generator.generate(
    prompts,
    n=1,
    temperature=how.temperature,
    top_p=cfg.top_p,
    top_k=cfg.top_k,
    max_new_tokens=cfg.max_new_tokens,
    seeds=seeds("draft", len(prompts)),
  )
  out = []
  for case, prompt, prompt_ids, (x,) in zip(cases, prompts, ids, drafts, strict=True):
    amount = _amount(x, line_id, cfg)
    gold = case.gold[line_id]
    out.append(
      Draft(
        case_id=case.case_id,
        line_id=line_id,
        gold=gold,
        prompt=prompt,
        prompt_ids=prompt_ids,
        x=x,
        amount=amount,
        right=cfg.correct(amount, gold),
      )
    )
  return out


def verifier_prompt(case: taxcalc.TaxCase, line_id: str, line_prompt: str, proposal: str) -> str:
  """The verifier's prompt on a proposal for one line of `case`, with the task family's note below
  the answer (`copycheck.verifier_note`; none outside the copy-and-check family). Rollouts, the
  warm start and the task tokenizer all build it here."""
  return game.verifier_prompt(line_prompt, proposal, copycheck.verifier_note(case, line_id, proposal))


def decision_prompt(
  case: taxcalc.TaxCase, line_id: str, line_prompt: str, proposal: str, sac, revision: str, cfg: RolloutConfig
) -> str:
  """The KEEP / REVISE prompt of one unit, with `copycheck.decision_note` when `cfg.decision_note`.
  Rollouts, the warm start and the task tokenizer all build it here."""
  note = copycheck.decision_note(case, line_id, proposal, revision) if cfg.decision_note else ""
  return game.decision_prompt(line_prompt, proposal, sac, revision, note)


def _verify_phase(
  cases, drafts: Sequence[Draft], verifier: RolePolicy, cfg: RolloutConfig, how: _Play, seeds
):
  """The verifier replies NS or SAC to every draft (one sampler call). With `how.verdicts` G > 1
  it samples G replies per draft at the same temperature and plays the first, so the play is the
  one-reply play in distribution; all G are kept (`Verdict.group`) for its GRPO group."""
  prompts = [verifier_prompt(c, d.line_id, d.prompt, d.x.text) for c, d in zip(cases, drafts, strict=True)]
  ids, replies = verifier.generate(
    prompts,
    n=how.verdicts,
    temperature=how.temperature,
    top_p=cfg.top_p,
    top_k=cfg.top_k,
    max_new_tokens=cfg.verdict_tokens,
    seeds=seeds("verify", len(drafts)),
  )
  out = []
  for prompt, prompt_ids, group in zip(prompts, ids, replies, strict=True):
    parsed = tuple(game.parse_verifier_reply(r.text, how.fallback_verdict) for r in group)
    grouped = dict(group=tuple(group), group_parsed=parsed) if how.verdicts > 1 else {}
    out.append(Verdict(prompt=prompt, prompt_ids=prompt_ids, reply=group[0], parsed=parsed[0], **grouped))
  return out


def _revise_phase(
  challenged: Sequence[tuple[Draft, Verdict]], generator: RolePolicy, cfg: RolloutConfig, how: _Play, seeds
) -> list[Revision]:
  """K revisions of every SAC'd draft (one sampler call); one kept by `keep_rule`; S_z."""
  prompts = [game.revision_prompt(d.prompt, d.x.text, v.parsed.sac) for d, v in challenged]
  ids, revisions = generator.generate(
    prompts,
    n=how.revisions,
    temperature=how.revision_temperature,
    top_p=cfg.top_p,
    top_k=cfg.top_k,
    max_new_tokens=cfg.max_new_tokens,
    seeds=seeds("revise", len(challenged)),
  )
  out = []
  for (d, _), prompt, prompt_ids, samples in zip(challenged, prompts, ids, revisions, strict=True):
    amounts = tuple(_amount(s, d.line_id, cfg) for s in samples)
    kept = keep_revision(samples, amounts, cfg.keep_rule)
    out.append(
      Revision(
        prompt=prompt,
        prompt_ids=prompt_ids,
        samples=tuple(samples),
        amounts=amounts,
        kept=kept,
        z_amount=amounts[kept],
        z_right=cfg.revision_correct(amounts[kept], d.gold),
        rights=tuple(cfg.revision_correct(a, d.gold) for a in amounts),
      )
    )
  return out


def _decide_phase(
  cases: Mapping[str, taxcalc.TaxCase],
  challenged: Sequence[tuple[Draft, Verdict]],
  revisions: Sequence[Revision],
  generator: RolePolicy,
  cfg: RolloutConfig,
  how: _Play,
  seeds,
) -> list[Decision]:
  """The generator's KEEP / REVISE on every SAC'd unit (one sampler call); in training, REVISE is
  forced with probability `explore`."""
  prompts = [
    decision_prompt(cases[d.case_id], d.line_id, d.prompt, d.x.text, v.parsed.sac, r.z.text, cfg)
    for (d, v), r in zip(challenged, revisions, strict=True)
  ]
  ids, replies = generator.generate(
    prompts,
    n=1,
    temperature=how.temperature,
    top_p=cfg.top_p,
    top_k=cfg.top_k,
    max_new_tokens=cfg.decision_tokens,
    seeds=seeds("decide", len(challenged)),
  )
  forced = np.random.default_rng(seeds("explore", 1)).random(len(challenged)) < how.explore
  out = []
  for prompt, prompt_ids, (reply,), force in zip(prompts, ids, replies, forced, strict=True):
    parsed = game.parse_decision(reply.text, how.fallback_decision)
    out.append(
      Decision(
        prompt=prompt,
        prompt_ids=prompt_ids,
        reply=reply,
        parsed=parsed,
        forced_revise=bool(force),
        action=game.REVISE if force else parsed.action,
      )
    )
  return out


def _settle(
  draft: Draft,
  verdict: Verdict,
  revision: Revision | None,
  decision: Decision | None,
  keep_draft_on_unparsed: bool = False,
) -> Unit:
  """The unit's 8-case label and submitted amount: the revision if REVISE was played, else x —
  and x after a REVISE on an unparsable revision with `keep_draft_on_unparsed`."""
  action = None if decision is None else decision.action
  z_right = None if revision is None else revision.z_right
  args = (draft.right, verdict.parsed.action, action, z_right)
  revised = action == game.REVISE
  if revised and keep_draft_on_unparsed and revision.z_amount is None:
    submitted, submitted_right = draft.amount, draft.right
  else:
    submitted = revision.z_amount if revised else draft.amount
    submitted_right = game.submitted_right(*args)
  return Unit(
    draft=draft,
    verdict=verdict,
    revision=revision,
    decision=decision,
    case=game.classify_case(*args),
    submitted=submitted,
    submitted_right=submitted_right,
  )


def play(
  cases: Sequence[taxcalc.TaxCase],
  generator: RolePolicy,
  verifier: RolePolicy,
  cfg: RolloutConfig,
  *,
  seed: int,
  step: int,
  greedy: bool = False,
  verdicts: int = 1,
) -> list[Unit]:
  """Plays every line of `cases` and returns the units in (line, case) order.

  `greedy` is evaluation: temperature 0 everywhere, one revision, no exploration, one verdict.
  `verdicts`: replies the verifier samples per unit in training, the first played (testbed v3's
  GRPO-trained verifier, `config.BaselineConfig.train_verifier`); 1: the played reply alone.
  """
  how = _Play.of(cfg, greedy, verdicts)
  by_id = {c.case_id: c for c in cases}
  shown = [cfg.show(c) for c in cases]
  drafted: list[dict[str, float | None]] = [{} for _ in cases]
  units: list[Unit] = []
  for li, line_id in enumerate(cfg.lines):
    seeds = lambda phase, n: seeding.derive_seeds(seed, step, li, _PHASES[phase], n=n)  # noqa: B023
    prompts = [cfg.line_prompt(c, line_id, d) for c, d in zip(shown, drafted, strict=True)]
    drafts = _draft_phase(cases, prompts, line_id, generator, cfg, how, seeds)
    verdicts = _verify_phase(cases, drafts, verifier, cfg, how, seeds)
    challenged = [(d, v) for d, v in zip(drafts, verdicts, strict=True) if v.parsed.action == game.SAC_ACTION]
    revisions = _revise_phase(challenged, generator, cfg, how, seeds)
    decisions = _decide_phase(by_id, challenged, revisions, generator, cfg, how, seeds)
    after_sac = {id(d): (r, c) for (d, _), r, c in zip(challenged, revisions, decisions, strict=True)}
    for draft, verdict, d in zip(drafts, verdicts, drafted, strict=True):
      keep_draft = cfg.unparsed_revision == "keep_draft"
      unit = _settle(
        draft, verdict, *after_sac.get(id(draft), (None, None)), keep_draft_on_unparsed=keep_draft
      )
      d[line_id] = unit.submitted if cfg.context == "submitted" else draft.amount
      units.append(unit)
  return units


@dataclasses.dataclass(frozen=True, kw_only=True)
class Group:
  """G completions of one prompt with their rewards: a line prompt's drafts (generator-only
  baselines, 0/1 by the oracle) or, with `amounts` empty, the verifier's G verdicts on one unit
  (`packing.verifier_groups`, testbed v3)."""

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
  """Generator-only episodes: G completions per line prompt; the first one (`group_carry="first"`)
  or the oracle-best one ("best": the first right completion, else the first) is carried forward."""
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
      amounts = tuple(_amount(s, line_id, cfg) for s in group)
      gold = case.gold[line_id]
      rewards = tuple(float(cfg.correct(a, gold)) for a in amounts)
      groups.append(
        Group(
          case_id=case.case_id,
          line_id=line_id,
          gold=gold,
          prompt=prompt,
          prompt_ids=prompt_ids,
          samples=tuple(group),
          amounts=amounts,
          rewards=rewards,
        )
      )
      carried = int(np.argmax(rewards)) if cfg.group_carry == "best" else 0
      d[line_id] = amounts[carried]
  return groups
