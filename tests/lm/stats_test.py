import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from lm import stats


def test_wilson_interval_closed_form_and_edges():
  # Wilson (1927): centre (p + z²/2n) / (1 + z²/n), half-width z·sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n).
  z, n, k = 1.959963984540054, 10, 8
  p = k / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  np.testing.assert_allclose(stats.wilson_interval(k, n), (centre - half, centre + half), atol=1e-12)
  assert stats.wilson_interval(0, 0) == (0.0, 1.0)
  for n in range(1, 80):  # the bounds always contain the point estimate, exactly at 0 and 1
    assert stats.wilson_interval(0, n)[0] == 0.0 and stats.wilson_interval(n, n)[1] == 1.0
    low, high = stats.wilson_interval(n // 2, n)
    assert low <= (n // 2) / n <= high
  with pytest.raises(ValueError, match="successes"):
    stats.wilson_interval(5, 4)


def test_wilson_interval_is_scipys():
  for n in (1, 2, 3, 7, 10, 28, 84, 101, 1000):
    for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
      for confidence in (0.8, 0.95, 0.99):
        ci = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
        np.testing.assert_allclose(
          stats.wilson_interval(k, n, confidence), (ci.low, ci.high), rtol=0, atol=1e-12
        )


def test_t_interval_is_the_textbook_one():
  # Three seeds 0.1, 0.2, 0.3: mean 0.2, sd 0.1, t_{0.975, 2} = 4.302652729911275 (table value).
  low, high = stats.t_interval([0.1, 0.2, 0.3])
  half = 4.302652729911275 * 0.1 / math.sqrt(3)
  np.testing.assert_allclose((low, high), (0.2 - half, 0.2 + half), atol=1e-12)
  ci = scipy_stats.ttest_1samp([0.05, -0.02, 0.11, 0.07, 0.0], 0.0).confidence_interval(0.9)
  np.testing.assert_allclose(stats.t_interval([0.05, -0.02, 0.11, 0.07, 0.0], 0.9), ci, atol=1e-12)
  assert stats.t_interval([0.0, 0.0, 0.0]) == (0.0, 0.0)  # no spread: the mean itself
  assert all(math.isnan(x) for x in stats.t_interval([0.4]))


def test_bootstrap_ci_contains_the_mean_and_narrows_with_data():
  values = [1.0] * 7 + [0.0] * 3
  low, high = stats.bootstrap_ci(values, samples=1000, seed=1)
  assert 0.0 <= low < 0.7 < high <= 1.0
  assert stats.bootstrap_ci(values, samples=1000, seed=1) == (low, high)
  wide, narrow = high - low, stats.bootstrap_ci(values * 20, samples=1000, seed=1)
  assert narrow[1] - narrow[0] < wide / 2
  assert stats.bootstrap_ci([1.0] * 5) == (1.0, 1.0)
  assert all(math.isnan(x) for x in stats.bootstrap_ci([]))


def _builds(rng, between_sd, builds=10, problems=60):
  """One list of 0/1 outcomes per build: each build's solve rate is 0.5 plus a random effect of sd
  `between_sd` (the tree it learned), its problems Bernoulli at that rate."""
  rates = np.clip(0.5 + rng.normal(0.0, between_sd, builds), 0.0, 1.0)
  return [(rng.random(problems) < r).astype(float) for r in rates]


def test_clustered_bootstrap_covers_where_the_pooled_one_is_too_narrow():
  """Ten builds with a per-build random effect (sd 0.1): the pooled-problem bootstrap's interval is
  about half the width the between-build spread needs and misses the true mean 0.5 often; the
  clustered one's half-width matches the closed form 1.96 · sqrt(sd²/G + p(1-p)/(nG)) and covers."""
  rng = np.random.default_rng(0)
  expected_half = 1.959964 * math.sqrt(0.1**2 / 10 + 0.25 / 600)
  naive_cover = clustered_cover = 0
  halves = []
  reps = 100
  for r in range(reps):
    builds = _builds(rng, 0.1)
    low, high = stats.bootstrap_ci(np.concatenate(builds), samples=400, seed=r)
    naive_cover += low <= 0.5 <= high
    low, high = stats.clustered_bootstrap_ci(builds, samples=400, seed=r)
    clustered_cover += low <= 0.5 <= high
    halves.append((high - low) / 2)
  assert naive_cover / reps < 0.85
  assert clustered_cover / reps >= 0.9
  assert 0.8 < np.mean(halves) / expected_half < 1.3


def test_clustered_bootstrap_without_a_build_effect_is_close_to_the_pooled_one():
  """The control: builds that differ only by sampling noise. Resampling problems within resampled
  builds counts the within-build noise about twice, so the interval is wider by at most about √2
  (conservative, never narrower); resampling builds only (`within=False`) is about as wide."""
  rng = np.random.default_rng(1)
  ratios, ratios_between = [], []
  for r in range(20):
    builds = _builds(rng, 0.0)
    low, high = stats.bootstrap_ci(np.concatenate(builds), samples=400, seed=r)
    c_low, c_high = stats.clustered_bootstrap_ci(builds, samples=400, seed=r)
    b_low, b_high = stats.clustered_bootstrap_ci(builds, samples=400, seed=r, within=False)
    ratios.append((c_high - c_low) / (high - low))
    ratios_between.append((b_high - b_low) / (high - low))
  assert 1.0 < np.mean(ratios) < 1.6
  assert 0.75 < np.mean(ratios_between) < 1.25
  assert stats.clustered_bootstrap_ci([[1.0, 1.0], [1.0]]) == (1.0, 1.0)
  assert all(math.isnan(x) for x in stats.clustered_bootstrap_ci([[], []]))
