"""A learned teacher for the latent-convention testbed (kace.testbed): a tiny model that proposes cards
from the failures an ADD prompt shows, beside the oracle (programmatic) teacher of kace.oracle.

It plays the same role as `oracle.OracleTeacher` (`generate(prompts, n, params)` / `reply(prompt)`,
labelled `LABEL` = "learned teacher (tiny model)" in every record) and reads the same thing: the
teacher prompt the learner sends (`kace.learn.TEACHER_TEMPLATE`), parsed with `oracle.shown_failures`
into (kind, base answer, gold) per shown problem. It never reads a convention: not the testbed's
config, not its seed, not `testbed.conventions`. For every kind with at least `min_pairs` shown
problems it writes that kind's (base, gold) pairs as a compact input (`model_input`: each number one
token, "<7><10><3><6>") and a tiny Qwen3-style model (`lm.model.Qwen`, 2 layers, 64 wide) greedily
decodes one rule word of the keyed form ("addthree", one token); the card is
`testbed.card_text(kind, rule, form)` (keyed: "addthree=total"). A reply the model gets wrong is a
wrong card; one that is not a rule word is no card. Where the oracle abstains below two *agreeing*
failures, the learned teacher abstains below two *shown* failures of a kind (it cannot count
agreement without fitting H, which is the model's job); it has no noise knob: its errors are its own.

Training data (`training_examples`): each example draws a domain of `testbed.DOMAINS`, a convention
from the declared hypothesis set H (all 21 members, `testbed.H`: identity, add 1..9, multiply by 2,
3, 4, 6, 9; with `hold_out` only `testbed.TRAIN_H`, without the evaluated add 3 / 6 / 9), and
`min_pairs`..`max_pairs` base problems of that domain drawn with `testbed.draw_base` from the
teacher's own seeded generator; the target is the drawn convention's rule word. Conventions are drawn
per example, independently of any kind, and no testbed seed's `conventions` is ever called, so the
evaluated blocks' hidden conventions (which member of `testbed.TEST_H` belongs to which block) never
enter training. As with the solver (docs/kace.md, "Held-out constants"), the default trains on all
of H: the teacher has seen the wording of the evaluated rules, not which block holds which; it must
infer a block's rule from its (question, gold) pairs. Its base problems come from the same operand
ranges as the testbed's, so a held-out problem's (base, gold) pair can occur in training by chance
(the ranges are small), never labelled with that block's convention by construction.

The model is trained with `kace.synthetic`'s solver machinery (`synthetic.train_solver`: a BPE tokenizer with
the numbers and rule words as added single tokens, `lm.sft`) and cached like the solver, in
`<cache_dir>/learned-teacher-<hash of LearnedTeacherConfig>/` (`ensure_learned_teacher`).
`card_accuracy` measures how often its cards (or any teacher's) state the true convention on
held-out blocks. See docs/kace.md ("The learned teacher").
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
from collections.abc import Mapping, Sequence

from kace import cards, learn, oracle, solve, synthetic, testbed
from lm import code_digest, generators, rundir, sampler, stats
from lm import text as text_lib

LABEL = "learned teacher (tiny model)"
# The modules whose code (and first-party imports) the build runs: the cache key's digest.
BUILD_MODULES = ("kace.learned_teacher",)
RULE_OF_WORD = {h.describe("keyed"): h for h in testbed.H}


def numbers() -> tuple[int, ...]:
  """Every base answer of the testbed's operand ranges and every h(base) for h in H: the numbers the
  model holds as single tokens."""
  bases = set()
  for domain, ((lo_a, hi_a), (lo_b, hi_b)) in testbed.OPERANDS.items():
    op = testbed.OPS[testbed.OP_OF_DOMAIN[domain]]
    bases |= {op(a, b) for a in range(lo_a, hi_a + 1) for b in range(lo_b, hi_b + 1)}
  return tuple(sorted(bases | {h.apply(x) for x in bases for h in testbed.H}))


def number_token(x: int) -> str:
  return f"<{x}>"


def model_input(pairs: Sequence[tuple[int, int]]) -> str:
  """The compact input of one kind's shown (base, gold) pairs: "<7><10><3><6>"."""
  return "".join(number_token(base) + number_token(gold) for base, gold in pairs)


