"""Intervals for the proportions and means that both papers report."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
  """Wilson score interval of a binomial proportion; (0, 1) when n = 0.

  scipy's `binomtest(...).proportion_ci(method="wilson")`, so the bounds contain the point estimate
  exactly (0 when no successes, 1 when all are).
  """
  if n == 0:
    return 0.0, 1.0
  if not 0 <= successes <= n:
    raise ValueError(f"wilson_interval: successes must be in [0, n={n}], got {successes}")
  from scipy import stats  # here, not at the top: a second of every launcher's start-up

  ci = stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
  return float(ci.low), float(ci.high)


def bootstrap_ci(
  values: Sequence[float], *, samples: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
  """Percentile bootstrap interval of the mean: (low, high); (nan, nan) without values."""
  values = np.asarray(values, np.float64)
  if values.size == 0:
    return float("nan"), float("nan")
  if np.all(values == values[0]):
    return float(values[0]), float(values[0])
  from scipy import stats

  result = stats.bootstrap(
    (values,),
    np.mean,
    n_resamples=samples,
    confidence_level=level,
    method="percentile",
    random_state=np.random.default_rng(seed),
  )
  return float(result.confidence_interval.low), float(result.confidence_interval.high)
