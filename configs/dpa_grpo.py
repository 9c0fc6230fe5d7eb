"""DPA-GRPO and its baselines on tax forms (docs/dpa_grpo.md).

Presets (`--config=configs/dpa_grpo.py:<preset>`):
  cpu (default)   tiny Qwen3-style model on synthetic TY24 forms, LoRA, CPU-sized everything
  testbed         the same model on copy-and-check cases (launch/dpa_testbed.py: arms x seeds)
  testbed_v2      testbed v2: the KEEP / REVISE decision has a signal; the paper's revision mechanism
                  against a proposal-only ablation, 60 steps (docs/dpa_grpo.md, "Testbed v2")
  testbed_v3      testbed v3: v2 with the collapse's fix (the reference's pair stubs, no penalty),
                  a committed warm start, and GRPO arms beside (docs/dpa_grpo.md, "Testbed v3")
  tiny            the smallest end-to-end run (tests): 2 lines, few tokens, 2 steps
  qwen3_4b, qwen3_8b            DPA-GRPO with the paper's hyper-parameters on TaxCalcBench TY24
  qwen3_4b_<m>, qwen3_8b_<m>    the same model and data for m in grpo, dapo, gspo, zero_shot
A preset may add a method to a CPU run too: cpu_grpo, tiny_dapo, ... A preset is `<size>` or
`<size>_<method>`, size in cpu, tiny, qwen3_4b, qwen3_8b; an unknown one fails naming the valid ones.
`<preset>@<target>` adds the plan's overrides for a machine (`TARGETS` below, docs/scale.md):
qwen3_4b@h100x1, qwen3_4b_grpo@v5p-8, ...
Set local paths with --config.model.checkpoint=/path/to/Qwen3-4B and --config.data.root=...
"""

import ml_collections

from configs import plan_targets

_METHODS = ("dpa_grpo", "grpo", "dapo", "gspo", "zero_shot")
_SIZES = ("cpu", "tiny", "qwen3_4b", "qwen3_8b", "testbed", "testbed_v2", "testbed_v3")
# Each size with one line (launchers' --help lists them); PRESET_NAMES adds the `<size>_<method>` ones.
PRESETS = {
  "cpu": "(default) tiny Qwen3-style model on synthetic TY24 forms, LoRA; about 10 min on 2 cores",
  "tiny": "the smallest end-to-end run (tests): 2 lines, few tokens, 2 steps; under a minute",
  "testbed": "the copy-and-check testbed (launch/dpa_testbed.py: arms x seeds)",
  "testbed_v2": "testbed v2: revision mechanism against a proposal-only ablation, 60 steps",
  "testbed_v3": "testbed v3: v2 with the format kept (the reference's pair stubs), DPA against GRPO arms",
  "qwen3_4b": "the paper's hyper-parameters on TaxCalcBench TY24; needs --config.model.checkpoint",
  "qwen3_8b": "the same with Qwen3-8B; needs --config.model.checkpoint",
  "<size>_<method>": "any size above with method grpo, dapo, gspo or zero_shot (e.g. tiny_grpo)",
}
PRESET_NAMES = (*_SIZES, *(f"{s}_{m}" for s in _SIZES for m in _METHODS))


def parse_preset(preset: str) -> tuple[str, str]:
  """(size, method) of a preset `<size>` or `<size>_<method>`: "qwen3_4b_grpo" -> ("qwen3_4b", "grpo")."""
  for size in sorted(_SIZES, key=len, reverse=True):
    if preset == size:
      return size, "dpa_grpo"
    if preset.startswith(size + "_") and preset[len(size) + 1 :] in _METHODS:
      return size, preset[len(size) + 1 :]
  raise ValueError(
    f"configs/dpa_grpo.py: unknown preset {preset!r}; presets: {', '.join(_SIZES)}, each also as "
    f"<size>_<method> for a method in {', '.join(_METHODS[1:])}"
  )