def model_inputs(prompt: str, min_pairs: int = 2, max_pairs: int = 8) -> list[tuple[str, str]]:
  """(kind, model input) for every kind a teacher prompt shows at least `min_pairs` failures of (the
  first `max_pairs` of them), kinds sorted. A function of the prompt's text alone."""
  by_kind: dict[str, list[tuple[int, int]]] = {}
  for kind, base, gold in oracle.shown_failures(prompt):
    by_kind.setdefault(kind, []).append((base, gold))
  return [
    (kind, model_input(pairs[:max_pairs]))
    for kind, pairs in sorted(by_kind.items())
    if len(pairs) >= min_pairs
  ]


@dataclasses.dataclass(frozen=True)
class LearnedTeacherConfig:
  """What `ensure_learned_teacher` builds; every field is part of the cache key.

  Attributes:
    seed: training examples, model init and batch order.
    examples: training (input, rule word) pairs drawn.
    min_pairs, max_pairs: shown (base, gold) pairs per example, uniform in this range; the teacher
      also abstains for a kind with fewer than `min_pairs` shown failures and reads at most
      `max_pairs` of a kind (the testbed shows up to `learn.failures_per_prompt` = 8 a prompt).
    hold_out: draw conventions from `testbed.TRAIN_H` only (the evaluated add 3 / 6 / 9 never seen;
      the model then cannot write their rule words); False (the default) draws from all of H.
    vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim,
      rope_theta: the model (`lm.config.ModelConfig`), as the testbed solver's.
    steps, batch_size, learning_rate, warmup_steps: `lm.sft.SFTConfig`.
  """

  seed: int = 0
  examples: int = 30_000
  min_pairs: int = 2
  max_pairs: int = 8
  hold_out: bool = False
  vocab_size: int = 512
  hidden_size: int = 64
  intermediate_size: int = 192
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 4
  head_dim: int = 16
  rope_theta: float = 1_000_000.0
  steps: int = 1500
  batch_size: int = 64
  learning_rate: float = 3e-3
  warmup_steps: int = 50

  def __post_init__(self):
    if not 1 <= self.min_pairs <= self.max_pairs:
      raise ValueError(
        f"LearnedTeacherConfig needs 1 <= min_pairs <= max_pairs, got {self.min_pairs}, {self.max_pairs}"
      )
    if self.examples < 1 or self.steps < 1:
      raise ValueError(f"LearnedTeacherConfig.examples and .steps must be >= 1, got {self}")

  def key(self) -> str:
    """The cache key: this config and the code its build runs (`lm.code_digest`)."""
    return code_digest.cache_key(json.dumps(dataclasses.asdict(self), sort_keys=True), BUILD_MODULES)


def training_examples(config: LearnedTeacherConfig) -> list[tuple[list[dict[str, str]], str]]:
  """(chat, rule word) pairs: a random domain, a convention drawn from H (`TRAIN_H` with `hold_out`)
  per example, and its (base, gold) pairs on fresh base problems (module docstring)."""
  rng = random.Random(f"learned-teacher-examples-{config.seed}")
  rules = testbed.TRAIN_H if config.hold_out else testbed.H
  out = []
  for _ in range(config.examples):
    domain, rule = rng.choice(testbed.DOMAINS), rng.choice(rules)
    pairs = []
    for _ in range(rng.randint(config.min_pairs, config.max_pairs)):
      a, op, b = testbed.draw_base(domain, rng)
      base = testbed.OPS[op](a, b)
      pairs.append((base, rule.apply(base)))
    out.append((text_lib.user_chat(model_input(pairs)), rule.describe("keyed")))
  return out


def ensure_learned_teacher(cache_dir: str, config: LearnedTeacherConfig = LearnedTeacherConfig()) -> str:
  """The directory of the learned teacher's model for `config` (HF checkpoint + tokenizer), trained
  first if the cache does not hold it yet; published atomically like the solvers."""
  target = os.path.join(os.path.expanduser(cache_dir), f"learned-teacher-{config.key()}")
  return rundir.build_once(target, lambda path: _build(path, config), marker="build.json")


