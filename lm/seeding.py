"""Sampling seeds derived from what identifies a call, so results never depend on batching.

One scheme for both papers: the parts (run seed, step, problem id, stage name, ...) go into numpy's
`SeedSequence`; a string part enters as its CRC-32. A seed is a function of its parts only, so a
problem solved alone or in any batch, on a fresh run or a resumed one, draws the same samples.
"""

from __future__ import annotations

import zlib

import numpy as np


def derive_seeds(*parts: int | str, n: int = 1) -> list[int]:
  """`n` non-negative 31-bit seeds from `parts` (ints, or strings hashed with CRC-32)."""
  entropy = [p if isinstance(p, int) else zlib.crc32(str(p).encode()) for p in parts]
  if any(p < 0 for p in entropy):
    raise ValueError(f"derive_seeds: parts must be non-negative, got {parts}")
  state = np.random.SeedSequence(entropy).generate_state(max(n, 1))
  return [int(s & 0x7FFFFFFF) for s in state[:n]]


def derive_seed(*parts: int | str) -> int:
  """One seed from `parts` (see `derive_seeds`)."""
  return derive_seeds(*parts, n=1)[0]
