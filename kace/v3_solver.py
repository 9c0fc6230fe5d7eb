"""Testbed v3's trained solver (docs/kace_v3.md, section 2): its config, training data and build.

A keyed tiny Qwen3-style solver like the v1/v2 testbed solver (`kace.synthetic.ensure_testbed_solver`,
trained with the same machinery, `synthetic.train_solver`), on v3 prompts (`training_examples`):

- questions of both kind words (`total`, `tally`) in the keyed form ("total: 23 + 41"), operands from
  both size classes' ranges (`testbed_v3.OPERANDS`), the large class a `large_share` minority of the
  examples, so large-class arithmetic is only partly learned (the gate large_true_card asks for 0.25 to
  0.75 of right samples) while small-class arithmetic is learned;
- 0 to `max_cards` cards in the notes: with probability `card_fraction` one card of the question's
  kind word, or (`conflict_fraction` of those) two or three of that word with different rules, the
  target the rule of one of them drawn uniformly (a conflict the prompt cannot settle: the solver
  learns to split its samples over the rules shown); cards of the other kind word as distractors;
- every rule drawn per example from `testbed_v3.RULES`; no build's `WorldConfig.rules()` is ever read,
  so which rule belongs to which (domain, class) block of an evaluated build never enters training;
- with no card of its kind word the target is a rule drawn at random: a rule it cannot know, so its
  samples disagree without a card (the gate no_card: at most 0.3 right).

The completion is v1/v2's "card_first" ("=totaladdthree: 64 + 3 -> \\boxed{67}"): the card key, the
rule read from the card token of that key, the base answer, the boxed result. Every card is one token
(`testbed.single_tokens`); digits are one token each, so every base and h(base) of v3 (up to 30 * 9
times 9 = 2430) is spelled digit by digit. Cached in `<cache_dir>/v3-solver-<V3SolverConfig.key()>/`
(`ensure_v3_solver`). `kace.v3_reader.ModelReader` reads it as a `kace.readers` reader.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random

from kace import synthetic, testbed, testbed_v3
from lm import code_digest, rundir

FORM = "keyed"
KINDS = tuple(testbed_v3.FAMILIES.values())  # ("total", "tally")
# The modules whose code (with their first-party imports) the build runs: the cache key's digest.
BUILD_MODULES = ("kace.v3_solver",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class V3SolverConfig:
  """What `ensure_v3_solver` builds; every field is part of the cache key (`key`).

  Attributes:
    seed: examples, model init and batch order.
    examples: training (chat, completion) pairs of the main phase.
    large_share: share of examples drawn from the large class's operand ranges (the rest small):
      fewer large-class examples, so large-class arithmetic is only partly learned.
    card_fraction: share of examples whose notes hold at least one card of the question's kind word
      (the target's rule among them); the others have none and a random rule as their target.
    conflict_fraction: of the examples with a card of their kind word, the share with two or three
      such cards of different rules (the target one of them, uniformly).
    max_cards: most cards in a prompt (the question's word's and the other word's together); v3's
      trees show 2 (kace) to 12 (a flat playbook) cards, so a long flat prompt is longer than any
      training prompt (docs/kace_v3.md, section 2).
    curriculum_steps: a first phase of this many SFT steps on prompts with at most
      `curriculum_cards` cards (as `TestbedSolverConfig`'s), before the `steps` steps; 0: none.
    curriculum_cards: most cards in a curriculum prompt.
    vocab_size: BPE vocabulary (the keyed form adds 219 single tokens: `testbed.single_tokens`).
    hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim, rope_theta: the
      model (as the v1/v2 testbed solver's: plain multi-head attention, RoPE base 1e6).
    steps, batch_size, learning_rate, warmup_steps: `lm.sft.SFTConfig` of the main phase.
    bucket_by_length: `lm.sft`'s length-bucketed batches.
  """

  seed: int = 0
  examples: int = 40_000
  large_share: float = 0.25
  card_fraction: float = 0.75
  conflict_fraction: float = 0.3
  max_cards: int = 6
  curriculum_steps: int = 500
  curriculum_cards: int = 2
  vocab_size: int = 768
  hidden_size: int = 64
  intermediate_size: int = 192
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 4
  head_dim: int = 16
  rope_theta: float = 1_000_000.0
  steps: int = 3000
  batch_size: int = 32
  learning_rate: float = 3e-3
  warmup_steps: int = 50
  bucket_by_length: bool = True

  def __post_init__(self):
    for name in ("large_share", "card_fraction", "conflict_fraction"):
      if not 0 <= getattr(self, name) <= 1:
        raise ValueError(f"V3SolverConfig.{name} must be in [0, 1], got {getattr(self, name)}")
    if self.max_cards < 3 or self.curriculum_cards < 1:
      raise ValueError(f"V3SolverConfig needs max_cards >= 3 and curriculum_cards >= 1, got {self}")

  def key(self) -> str:
    """The cache key: every field (the data generation's included) and the code the build runs."""
    return code_digest.cache_key(json.dumps(dataclasses.asdict(self), sort_keys=True), BUILD_MODULES)


@dataclasses.dataclass(frozen=True)
class Example:
  """One training example before rendering: what `training_examples` renders, and what tests read."""

  kind: str
  domain: str
  size: str
  a: int
  b: int
  shown: tuple[tuple[str, testbed.Convention], ...]  # (kind word, rule) of each card, in prompt order
  target: testbed.Convention

  @property
  def base(self) -> int:
    return testbed.OPS[testbed.OP_OF_DOMAIN[self.domain]](self.a, self.b)

  def question(self) -> str:
    return testbed.question(self.kind, self.a, testbed.OP_OF_DOMAIN[self.domain], self.b, FORM)

  def chat(self) -> list[dict[str, str]]:
    return solver_messages(self.question(), self.shown)

  def completion(self) -> str:
    return self.target.completion(self.base, "card_first", FORM, self.kind)


def solver_messages(question: str, shown) -> list[dict[str, str]]:
  """The v3 solver's chat: the question and the cards shown ((kind word, rule) each, in order),
  rendered as the v1/v2 solver's notes (`synthetic.convention_notes`)."""
  notes = synthetic.convention_notes([testbed_v3.card(kind, rule) for kind, rule in shown])
  return synthetic.solver_messages(question, notes)


def draw_examples(config: V3SolverConfig, max_cards: int | None = None, tag: str = "main") -> list[Example]:
  """`config.examples` examples (module docstring), at most `max_cards` cards each (default
  `config.max_cards`); `tag` names the draw's random stream (the curriculum's is its own)."""
  rng = random.Random(f"v3-solver-examples-{tag}-{config.seed}")
  limit = config.max_cards if max_cards is None else max_cards
  out = []
  for _ in range(config.examples):
    kind, domain = rng.choice(KINDS), rng.choice(testbed_v3.DOMAINS)
    size = "large" if rng.random() < config.large_share else "small"
    (lo_a, hi_a), (lo_b, hi_b) = testbed_v3.OPERANDS[(domain, size)]
    a, b = rng.randint(lo_a, hi_a), rng.randint(lo_b, hi_b)
    own: list[testbed.Convention] = []
    if rng.random() < config.card_fraction:
      conflicting = rng.random() < config.conflict_fraction
      own = rng.sample(testbed_v3.RULES, min(limit, rng.randint(2, 3)) if conflicting else 1)
    target = rng.choice(own) if own else rng.choice(testbed_v3.RULES)
    other = next(k for k in KINDS if k != kind)
    distractors = rng.sample(testbed_v3.RULES, rng.randint(0, limit - len(own)))
    shown = [(kind, r) for r in own] + [(other, r) for r in distractors]
    rng.shuffle(shown)
    out.append(Example(kind, domain, size, a, b, tuple(shown), target))
  return out


def training_examples(config: V3SolverConfig, max_cards: int | None = None, tag: str = "main"):
  """(chat, completion) pairs of `draw_examples`."""
  return [(e.chat(), e.completion()) for e in draw_examples(config, max_cards, tag)]


def ensure_v3_solver(cache_dir: str, config: V3SolverConfig = V3SolverConfig()) -> str:
  """The directory of the v3 solver for `config` (HF checkpoint + tokenizer), trained first if the
  cache does not hold it yet; published atomically (`lm.rundir.build_once`)."""
  target = os.path.join(os.path.expanduser(cache_dir), f"v3-solver-{config.key()}")
  return rundir.build_once(target, lambda path: _build(path, config), marker="build.json")


def _build(path: str, config: V3SolverConfig) -> None:
  examples = training_examples(config)
  corpus = [chat[0]["content"] + " " + completion for chat, completion in examples[::10]]
  corpus += ["user\nassistant\n", *(f"- [{testbed.CARD_TYPE}] " for _ in range(20))]
  corpus += [h.describe(FORM) for h in testbed.H] * 20
  first = training_examples(config, config.curriculum_cards, "curriculum") if config.curriculum_steps else ()
  _, history, count = synthetic.train_solver(
    path,
    examples,
    corpus,
    config,
    log_every=max(1, config.steps // 20),
    first_phase=first,
    added_tokens=testbed.single_tokens(FORM),
    bucket_by_length=config.bucket_by_length,
    rope_theta=config.rope_theta,
    label="v3 solver build",
  )
  rundir.write_json(
    os.path.join(path, "build.json"),
    {"config": dataclasses.asdict(config), "code_digest": code_digest.source_digest(BUILD_MODULES),
     "train_examples": count, "sft": history},
  )  # fmt: skip
