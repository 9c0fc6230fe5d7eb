"""A synthetic maths benchmark and a tiny solver trained on it, for CPU-scale KACE runs.

Nothing here is a real maths benchmark. The point is a model whose solve rate really varies with
difficulty, so that tiered voting, exit tiers and the order-preservation metric have something to
measure on a laptop: problems come from three domains (arithmetic → algebra, remainders → number
theory, counting → combinatorics) at four levels whose input spaces and computations grow, and a
tiny Qwen3-style model is trained for a minute or two with `lm.sft` to answer them in `\\boxed{}`.
Easy levels end up solved almost always, hard ones rarely. See docs/kace.md ("CPU scale") for
what its numbers do and do not mean.

`ensure_tiny_solver(cache_dir, config)` builds the tokenizer, trains the model and saves both as
one HF checkpoint directory (plus a small hand-written demonstration tree), once per config: the
directory name hashes the config, the build is deterministic by seed, and it is published by an
atomic rename, so concurrent or killed builds never leave a half-written model behind.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import re
from collections.abc import Callable, Sequence

from flax import nnx

from kace import answers, data, projection, testbed
from kace import cards as cards_lib
from lm import code_digest, generators, hf, rundir, seeding, sft
from lm import text as text_lib
from lm.config import ModelConfig
from lm.model import Qwen
from lm.tokenizer import load_tokenizer, train_bpe_tokenizer

_log = logging.getLogger(__name__)

LEVELS = (1, 2, 3, 4)

# (subject label, level) -> a function drawing (question, answer) from an RNG. Subject labels are
# MATH's, so data.domain_of maps them onto the tree's domains like a real benchmark's labels.
Family = Callable[[random.Random], tuple[str, int]]


def _add(lo: int, hi: int, terms: int) -> Family:
  def draw(rng: random.Random) -> tuple[str, int]:
    xs = [rng.randint(lo, hi) for _ in range(terms)]
    return f"What is {' + '.join(map(str, xs))}?", sum(xs)

  return draw


def _add_zero(rng: random.Random) -> tuple[str, int]:
  a = rng.randint(0, 99)
  return f"What is {a} + 0?", a


def _multiply(rng: random.Random) -> tuple[str, int]:
  a, b = rng.randint(11, 99), rng.randint(3, 9)
  return f"What is {a} * {b}?", a * b


def _remainder(lo: int, hi: int, moduli: tuple[int, int]) -> Family:
  def draw(rng: random.Random) -> tuple[str, int]:
    a, m = rng.randint(lo, hi), rng.randint(*moduli)
    return f"What is the remainder when {a} is divided by {m}?", a % m

  return draw


def _last_digit_of_product(rng: random.Random) -> tuple[str, int]:
  a, b = rng.randint(11, 99), rng.randint(11, 99)
  return f"What is the last digit of {a} * {b}?", (a * b) % 10


def _outfits(shirts: tuple[int, int], hats: tuple[int, int]) -> Family:
  def draw(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(*shirts), rng.randint(*hats)
    return f"How many outfits can be made from {a} shirts and {b} hats?", a * b

  return draw


def _multiples(rng: random.Random) -> tuple[str, int]:
  n, k = rng.randint(10, 200), rng.randint(2, 9)
  return f"How many integers from 1 to {n} are multiples of {k}?", n // k


def _pairs(rng: random.Random) -> tuple[str, int]:
  n = rng.randint(3, 60)
  return f"How many ways are there to choose 2 of {n} books?", math.comb(n, 2)


# Level 1 copies a number from the question (learnt quickly: attention copies), level 2 is a
# one-digit table, level 3 multi-digit carries or division, level 4 beyond what the tiny model learns.
FAMILIES: dict[tuple[str, int], Family] = {
  ("Algebra", 1): _add_zero,
  ("Algebra", 2): _add(0, 9, 2),
  ("Algebra", 3): _add(10, 99, 2),
  ("Algebra", 4): _multiply,
  ("Number Theory", 1): _remainder(1, 99, (100, 200)),
  ("Number Theory", 2): _remainder(1, 20, (2, 5)),
  ("Number Theory", 3): _remainder(1, 999, (3, 12)),
  ("Number Theory", 4): _last_digit_of_product,
  ("Counting & Probability", 1): _outfits((2, 99), (1, 1)),
  ("Counting & Probability", 2): _outfits((2, 9), (2, 5)),
  ("Counting & Probability", 3): _multiples,
  ("Counting & Probability", 4): _pairs,
}


def generate(per_cell: int, seed: int, levels: Sequence[int] = LEVELS) -> list[data.Problem]:
  """`per_cell` distinct problems for every (subject, level) family, deterministic by seed.

  Ids are `synthetic/<domain>/L<level>/<n>`. A family whose question space is smaller than
  `per_cell` yields all its distinct questions it finds in a bounded number of draws.
  """
  rng = random.Random(seed)
  problems = []
  for (subject, level), draw in FAMILIES.items():
    if level not in levels:
      continue
    domain = data.domain_of(subject)
    seen: dict[str, int] = {}
    for _ in range(20 * per_cell):
      if len(seen) == per_cell:
        break
      question, answer = draw(rng)
      seen.setdefault(question, answer)
    for n, (question, answer) in enumerate(seen.items()):
      problems.append(
        data.Problem(
          id=f"synthetic/{domain}/L{level}/{n}",
          question=question,
          answer=str(answer),
          source="synthetic",
          subject=subject,
          domain=domain,
          level=level,
        )
      )
  return problems


def split(problems: Sequence[data.Problem], test_per_cell: int, seed: int) -> tuple[list, list]:
  """(train, test): `test_per_cell` problems of every (domain, level) go to test; no test question
  occurs in train, so the model must compute answers, not recall them."""
  rng = random.Random(seed)
  cells: dict[tuple, list[data.Problem]] = {}
  for p in problems:
    cells.setdefault((p.domain, p.level), []).append(p)
  test = [p for cell in cells.values() for p in rng.sample(cell, min(test_per_cell, len(cell)))]
  test_questions = {p.question for p in test}
  train = [p for p in problems if p.question not in test_questions]
  return train, sorted(test, key=lambda p: p.id)


# ---- the demonstration tree ------------------------------------------------------------------------

# Hand-written cards, one per (tier, domain) block that reads cards, plus one universal card. They
# demonstrate the `kace` method's plumbing at CPU scale; they are not learned (`kace.learn`'s ADD
# and REFINE learn trees) and the tiny model cannot use their content.
DEMO_CARDS = (
  ("MS", "algebra", "decomposition", "Add ones, then tens."),
  ("HS", "algebra", "verification_rule", "Check the last digit."),
  ("MS", "number_theory", "lemma", "A remainder is below the divisor."),
  ("HS", "number_theory", "invariant", "Last digits multiply."),
  ("MS", "combinatorics", "lemma", "Divide and round down."),
  ("HS", "combinatorics", "lemma", "Pairs of n: n(n-1)/2."),
  (None, None, "verification_rule", "Answer with one number."),
)


def demo_tree() -> cards_lib.EpistemicTree:
  tree = cards_lib.EpistemicTree()
  for tier, domain, card_type, text in DEMO_CARDS:
    provenance = cards_lib.Provenance(origin="manual:synthetic-demo")
    tree, _ = tree.add(text, card_type, tier, domain, provenance, reason="demonstration card")
  return tree


# ---- the tiny solver -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TinySolverConfig:
  """What `ensure_tiny_solver` builds; every field is part of the cache key.

  Attributes:
    seed: problems, split, model init and batch order.
    per_cell: problems generated per (domain, level) before the split.
    test_per_cell: held-out problems per (domain, level) (the evaluation set).
    vocab_size: BPE vocabulary (256 bytes + special tokens + merges learnt on the prompts).
    hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim: the model.
    card_fraction: share of training prompts that carry the demonstration tree's cards for their
      (tier, domain), drawn at random, so prompts with cards are not out of distribution.
    steps, batch_size, learning_rate, warmup_steps: `lm.sft.SFTConfig`.
  """

  seed: int = 0
  per_cell: int = 400
  test_per_cell: int = 4
  vocab_size: int = 512
  hidden_size: int = 64
  intermediate_size: int = 192
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 16
  card_fraction: float = 0.3
  steps: int = 1000
  batch_size: int = 32
  learning_rate: float = 3e-3
  warmup_steps: int = 30

  def key(self) -> str:
    """The cache key: this config and the code its build runs (`lm.code_digest`)."""
    return code_digest.cache_key(json.dumps(dataclasses.asdict(self), sort_keys=True), BUILD_MODULES)

  def problems(self) -> tuple[list[data.Problem], list[data.Problem]]:
    """(train, test) of the synthetic benchmark this solver is trained and evaluated on."""
    return split(generate(self.per_cell, self.seed), self.test_per_cell, self.seed)


# The modules whose code (with every first-party module they import) a solver build runs: the solver
# caches are keyed on a digest of their source (`lm.code_digest`), not on a hand-bumped version.
BUILD_MODULES = ("kace.synthetic",)


def build_tokenizer(
  path: str, corpus: Sequence[str], vocab_size: int, added_tokens: Sequence[str] = ()
) -> None:
  """The solver's byte-level BPE tokenizer, trained on `corpus` (ChatML template), plus
  `added_tokens` as single tokens (within `vocab_size`).

  Digits are split one per token, as Qwen does, so numbers are spelled digit by digit.
  """
  train_bpe_tokenizer(
    path, corpus, vocab_size=vocab_size, added_tokens=added_tokens, split_digits=True, model_max_length=2048
  )


def solver_messages(question: str, notes: str = "") -> list[dict[str, str]]:
  """The chat the solver sees (kace.solve sends exactly this)."""
  return text_lib.user_chat(projection.solver_prompt(question, notes))


def balanced(problems: Sequence[data.Problem], seed: int) -> list[data.Problem]:
  """Every (domain, level) cell repeated (sampled with replacement) up to the largest cell's size,
  so families with few distinct questions weigh as much as the others in training."""
  rng = random.Random(seed)
  cells: dict[tuple, list[data.Problem]] = {}
  for p in problems:
    cells.setdefault((p.domain, p.level), []).append(p)
  size = max(len(c) for c in cells.values())
  return [p for c in cells.values() for p in c + rng.choices(c, k=size - len(c))]


def training_examples(
  problems: Sequence[data.Problem], tree: cards_lib.EpistemicTree, card_fraction: float, seed: int
) -> list[tuple[list[dict[str, str]], str]]:
  """(chat, completion) pairs, cells balanced; a `card_fraction` share of chats carry the cards of
  a random tier."""
  rng = random.Random(seed)
  examples = []
  for p in balanced(problems, seed):
    notes = ""
    if rng.random() < card_fraction:
      notes = projection.project(tree, rng.choice(("MS", "HS")), p.domain).notes
    examples.append((solver_messages(p.question, notes), f"\\boxed{{{p.answer}}}"))
  return examples


def ensure_tiny_solver(cache_dir: str, config: TinySolverConfig = TinySolverConfig()) -> str:
  """The directory of the tiny solver for `config` (HF checkpoint + tokenizer + `tree.json`),
  built first if the cache does not hold it yet. Returns its path."""
  target = os.path.join(os.path.expanduser(cache_dir), f"tiny-solver-{config.key()}")
  return rundir.build_once(target, lambda path: _build(path, config), marker="build.json")


def _build(path: str, config: TinySolverConfig) -> None:
  train, _ = config.problems()
  tree = demo_tree()
  examples = training_examples(train, tree, config.card_fraction, config.seed)
  corpus = [projection.solver_prompt(p.question) + f" \\boxed{{{p.answer}}}" for p in train[::4]]
  # Chat roles and card lines are repeated so that BPE merges them: shorter prompts, faster runs.
  corpus += ["user\nassistant\n", *(cards_lib.render_card(c) for c in tree.cards)] * 50
  _, history, count = train_solver(path, examples, corpus, config, log_every=max(1, config.steps // 10))
  tree.save(os.path.join(path, "tree.json"))
  rundir.write_json(
    os.path.join(path, "build.json"),
    {
      "config": dataclasses.asdict(config),
      "code_digest": code_digest.source_digest(BUILD_MODULES),
      "train_examples": count,
      "sft": history,
    },
  )


# ---- the testbed solver: trained to use context -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TestbedSolverConfig:
  """What `ensure_testbed_solver` builds (kace.testbed); every field is part of the cache key.

  Attributes:
    seed: examples, model init and batch order.
    examples: training (chat, completion) pairs drawn.
    card_fraction: share of level >= 2 examples whose notes hold the true card of their kind (a
      training convention); the others have no true card and a random training convention as their
      target, so without a card the solver guesses and its samples disagree.
    min_distractors: at least this many distractor cards in every prompt (monolithic contexts hold
      every block's card, so robustness to many matters most).
    max_distractors: up to this many cards for other kinds (random training conventions) are mixed
      into the notes, in random order, so the solver learns to read the card of its own kind.
    hold_out: train on `testbed.TRAIN_H` only (the evaluated "add 3 / 6 / 9" never seen); False
      trains on all of H, so what is held out is only which rule belongs to which block. Two builds
      with held-out constants failed their gates (docs/kace.md), hence the default.
    form: the questions' and cards' surface form (`testbed.FORMS`); the testbed uses the solver's.
      The keyed form's rules, card keys and cards are single tokens of the tokenizer
      (`testbed.single_tokens`).
    completion: the target's style (`testbed.COMPLETIONS`): "card_first" writes the card of the
      question's kind (key, then rule) before the arithmetic, "rule_first" copies only the rule,
      "working" writes only the arithmetic.
    curriculum_steps: a first phase of this many SFT steps on prompts with at most
      `curriculum_distractors` distractor cards (short prompts: cheap steps, and the "find my kind's
      card" lookup learnt among few cards), before the `steps` steps on the full mix; the second
      phase starts from the first's model with a fresh optimizer and its own warmup. 0: no curriculum.
      The default (600) is build 8 of docs/kace.md's.
    rope_theta: RoPE base (Qwen3's 1e6; the tiny solver's 1e4 leaves fewer of a 16-wide head's
      dimensions nearly position-free, which matching a card 10-100 tokens back relies on).
    bucket_by_length: `lm.sft`'s length-bucketed batches (each padded to its own width), cheaper
      steps than padding every batch to the longest prompt of the set.
    variant: the testbed variant (`testbed.VARIANTS`) whose kind words the questions carry: "v1"
      (`testbed.KINDS`, one word per operator and level) or "conflict" (`testbed.CONFLICT_KINDS`,
      each level >= 2 word shared by every domain's operator, so the card lookup must key on the
      word, not the operator). Distractor cards are drawn from every other word of `testbed.KINDS`
      either way.
    the others: as in `TinySolverConfig`; `num_kv_heads` equals `num_heads` (plain multi-head
      attention), which XLA:CPU runs faster than grouped-query attention (docs/kace.md).
  """

  seed: int = 0
  examples: int = 40_000
  card_fraction: float = 0.7
  min_distractors: int = 0
  max_distractors: int = 8
  hold_out: bool = False
  form: str = "keyed"
  completion: str = "card_first"
  curriculum_steps: int = 600
  curriculum_distractors: int = 2
  vocab_size: int = 768
  hidden_size: int = 64
  intermediate_size: int = 192
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 4
  head_dim: int = 16
  steps: int = 3500
  batch_size: int = 32
  learning_rate: float = 3e-3
  warmup_steps: int = 50
  bucket_by_length: bool = True
  rope_theta: float = 1_000_000.0
  variant: str = "v1"

  def __post_init__(self):
    if self.variant not in testbed.VARIANTS:
      raise ValueError(f"testbed.solver.variant must be one of {testbed.VARIANTS}, got {self.variant!r}")

  def key(self) -> str:
    """The cache key: every field (the data generation's included) and the code the build runs."""
    return code_digest.cache_key(json.dumps(dataclasses.asdict(self), sort_keys=True), BUILD_MODULES)


def convention_notes(cards: Sequence[str]) -> str:
  """Card texts rendered as the projection renders cards of type `testbed.CARD_TYPE`."""
  return "\n".join(f"- [{testbed.CARD_TYPE}] {text}" for text in cards)


def testbed_examples(config: TestbedSolverConfig) -> list[tuple[list[dict[str, str]], str]]:
  """(chat, completion) pairs over every (domain, level), its kind word that of `config.variant`,
  conventions from `testbed.TRAIN_H` (`hold_out`) or H."""
  rng = random.Random(f"testbed-examples-{config.seed}")
  rules = testbed.TRAIN_H if config.hold_out else testbed.H
  kinds = testbed.CONFLICT_KINDS if config.variant == "conflict" else testbed.KINDS
  cells = list(testbed.KINDS)
  out = []
  for _ in range(config.examples):
    domain, level = rng.choice(cells)
    kind = kinds[(domain, level)]
    a, op, b = testbed.draw_base(domain, rng)
    base = testbed.OPS[op](a, b)
    others = rng.sample(
      [k for k in testbed.KINDS.values() if k != kind],
      rng.randint(config.min_distractors, config.max_distractors),
    )
    card = lambda k, h: testbed.card_text(k, h, config.form)
    notes = [card(k, rng.choice(rules)) for k in others]
    if level == 1:
      rule = testbed.IDENTITY
      if rng.random() < config.card_fraction / 4:
        notes.append(card(kind, rule))
    else:
      rule = rng.choice(rules)
      if rng.random() < config.card_fraction:
        notes.append(card(kind, rule))
    rng.shuffle(notes)
    chat = solver_messages(testbed.question(kind, a, op, b, config.form), convention_notes(notes))
    out.append((chat, rule.completion(base, config.completion, config.form, kind)))
  return out


def ensure_testbed_solver(cache_dir: str, config: TestbedSolverConfig = TestbedSolverConfig()) -> str:
  """The directory of the testbed solver for `config` (HF checkpoint + tokenizer), built first if
  the cache does not hold it yet; published atomically like `ensure_tiny_solver`."""
  target = os.path.join(os.path.expanduser(cache_dir), f"testbed-solver-{config.key()}")
  return rundir.build_once(target, lambda path: _build_testbed(path, config), marker="build.json")


def _build_testbed(path: str, config: TestbedSolverConfig) -> None:
  examples = testbed_examples(config)
  corpus = [chat[0]["content"] + " " + completion for chat, completion in examples[::10]]
  corpus += [
    "user\nassistant\n",
    *(f"- [{testbed.CARD_TYPE}] " + k + " problems:" for k in testbed.KINDS.values()),
  ]
  corpus += [h.describe(config.form) for h in testbed.H] * 20
  first = ()
  if config.curriculum_steps:
    few = dataclasses.replace(config, min_distractors=0, max_distractors=config.curriculum_distractors)
    first = testbed_examples(few)
  model, history, count = train_solver(
    path,
    examples,
    corpus,
    config,
    log_every=max(1, config.steps // 20),
    first_phase=first,
    added_tokens=testbed.single_tokens(config.form),
    bucket_by_length=config.bucket_by_length,
    rope_theta=config.rope_theta,
  )
  rundir.write_json(
    os.path.join(path, "build.json"),
    {"config": dataclasses.asdict(config), "code_digest": code_digest.source_digest(BUILD_MODULES),
     "train_examples": count,
     "sft": history},
  )  # fmt: skip


def train_solver(
  path: str,
  examples,
  corpus: Sequence[str],
  config,
  log_every: int,
  first_phase=(),
  added_tokens=(),
  bucket_by_length: bool = False,
  rope_theta: float = 10_000.0,
  label: str = "solver build",
) -> tuple[Qwen, list, int]:
  """Tokenizer on `corpus` (plus `added_tokens`), then a Qwen3-style model of `config`'s size trained
  by `lm.sft` on `examples` (after `config.curriculum_steps` steps on `first_phase`, when given);
  both saved at `path`. Returns (model, SFT history, number of examples). Each phase pads its
  batches to its own longest example (or, `bucket_by_length`, each batch to its own), so a phase
  of short prompts has cheap steps."""
  if added_tokens:  # they are split off before BPE runs, so merges spent on them would be wasted
    pattern = re.compile("|".join(re.escape(t) for t in sorted(added_tokens, key=len, reverse=True)))
    corpus = [pattern.sub(" ", text) for text in corpus]
  build_tokenizer(path, corpus, config.vocab_size, added_tokens)
  tokenizer = load_tokenizer(path)
  for text in added_tokens:
    if len(tokenizer.encode(text)) != 1:
      raise ValueError(f"{text!r} is not a single token of the solver's tokenizer")
  model_config = ModelConfig(
    vocab_size=tokenizer.vocab_size,
    hidden_size=config.hidden_size,
    intermediate_size=config.intermediate_size,
    num_layers=config.num_layers,
    num_heads=config.num_heads,
    num_kv_heads=config.num_kv_heads,
    head_dim=config.head_dim,
    rope_theta=rope_theta,
    max_position_embeddings=2048,
    bos_token_id=None,
    eos_token_ids=(1, 0),
    pad_token_id=0,
  )
  encode = lambda pairs: [
    (tokenizer.encode_chat(chat), tokenizer.encode(completion) + [tokenizer.eos_ids[0]])
    for chat, completion in pairs
  ]
  ids = encode(examples)
  model = Qwen(model_config, rngs=nnx.Rngs(config.seed))
  sft_config = sft.SFTConfig(
    steps=config.steps,
    batch_size=config.batch_size,
    learning_rate=config.learning_rate,
    warmup_steps=config.warmup_steps,
    seed=config.seed,
    log_every=log_every,
    bucket_by_length=bucket_by_length,
  )
  _log.info("training a solver: %d examples, %d params", len(ids), model_config.num_params)
  history = []
  if first_phase:
    steps = config.curriculum_steps
    first = dataclasses.replace(sft_config, steps=steps, log_every=max(1, steps // 10))
    model, history = sft.train_sft(
      model, encode(first_phase), first, pad_id=tokenizer.pad_id, label=f"{label} (curriculum)"
    )
    history = [{**h, "phase": "curriculum"} for h in history]
  model, main = sft.train_sft(model, ids, sft_config, pad_id=tokenizer.pad_id, label=label)
  history += main
  hf.save_hf(model, path, dtype="float32")
  return model, history, len(ids)


# The gates a testbed solver must pass before any comparison (on level-2 held-out problems): with
# the true card it solves; without a card it does not; among every block's card (a monolithic
# context) it still solves, so an ablation that pools cards does not fail by construction.
GATES = {"true_card": (">=", 0.8), "no_card": ("<=", 0.3), "true_card_and_distractors": (">=", 0.7)}


def testbed_gates(
  generator: generators.TextGenerator,
  config: testbed.TestbedConfig,
  params: generators.GenerationParams,
  samples: int = 4,
) -> dict:
  """Solve rates (share of correct samples) of `generator` on the held-out problems of `config`,
  per level, with the true card alone, with no card, and with the true card among every other
  block's card in random order; plus `passed` for each gate of `GATES` (level 2). Every prompt's
  samples get their own seed, derived from `params.seed` (or, unseeded, `config.seed`), the problem
  and the condition, as the pipeline seeds per problem and stage: a solver's gates measure the same
  on every run, and no two prompts share their random draws."""
  base = config.seed if params.seed is None else params.seed
  _, test = config.problems()
  null, kinds = config.null_ids(), config.kinds()
  rules = config.conventions()
  every = testbed.true_cards(rules, levels=testbed.LEVELS, form=config.form, kinds=kinds)
  rng = random.Random(f"testbed-gates-{config.seed}")
  prompts, keys, per_prompt = [], [], []
  for p in (p for p in test if p.id not in null):  # no card helps a null problem (variant "conflict")
    cell = (p.domain, p.level)
    true = testbed.card_text(kinds[cell], rules[cell], config.form)
    # the distractors are every other kind word's card; a card of the same word from another block
    # (variant "conflict") is the conflict the comparison measures, not a gate
    mixed = [text for other, text in every.items() if other == cell or kinds[other] != kinds[cell]]
    rng.shuffle(mixed)
    for condition, notes in (("true_card", [true]), ("no_card", []), ("true_card_and_distractors", mixed)):
      prompts.append(solver_messages(p.question, convention_notes(notes)))
      keys.append((condition, p.level, p.answer))
      seed = seeding.derive_seed(base, p.id, f"gate-{condition}")
      per_prompt.append(dataclasses.replace(params, seed=seed))
  results = generator.generate(prompts, n=samples, params=per_prompt)
  labelled = [(f"{condition}/L{level}", gold) for condition, level, gold in keys]
  rates = dict(sorted(_solve_rates(labelled, results).items()))
  passed = {
    name: (rates[f"{name}/L2"] >= bound if op == ">=" else rates[f"{name}/L2"] <= bound)
    for name, (op, bound) in GATES.items()
  }
  return {"rates": rates, "passed": passed, "all_passed": all(passed.values())}


def card_rates(
  generator: generators.TextGenerator,
  form: str,
  params: generators.GenerationParams,
  per_card: int = 6,
  samples: int = 4,
  seed: int = 0,
) -> dict[str, float]:
  """Solve rate of `generator` with each card alone, for every level >= 2 kind and every member of H
  ("total/addthree": the share of right samples on `per_card` fresh problems of kind "total" whose
  notes hold only the card "addthree=total").

  Why: the gates measure the cards a seed evaluates, a handful of the 90. In the keyed form every card
  is a token of its own, learnt from its own examples, so one card can go unread while the others
  are read (build 12: "asis=total" 0.125, which the identity control evaluates; docs/kace.md). This is
  the map of every card, to see which a solver cannot read before a seed or a control needs it."""
  rng = random.Random(f"testbed-card-rates-{seed}")
  prompts, keys, per_prompt = [], [], []
  for (domain, level), kind in testbed.KINDS.items():
    if level == 1:
      continue
    for rule in testbed.H:
      for i in range(per_card):
        a, op, b = testbed.draw_base(domain, rng)
        notes = convention_notes([testbed.card_text(kind, rule, form)])
        prompts.append(solver_messages(testbed.question(kind, a, op, b, form), notes))
        keys.append((f"{kind}/{rule.describe('keyed')}", str(rule.apply(testbed.OPS[op](a, b)))))
        draw = seeding.derive_seed(seed, kind, rule.describe(), i)
        per_prompt.append(dataclasses.replace(params, seed=draw))
  return _solve_rates(keys, generator.generate(prompts, n=samples, params=per_prompt))


def _solve_rates(keys: Sequence[tuple[str, str]], results) -> dict[str, float]:
  """Share of right samples per label, from (label, gold) per prompt and each prompt's generations
  (the gates' and the card map's one tally)."""
  tally: dict[str, list[int]] = {}
  for (label, gold), gens in zip(keys, results, strict=True):
    count = tally.setdefault(label, [0, 0])
    count[0] += sum(answers.extract_answer(g.text) == gold for g in gens)
    count[1] += len(gens)
  return {label: right / total for label, (right, total) in tally.items()}