def get_config(preset: str = "cpu") -> ml_collections.ConfigDict:
  preset, _, target = preset.partition("@")
  size, method = parse_preset(preset)
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.method = method
  # Backbone: an HF checkpoint directory, or (empty) a preset of lm.config.ModelConfig initialised
  # from the seed with `overrides` (vocab / eos / pad default to the tokenizer's). The tokenizer is
  # `tokenizer`, else the checkpoint's, else one fitted to the task (`tokenizer_vocab` ids) in the
  # run directory.
  c.model = ml_collections.ConfigDict(
    dict(
      preset="tiny_qwen3",
      checkpoint="",
      tokenizer="",
      tokenizer_vocab=1024,
      dtype="float32",
      overrides={},
      attention_impl="blockwise",  # or "cudnn" on GPUs (flash attention; "xla" anywhere)
    )
  )
  # Cases: TaxCalcBench at `root` (…/tax_calc_bench/ty24/test_data), else synthetic forms.
  c.data = ml_collections.ConfigDict(
    dict(
      root="",
      synthetic=dict(n=50, seed=0, difficulty=0),
      test_fraction=0.2,
      split_seed=42,
      batch_cases=4,  # cases per training step (each gives one decision unit per line)
    )
  )
  # Fields of dpa_grpo.rollout.RolloutConfig; lines=() means all 19 in form order. Every section
  # becomes a typed dataclass of dpa_grpo.config at the launcher.
  c.rollout = ml_collections.ConfigDict(
    dict(
      lines=(),
      answer_format="line",
      temperature=0.2,
      top_p=0.9,
      top_k=0,
      revisions=5,
      revision_temperature=0.7,
      keep_rule="majority",
      explore=0.4,
      max_new_tokens=2048,
      verdict_tokens=512,
      decision_tokens=16,
      tolerance=0.0,
      compact_forms=False,
      enable_thinking=False,
      invalid_verdict_action="SAC",
      invalid_decision_action="KEEP",
      group_size=8,
      missing_as_zero=False,  # the reference evaluator reads a missing amount as 0.0
      context="submitted",  # later lines show the submitted amount, or (reference) the draft x
      group_carry="first",  # generator-only: the draft carried to later lines (reference: best)
      unparsed_revision="missing",  # or "keep_draft": S_z = 0 and a REVISE on it submits x
      decision_note=False,  # copy-and-check: KEEP / REVISE prompt says which amount matches the field
      engine="jax",  # or "openai": roles sampled from a serving engine as LoRA adapters (docs/dpa_grpo.md)
      engine_url="",  # the engine's OpenAI base URL, e.g. http://127.0.0.1:8000/v1
      engine_adapter_dir="",  # where adapters are written for the engine ("": <workdir>/engine_adapters)
      truncated="unanswered",  # a reply cut by max_new_tokens: only complete lines answer (or "extract")
    )
  )
  # DPA-GRPO loss (dpa_grpo.losses): β, KL estimator (k1 = the reference code; k3; exact), weighting
  # of the pair (pair = the paper's mean; policy = on-policy expectation), component weights.
  c.loss = ml_collections.ConfigDict(
    dict(
      beta=0.04,
      kl="k1",
      weighting="pair",
      decision_weight=1.0,
      proposal_weight=1.0,
      invalid_penalty=0.1,
      vocab_chunk=8192,
      remat="none",  # per-layer rematerialisation: none, dots_saveable, full (lm.model.REMAT_POLICIES)
      # The reference code's mechanisms (dpa_grpo.config.LossConfig; on in the paper presets).
      decision_rewards="outcome",
      cave_penalty=0.2,
      miss_penalty=0.3,
      outcome_bonus=0.5,
      case_weights=False,
      revision_weight=0.0,
      skip_verifier_on_invalid_draft=False,
      balance_strength=1.5,  # shaped rewards only: REVISE bonus strength · max(target − share, 0)
      balance_target=0.3,
      case_weight_by="case",  # or "case_id": the reference's integer ids (5a/5b, 6a/6b merged)
      case_weight_power=1.0,
      skip_decision_on_invalid_revision=False,
      aggregate="mean",  # or "sum": each group's loss ÷ its size summed over the units (reference)
      verifier_weight=1.0,
      revision_filter=False,  # True: only parsed revisions, and only groups with contrast, train
    )
  )
  # Generator-only methods, each with its own settings (defaults: its paper's — GRPO, Shao et al.
  # 2024: β 0.04, ε 0.2; DAPO, Yu et al. 2025: no KL, clip-higher ε 0.2 / 0.28; GSPO, Zheng et al.
  # 2025: no KL, sequence-level ε 3e-4 / 4e-4) and DAPO's overlong cache. An override such as
  # --config.baseline.grpo.beta=0.1 applies to that method wherever it runs (main or compared).
  c.baseline = ml_collections.ConfigDict(
    dict(
      mode="library",  # or "reference": the reference code's pair-loss baseline (BaselineConfig)
      grpo=dict(beta=0.04, eps_low=0.2, eps_high=0.2),
      dapo=dict(beta=0.0, eps_low=0.2, eps_high=0.28),
      gspo=dict(beta=0.0, eps_low=3e-4, eps_high=4e-4),
      overlong_cache=512,
      steps=0,  # the generator-only methods' budget where it differs (0: train.steps; reference: 20)
      batch_cases=0,  # cases per step (0: data.batch_cases; reference: 5)
      patience=0,  # (0: train.patience; reference: 3)
      # Testbed v3: the verifier trains too, GRPO on groups of its own sampled verdicts (off: the
      # generator alone); G verdicts per unit (2: the DPA arms' 2 sequences per unit); the reward
      # of an unparsable verdict (0: as a wrong one). config.BaselineConfig has the details.
      train_verifier=False,
      verifier_group_size=2,
      verifier_invalid_reward=0.0,
    )
  )
  c.lora = ml_collections.ConfigDict(
    dict(
      enabled=True,
      rank=16,
      alpha=32.0,
      targets=("q", "k", "v", "o", "gate", "up", "down"),
      dtype="float32",
      dropout=0.0,
    )
  )
  c.optim = ml_collections.ConfigDict(
    dict(
      lr=1e-5,
      schedule="constant",
      warmup_steps=0,
      end_lr=0.0,
      b1=0.9,
      b2=0.999,
      eps=1e-8,
      weight_decay=0.0,
      max_grad_norm=1.0,
    )
  )
  c.train = ml_collections.ConfigDict(
    dict(
      steps=30,
      eval_every=5,
      patience=2,
      checkpoint_every=5,
      keep_checkpoints=2,
      pairs_per_chunk=32,  # items per gradient-accumulation chunk (rounded to the mesh's batch axes)
      groups_per_chunk=4,
      export_hf=False,
      progress=True,
      update_every="step",  # or "case": one AdamW update per case (the reference)
      eval_cases=0,  # evaluate / select on the first n test cases (0: all; the reference: 8)
      min_steps=0,  # no early stop before this step (the reference: 10)
      select_initial=True,  # the step-0 evaluation may be chosen as best (reference: False)
    )
  )
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tp=1))
  # Every role's in-process sampler (lm.sampler.SamplerConfig): at most max_rows decode rows a device
  # call (larger requests are chunked; launch.plan compiles the sampler at it), rollout prompts
  # padded to multiples of 64 tokens, new tokens to multiples of step_bucket.
  c.sampler = ml_collections.ConfigDict(dict(max_rows=256, prompt_bucket_multiple=64, step_bucket=64))
  # dpa_grpo.reproduce: a supervised warm start of a from-scratch backbone (steps=0: none; fields
  # of dpa_grpo.config.WarmStartConfig) and the methods run beside `method` for comparison.
  c.warm_start = ml_collections.ConfigDict(
    dict(
      steps=0,
      batch_size=16,
      learning_rate=3e-3,
      warmup_steps=20,
      wrong_fraction=0.5,
      seed=0,
      cache_dir="",
      from_dir="",
    )
  )
  c.compare = ()

  if size == "cpu":
    # The CPU-scale reproduction (docs/taxcalc.md): ~10 minutes on 2 cores. A from-scratch model
    # warm-started on the training cases, then DPA-GRPO and generator-only GRPO from it. Lines: two
    # the warm-started model gets right from priors (12, 27), two it can get right or wrong (34, 37:
    # one is 0), three it cannot yet compute (1a, 16, 25d); difficulty-0 forms (single filers).
    c.model.overrides = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1)
    c.data.synthetic = dict(n=60, seed=0, difficulty=0)
    c.rollout.update(
      lines=("1a", "12", "16", "25d", "27", "34", "37"),
      compact_forms=True,
      max_new_tokens=24,
      verdict_tokens=40,
      decision_tokens=10,
      revisions=3,
      group_size=4,
    )
    c.warm_start.update(steps=300, batch_size=8, learning_rate=1e-2)
    c.compare = ("grpo",)
    c.optim.lr = 1e-3
    c.lora.update(rank=8, alpha=16.0)
    c.train.update(steps=20, eval_every=5, patience=100, checkpoint_every=5, pairs_per_chunk=16)
  elif size == "tiny":
    c.model.tokenizer_vocab = 512
    c.data.synthetic = dict(n=6, seed=0, difficulty=0)
    c.data.batch_cases = 2
    c.rollout.update(
      lines=("1a", "9"),
      compact_forms=True,
      max_new_tokens=8,
      verdict_tokens=8,
      decision_tokens=4,
      revisions=2,
      group_size=2,
      temperature=1.0,
    )
    c.loss.vocab_chunk = 512
    c.baseline.overlong_cache = 4
    c.optim.lr = 1e-2
    c.lora.update(rank=2, alpha=4.0)
    c.train.update(
      steps=2, eval_every=2, patience=2, checkpoint_every=1, pairs_per_chunk=8, groups_per_chunk=4
    )
    c.train.progress = False
  elif size in ("qwen3_4b", "qwen3_8b"):
    c.model.preset = size
    c.model.dtype = "bfloat16"
    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tp=1))
    # Per-layer remat: without it the 4B `accumulate` step needs 154 GiB of temporaries per H100
    # (8 devices); with it the plan fits H100 x8 and v5p-8 with 25% headroom (docs/scale.md).
    c.loss.remat = "full"
    _reference_training(c)
  if size in ("testbed", "testbed_v2", "testbed_v3"):
    _testbed(c)
  if size in ("testbed_v2", "testbed_v3"):
    _testbed_v2(c)
  if size == "testbed_v3":
    _testbed_v3(c)
  if method == "zero_shot":
    c.train.steps = 0
  if target:
    c.update_from_flattened_dict(target_overrides(size, target))
  return c