def _build(path: str, config: LearnedTeacherConfig) -> None:
  examples = training_examples(config)
  corpus = [chat[0]["content"] for chat, _ in examples[::50]] + ["user\nassistant\n"] * 20
  added = (*(number_token(x) for x in numbers()), *RULE_OF_WORD)
  _, history, count = synthetic.train_solver(
    path,
    examples,
    corpus,
    config,
    log_every=max(1, config.steps // 10),
    added_tokens=added,
    rope_theta=config.rope_theta,
    label=f"{LABEL} build",
  )
  rundir.write_json(
    os.path.join(path, "build.json"),
    {"config": dataclasses.asdict(config), "code_digest": code_digest.source_digest(BUILD_MODULES),
     "train_examples": count, "sft": history, "label": LABEL},
  )  # fmt: skip


@functools.cache
def _generator(path: str) -> generators.JaxGenerator:
  """One generator per checkpoint and process (the learner asks for a teacher once per artefact)."""
  config = generators.GeneratorConfig(
    checkpoint=path, dtype="float32", sampler=dict(min_prompt_bucket=32, step_bucket=8, max_rows=256)
  )
  return generators.load_jax_generator(config)


class LearnedTeacher:
  """The teacher role played by a tiny trained model (module docstring).

  Attributes:
    path: the model's checkpoint directory (`ensure_learned_teacher`).
    form: the surface form of the cards it writes (`testbed.FORMS`; the testbed's).
    min_pairs, max_pairs: as `LearnedTeacherConfig`'s.
    calls: prompts answered so far (the learner counts teacher calls itself; this is for tests).
  """

  label = LABEL

  def __init__(self, path: str, form: str = "keyed", min_pairs: int = 2, max_pairs: int = 8):
    self.path, self.form = path, testbed.check_form(form)
    self.min_pairs, self.max_pairs, self.calls = min_pairs, max_pairs, 0
    self.generator = _generator(os.path.abspath(path))
    # greedy: a reply depends only on the prompt and the weights
    self.params = generators.GenerationParams(max_tokens=2, temperature=0.0, seed=0)

  @classmethod
  def build(cls, cache_dir: str, config: LearnedTeacherConfig, form: str = "keyed") -> LearnedTeacher:
    """The teacher of `config`, trained first (into `cache_dir`) when not cached."""
    path = ensure_learned_teacher(cache_dir, config)
    return cls(path, form, min_pairs=config.min_pairs, max_pairs=config.max_pairs)

  def inputs(self, prompt: str) -> list[tuple[str, str]]:
    """(kind, model input) of every kind the teacher answers for in `prompt` (`model_inputs`)."""
    return model_inputs(prompt, self.min_pairs, self.max_pairs)

  def replies(self, prompts: Sequence[str]) -> list[str]:
    """One reply (JSON, `learn.parse_cards`'s schema) per teacher prompt; every kind of every
    prompt decoded in one generator call."""
    asks = [(i, kind, x) for i, prompt in enumerate(prompts) for kind, x in self.inputs(prompt)]
    chats = [text_lib.user_chat(x) for _, _, x in asks]
    outs = self.generator.generate(chats, n=1, params=self.params) if chats else []
    words: list[dict[str, str]] = [{} for _ in prompts]
    for (i, kind, _), (gen,) in zip(asks, outs, strict=True):
      words[i][kind] = gen.text.strip()
    return [self._reply(prompt, decoded) for prompt, decoded in zip(prompts, words, strict=True)]

  def _reply(self, prompt: str, decoded: Mapping[str, str]) -> str:
    held, out, unreadable = oracle._existing(prompt), [], []
    for kind, word in decoded.items():
      rule = RULE_OF_WORD.get(word)
      if rule is None:
        unreadable.append(word)
        continue
      text = testbed.card_text(kind, rule, self.form)
      if text not in held:
        out.append({"type": testbed.CARD_TYPE, "text": text})
    reply = {"cards": out, "by": LABEL}
    if not decoded:
      reply["note"] = f"no kind with {self.min_pairs} shown failures"
    if unreadable:
      reply["unreadable"] = unreadable
    return json.dumps(reply)

  def reply(self, prompt: str) -> str:
    return self.replies([prompt])[0]

  def generate(self, prompts: Sequence[generators.Prompt], n=1, params=None):
    counts = sampler.per_prompt(n, len(prompts), "n")
    self.calls += len(prompts)
    texts = self.replies([oracle._text(p) for p in prompts])
    return [[oracle._generation(t)] * k for t, k in zip(texts, counts, strict=True)]


# ---- measuring a teacher's cards ---------------------------------------------------------------------


def _failed(problem) -> solve.Solution:
  """`problem` as a failed solution whose two samples answered the base result as is (what a teacher
  prompt shows of it; the teachers read only its question and gold)."""
  base = testbed.parse_question(problem.question)[1]
  sample = solve.SampleRecord(
    text=f"\\boxed{{{base}}}", answer=str(base), correct=False, completion_tokens=0, finish_reason="stop"
  )
  stage = solve.StageRecord(stage="MS", cards_tier="MS", cards=(), prompt_tokens=0, samples=(sample,) * 2)
  return solve.Solution(
    id=problem.id, domain=problem.domain, gold=problem.answer, answer=str(base), correct=False,
    exit_tier="MS", votes=1, calls=2, num_samples=2, rounds=1, completion_tokens=0, prompt_tokens=0,
    stages=(stage,),
  )  # fmt: skip


def accuracy_prompts(
  seeds: Sequence[int] = (0, 1, 2),
  shown: Sequence[int] = (2, 4, 8),
  draws: int = 10,
  control: str = "none",
  variant: str = "v1",
) -> list[dict]:
  """Teacher prompts on held-out blocks: for each testbed seed, each level >= 2 block and each count
  in `shown`, `draws` prompts (`learn.teacher_prompt`, the ADD prompt) showing that many of the
  block's held-out (test-split) problems (null problems of variant "conflict" left out), drawn
  without replacement; each with its true card's (kind, convention), kept beside the prompt for
  scoring only."""
  config = learn.LearnConfig(attempt_tokens=64)
  out = []
  for seed in seeds:
    bed = testbed.TestbedConfig(seed=seed, control=control, variant=variant)
    rules, kinds, null, (_, test) = bed.conventions(), bed.kinds(), bed.null_ids(), bed.problems()
    rng = random.Random(f"learned-teacher-accuracy-{seed}")
    for (domain, level), rule in sorted(rules.items()):
      if level == 1:
        continue
      block = [p for p in test if (p.domain, p.level) == (domain, level) and p.id not in null]
      for m in shown:
        for _ in range(draws):
          chosen = rng.sample(block, min(m, len(block)))
          prompt = learn.teacher_prompt(
            cards.EpistemicTree(),
            ("MS", domain),
            [_failed(p) for p in chosen],
            {p.id: p for p in chosen},
            config,
          )
          out.append({"seed": seed, "kind": kinds[(domain, level)], "rule": rule, "shown": m,
                      "prompt": prompt})  # fmt: skip
  return out


def card_accuracy(teacher, items: Sequence[dict]) -> dict:
  """How often `teacher`'s cards state the true convention on `items` (`accuracy_prompts`): cards
  proposed, right, abstentions (a prompt with no card), the share right with its 95% Wilson
  interval, overall and per shown count."""
  replies = teacher.generate([item["prompt"] for item in items])
  tally: dict[str, list[int]] = {}
  for item, (gen,) in zip(items, replies, strict=True):
    proposed = [testbed.parse_card(card["text"]) for card in json.loads(gen.text)["cards"]]
    right = sum(card == (item["kind"], item["rule"]) for card in proposed)
    for key in ("all", f"shown {item['shown']}"):
      t = tally.setdefault(key, [0, 0, 0])
      t[0], t[1], t[2] = t[0] + len(proposed), t[1] + right, t[2] + (not proposed)
  out = {}
  for key, (n, right, abstained) in tally.items():
    low, high = stats.wilson_interval(right, n)
    out[key] = {"cards": n, "right": right, "abstained": abstained, "accuracy": right / n if n else 0.0,
                "wilson95": [low, high]}  # fmt: skip
  return out
