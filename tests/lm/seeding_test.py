import numpy as np

from lm import seeding


def test_seeds_depend_only_on_their_parts():
  a = seeding.derive_seeds(0, 3, 1, 0, n=4)
  assert a == seeding.derive_seeds(0, 3, 1, 0, n=4) and a[:2] == seeding.derive_seeds(0, 3, 1, 0, n=2)
  assert a != seeding.derive_seeds(0, 3, 1, 1, n=4) and a != seeding.derive_seeds(0, 4, 1, 0, n=4)
  # Integer parts go to numpy's SeedSequence as they are (what DPA-GRPO's rollouts were seeded with).
  expected = np.random.SeedSequence([0, 3, 1, 0]).generate_state(4)
  assert a == [int(s & 0x7FFFFFFF) for s in expected]


def test_string_parts_are_stable_and_distinct():
  assert seeding.derive_seed(0, "p", "ES") == seeding.derive_seed(0, "p", "ES")
  seeds = {seeding.derive_seed(s, p, t) for s in (0, 1) for p in ("p", "q") for t in ("ES", "MS")}
  assert len(seeds) == 8 and all(0 <= x < 2**31 for x in seeds)
