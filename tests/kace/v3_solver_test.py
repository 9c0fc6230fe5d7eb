"""Testbed v3's trained solver: its training data (no build's rules, conflicting cards with the target
among them), its cache key, the prefetching `v3_arms.Solver` (the same outcomes as one sample at a
time) and the model reader end to end on a tiny model."""

import collections
import dataclasses
import random

import pytest

from kace import readers, testbed, testbed_v3, tiers, v3_arms, v3_reader, v3_solver

SMALL = v3_solver.V3SolverConfig(examples=3000)


def test_training_examples_never_read_a_build_and_hold_conflicting_cards(monkeypatch):
  def forbidden(self):
    raise AssertionError("training read a build's rules")

  monkeypatch.setattr(testbed_v3.WorldConfig, "rules", forbidden)
  examples = v3_solver.draw_examples(SMALL)
  assert len(examples) == SMALL.examples
  targets_by_cell, conflicts = collections.defaultdict(set), 0
  for e in examples:
    assert 0 <= len(e.shown) <= SMALL.max_cards and e.target in testbed_v3.RULES
    assert all(kind in v3_solver.KINDS and rule in testbed_v3.RULES for kind, rule in e.shown)
    (lo_a, hi_a), (lo_b, hi_b) = testbed_v3.OPERANDS[(e.domain, e.size)]
    assert lo_a <= e.a <= hi_a and lo_b <= e.b <= hi_b
    own = [rule for kind, rule in e.shown if kind == e.kind]
    assert len(set(own)) == len(own) <= 3
    if own:
      assert e.target in own  # the target is one of the cards of its word shown
    conflicts += len(own) >= 2
    targets_by_cell[(e.domain, e.size, e.kind)].add(e.target)
    chat, completion = e.chat(), e.completion()
    notes, question = chat[0]["content"].rsplit("Problem: ", 1)
    assert testbed.parse_question(question) == (e.kind, e.base)
    assert testbed.cards_in(notes) == list(e.shown)
    assert completion.endswith(f"\\boxed{{{e.target.apply(e.base)}}}")
    assert completion.startswith(f"={e.kind}{e.target.describe('keyed')}: ")
  assert conflicts > 0.15 * len(examples)
  # no (domain, class, word) block has a rule of its own: every cell's targets spread over H
  assert len(targets_by_cell) == 12
  assert all(t == set(testbed_v3.RULES) for t in targets_by_cell.values())
  large = sum(e.size == "large" for e in examples) / len(examples)
  assert abs(large - SMALL.large_share) < 0.03
  no_card = [e for e in examples if not e.shown]
  assert no_card and len({e.target for e in no_card}) > 5
  curriculum = v3_solver.draw_examples(SMALL, max_cards=2, tag="curriculum")
  assert max(len(e.shown) for e in curriculum) == 2


def test_cache_key_changes_with_every_field():
  base = v3_solver.V3SolverConfig()
  assert base.key() == v3_solver.V3SolverConfig().key()
  for field in dataclasses.fields(base):
    value = getattr(base, field.name)
    other = (not value) if isinstance(value, bool) else value / 2 if isinstance(value, float) else value + 1
    assert dataclasses.replace(base, **{field.name: other}).key() != base.key(), field.name
  with pytest.raises(ValueError, match="large_share"):
    v3_solver.V3SolverConfig(large_share=1.5)


