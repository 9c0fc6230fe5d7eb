"""The registry of solving methods: one config key (`config.methods`) picks them by name.

A method is what the batched solver needs to know: the voting schedule, what each stage reads
(`projection.Context`) and the solver prompt. The evaluation loop only calls `build(name, config)`,
so new methods (ACE playbook, GEPA, the ablations) are added here with `@register` and never touch
`kace.evaluate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import ml_collections

from kace import cards, projection, tiers


@dataclasses.dataclass(frozen=True)
class Method:
  """How to solve: schedule, context (cards per stage) and solver prompt template."""

  name: str
  schedule: tiers.Schedule
  context: projection.Context = projection.NO_CONTEXT
  template: str = projection.SOLVER_TEMPLATE


Builder = Callable[[ml_collections.ConfigDict], Method]
METHODS: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
  """Adds a builder `config -> Method` under `name` (the evaluation config is passed whole)."""

  def add(builder: Builder) -> Builder:
    if name in METHODS:
      raise ValueError(f"method {name!r} is registered twice")
    METHODS[name] = builder
    return builder

  return add


def build(name: str, config: ml_collections.ConfigDict) -> Method:
  if name not in METHODS:
    raise ValueError(f"unknown method {name!r}; registered: {', '.join(sorted(METHODS))}")
  return METHODS[name](config)


def template(config: ml_collections.ConfigDict) -> str:
  return projection.check_template(config.prompt.solver, ("question", "notes"))


@register("best_of_n")
def best_of_n(config: ml_collections.ConfigDict) -> Method:
  """Fixed self-consistency: `config.best_of_n.n` samples without cards, plurality vote."""
  return Method("best_of_n", tiers.Schedule.best_of_n(config.best_of_n.n), template=template(config))


@register("tiered")
def tiered(config: ml_collections.ConfigDict) -> Method:
  """Tiered self-consistency (`config.schedule`) reading no cards."""
  return Method("tiered", tiers.Schedule.from_config(config.schedule.to_dict()), template=template(config))


@register("kace")
def kace(config: ml_collections.ConfigDict) -> Method:
  """Tiered self-consistency reading block (tier, domain) + universal cards of `config.kace.tree`."""
  if not config.kace.tree:
    raise ValueError("method 'kace' needs config.kace.tree (an Epistemic Tree JSON file)")
  tree = cards.EpistemicTree.load(config.kace.tree)
  if tree.domains != (cards.ANY,) and not set(tree.domains) <= set(config.domains):
    raise ValueError(
      f"tree {config.kace.tree} has domains {tree.domains} outside config.domains {config.domains}"
    )
  schedule = tiers.Schedule.from_config(config.schedule.to_dict())
  return Method("kace", schedule, projection.TreeContext(tree), template(config))