# The plan's overrides per preset size and target (`<preset>@<target>`): micro-batch, remat, mesh and
# sampler rows a call, as `launch.plan --render` writes them from the plan's newest record of each
# target (configs/plan_targets.py; docs/scale.md shows the figures), read against `lm.plan.budget`:
# 90% of the memory JAX may use, on a GPU the allocator's pool the launchers set (0.90 of the card,
# lm/memory.py). A target whose plan does not fit, or that was not planned, is in `UNPLANNED` with the
# plan's reason; `launch.plan --target=<name>` plans it. tests/configs/targets_test.py checks the
# table against the records.
# GPU targets train with cuDNN's fused attention: on an H200 its gradient lay as near a float32
# reference as the blockwise attention's (6.07% against 6.28%), and the 4B step ran 5.4x faster
# (53.3 s -> 9.6 s at 32 rows; docs/results/2026-12-04-attention-choice.md). The plan compiles the
# blockwise attention in its place (`dpa_grpo.plan.shaped_step`).
GPU_ATTENTION = {"model.attention_impl": "cudnn"}
_PLANNED = {size: plan_targets.planned(f"configs/dpa_grpo.py:{size}") for size in ("qwen3_4b", "qwen3_8b")}
TARGETS = {
  size: {
    target: {**e["overrides"], **(GPU_ATTENTION if e["platform"] == "cuda" else {})}
    for target, e in entries.items()
    if "overrides" in e
  }
  for size, entries in _PLANNED.items()
}
UNPLANNED = {
  (size, target): e["why"]
  for size, entries in _PLANNED.items()
  for target, e in entries.items()
  if "overrides" not in e
}