class Counting(readers.Reader):
  """A scripted reader that counts its `answers` calls."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    object.__setattr__(self, "calls", [])

  def answers(self, asks):
    self.calls.append(len(asks))
    return super().answers(asks)


def _trees(world):
  rules = world.rules()
  true = v3_arms.true_tree(world)
  small_everywhere = v3_arms.Tree(
    v3_arms.MONOLITHIC,
    12,
    {("*", "*"): [("total", rules[(d, "main", "small")]) for d in testbed_v3.DOMAINS]},
  )
  flat = [next(a for a in v3_arms.ARMS if a.inference == inference) for inference in ("playbook", "top_k")]
  pairs = [(None, v3_arms.ARMS[0]), (true, v3_arms.Arm(name="t")), (small_everywhere, v3_arms.ARMS[4])]
  return pairs + [(small_everywhere, arm) for arm in flat]


@pytest.mark.parametrize("reader", readers.READERS, ids=lambda r: r.name)
def test_prefetch_gives_the_one_sample_paths_outcomes(reader):
  world = testbed_v3.WorldConfig(seed=2)
  problems = world.split("calibration")
  batched = Counting(name=reader.name, policy=reader.policy, large_error=reader.large_error)
  one_by_one = v3_arms.Solver(reader, 2, v3_arms.Budget())
  prefetching = v3_arms.Solver(batched, 2, v3_arms.Budget())
  for tree, arm in _trees(world):
    before = len(batched.calls)
    right = prefetching.correct(tree, arm, problems)
    assert len(batched.calls) == before + 1  # one call for every problem's stages
    expected = [one_by_one.solve(tree, arm, p) for p in problems]
    assert [prefetching.solve(tree, arm, p) for p in problems] == expected
    assert right == sum(o.correct for o in expected)
  # the gates: the same rates as drawing each sample alone from one rng, in order
  gated = v3_arms.gates(v3_arms.Solver(reader, 2, v3_arms.Budget()), world)
  rules, rng = world.rules(), random.Random(v3_arms.seed_of("gates", world.seed, reader.name))
  part = world.split("calibration")
  for name, group, card in (
    ("small_true_card", [p for p in part if p.size == "small"], True),
    ("no_card", part, False),
    ("large_true_card", [p for p in part if p.size == "large"], True),
  ):
    right = 0
    for p in group:
      shown = [(p.kind, rules[(p.domain, p.family, p.size)])] if card else []
      right += sum(reader.answer(p, shown, rng) == p.problem.answer for _ in range(8))
    assert gated["rates"][name] == right / (8 * len(group)), name


@pytest.fixture(scope="module")
def tiny_solver(tmp_path_factory):
  config = v3_solver.V3SolverConfig(
    examples=200,
    steps=2,
    curriculum_steps=0,
    batch_size=4,
    vocab_size=512,
    hidden_size=16,
    intermediate_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=2,
    head_dim=8,
    bucket_by_length=False,  # one shape: one compile
  )
  return v3_solver.ensure_v3_solver(str(tmp_path_factory.mktemp("v3")), config)


def test_model_reader_end_to_end_through_solve_and_gates(tiny_solver):
  reader = v3_reader.ModelReader(tiny_solver, name="tiny")
  tokenizer = reader.generator.tokenizer
  for number in (0, 9, 270, 2430):  # every base and h(base) of v3 is spelled digit by digit
    assert tokenizer.decode(tokenizer.encode(str(number))) == str(number)
  assert all(len(tokenizer.encode(text)) == 1 for text in testbed.single_tokens("keyed"))
  per_split = (("teach", 1), ("accept", 1), ("calibration", 1), ("test", 1))
  world = testbed_v3.WorldConfig(seed=0, per_split=per_split)
  solver = v3_arms.Solver(reader, 0, v3_arms.Budget())
  part = world.split("calibration")
  tree, arm = v3_arms.true_tree(world), v3_arms.Arm(name="t")
  assert 0 <= solver.correct(tree, arm, part) <= len(part)
  outcome = solver.solve(tree, arm, part[0])
  assert outcome.exit_tier in (tiers.ES, tiers.MS, tiers.HS, tiers.POOL) and outcome.calls in (2, 5, 10)
  # common random numbers: the same cards shown give the same samples, in another solver too (there
  # drawn one stage at a time, not prefetched with the other problems)
  assert v3_arms.Solver(reader, 0, v3_arms.Budget()).solve(tree, arm, part[0]) == outcome
  gated = v3_arms.gates(solver, world, samples=2)
  assert set(gated["rates"]) == set(v3_arms.GATES) and all(-1 <= x <= 1 for x in gated["rates"].values())
