"""Intervals for the proportions and means that both papers report."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
  """Wilson score interval of a binomial proportion; (0, 1) when n = 0.

  scipy's `binomtest(...).proportion_ci(method="wilson")` term for term (Newcombe 1998's form, as
  scipy writes it; `tests/lm/stats_test.py` checks the two agree), with the bounds exactly 0 with no
  successes and 1 when all are, so they always contain the point estimate. Written out rather than
  called: importing `scipy.stats` takes about 2 s, paid by every process that reports a proportion.
  """
  if n == 0:
    return 0.0, 1.0
  if not 0 <= successes <= n:
    raise ValueError(f"wilson_interval: successes must be in [0, n={n}], got {successes}")
  z = statistics.NormalDist().inv_cdf(0.5 + 0.5 * confidence)
  p = successes / n
  denom = 2 * (n + z**2)
  center = (2 * n * p + z**2) / denom
  delta = z / denom * math.sqrt(4 * n * p * (1 - p) + z**2)
  low = 0.0 if successes == 0 else center - delta
  high = 1.0 if successes == n else center + delta
  return float(low), float(high)


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
  """Student-t interval of the mean of independent replicates (seeds): mean ± t_{n-1} · sd / √n.

  (nan, nan) with fewer than two values; (v, v) when every value is v (no spread, no width)."""
  v = np.asarray(values, np.float64)
  if v.size < 2:
    return float("nan"), float("nan")
  from scipy import stats

  half = float(stats.t.ppf(0.5 + 0.5 * confidence, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
  return float(v.mean() - half), float(v.mean() + half)


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


def clustered_bootstrap_ci(
  clusters: Sequence[Sequence[float]],
  *,
  samples: int = 2000,
  level: float = 0.95,
  seed: int = 0,
  within: bool = True,
) -> tuple[float, float]:
  """Percentile interval of the pooled mean of `clusters` (one sequence of unit values per cluster)
  from a two-stage bootstrap: draw clusters with replacement, then (`within`) units with replacement
  inside each drawn cluster; each resample's statistic is the mean over all its units.

  Why: a testbed's problems are not independent draws when each seed builds its own tree; the build
  is the unit that varies, and a bootstrap over pooled problems (`bootstrap_ci`) ignores the spread
  between builds, so its interval is too narrow when the builds differ (issue 47, item 7). Paired
  differences between two arms are clustered the same way: one value per (build, problem), a − b.
  With one cluster this is `bootstrap_ci`'s resampling; (nan, nan) without values.
  """
  sizes = np.asarray([len(c) for c in clusters], np.int64)
  if sizes.sum() == 0:
    return float("nan"), float("nan")
  clusters = [np.asarray(c, np.float64) for c in clusters if len(c)]
  sizes = sizes[sizes > 0]
  flat = np.concatenate(clusters)
  if np.all(flat == flat[0]):
    return float(flat[0]), float(flat[0])
  padded = np.zeros((len(clusters), int(sizes.max())), np.float64)  # [G, max n]
  for g, c in enumerate(clusters):
    padded[g, : len(c)] = c
  rng = np.random.default_rng(seed)
  stats_b = np.empty(samples, np.float64)
  chunk = max(1, 2_000_000 // padded.size)
  for start in range(0, samples, chunk):
    b = min(chunk, samples - start)
    picked = rng.integers(0, len(clusters), size=(b, len(clusters)))  # [b, G]
    n = sizes[picked]  # [b, G]
    if within:
      idx = np.floor(rng.random((b, len(clusters), padded.shape[1])) * n[..., None]).astype(np.int64)
      mask = np.arange(padded.shape[1]) < n[..., None]  # [b, G, max n]
      values = np.take_along_axis(padded[picked], idx, axis=2)
      totals = np.where(mask, values, 0.0).sum(axis=(1, 2))
    else:
      totals = padded[picked].sum(axis=(1, 2))
    stats_b[start : start + b] = totals / n.sum(axis=1)
  alpha = (1 - level) / 2
  low, high = np.quantile(stats_b, [alpha, 1 - alpha])
  return float(low), float(high)