def target_overrides(size: str, target: str) -> dict:
  """The dotted overrides of preset `size` on `target`; ValueError naming the known targets."""
  known = TARGETS.get(size, {})
  if target not in known:
    raise ValueError(f"configs/dpa_grpo.py: unknown target {target!r} for {size}; known: {sorted(known)}")
  return dict(known[target])


def _reference_training(c: ml_collections.ConfigDict) -> None:
  """The paper's training as its reference code runs it (docs/dpa_grpo.md, fidelity table)."""
  c.data.batch_cases = 10  # cases per step, each followed by its own AdamW update
  c.train.update(update_every="case", eval_cases=8, min_steps=10, select_initial=False)
  c.rollout.update(
    verdict_tokens=2048,
    decision_tokens=256,
    keep_rule="first",  # the revision shown to the decision: the first of the K samples
    missing_as_zero=True,
    context="draft",
    group_size=2,
    group_carry="best",
    unparsed_revision="keep_draft",  # S_z = 0, and a REVISE on it submits x (dual_rollout.py)
  )
  c.loss.update(
    decision_rewards="shaped",  # cave 0.2, miss 0.3, outcome bonus 0.5, format penalty 0.25
    balance_strength=1.5,  # REVISE bonus 1.5 · max(0.3 − the update's REVISE share, 0)
    balance_target=0.3,
    case_weights=True,
    case_weight_by="case_id",  # the reference's ids 2, 3, 5, 6 (5a/5b, 6a/6b merged), power 1
    case_weight_power=1.0,
    skip_decision_on_invalid_revision=True,
    aggregate="sum",  # each group's loss (÷ its size) summed over the case's units
    verifier_weight=0.5,  # --verifier-loss-scale
    revision_weight=1.0,
    revision_filter=True,  # only parsed revisions, and only a group with contrast, is trained
    skip_verifier_on_invalid_draft=True,
    proposal_weight=0.0,
    invalid_penalty=0.0,
    pair_actions="reference_stub",  # {"target_line": L, "decision": ...}, never a sampled reply's prefix
  )
  c.baseline.mode = "reference"
  # The reference's baseline scripts (scripts/training_filer_only*.sh): 20 steps of 5 cases,
  # patience 3 (its DPA-GRPO: 30 of 10, patience 2). Applied by ExperimentConfig.for_method.
  c.baseline.update(steps=20, batch_cases=5, patience=3)
  c.optim.update(weight_decay=0.01, max_grad_norm=0.0)
  c.lora.update(rank=8, alpha=32.0, dropout=0.05)  # PEFT's lora_dropout, in training losses only


