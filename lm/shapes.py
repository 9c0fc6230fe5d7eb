"""Padded sizes for jitted programs: few distinct shapes, so few compilations, little padding."""

from __future__ import annotations

import math


def round_up(x: int, multiple: int) -> int:
  """The smallest multiple of `multiple` that is >= x."""
  return -(-x // multiple) * multiple


def pow2_bucket(n: int, minimum: int = 1) -> int:
  """The smallest power of two >= n, at least `minimum`."""
  return max(minimum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def width_bucket(n: int, minimum: int = 64) -> int:
  """Sequence widths for training batches: powers of two up to 256, then multiples of 128 up to
  1024, then of 256 (attention cost is quadratic in the width, so large widths pad finely)."""
  if n <= 256:
    return pow2_bucket(n, minimum)
  return round_up(n, 128 if n <= 1024 else 256)
