"""The registry of solving methods: one config key (`config.methods`) picks them by name.

A method is what the batched solver needs to know: the voting schedule, what each stage reads
(`projection.Context`) and the solver prompt. The evaluation loop only calls `build(name, config)`,
so methods are added here with `@register` and never touch `kace.evaluate`. Learned methods read
an artefact (a tree, a playbook, a GEPA prompt) that `kace.pipeline.build` wrote; `ARTIFACT` says
which, so the builder and the evaluation agree on one name per method.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable

import ml_collections

from kace import baselines, cards, embed, projection, tiers
from lm import generators


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
    raise ValueError(f"unknown method {name!r}; registered: {', '.join(METHODS)}")
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
  return Method("tiered", schedule(config), template=template(config))


# ---- learned methods ---------------------------------------------------------------------------------

# Each learned method reads one artefact that `kace.pipeline.build` writes into `config.learn.dir`
# (`<dir>/<artefact>/tree.json`, or `prompt.json` for GEPA); several methods share one.
ARTIFACT = {
  "kace": "kace",
  "no_domain": "no_domain",
  "no_difficulty": "no_difficulty",
  "raw_reflections": "raw_reflections",
  "llm_router": "kace",
  "embedding_retrieval": "kace",
  "ace_playbook": "ace_playbook",
  "gepa": "gepa",
  "tiered_gepa": "gepa",
}

# Tree artefacts: the layout (cards.EpistemicTree axes) and how ADD distils (learn.LearnConfig.distill).
TREE_ARTIFACTS = {
  "kace": ({}, "teacher"),
  "no_domain": ({"domains": (cards.ANY,)}, "teacher"),
  "no_difficulty": ({"tiers": (cards.ANY,), "domains": (cards.ANY,)}, "teacher"),
  "raw_reflections": ({}, "reflection"),
}


def artifact_path(config: ml_collections.ConfigDict, artifact: str, filename: str = "tree.json") -> str:
  """Where `artifact` lives; `config.kace.tree`, when set, is the `kace` tree."""
  if artifact == "kace" and config.kace.tree:
    return config.kace.tree
  if not config.learn.dir:
    raise ValueError(
      f"the {artifact!r} artefact needs config.learn.dir (a build directory; python -m launch.kace_build)"
      + (" or config.kace.tree" if artifact == "kace" else "")
    )
  path = os.path.join(config.learn.dir, artifact, filename)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} does not exist: build it with python -m launch.kace_build")
  return path


def schedule(config: ml_collections.ConfigDict) -> tiers.Schedule:
  return tiers.Schedule.from_config(config.schedule.to_dict())


def _learned_tree(config, artifact: str) -> cards.EpistemicTree:
  path = artifact_path(config, artifact)
  tree = cards.EpistemicTree.load(path)
  if tree.domains != (cards.ANY,) and not set(tree.domains) <= set(config.domains):
    raise ValueError(f"tree {path} has domains {tree.domains} outside config.domains {config.domains}")
  return tree


def _tree_method(name: str) -> Builder:
  def builder(config: ml_collections.ConfigDict) -> Method:
    tree = _learned_tree(config, ARTIFACT[name])
    return Method(name, schedule(config), projection.TreeContext(tree), template(config))

  builder.__doc__ = (
    f"Tiered self-consistency reading block (tier, domain) + universal cards of the {name!r} tree."
  )
  return builder


for _name in TREE_ARTIFACTS:
  register(_name)(_tree_method(_name))


@functools.cache
def _role(role_json: str) -> generators.TextGenerator:
  """One generator per distinct role config, shared by the methods that use it (a second method
  asking for the solver's model does not load it twice)."""
  return generators.make_generator(ml_collections.ConfigDict(json.loads(role_json)))


def role(config: ml_collections.ConfigDict, name: str) -> generators.TextGenerator:
  """The generator of `config.roles.<name>`, or of the solver when that role is not set."""
  chosen = config.roles.get(name) or config.roles.solver
  return _role(json.dumps(chosen.to_dict(), sort_keys=True))


def role_params(config: ml_collections.ConfigDict) -> generators.GenerationParams:
  s = config.role_sampling
  return generators.GenerationParams(**{**s.to_dict(), "stop": tuple(s.stop)})


@register("llm_router")
def llm_router(config: ml_collections.ConfigDict) -> Method:
  """Tiered self-consistency; an LLM (`roles.router`) picks `router.k` cards from the whole kace store."""
  context = baselines.RouterContext(
    _learned_tree(config, "kace"),
    role(config, "router"),
    config.router.k,
    role_params(config),
    config.learn.retries,
  )
  return Method("llm_router", schedule(config), context, template(config))


@register("embedding_retrieval")
def embedding_retrieval(config: ml_collections.ConfigDict) -> Method:
  """Tiered self-consistency reading the `retrieval.k` kace cards most similar to the problem (MiniLM)."""
  context = baselines.EmbeddingContext(
    _learned_tree(config, "kace"), embed.MiniLM(config.retrieval.model_dir), config.retrieval.k
  )
  return Method("embedding_retrieval", schedule(config), context, template(config))


def playbook_schedule(config: ml_collections.ConfigDict) -> tiers.Schedule:
  """Best-of-N (`best_of_n.n`) whose every sample reads the whole playbook (its one block)."""
  return dataclasses.replace(tiers.Schedule.best_of_n(config.best_of_n.n), pool_reads=cards.ANY)


@register("ace_playbook")
def ace_playbook(config: ml_collections.ConfigDict) -> Method:
  """ACE: best-of-N with the whole learned playbook in every prompt."""
  playbook = cards.EpistemicTree.load(artifact_path(config, "ace_playbook"))
  return Method("ace_playbook", playbook_schedule(config), projection.TreeContext(playbook), template(config))


def _gepa_template(config) -> str:
  prompt = baselines.load_prompt(artifact_path(config, "gepa", "prompt.json"))
  return projection.check_template(prompt, ("question", "notes"))


@register("gepa")
def gepa(config: ml_collections.ConfigDict) -> Method:
  """Best-of-N with the solver instruction GEPA evolved."""
  return Method("gepa", tiers.Schedule.best_of_n(config.best_of_n.n), template=_gepa_template(config))


@register("tiered_gepa")
def tiered_gepa(config: ml_collections.ConfigDict) -> Method:
  """Tiered self-consistency (no cards) with the solver instruction GEPA evolved."""
  return Method("tiered_gepa", schedule(config), template=_gepa_template(config))
