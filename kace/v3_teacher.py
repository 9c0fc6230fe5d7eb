"""The learned teacher on testbed v3 (`kace.testbed_v3`): the v1/v2 learned teacher's model
(`kace.learned_teacher`: (base, gold) pairs as number tokens in, one keyed rule word out), trained on
v3's operand ranges, and the `kace.v3_learn.Teacher` it plays in every v3 arm.

Why a module of its own: the v1/v2 teacher's cache key is `lm.code_digest.cache_key` of its config
and of the code `kace.learned_teacher` imports; a field or branch added there would change the key of
its default build, which recorded v1/v2 results used. Here `V3TeacherConfig` extends its config
(`operands`: which ranges training draws and the number tokens cover; `mixed`: the share of training
groups whose pairs mix two rules), with its own key over this module's code, and reuses its model
input, rule words, trainer and generator unchanged.

What it sees (`cards`): of each shown failure only what a teacher prompt shows, the question text
and the gold answer (`shown`). Its kind word and base answer are read from the question text with
`testbed.parse_question`, as the v1/v2 teacher does (`learned_teacher.model_inputs` ->
`oracle.shown_failures` -> `testbed.parse_question`): the question is written in the prompt, and its
arithmetic is exact. The testbed's hidden fields (`Problem.base`, `.size`, `.family`, `.split`) and
any build's `WorldConfig.rules()` never reach it. The programmatic teacher
(`kace.v3_learn.teacher`) reads `Problem.base` directly: the same number here, since a v3 base is
the question's arithmetic, but read from the testbed, not from a prompt.

Training (`training_examples`): per example a domain, a rule of `testbed_v3.RULES` (H without the
identity; with `hold_out`, `testbed.TRAIN_H`'s members only) and `min_pairs`..`max_pairs` base
problems of that domain, each of a size class drawn uniformly, from the teacher's own seeded
generator; with probability `mixed` a group of three or four pairs takes one pair from a second
rule, as an ADD call on a (tier, domain) block that holds both classes shows, and the target stays
the majority's rule. No `WorldConfig` is built: which rule a build gives which block never enters.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
from collections.abc import Sequence

from kace import learned_teacher, synthetic, testbed, testbed_v3
from lm import code_digest, generators, rundir, stats
from lm import text as text_lib

LABEL = learned_teacher.LABEL  # "learned teacher (tiny model)"
Card = tuple[str, testbed.Convention]  # (kind word, rule), as `kace.v3_arms.Card`
BUILD_MODULES = ("kace.v3_teacher",)
# Operand ranges by testbed: {(domain, size class): ((lo_a, hi_a), (lo_b, hi_b))}.
OPERAND_SETS = {
  "v1": {(d, "small"): r for d, r in testbed.OPERANDS.items()},
  "v3": dict(testbed_v3.OPERANDS),
}


def _op(domain: str):
  return testbed.OPS[testbed.OP_OF_DOMAIN[domain]]


def bases(operands: str = "v3") -> tuple[int, ...]:
  """Every base answer the `operands` ranges can give."""
  out = set()
  for (domain, _), ((lo_a, hi_a), (lo_b, hi_b)) in OPERAND_SETS[operands].items():
    out |= {_op(domain)(a, b) for a in range(lo_a, hi_a + 1) for b in range(lo_b, hi_b + 1)}
  return tuple(sorted(out))


def numbers(operands: str = "v3") -> tuple[int, ...]:
  """Every base of `operands` and every h(base), h in H: the numbers the model holds as tokens."""
  xs = bases(operands)
  return tuple(sorted(set(xs) | {h.apply(x) for x in xs for h in testbed.H}))


@dataclasses.dataclass(frozen=True)
class V3TeacherConfig(learned_teacher.LearnedTeacherConfig):
  """`learned_teacher.LearnedTeacherConfig` for testbed v3; every field is part of the cache key.

  Attributes (beyond the base config's, whose defaults change as marked):
    operands: the ranges training draws and the number tokens cover (`OPERAND_SETS`).
    mixed: share of training groups (of 3 or 4 pairs) with one pair of a second rule.
    min_pairs, max_pairs: 1..4, v3's `Budget.shown_failures`; one shown failure of a kind gets a
      card, as from the programmatic teacher.
    vocab_size: room for v3's 515 number tokens.
    examples, hidden_size, intermediate_size, head_dim, steps: the third of three builds tried
      (628k parameters, 8.3 min on the shared 2-core machine); the v1/v2 teacher's 64-wide shape
      reached 0.76-0.89 card accuracy here, this one 0.98 (docs/results/
      2026-12-04-kace-v3-learned-teacher.md).
  """

  operands: str = "v3"
  mixed: float = 0.25
  min_pairs: int = 1
  max_pairs: int = 4
  vocab_size: int = 1024
  examples: int = 80_000
  hidden_size: int = 128
  intermediate_size: int = 512
  head_dim: int = 32
  steps: int = 3000

  def __post_init__(self):
    super().__post_init__()
    if self.operands not in OPERAND_SETS:
      raise ValueError(
        f"V3TeacherConfig.operands must be one of {tuple(OPERAND_SETS)}, got {self.operands!r}"
      )
    if not 0.0 <= self.mixed <= 1.0:
      raise ValueError(f"V3TeacherConfig.mixed must be in [0, 1], got {self.mixed}")

  def key(self) -> str:
    return code_digest.cache_key(json.dumps(dataclasses.asdict(self), sort_keys=True), BUILD_MODULES)

  def rules(self) -> tuple[testbed.Convention, ...]:
    """The rules training draws: `testbed_v3.RULES`, or with `hold_out` those in `testbed.TRAIN_H`."""
    return tuple(h for h in testbed_v3.RULES if not self.hold_out or h in testbed.TRAIN_H)


def training_examples(config: V3TeacherConfig) -> list[tuple[list[dict[str, str]], str]]:
  """(chat, rule word) pairs (module docstring)."""
  rng = random.Random(f"learned-teacher-v3-examples-{config.seed}")
  ranges, rules = OPERAND_SETS[config.operands], config.rules()
  domains = sorted({d for d, _ in ranges})
  classes = {d: sorted(c for dd, c in ranges if dd == d) for d in domains}

  def base(domain: str) -> int:
    (lo_a, hi_a), (lo_b, hi_b) = ranges[(domain, rng.choice(classes[domain]))]
    return _op(domain)(rng.randint(lo_a, hi_a), rng.randint(lo_b, hi_b))

  out = []
  for _ in range(config.examples):
    domain, rule = rng.choice(domains), rng.choice(rules)
    n = rng.randint(config.min_pairs, config.max_pairs)
    pair_rules = [rule] * n
    if n >= 3 and rng.random() < config.mixed:
      pair_rules[rng.randrange(n)] = rng.choice([h for h in rules if h != rule])
    pairs = [(x, h.apply(x)) for x, h in ((base(domain), h) for h in pair_rules)]
    out.append((text_lib.user_chat(learned_teacher.model_input(pairs)), rule.describe("keyed")))
  return out


def ensure_v3_teacher(cache_dir: str, config: V3TeacherConfig = V3TeacherConfig()) -> str:
  """The directory of the v3 teacher's model for `config`, trained first when not cached
  (`<cache_dir>/learned-teacher-v3-<key>/`)."""
  target = os.path.join(os.path.expanduser(cache_dir), f"learned-teacher-v3-{config.key()}")
  return rundir.build_once(target, lambda path: _build(path, config), marker="build.json")


def _build(path: str, config: V3TeacherConfig) -> None:
  examples = training_examples(config)
  corpus = [chat[0]["content"] for chat, _ in examples[::50]] + ["user\nassistant\n"] * 20
  added = (
    *(learned_teacher.number_token(x) for x in numbers(config.operands)),
    *learned_teacher.RULE_OF_WORD,
  )
  _, history, count = synthetic.train_solver(
    path,
    examples,
    corpus,
    config,
    log_every=max(1, config.steps // 10),
    added_tokens=added,
    rope_theta=config.rope_theta,
    label=f"{LABEL} v3 build",
  )
  rundir.write_json(
    os.path.join(path, "build.json"),
    {"config": dataclasses.asdict(config), "code_digest": code_digest.source_digest(BUILD_MODULES),
     "train_examples": count, "sft": history, "label": LABEL},
  )  # fmt: skip


def shown(problem: testbed_v3.Problem) -> tuple[str, str]:
  """What a teacher prompt shows of a failed v3 problem: its question text and gold answer."""
  return problem.problem.question, problem.problem.answer


def groups_of(views: Sequence[tuple[str, str]], max_pairs: int) -> list[tuple[str, list[tuple[int, int]]]]:
  """(kind, its first `max_pairs` (base, gold) pairs) per kind word among shown (question, gold)
  views, kinds sorted; the kind and base read from the question text (`testbed.parse_question`)."""
  by_kind: dict[str, list[tuple[int, int]]] = {}
  for question, gold in views:
    parsed = testbed.parse_question(question)
    if parsed is not None and gold.lstrip("-").isdigit():
      by_kind.setdefault(parsed[0], []).append((parsed[1], int(gold)))
  return [(kind, pairs[:max_pairs]) for kind, pairs in sorted(by_kind.items())]


class LearnedV3Teacher:
  """The `kace.v3_learn.Teacher` played by the trained model (module docstring).

  Attributes:
    generator: the model behind `lm.generators.TextGenerator` (`load`: the checkpoint's
      `JaxGenerator`); asked for the rule word of each model input, greedily.
    min_pairs, max_pairs: it abstains for a kind with fewer shown failures; reads at most max_pairs.
    calls, decoded: teacher calls answered, and model inputs decoded (a repeated input is answered
      from memory: greedy decoding makes a reply a function of the input).
  """

  name = LABEL

  def __init__(self, generator: generators.TextGenerator, min_pairs: int = 1, max_pairs: int = 4):
    self.generator, self.min_pairs, self.max_pairs = generator, min_pairs, max_pairs
    self.params = generators.GenerationParams(max_tokens=2, temperature=0.0, seed=0)
    self.calls, self.decoded = 0, 0
    self._memo: dict[str, str] = {}

  @classmethod
  def load(cls, path: str, config: V3TeacherConfig = V3TeacherConfig()) -> LearnedV3Teacher:
    """The teacher of the checkpoint at `path` (built by `config`)."""
    return cls(_generator(os.path.abspath(path)), config.min_pairs, config.max_pairs)

  @classmethod
  def build(cls, cache_dir: str, config: V3TeacherConfig = V3TeacherConfig()) -> LearnedV3Teacher:
    """The teacher of `config`, trained first (into `cache_dir`) when not cached."""
    return cls.load(ensure_v3_teacher(cache_dir, config), config)

  def words(self, inputs: Sequence[str]) -> list[str]:
    """The decoded rule word of each model input, the new ones in one generator call."""
    new = sorted({x for x in inputs if x not in self._memo})
    if new:
      outs = self.generator.generate([text_lib.user_chat(x) for x in new], n=1, params=self.params)
      self._memo.update((x, gen.text.strip()) for x, (gen,) in zip(new, outs, strict=True))
      self.decoded += len(new)
    return [self._memo[x] for x in inputs]

  def cards_batch(self, views: Sequence[Sequence[tuple[str, str]]]) -> list[list[Card]]:
    """For each list of shown (question, gold) views, one card per kind word with >= `min_pairs`
    of them (a reply that is no rule word is no card); every list decoded in one generator call."""
    asks = [
      [
        (k, learned_teacher.model_input(p))
        for k, p in groups_of(v, self.max_pairs)
        if len(p) >= self.min_pairs
      ]
      for v in views
    ]
    words, out = self.words([x for a in asks for _, x in a]), []
    for a in asks:
      rules = [learned_teacher.RULE_OF_WORD.get(w) for w in words[: len(a)]]
      words = words[len(a) :]
      out.append([(kind, rule) for (kind, _), rule in zip(a, rules, strict=True) if rule is not None])
    return out

  def cards(self, failures: Sequence[testbed_v3.Problem], shown_failures: int, rng: random.Random):
    """`Teacher.cards`: the failures shown are drawn as the programmatic teacher draws them (the
    same `rng` calls), and only their question text and gold answer are read."""
    self.calls += 1
    chosen = rng.sample(list(failures), min(shown_failures, len(failures)))
    return self.cards_batch([[shown(p) for p in chosen]])[0]


@functools.cache
def _generator(path: str) -> generators.JaxGenerator:
  config = generators.GeneratorConfig(
    checkpoint=path, dtype="float32", sampler=dict(min_prompt_bucket=32, step_bucket=8, max_rows=256)
  )
  return generators.load_jax_generator(config)


# ---- measuring a teacher's cards on v3 teaching failures -----------------------------------------------


def accuracy_groups(builds: Sequence[int] = tuple(range(10)), split: str = "teach", size: int = 4) -> list:
  """Groups of <= `size` problems of `split` per build, as a teacher call shows them, each with the
  rules it is scored against (read here, for scoring only; a teacher gets `problems` alone):
  - "block": every (domain, family, size) block cut into groups of `size` (one rule);
  - "mixed": per (domain, family), its two size classes' problems shuffled together and cut into
    groups of `size` (as an ADD call on a (tier, domain) block that holds both classes shows them):
    the main family's groups hold two rules, the control family's one."""
  out = []
  for b in builds:
    rng = random.Random(f"v3-teacher-accuracy-{b}-{split}")
    cells: dict[tuple, list] = {}
    for p in testbed_v3.WorldConfig(seed=b).split(split):
      cells.setdefault((p.domain, p.family, p.size), []).append(p)
    cut = [("block", d, f, ps) for (d, f, _), ps in sorted(cells.items())]
    cut += [
      ("mixed", d, f, [p for c in testbed_v3.CLASSES for p in cells[(d, f, c)]])
      for d in testbed_v3.DOMAINS
      for f in testbed_v3.FAMILIES
    ]
    for group, domain, family, ps in cut:
      ps = list(ps)
      rng.shuffle(ps)
      out.extend(
        {"build": b, "group": group, "domain": domain, "family": family, "problems": ps[i : i + size]}
        for i in range(0, len(ps), size)
      )
  for g in out:
    g["rules"] = {p.size: rules_of(g["build"])[(p.domain, p.family, p.size)] for p in g["problems"]}
  return out


@functools.cache
def rules_of(build: int) -> dict:
  """Build `build`'s rules, for scoring accuracy groups only."""
  return testbed_v3.WorldConfig(seed=build).rules()


def score(group: dict, cards: Sequence[tuple[str, testbed.Convention]]) -> dict[str, float]:
  """One group's scores: "right" (a card of the group's kind word states the rule of a class the group
  holds; 0 with no card), "majority" (it states the rule of the class holding more than half of the
  group; None when no class does) and "abstained"."""
  kind = testbed_v3.FAMILIES[group["family"]]
  mine = [rule for k, rule in cards if k == kind]
  sizes = [p.size for p in group["problems"]]
  top = max(set(sizes), key=sizes.count)
  majority = group["rules"][top] if 2 * sizes.count(top) > len(sizes) else None
  return {
    "right": float(bool(mine) and mine[0] in group["rules"].values()),
    "majority": None if majority is None else float(bool(mine) and mine[0] == majority),
    "abstained": float(not mine),
  }


def card_accuracy(teacher, groups: Sequence[dict], seed: int = 0) -> dict:
  """`teacher`'s cards on `groups` (`accuracy_groups`), each group shown whole: per group
  kind and overall, the share "right" and "majority" (`score`) with a 95% interval clustered by
  build (`lm.stats.clustered_bootstrap_ci`), and abstentions."""
  if hasattr(teacher, "cards_batch"):
    all_cards = teacher.cards_batch([[shown(p) for p in g["problems"]] for g in groups])
  else:  # the programmatic teacher: shown the whole group (a draw of all of it)
    all_cards = [teacher.cards(g["problems"], len(g["problems"]), random.Random(seed)) for g in groups]
  scored = [score(g, c) for g, c in zip(groups, all_cards, strict=True)]
  out = {}
  for kind in ("block", "mixed", "mixed/main", "all"):
    pick = [
      (g, s)
      for g, s in zip(groups, scored, strict=True)
      if kind in ("all", g["group"], f"{g['group']}/{g['family']}")
    ]
    row = {"groups": len(pick), "abstained": int(sum(s["abstained"] for _, s in pick))}
    for stat in ("right", "majority"):
      by_build: dict[int, list[float]] = {}
      for g, s in pick:
        if s[stat] is not None:
          by_build.setdefault(g["build"], []).append(s[stat])
      values = [v for vs in by_build.values() for v in vs]
      low, high = stats.clustered_bootstrap_ci(list(by_build.values()), seed=seed)
      row[stat] = {
        "n": len(values),
        "mean": sum(values) / len(values) if values else float("nan"),
        "ci95": [low, high],
      }
    out[kind] = row
  return out
