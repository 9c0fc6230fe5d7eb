"""The theory job's typed configuration, built once at `launch/theory.py` from `configs/theory.py`.

`TheoryConfig.from_dict(config_dict.to_dict())`: frozen keyword-only sections, unknown keys refused
by name (`dpa_grpo.config.build`), values checked in `__post_init__`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dpa_grpo import theory
from dpa_grpo.config import KL_ESTIMATORS, WEIGHTINGS, build


def _tuple(value):
  return tuple(_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


@dataclasses.dataclass(frozen=True, kw_only=True)
class TheoryLoss:
  """The loss the theory differentiates (`dpa_grpo.losses.paired_loss`): β, KL estimator, weighting,
  and the generator's averaging ("expected": weighted by P(SAC), the game's ODE; "sac_units": a mean
  over SAC'd units, as the trainer averages — the generator's clock 1/P(SAC) times faster)."""

  beta: float = 0.04
  kl: str = "k1"
  weighting: str = "pair"
  averaging: str = "expected"

  def __post_init__(self):
    if self.beta < 0:
      raise ValueError(f"loss.beta must be >= 0, got {self.beta}")
    if self.kl not in KL_ESTIMATORS:
      raise ValueError(f"loss.kl must be one of {KL_ESTIMATORS}, got {self.kl!r}")
    if self.weighting not in WEIGHTINGS:
      raise ValueError(f"loss.weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
    if self.averaging not in theory.AVERAGINGS:
      raise ValueError(f"loss.averaging must be one of {theory.AVERAGINGS}, got {self.averaging!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OdeConfig:
  """RK4 steps to `t_end`; `grid`² trajectory starts and a `quiver`² arrow grid in the portrait."""

  t_end: float = 300.0
  steps: int = 3000
  save_every: int = 10
  grid: int = 4
  quiver: int = 17

  def __post_init__(self):
    if self.steps <= 0 or self.save_every <= 0 or self.t_end <= 0:
      raise ValueError(f"ode.t_end, ode.steps and ode.save_every must be > 0, got {self}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SAConfig:
  """Stochastic approximation: step sizes a_n = a0 / (1 + n / n0)^kappa, `seeds` runs, `shown` drawn."""

  seeds: int = 256
  steps: int = 4000
  save_every: int = 20
  a0: float = 0.5
  n0: float = 50.0
  kappa: float = 0.7
  shown: int = 6

  def __post_init__(self):
    if self.seeds <= 0 or self.steps <= 0 or self.save_every <= 0:
      raise ValueError(f"sa.seeds, sa.steps and sa.save_every must be > 0, got {self}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FixedPointsConfig:
  """β grid (log-spaced) of the fixed-point figure; `compare_variants` adds every loss variant."""

  beta_min: float = 0.01
  beta_max: float = 10.0
  num_betas: int = 13
  compare_variants: bool = True

  def __post_init__(self):
    if not 0 < self.beta_min <= self.beta_max:
      raise ValueError(f"fixed_points needs 0 < beta_min <= beta_max, got {self}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TheoryConfig:
  seed: int = 0
  game: theory.Game = dataclasses.field(default_factory=theory.Game)
  loss: TheoryLoss = dataclasses.field(default_factory=TheoryLoss)
  ode: OdeConfig = dataclasses.field(default_factory=OdeConfig)
  sa: SAConfig = dataclasses.field(default_factory=SAConfig)
  fixed_points: FixedPointsConfig = dataclasses.field(default_factory=FixedPointsConfig)

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> TheoryConfig:
    """The typed config of a ConfigDict's `to_dict()`; lists become the tuples a static jit
    argument needs; unknown keys fail with their name."""
    v = dict(values)
    sections = {"loss": TheoryLoss, "ode": OdeConfig, "sa": SAConfig, "fixed_points": FixedPointsConfig}
    if "game" in v:
      v["game"] = build(theory.Game, {k: _tuple(x) for k, x in v["game"].items()}, "game")
    for name, section in sections.items():
      if name in v:
        v[name] = build(section, dict(v[name]), name)
    return build(cls, v, "")

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)
