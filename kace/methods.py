"""The registry of solving methods: one config key (`config.methods`) picks them by name.

A method is what the batched solver needs to know: the voting schedule, what each stage reads
(`projection.Context`) and the solver prompt. The evaluation loop only calls `build(name, options)`,
so methods are added here with `@register` and never touch `kace.evaluate`. A builder reads only
`MethodOptions` (schedule, prompt, where the learned artefacts are, the router's role), which
`kace.config.KaceConfig.method_options()` distils from the whole config; this module imports no
config, so `kace.config` can import it to check method names.
Learned methods read an artefact (a tree, a playbook, a GEPA prompt) that `kace.pipeline.build`
wrote; `ARTIFACT` says which, so the builder and the evaluation agree on one name per method.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Sequence

from kace import baselines, cards, embed, projection, tiers
from lm import generators

GeneratorConfig = generators.GeneratorConfig


@dataclasses.dataclass(frozen=True)
class Method:
  """How to solve: schedule, context (cards per stage) and solver prompt template."""

  name: str
  schedule: tiers.Schedule
  context: projection.Context = projection.NO_CONTEXT
  template: str = projection.SOLVER_TEMPLATE


@dataclasses.dataclass(frozen=True, kw_only=True)
class MethodOptions:
  """What a method builder (`kace.methods.register`) may read.

  Attributes:
    best_of_n: samples of the best-of-N methods.
    best_of_n_max: samples per problem of `best_of_n_curve`.
    schedule: the tiered methods' schedule.
    template: the solver prompt (with {question} and {notes}).
    kace_tree: the `kace` tree file ("" = `learn_dir`'s).
    learn_dir: the build directory holding learned artefacts.
    domains: the domains a learned tree may use.
    router, router_k, role_params, retries: the LLM router's role, cards picked, sampling, and
      extra asks after a malformed reply.
    retrieval_k, retrieval_model_dir: embedding retrieval's cards per problem and MiniLM weights.
  """

  best_of_n: int
  best_of_n_max: int
  schedule: tiers.Schedule
  template: str
  kace_tree: str
  learn_dir: str
  domains: tuple[str, ...]
  router: GeneratorConfig
  router_k: int
  role_params: generators.GenerationParams
  retries: int
  retrieval_k: int
  retrieval_model_dir: str


Builder = Callable[[MethodOptions], Method]
METHODS: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
  """Adds a builder `MethodOptions -> Method` under `name`."""

  def add(builder: Builder) -> Builder:
    if name in METHODS:
      raise ValueError(f"method {name!r} is registered twice")
    METHODS[name] = builder
    return builder

  return add


def build(name: str, options: MethodOptions) -> Method:
  if name not in METHODS:
    raise ValueError(f"unknown method {name!r}; registered: {', '.join(METHODS)}")
  return METHODS[name](options)


def schedule(name: str, options: MethodOptions) -> tiers.Schedule:
  """The schedule method `name` votes with, read without its artefacts (the dry run's counts):
  Best-of-N for the best-of-N methods, the playbook's for ACE, `options.schedule` for the rest."""
  if name not in METHODS:
    raise ValueError(f"unknown method {name!r}; registered: {', '.join(METHODS)}")
  if name in ("best_of_n", "gepa"):
    return tiers.Schedule.best_of_n(options.best_of_n)
  if name == "best_of_n_curve":
    return tiers.Schedule.best_of_n(options.best_of_n_max)
  if name == "ace_playbook":
    return playbook_schedule(options.best_of_n)
  return options.schedule


@register("best_of_n")
def best_of_n(options: MethodOptions) -> Method:
  """Fixed self-consistency: `options.best_of_n` samples without cards, plurality vote."""
  return Method("best_of_n", schedule("best_of_n", options), template=options.template)


@register("best_of_n_curve")
def best_of_n_curve(options: MethodOptions) -> Method:
  """`options.best_of_n_max` samples without cards, once per problem: its own point is best-of-max,
  and `kace.evaluate.best_of_n_curve` votes over every subset of its samples for N = 1 … max."""
  return Method("best_of_n_curve", schedule("best_of_n_curve", options), template=options.template)


@register("tiered")
def tiered(options: MethodOptions) -> Method:
  """Tiered self-consistency (`options.schedule`) reading no cards."""
  return Method("tiered", options.schedule, template=options.template)


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


class MissingArtifact(ValueError, FileNotFoundError):
  """A learned method's artefact (tree, playbook, prompt) is not there: the launchers print the
  message as one line, before any generation call, and say which build makes it."""


def artifact_path(options: MethodOptions, artifact: str, filename: str = "tree.json") -> str:
  """Where `artifact` lives; `config.kace.tree` (`options.kace_tree`), when set, is the `kace` tree."""
  if artifact == "kace" and options.kace_tree:
    return options.kace_tree
  if not options.learn_dir:
    raise MissingArtifact(
      f"the {artifact!r} artefact needs config.learn.dir (a build directory; python -m launch.kace_build)"
      + (" or config.kace.tree" if artifact == "kace" else "")
    )
  path = os.path.join(options.learn_dir, artifact, filename)
  if not os.path.exists(path):
    raise MissingArtifact(f"{path} does not exist: build it with python -m launch.kace_build")
  return path


def check_artifacts(names: Sequence[str], options: MethodOptions) -> None:
  """Raises MissingArtifact for the first method of `names` whose learned artefact is not there:
  checked by the launchers before a run directory is written or a model loaded."""
  for name in names:
    if name in ARTIFACT:
      artifact = ARTIFACT[name]
      artifact_path(options, artifact, "prompt.json" if artifact == "gepa" else "tree.json")


def _learned_tree(options: MethodOptions, artifact: str) -> cards.EpistemicTree:
  path = artifact_path(options, artifact)
  tree = cards.EpistemicTree.load(path)
  if tree.domains != (cards.ANY,) and not set(tree.domains) <= set(options.domains):
    raise ValueError(f"tree {path} has domains {tree.domains} outside config.domains {options.domains}")
  return tree


def _tree_method(name: str) -> Builder:
  def builder(options: MethodOptions) -> Method:
    tree = _learned_tree(options, ARTIFACT[name])
    return Method(name, options.schedule, projection.TreeContext(tree), options.template)

  builder.__doc__ = (
    f"Tiered self-consistency reading block (tier, domain) + universal cards of the {name!r} tree."
  )
  return builder


for _name in TREE_ARTIFACTS:
  register(_name)(_tree_method(_name))


def role(config: generators.GeneratorConfig) -> generators.TextGenerator:
  """One generator per distinct role config, shared by the methods that use it (a second method
  asking for the solver's model does not load it twice)."""
  return _role(json.dumps(config.to_dict(), sort_keys=True))


@functools.cache
def _role(role_json: str) -> generators.TextGenerator:  # a config holds a dict: cached by its JSON
  return generators.make_generator(generators.GeneratorConfig.from_dict(json.loads(role_json)))


@register("llm_router")
def llm_router(options: MethodOptions) -> Method:
  """Tiered self-consistency; an LLM (`roles.router`) picks `router.k` cards from the whole kace store."""
  context = baselines.RouterContext(
    tree=_learned_tree(options, "kace"),
    router=role(options.router),
    k=options.router_k,
    params=options.role_params,
    retries=options.retries,
  )
  return Method("llm_router", options.schedule, context, options.template)


@register("embedding_retrieval")
def embedding_retrieval(options: MethodOptions) -> Method:
  """Tiered self-consistency reading the `retrieval.k` kace cards most similar to the problem (MiniLM)."""
  context = baselines.EmbeddingContext(
    _learned_tree(options, "kace"), embed.MiniLM(options.retrieval_model_dir), options.retrieval_k
  )
  return Method("embedding_retrieval", options.schedule, context, options.template)


def playbook_schedule(best_of_n: int) -> tiers.Schedule:
  """Best-of-N whose every sample reads the whole playbook (its one block)."""
  return dataclasses.replace(tiers.Schedule.best_of_n(best_of_n), pool_reads=cards.ANY)


@register("ace_playbook")
def ace_playbook(options: MethodOptions) -> Method:
  """ACE: best-of-N with the whole learned playbook in every prompt."""
  playbook = cards.EpistemicTree.load(artifact_path(options, "ace_playbook"))
  return Method(
    "ace_playbook", schedule("ace_playbook", options), projection.TreeContext(playbook), options.template
  )


def _gepa_template(options: MethodOptions) -> str:
  prompt = baselines.load_prompt(artifact_path(options, "gepa", "prompt.json"))
  return projection.check_template(prompt, ("question", "notes"))


@register("gepa")
def gepa(options: MethodOptions) -> Method:
  """Best-of-N with the solver instruction GEPA evolved."""
  return Method("gepa", schedule("gepa", options), template=_gepa_template(options))


@register("tiered_gepa")
def tiered_gepa(options: MethodOptions) -> Method:
  """Tiered self-consistency (no cards) with the solver instruction GEPA evolved."""
  return Method("tiered_gepa", options.schedule, template=_gepa_template(options))