def get_sweep(h):
  """β × KL estimator for DPA-GRPO (launch/sweep.py)."""
  return h.product(
    [h.sweep("config.loss.kl", ["k1", "k3", "exact"]), h.sweep("config.loss.beta", [0.01, 0.04, 0.16])]
  )


def _testbed(c: ml_collections.ConfigDict) -> None:
  """The copy-and-check testbed (dpa_grpo.envs.copycheck, launch/dpa_testbed.py): every role can
  learn its job, and the warm start leaves each of them room to move (docs/dpa_grpo.md, testbed).

  324 cases: 270 train, 54 test (x 3 lines = 162 held-out units); a separate validation draw plays
  the step-0 gates. Sampling at temperature 1.0, so the sampled drafts carry the warm start's own
  error rate (at the paper's 0.2 a group of drafts almost always ties).
  """
  c.model.tokenizer_vocab = 512
  c.model.overrides = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1)
  c.data.synthetic = dict(n=324, seed=0, difficulty=0, family="copycheck")
  c.data.test_fraction = 1 / 6
  c.data.batch_cases = 8
  c.rollout.update(
    lines=("1a", "25d", "12"),
    compact_forms=True,
    temperature=0.7,
    top_p=1.0,
    max_new_tokens=16,
    verdict_tokens=96,  # 48 cut the SAC short (measured: 70 of 180 step-0 SACs lacked their fields)
    decision_tokens=10,
    revisions=3,
    group_size=4,
  )
  c.warm_start.update(
    steps=2000,  # 600 taught the lookup only partly; 1500 left the verifier weak (SAC gap 0.06)
    batch_size=16,
    learning_rate=1e-2,
    draft_wrong=0.45,  # x copycheck.habit: north desk 0.72, south 0.18 of draft targets wrong
    verify_flip=0.25,
    verify_pairs=True,  # one answer per prompt left the verifier blind (SAC gap -0.09, measured)
    revise_wrong=0.45,  # 0.4 gave P(z right | x wrong) 0.65, 0.5 gave 0.20: outside its gate
    cache_dir="~/.cache/dpa_grpo",  # shared by run directories (launch/main.py, launch/dpa_testbed.py)
  )
  c.optim.lr = 1e-3
  c.lora.update(rank=8, alpha=16.0)
  c.loss.vocab_chunk = 512
  c.train.update(steps=15, eval_every=5, patience=100, checkpoint_every=5, pairs_per_chunk=32)


