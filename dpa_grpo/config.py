"""The experiment's typed configuration, built once at the launcher from `configs/dpa_grpo.py`.

`ExperimentConfig.from_dict(config_dict.to_dict())` turns the ConfigDict into frozen, keyword-only
dataclasses, one per section; an unknown key fails there with its name, a bad value in the
section's `__post_init__`. Library functions take the sub-config they read (`DataConfig`,
`LossConfig`, ...), so a signature says what a function depends on.

Each comparison method's loss settings live under `baseline.<method>` (defaults: that method's
paper), so an override such as `--config.baseline.grpo.beta=0.1` reaches the GRPO run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from dpa_grpo import game, losses, rollout
from dpa_grpo.envs import taxcalc
from lm import sharding
from lm.model import REMAT_POLICIES
from lm.sampler import SamplerConfig

METHODS = ("dpa_grpo", "grpo", "dapo", "gspo", "zero_shot")
BASELINES = losses.BASELINES
TURNS = ("draft", "verify", "revise", "decide")
SCHEDULES = ("constant", "cosine")
KL_ESTIMATORS = ("k1", "k3", "exact")
WEIGHTINGS = ("pair", "policy")
DECISION_REWARDS = ("outcome", "shaped")
CASE_CLASSES = ("case", "case_id")
AGGREGATES = ("mean", "sum")
PAIR_ACTIONS = ("reply_prefix", "reference_stub")
UPDATE_SCHEDULES = ("step", "case")
BASELINE_MODES = ("library", "reference")
FAMILIES = ("forms", "copycheck")


def build(cls, values: Mapping[str, Any], where: str):
  """`cls(**values)`, refusing keys `cls` does not have by name (`where` says which section)."""
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - names)
  if unknown:
    raise ValueError(f"config.{where}: unknown key(s) {unknown}; known: {sorted(names)}")
  return cls(**values)


def _tuple(value) -> tuple:
  return tuple(_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """The backbone: an HF checkpoint directory, or (empty) an `lm.config.ModelConfig` preset
  initialised from the seed with `overrides` (vocab / eos / pad default to the tokenizer's). The
  tokenizer is `tokenizer`, else the checkpoint's, else one fitted to the task (`tokenizer_vocab`
  ids) in the run directory."""

  preset: str = "tiny_qwen3"
  checkpoint: str = ""
  tokenizer: str = ""
  tokenizer_vocab: int = 1024
  dtype: str = "float32"
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  # How sequences longer than the model's attention block attend (`lm.config.ModelConfig.attention_impl`):
  # "blockwise" (every backend), "xla" or "cudnn" (GPUs: 5.3x the 4B step on an H200,
  # docs/results/2026-12-04-device-check-h200.md). A checkpoint or a preset alike.
  attention_impl: str = "blockwise"

  def __post_init__(self):
    if not self.checkpoint and self.tokenizer_vocab <= 0:
      raise ValueError(f"model.tokenizer_vocab must be > 0, got {self.tokenizer_vocab}")
    if self.attention_impl not in ("blockwise", "xla", "cudnn"):
      raise ValueError(f"model.attention_impl must be blockwise, xla or cudnn, got {self.attention_impl!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticConfig:
  """Synthetic cases: `family` "forms" (TY24 forms, `dpa_grpo.envs.forms.generate_cases`, of
  `difficulty`) or "copycheck" (copy-and-check cases, `dpa_grpo.envs.copycheck`)."""

  n: int = 50
  seed: int = 0
  difficulty: int = 0
  family: str = "forms"

  def __post_init__(self):
    if self.n <= 0:
      raise ValueError(f"data.synthetic.n must be > 0, got {self.n}")
    if self.family not in FAMILIES:
      raise ValueError(f"data.synthetic.family must be one of {FAMILIES}, got {self.family!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
  """Cases: TaxCalcBench at `root` (…/tax_calc_bench/ty24/test_data), else synthetic forms; split
  by `split_seed`; `batch_cases` cases per training step (each one decision unit per line)."""

  root: str = ""
  synthetic: SyntheticConfig = dataclasses.field(default_factory=SyntheticConfig)
  test_fraction: float = 0.2
  split_seed: int = 42
  batch_cases: int = 4

  def __post_init__(self):
    if not 0.0 < self.test_fraction < 1.0:
      raise ValueError(f"data.test_fraction must be in (0, 1), got {self.test_fraction}")
    if self.batch_cases <= 0:
      raise ValueError(f"data.batch_cases must be > 0, got {self.batch_cases}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
  """The DPA-GRPO loss (`dpa_grpo.losses`): β, KL estimator (k1 = the reference code; k3; exact),
  weighting of the pair (pair = the paper's mean; policy = the on-policy expectation), the
  generator's component weights, the penalty on an unreadable reply, the vocabulary chunk.

  The reference code's mechanisms, each off by default (the CPU presets) and on in the paper
  presets (docs/dpa_grpo.md, fidelity table):
    decision_rewards: KEEP/REVISE rewards — "outcome" ([S_x, S_z]: ties when x and z are both
      right or both wrong) or "shaped" (x right → KEEP; x and z wrong → KEEP; z unparsable →
      KEEP; x wrong and z right → REVISE; `packing.decision_rewards` has the formula).
    cave_penalty, miss_penalty, outcome_bonus, revise_format_penalty: the shaped rewards'
      magnitudes (the reference's `scripts/train_tax.sh` and `train_grpo.py` values).
    balance_strength, balance_target: the shaped rule's REVISE bonus, strength · max(target −
      the update's REVISE share, 0) (`packing.balance_bonus`); strength 0: none.
    case_weights: inverse-frequency weights on the generator's decision pairs, over `case_weight_by`
      ("case": the 8 cases; "case_id": the reference's ids, 5a/5b and 6a/6b merged) to the power
      `case_weight_power` (`packing.case_weights`).
    skip_decision_on_invalid_revision: no decision pair on a unit whose kept revision is unparsable.
    aggregate: "mean" — each component's loss is the mean over its units in an update; "sum" —
      the sum (the reference's: its groups' losses summed over a case's transitions).
    verifier_weight: weight of the verifier's verdict pairs (the reference's 0.5,
      `--verifier-loss-scale`; with an adapter per role and AdamW a constant factor on one role's
      loss barely moves its update).
    revision_weight: weight of the revise turn's own group (the K revisions on the revise prompt,
      reward S_z); 0: the revise prompt gets no loss.
    revision_filter: unparsable revisions leave the revise group; a group with fewer than two
      left, or whose rewards all agree, is skipped (`packing.revision_items`).
    skip_verifier_on_invalid_draft: no verifier pair on units whose draft x is unparsable.
    pair_actions: the canonical strings both pairs score. "reply_prefix" (ours until testbed v3):
      `{"verdict": "correct"}` / `{"verdict": "wrong"}` and `{"decision": "KEEP"}` / ... — exact
      prefixes of the replies the roles sample, so the pair loss moves the sampled replies' own
      tokens. "reference_stub" (the reference code's `updates.py`): `{"target_line": L,
      "decision": "SAC"|"NO_SAC"}` and `{"target_line": L, "decision": "KEEP"|"REVISE"}`, a schema
      the verifier never samples (`game.pair_strings`).
  Memory (`launch.plan` picks them per target; docs/scale.md):
    remat: each decoder layer's rematerialisation in the backward pass, one of
      `lm.model.REMAT_POLICIES` ("none"; "dots_saveable": matmul outputs kept; "full": only the
      layer's input kept). With `train.pairs_per_chunk` / `groups_per_chunk` (the micro-batch
      the step accumulates gradients over) it sets a train step's activation memory.
  Speed:
    share_prompts: score each pair (both actions share their prompt) as one row [prompt, first,
      second], the second attending the prompt and not the first (`lm.scoring.pack_shared_pairs`):
      the same loss and gradient as the two rows, with the prompt's forward and backward pass done
      once — close to half the step's work when prompts are long and actions short. The rows'
      [T, T] attention mask is then a whole array at any length (`lm.model.branch_mask`), where
      two-row packing uses blockwise attention past `model.attention_block`; and chunks round
      `train.pairs_per_chunk` up to the mesh's batch axes (one row a pair).
  """

  beta: float = 0.04
  kl: str = "k1"
  weighting: str = "pair"
  decision_weight: float = 1.0
  proposal_weight: float = 1.0
  invalid_penalty: float = 0.1
  vocab_chunk: int = 8192
  decision_rewards: str = "outcome"
  cave_penalty: float = 0.2
  miss_penalty: float = 0.3
  outcome_bonus: float = 0.5
  revise_format_penalty: float = 0.25
  balance_strength: float = 1.5
  balance_target: float = 0.3
  case_weights: bool = False
  case_weight_by: str = "case"
  case_weight_power: float = 1.0
  skip_decision_on_invalid_revision: bool = False
  aggregate: str = "mean"
  verifier_weight: float = 1.0
  revision_weight: float = 0.0
  revision_filter: bool = False
  skip_verifier_on_invalid_draft: bool = False
  pair_actions: str = "reply_prefix"
  remat: str = "none"
  share_prompts: bool = False

  def __post_init__(self):
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"loss.remat must be one of {REMAT_POLICIES}, got {self.remat!r}")
    if self.beta < 0:
      raise ValueError(f"loss.beta must be >= 0, got {self.beta}")
    if self.kl not in KL_ESTIMATORS:
      raise ValueError(f"loss.kl must be one of {KL_ESTIMATORS}, got {self.kl!r}")
    if self.weighting not in WEIGHTINGS:
      raise ValueError(f"loss.weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
    if self.invalid_penalty < 0:
      raise ValueError(f"loss.invalid_penalty must be >= 0, got {self.invalid_penalty}")
    if self.decision_rewards not in DECISION_REWARDS:
      raise ValueError(
        f"loss.decision_rewards must be one of {DECISION_REWARDS}, got {self.decision_rewards!r}"
      )
    if self.aggregate not in AGGREGATES:
      raise ValueError(f"loss.aggregate must be one of {AGGREGATES}, got {self.aggregate!r}")
    if self.case_weight_by not in CASE_CLASSES:
      raise ValueError(f"loss.case_weight_by must be one of {CASE_CLASSES}, got {self.case_weight_by!r}")
    if self.balance_strength < 0 or not 0.0 <= self.balance_target <= 1.0:
      raise ValueError(
        f"loss.balance_strength must be >= 0 and loss.balance_target in [0, 1], got "
        f"{self.balance_strength}, {self.balance_target}"
      )
    if self.revision_weight < 0:
      raise ValueError(f"loss.revision_weight must be >= 0, got {self.revision_weight}")
    if self.pair_actions not in PAIR_ACTIONS:
      raise ValueError(f"loss.pair_actions must be one of {PAIR_ACTIONS}, got {self.pair_actions!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MethodLoss:
  """One generator-only method's loss settings: KL weight and clip range."""

  beta: float
  eps_low: float
  eps_high: float

  def __post_init__(self):
    if self.beta < 0 or self.eps_low < 0 or self.eps_high < 0:
      raise ValueError(f"baseline beta / eps must be >= 0, got {self}")


def _paper(method: str) -> MethodLoss:
  paper = losses.BaselineConfig.paper(method)
  return MethodLoss(beta=paper.beta, eps_low=paper.eps_low, eps_high=paper.eps_high)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BaselineConfig:
  """The generator-only methods: each method's own settings (defaults: its paper's, as
  `losses.BaselineConfig.paper` records them), and DAPO's overlong cache.

  `mode`: "library" — each method's own objective (clipping, k3 or no KL, its aggregation) on
  groups of `rollout.group_size`; "reference" — the DPA-GRPO reference code's generator-only
  baseline: the pair loss of DPA-GRPO (−A·ℓ + β(ℓ − ℓ_ref), ½ per draft, k1, length-normalised,
  β the method's own) on groups of 2 drafts, tied groups skipped (set `rollout.group_size=2` and
  `rollout.group_carry="best"` with it, as the paper presets do).

  The generator-only methods' budget, where it differs from the experiment's (0: the experiment's
  `train.steps`, `data.batch_cases`, `train.patience`; `ExperimentConfig.for_method` applies it):
  `steps`, `batch_cases` (cases per step) and `patience`. The reference code's baseline scripts
  (`scripts/training_filer_only*.sh`) run 20 steps of 5 cases with patience 3 where its DPA-GRPO
  runs 30 of 10 with patience 2; the paper presets set the former.

  Testbed v3's verifier under a generator-only method (off by default, so every preset and
  recorded result is unchanged; docs/dpa_grpo.md, "Testbed v3's GRPO arm with a trained verifier"):
    train_verifier: the verifier trains too (`ExperimentConfig.roles` is both roles), with the
      method's own group objective and settings (`baseline.<method>`), on groups of its own
      sampled verdicts: each training step also plays the game, the verifier sampling
      `verifier_group_size` replies per unit of which the first is played (so the game's play is
      the usual one in distribution), and evaluation plays the game. The generator trains as
      without it, on its groups of drafts. Library mode only.
    verifier_group_size: G, the verdicts sampled per unit, every one trained. 2 matches the DPA
      arms' budget: their verifier trains on 2 sequences per unit (the NS and SAC strings).
    verifier_invalid_reward: the reward of a reply that does not parse as a verdict (game's
      `valid`), whatever it plays; a right verdict earns 1, a wrong one 0. Default 0: an
      unparsable reply counts as a wrong verdict.
  """

  mode: str = "library"
  grpo: MethodLoss = dataclasses.field(default_factory=lambda: _paper("grpo"))
  dapo: MethodLoss = dataclasses.field(default_factory=lambda: _paper("dapo"))
  gspo: MethodLoss = dataclasses.field(default_factory=lambda: _paper("gspo"))
  overlong_cache: int = 512
  steps: int = 0
  batch_cases: int = 0
  patience: int = 0
  train_verifier: bool = False
  verifier_group_size: int = 2
  verifier_invalid_reward: float = 0.0

  def __post_init__(self):
    if self.verifier_group_size < 2:
      raise ValueError(f"baseline.verifier_group_size must be >= 2 (a group), got {self.verifier_group_size}")
    if not math.isfinite(self.verifier_invalid_reward):
      raise ValueError(f"baseline.verifier_invalid_reward must be finite, got {self.verifier_invalid_reward}")
    if self.train_verifier and self.mode != "library":
      raise ValueError(
        "baseline.train_verifier trains the verifier with the method's own group objective: it needs "
        f"baseline.mode='library', got {self.mode!r}"
      )
    if self.mode not in BASELINE_MODES:
      raise ValueError(f"baseline.mode must be one of {BASELINE_MODES}, got {self.mode!r}")
    for name in ("steps", "batch_cases", "patience"):
      if getattr(self, name) < 0:
        raise ValueError(f"baseline.{name} must be >= 0 (0: the experiment's), got {getattr(self, name)}")

  def method(self, name: str) -> MethodLoss:
    if name not in BASELINES:
      raise ValueError(f"baseline method must be one of {BASELINES}, got {name!r}")
    return getattr(self, name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoRAConfig:
  """Adapters (one per role) on a frozen backbone; `enabled=False` fine-tunes the backbone.

  `dropout`: rate of PEFT-style dropout on each adapter's input (the reference's 0.05), in the
  train step's loss computations only (`lm.lora.with_dropout`); sampling, evaluation and the
  reference run without it. It needs adapters: full fine-tuning refuses a nonzero rate."""

  enabled: bool = True
  rank: int = 16
  alpha: float = 32.0
  targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
  dtype: str = "float32"
  dropout: float = 0.0

  def __post_init__(self):
    if self.enabled and self.rank <= 0:
      raise ValueError(f"lora.rank must be > 0, got {self.rank}")
    if not 0.0 <= self.dropout < 1.0:
      raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
    if self.dropout and not self.enabled:
      raise ValueError(f"lora.dropout={self.dropout} acts on adapters: it needs lora.enabled=True")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
  """AdamW with global-norm clipping (max_grad_norm <= 0: none, as the reference code); warmup then
  a constant or cosine learning rate."""

  lr: float = 1e-5
  schedule: str = "constant"
  warmup_steps: int = 0
  end_lr: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  weight_decay: float = 0.0
  max_grad_norm: float = 1.0

  def __post_init__(self):
    if self.schedule not in SCHEDULES:
      raise ValueError(f"config.optim.schedule must be 'constant' or 'cosine', got {self.schedule!r}")
    if self.lr < 0 or self.warmup_steps < 0:
      raise ValueError(f"optim.lr and optim.warmup_steps must be >= 0, got {self.lr}, {self.warmup_steps}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """The loop: steps, evaluation / patience / checkpoint cadence, chunk sizes, export, progress.

  update_every: "step" — one optimiser update per training step over its `data.batch_cases` cases;
    "case" — the reference code's schedule: each of the step's cases is played with the current
    parameters and followed by its own AdamW update (batch_cases updates per step).
  eval_cases: evaluate and select the model on the first `eval_cases` test cases (0: all); with
    it, the all-cases figure is logged beside (`eval/all_cases`).
  min_steps: no early stop before this step (the reference: 10).
  select_initial: the evaluation before the first step competes for the best step and counts for
    patience (False: it is logged only — the reference evaluates first after `eval_every` steps).
  """

  steps: int = 30
  eval_every: int = 5
  patience: int = 2
  checkpoint_every: int = 5
  keep_checkpoints: int = 2
  pairs_per_chunk: int = 32  # items per gradient-accumulation chunk (rounded to the mesh's batch axes)
  groups_per_chunk: int = 4
  export_hf: bool = False
  progress: bool = True
  update_every: str = "step"
  eval_cases: int = 0
  min_steps: int = 0
  select_initial: bool = True

  def __post_init__(self):
    if self.update_every not in UPDATE_SCHEDULES:
      raise ValueError(f"train.update_every must be one of {UPDATE_SCHEDULES}, got {self.update_every!r}")
    if self.eval_cases < 0 or self.min_steps < 0:
      raise ValueError(f"train.eval_cases and train.min_steps must be >= 0, got {self}")
    for name in ("eval_every", "checkpoint_every", "pairs_per_chunk", "groups_per_chunk"):
      if getattr(self, name) <= 0:
        raise ValueError(f"train.{name} must be > 0, got {getattr(self, name)}")
    if self.steps < 0:
      raise ValueError(f"train.steps must be >= 0, got {self.steps}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmStartConfig:
  """The supervised warm start (`dpa_grpo.warm_start`); steps=0: none.

  Attributes:
    steps, batch_size, learning_rate, warmup_steps: `lm.sft.SFTConfig` knobs.
    wrong_fraction: share of verifier examples whose proposal is corrupted.
    turns: which turns get examples (see `dpa_grpo.warm_start`).
    seed: example sampling, corruption and batch order.
    draft_wrong: share of draft targets replaced by a plausible wrong amount (times the case's
      `copycheck.habit` on copy-and-check cases), so the warm-started generator drafts wrong
      sometimes; 0: every draft target is the gold answer.
    verify_flip: share of verifier targets whose verdict is flipped (an imperfect reviewer).
    revise_wrong: share of revision targets replaced by a plausible wrong amount.
    verify_pairs: every unit gives the verifier both a right and a wrong proposal (a contrastive
      pair on one prompt) instead of one of them (`wrong_fraction`); off: the stream as before.
    decide_style: the KEEP / REVISE examples. "oracle" (testbed v1): x and z each right half the
      time, a wrong z a corrupted amount off the answer pool, the oracle's label. "habit" (testbed
      v2, `dpa_grpo.envs.copycheck`): a wrong z from the line's answer pool, and a REVISE label
      turned KEEP with probability `decide_keep` times the desk's `copycheck.habit`.
    decide_keep: see `decide_style` ("habit" only).
    cache_dir: where the copy-and-check testbed keeps its warm starts, one directory per
      `testbed.warm_start_key` (not part of the key), so run directories on one machine share them;
      "": inside the run directory (`<workdir>/warm_start/`).
    from_dir: a committed warm start used instead of training one (a path relative to the
      repository root, or absolute): the directory this config's warm start wrote, whose
      warm_start.json records its `testbed.warm_start_key` (`testbed.export_warm_start`); a key
      that differs stops the run. Why: 2,000 SFT steps end in different weights on CPUs of
      another kind (AVX2 against AVX-512), and the step-0 gates read those weights, so a testbed
      whose every machine must play the same registered start ships it (testbed v3). "": train.
    waive_gates: step-0 gates (`testbed_arms.GATE_NAMES`) the committed start is registered to
      fail and to play all the same, each by name under a dated amendment (docs/dpa_grpo.md);
      the testbed waives them as `--waive_gates` does (printed with the gates and in the report,
      part of the work directory's stamp). Testbed v3: ("fix",).
  """

  steps: int = 300
  batch_size: int = 16
  learning_rate: float = 3e-3
  warmup_steps: int = 20
  wrong_fraction: float = 0.5
  turns: tuple[str, ...] = TURNS
  seed: int = 0
  draft_wrong: float = 0.0
  verify_flip: float = 0.0
  revise_wrong: float = 0.0
  verify_pairs: bool = False
  decide_style: str = "oracle"
  decide_keep: float = 0.0
  cache_dir: str = ""
  from_dir: str = ""
  waive_gates: tuple[str, ...] = ()

  def __post_init__(self):
    if self.decide_style not in ("oracle", "habit"):
      raise ValueError(f"warm_start.decide_style must be 'oracle' or 'habit', got {self.decide_style!r}")
    for name in ("draft_wrong", "verify_flip", "revise_wrong", "decide_keep"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"warm_start.{name} must be in [0, 1], got {getattr(self, name)}")
    unknown = set(self.turns) - set(TURNS)
    if unknown:
      raise ValueError(f"warm-start turns must be among {TURNS}, got {sorted(unknown)}")


# `BaselineConfig`'s testbed-v3 keys and their defaults: `ExperimentConfig.to_dict` leaves them out
# at these values.
V3_BASELINE_DEFAULTS = {"train_verifier": False, "verifier_group_size": 2, "verifier_invalid_reward": 0.0}


def rollout_config(values: Mapping[str, Any]) -> rollout.RolloutConfig:
  """`rollout.RolloutConfig` of the config's section; lines=() means all 19 in form order."""
  values = dict(values)
  values["lines"] = tuple(values.get("lines") or ()) or taxcalc.LINE_IDS
  return build(rollout.RolloutConfig, values, "rollout")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
  """One experiment: `method` from `model` on `data`, and the `compare` methods beside it."""

  seed: int = 0
  method: str = "dpa_grpo"
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  rollout: rollout.RolloutConfig = dataclasses.field(default_factory=rollout.RolloutConfig)
  loss: LossConfig = dataclasses.field(default_factory=LossConfig)
  baseline: BaselineConfig = dataclasses.field(default_factory=BaselineConfig)
  lora: LoRAConfig = dataclasses.field(default_factory=LoRAConfig)
  optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
  train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
  mesh: sharding.MeshConfig = dataclasses.field(default_factory=sharding.MeshConfig)
  # The in-process sampler of every role (`lm.sampler.SamplerConfig`): `max_rows` decode rows a
  # device call (the trainer's memory knob beside `loss.remat` and `train.pairs_per_chunk`; the
  # plan compiles the sampler at it, docs/scale.md); long rollout prompts of similar lengths
  # padded to multiples of `prompt_bucket_multiple` rather than powers of two (prefill attention
  # is quadratic in the padded length).
  sampler: SamplerConfig = dataclasses.field(default_factory=lambda: SamplerConfig(prompt_bucket_multiple=64))
  warm_start: WarmStartConfig = dataclasses.field(default_factory=WarmStartConfig)
  compare: tuple[str, ...] = ()

  def __post_init__(self):
    for method in (self.method, *self.compare):
      if method not in METHODS:
        raise ValueError(f"config.method / compare must be among {METHODS}, got {method!r}")

  @property
  def plays_game(self) -> bool:
    """Whether training and evaluation play the generator-verifier game: DPA-GRPO, and a
    generator-only method with `baseline.train_verifier` (testbed v3); the others draft only."""
    return self.method == "dpa_grpo" or (self.method in BASELINES and self.baseline.train_verifier)

  @property
  def roles(self) -> tuple[str, ...]:
    """The trained roles: both for DPA-GRPO and for a generator-only method with
    `baseline.train_verifier` (in `game.ROLES` order, which seeds their adapters), the generator
    alone for the others."""
    return game.ROLES if self.plays_game else ("generator",)

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> ExperimentConfig:
    """The typed config of a ConfigDict's `to_dict()`; unknown keys fail with their name."""
    v = dict(values)
    sections = {
      "model": lambda d: build(ModelConfig, {**d, "overrides": dict(d.get("overrides", {}))}, "model"),
      "data": lambda d: build(
        DataConfig,
        {**d, "synthetic": build(SyntheticConfig, d.get("synthetic", {}), "data.synthetic")},
        "data",
      ),
      "rollout": rollout_config,
      "loss": lambda d: build(LossConfig, d, "loss"),
      "baseline": lambda d: build(
        BaselineConfig,
        {k: build(MethodLoss, x, f"baseline.{k}") if k in BASELINES else x for k, x in d.items()},
        "baseline",
      ),
      "lora": lambda d: build(
        LoRAConfig, {**d, "targets": _tuple(d.get("targets", LoRAConfig.targets))}, "lora"
      ),
      "optim": lambda d: build(OptimConfig, d, "optim"),
      "train": lambda d: build(TrainConfig, d, "train"),
      "mesh": lambda d: build(sharding.MeshConfig, d, "mesh"),
      "sampler": lambda d: build(SamplerConfig, d, "sampler"),
      "warm_start": lambda d: build(
        WarmStartConfig, {**d, **({"turns": _tuple(d["turns"])} if "turns" in d else {})}, "warm_start"
      ),
    }
    for name, make in sections.items():
      if name in v:
        v[name] = make(dict(v[name]))
    if "compare" in v:
      v["compare"] = tuple(v["compare"])
    return build(cls, v, "")

  def to_dict(self) -> dict[str, Any]:
    """The resolved config as plain JSON-able values (what `config.json` holds). The keys added
    for testbed v3 (`V3_BASELINE_DEFAULTS`, `warm_start.from_dir` / `waive_gates`) and
    `model.attention_impl` are left out at their defaults, so the run and work directories (and
    the warm-start keys) written before them keep their config (a rerun there is not a config
    change); `from_dict` reads them back as the defaults."""
    values = dataclasses.asdict(self)
    if values["model"]["attention_impl"] == "blockwise":
      del values["model"]["attention_impl"]
    for key, default in V3_BASELINE_DEFAULTS.items():
      if values["baseline"][key] == default:
        del values["baseline"][key]
    for key in ("from_dir", "waive_gates"):
      if not values["warm_start"][key]:
        del values["warm_start"][key]
    return values

  def for_method(self, method: str, checkpoint: str = "") -> ExperimentConfig:
    """This experiment's settings for `method` (from `checkpoint`, if given); zero_shot trains 0
    steps; a generator-only method gets the baseline budget (`baseline.steps`, `batch_cases`,
    `patience`, where set). Every other setting — a comparison method's `baseline.<method>`
    included — is kept."""
    model = dataclasses.replace(self.model, checkpoint=checkpoint) if checkpoint else self.model
    train, data = self.train, self.data
    if method in BASELINES:
      b = self.baseline
      train = dataclasses.replace(train, steps=b.steps or train.steps, patience=b.patience or train.patience)
      data = dataclasses.replace(data, batch_cases=b.batch_cases or data.batch_cases)
    if method == "zero_shot":
      train = dataclasses.replace(train, steps=0)
    return dataclasses.replace(self, method=method, model=model, train=train, data=data)