def _testbed_v2(c: ml_collections.ConfigDict) -> None:
  """Testbed v2 (docs/dpa_grpo.md, "Testbed v2"): v1's cases and warm start, but the
  KEEP / REVISE decision has something it can learn. Its prompt says which amount matches the field
  (`copycheck.decision_note`); its warm-start examples show wrong revisions from the line's answer
  pool (v1: corrupted amounts off it, so the decision learned "KEEP" on every play) and turn a
  REVISE label into KEEP with probability 0.5 x the desk's habit (north 0.8, south 0.2), so the
  greedy decision revises at one desk and keeps at the other: room to learn, not constant.
  60 steps (the issue's 60-100) for the arms of `testbed_arms.V2_ARMS`, nine seeds."""
  c.rollout.decision_note = True
  c.warm_start.update(decide_style="habit", decide_keep=0.5)
  c.train.update(steps=60, eval_every=15, checkpoint_every=15)


# Testbed v3's committed warm start (repository-relative; `testbed.export_warm_start` wrote it).
V3_WARM_START = "dpa_grpo/warm_starts/testbed_v3"
V3_WARM_START_SEED = 2


def _testbed_v3(c: ml_collections.ConfigDict) -> None:
  """Testbed v3 (docs/dpa_grpo.md, "Testbed v3"): v2's cases, prompts and warm-start recipe, with
  the fix the collapse ablations named — the verifier's pair is the reference's stubs, never a
  prefix of the reply it samples, and no penalty on unparsable replies (a5: format kept in nine of
  nine seeds) — and a committed warm start, so that every machine kind plays from the same weights.
  None of warm-start seeds 0-9 passed every step-0 gate on the AVX2 machine that trained them;
  seed 2 failed one, P(z right | x wrong) 0.643 against the bound 0.6, and is committed with that
  gate waived by name (the amendment of 2026-12-04 in the docs). Arms `testbed_arms.V3_ARMS`,
  nine seeds, each run counted only if it keeps the format (`testbed_arms.GATE_V3_FORMAT`)."""
  c.loss.update(pair_actions="reference_stub", invalid_penalty=0.0)
  c.warm_start.update(seed=V3_WARM_START_SEED, from_dir=V3_WARM_START, waive_gates=("fix",))


_HF_IDS = {"qwen3_4b": "Qwen/Qwen3-4B", "qwen3_8b": "Qwen/Qwen3-8B"}


def required_weights(preset: str, config: ml_collections.ConfigDict) -> dict[str, str]:
  """{config field: Hugging Face model id} of the real weights a paper preset runs on; the
  launchers refuse such a preset while the field is empty (launch/common.py). Read from the
  config's `model.preset`, so a paper preset run on a tiny model (the README's CPU smoke command,
  `--config.model.preset=tiny_qwen3`) needs none."""
  del preset
  return {"model.checkpoint": _HF_IDS[config.model.preset]} if config.model.preset in _HF_IDS else {}


def random_init(preset: str, config: ml_collections.ConfigDict) -> bool:
  """Whether the run starts from a small randomly initialised model (said in the first line): no
  checkpoint, no committed warm start (`warm_start.from_dir`), and a model that is not a paper size
  (the tiny presets, or a paper preset's CPU smoke run on `model.preset=tiny_qwen3`)."""
  del preset
  committed = config.get("warm_start", {}).get("from_dir", "")  # testbed v3 loads its committed start
  return config.model.preset not in _HF_IDS and not config.model.checkpoint and not committed
