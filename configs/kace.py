"""KACE evaluation, learning and the table (docs/kace.md); presets: cpu (default), qwen3_4b, openai.

Read by launch/kace_eval.py (`methods`), launch/kace_build.py (learns what `methods` read, from the
training half) and launch/kace_table.py (`table.methods` x `table.benchmarks`).

cpu       a tiny Qwen3-style model the project trains on its own synthetic maths set (built once,
          cached), evaluated on that set's held-out problems — a few minutes on 2 cores.
qwen3_4b  a local HF checkpoint through JaxGenerator on a mesh, on MATH levels 4–5:
          --config.roles.solver.checkpoint=/path/Qwen3-4B --config.data.source=/path/MATH
testbed   the latent-convention testbed (kace.testbed): a tiny solver trained to use cards (built once,
          cached), the oracle (programmatic) teacher and curator, every method of the registry.
testbed_v2  testbed v2 (docs/kace.md): kind words shared across domains with conflicting rules, null
          problems, ADD's strict rule, retrieval k chosen on validation.
openai    any OpenAI-compatible server (vLLM, SGLang, launch/serve.py):
          --config.roles.solver.base_url=http://host:8000/v1 --config.roles.solver.model=Qwen/Qwen3-4B
qwen3_4b@<target>  the same with the plan's overrides for a machine (`TARGETS` below), e.g.
          qwen3_4b@h100x1, qwen3_4b@v5p-8
"""

import ml_collections

from configs import plan_targets
from configs.generators import generator_config

# The defaults below are those of the library records they configure (kace.learn.LearnConfig,
# kace.synthetic.TinySolverConfig, kace.cards.DEFAULT_DOMAINS,
# kace.projection.SOLVER_TEMPLATE), written out so that this file imports no library module;
# tests/kace/config_test.py checks that they agree. kace.config.KaceConfig types this ConfigDict
# once, in the launchers.
# Each preset with one line (launchers' --help lists them; an unknown one is refused naming the closest).
PRESETS = {
  "cpu": "(default) a tiny solver trained here on synthetic maths, evaluated held out; minutes",
  "testbed": "the latent-convention testbed: tiny solver, oracle teacher and curator, every method",
  "testbed_v2": "testbed v2: shared kind words with conflicting rules, null problems, strict ADD",
  "qwen3_4b": "a local Qwen3-4B on MATH levels 4-5; needs --config.roles.solver.checkpoint",
  "openai": "any OpenAI-compatible server (vLLM, SGLang, lm-serve); needs --config.roles.solver.base_url",
}
DOMAINS = ("algebra", "geometry", "combinatorics", "number_theory")
SOLVER_TEMPLATE = (
  "Solve the following math problem. Put the final answer in \\boxed{{}}.\n{notes}\nProblem: {question}"
)


# The plan's overrides per preset and target (`qwen3_4b@<target>`): the solver's rows a call and mesh,
# and the teacher's and curator's where they run in this process, as `launch.plan --render` writes
# them from the plan's newest record of each target (configs/plan_targets.py; docs/scale.md shows the
# figures). Where only kace_eval's solver fits (the build roles do not fit beside it), the solver's.
TARGETS = {
  "qwen3_4b": {
    target: e["overrides"]
    for target, e in plan_targets.planned("configs/kace.py:qwen3_4b").items()
    if "overrides" in e
  },
}


def get_config(arg: str = "cpu") -> ml_collections.ConfigDict:
  arg, _, target = arg.partition("@")
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.methods = ("best_of_n", "best_of_n_curve", "tiered", "kace")
  # Per-method options (kace.methods reads them; the learned methods and baselines have their own).
  # best_of_n_curve draws curve_max samples once per problem: Best-of-N for N = 1 … curve_max.
  c.best_of_n = ml_collections.ConfigDict(dict(n=5, curve_max=10))
  c.kace = ml_collections.ConfigDict(dict(tree=""))  # an Epistemic Tree JSON file
  # Learning (kace.learn.LearnConfig fields; `dir`: a build directory with the learned artefacts).
  c.learn = ml_collections.ConfigDict(
    dict(
      dir="",
      budget_tokens=1024,
      train_limit=0,
      embedder_dir="",
      distill="teacher",
      accept_fraction=0.5,  # held out from the teacher and curator; every change is judged on it
      max_sweeps=3,  # ADD passes over every cell; fewer when a sweep keeps no card
      accept_rule="min_gain",  # min_gain | strict (a gain beyond chance, few regressions; kace.learn)
      min_gain=0,  # correct answers a card must add on its acceptance readers (0: no drop)
      accept_alpha=0.05,  # strict: one-sided level of the sign test on the readers it changed
      max_regression=0.1,  # strict: share of readers it may turn from right to wrong
      universal=True,  # each sweep ends with one teacher call for universal cards
      failures_per_prompt=4,
      max_cards=3,
      attempt_tokens=6144,  # a failed trace is shown whole within this budget, else head + tail
      retries=2,
      refine_rounds=1,
      credit_max_problems=0,  # > 0: a card's counterfactual credit on at most this many readers
      curator_cards=8,  # lowest-credit cards shown to the curator with examples
      curator_examples=2,
      duplicate_threshold=0.85,
      max_card_chars=600,
    )
  )
  c.ace = ml_collections.ConfigDict(dict(epochs=1, batch_size=16, budget_tokens=2048))
  c.gepa = ml_collections.ConfigDict(dict(max_metric_calls=300, val_fraction=0.5))
  # Cards a problem of llm_router / embedding_retrieval: k, or with k_candidates the one that solves
  # most of the validation split (the kace build's acceptance part; kace.pipeline.choose_k).
  c.router = ml_collections.ConfigDict(dict(k=4, k_candidates=()))
  c.retrieval = ml_collections.ConfigDict(dict(k=4, k_candidates=(), model_dir=""))  # "" = MiniLM wheel
  # The paper-style table (launch/kace_table.py): benchmarks, each a set of config.data overrides.
  c.table = ml_collections.ConfigDict(
    dict(
      methods=("best_of_n", "best_of_n_curve", "tiered", "kace", "ace_playbook", "gepa", "tiered_gepa",
               "no_domain", "no_difficulty", "raw_reflections", "llm_router", "embedding_retrieval"),
      benchmarks=("synthetic",),
    )
  )  # fmt: skip
  c.benchmarks = ml_collections.ConfigDict(
    dict(
      synthetic=dict(name="synthetic"),
      # All 30 AIME 2025 problems are evaluated; cards are learned on MATH levels 4-5 (point
      # train_source at MATH's train split) or, with train_name="aime2025", at earlier AIME years.
      aime2025=dict(name="aime2025", test_fraction=0.0, train_name="math"),
      math=dict(name="math", test_fraction=0.5),
      olymmath=dict(name="olymmath", verifiable_only=True, test_fraction=0.5),
    )
  )
  # Fields of kace.tiers.Schedule except the tier ladder (the paper's); see docs/kace.md.
  c.schedule = ml_collections.ConfigDict(
    dict(
      carry_over=False,
      tie="continue",
      pool_size=10,
      pool_reuse=True,
      pool_reads="HS",
      pool_vote="plurality",
      calls="samples",
    )
  )
  c.domains = DOMAINS
  c.fallback_domain = ""  # an unusable classifier reply gets this domain ("" = the first domain)
  c.prompt = ml_collections.ConfigDict(dict(solver=SOLVER_TEMPLATE))
  # Solver sampling (lm.generators.GenerationParams; seeds are derived per problem and stage). The
  # real-model defaults are Qwen3's own recommendation for thinking mode (model card,
  # https://huggingface.co/Qwen/Qwen3-4B, "Best Practices"): temperature 0.6, top-p 0.95, top-k 20,
  # min-p 0 (the servers' and our sampler's default), and an output length of 38,912 tokens for
  # competition maths such as AIME (32,768 for most queries) — with a ~2k-token prompt that is the
  # 40,960 positions of Qwen3-4B's config. A shorter budget cuts AIME traces inside <think>, where
  # no answer is extracted.
  c.sampling = ml_collections.ConfigDict(
    dict(max_tokens=38912, temperature=0.6, top_p=0.95, top_k=20, stop=(), enable_thinking=True)
  )
  # Teacher, curator, reflector and router sampling (their replies are JSON after the thinking):
  # the same Qwen3 thinking-mode settings; 12,288 output tokens leave room in a 40,960-position
  # context for a prompt of learn.failures_per_prompt (4) traces of learn.attempt_tokens (6,144).
  c.role_sampling = ml_collections.ConfigDict(
    dict(max_tokens=12288, temperature=0.6, top_p=0.95, top_k=20, stop=(), enable_thinking=True)
  )
  c.classifier_sampling = ml_collections.ConfigDict(
    dict(max_tokens=32, temperature=0.0, top_p=1.0, top_k=0, stop=(), enable_thinking=False)
  )
  # LLM roles (lm.generators.GeneratorConfig fields); a role left None is played by the solver. The
  # real-model presets set teacher and curator to a separate, stronger model (Qwen3-32B); the CPU
  # preset leaves them to the tiny solver.
  c.roles = ml_collections.ConfigDict()
  c.roles.solver = generator_config()
  for name in ("classifier", "teacher", "curator", "router"):
    c.roles[name] = ml_collections.config_dict.placeholder(ml_collections.ConfigDict)
  c.data = ml_collections.ConfigDict(
    dict(
      name="synthetic",  # synthetic | aime2025 | math | olymmath
      source="",  # a local file / directory, or a hub name (aime2025 default: opencompass/AIME2025)
      # Learning data: "" = the other part of this benchmark's test_fraction split; else a loader
      # name (math, aime2025 for any AIME-format file, olymmath) whose `train_source` is learned on.
      train_name="",
      train_source="",
      levels=(4, 5),  # math
      splits=("EN-EASY", "EN-HARD"),  # olymmath
      verifiable_only=False,
      test_fraction=0.0,  # > 0: evaluate on the test half of a seeded split
      split_seed=42,
      limit=0,  # > 0: the first `limit` problems by id
    )
  )
  c.eval = ml_collections.ConfigDict(dict(batch_size=64, solve_rate_k=10, bootstrap=2000))
  # truncated: what a reply cut off by max_tokens answers: "unanswered" (the maths benchmarks' rule:
  # only a complete \\boxed{}, never the last number of a cut-off chain of thought) or "extract".
  c.grader = ml_collections.ConfigDict(dict(workers=2, timeout_s=5.0, truncated="unanswered"))
  # The dry run and the endpoint check (kace.config.PlanConfig, kace.budget; docs/kace.md, "Running
  # against an endpoint"): dry_run prints what a run will ask (samples worst case and expected,
  # tokens, cost at price_in / price_out $ a million tokens, hours at tokens_per_s) and stops before
  # any call; the expected counts assume each sample is right with p_correct, wrong answers never agree.
  c.plan = ml_collections.ConfigDict(
    dict(
      dry_run=False,
      check_context=True,
      p_correct=0.5,
      completion_tokens=0,
      chars_per_token=3.5,
      price_in=0.0,
      price_out=0.0,
      tokens_per_s=0.0,
    )
  )
  # The CPU-scale tiny solver (kace.synthetic.TinySolverConfig fields + where to cache it).
  c.synthetic = ml_collections.ConfigDict(
    dict(
      build_solver=False,
      cache_dir="~/.cache/kace",
      seed=0,
      per_cell=400,
      test_per_cell=4,
      vocab_size=512,
      hidden_size=64,
      intermediate_size=192,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
      card_fraction=0.3,
      steps=1000,
      batch_size=32,
      learning_rate=3e-3,
      warmup_steps=30,
    )
  )

  # The latent-convention testbed (kace.testbed; data.name="testbed"): its problems, its context-using
  # solver (kace.synthetic.TestbedSolverConfig fields, cached under synthetic.cache_dir) and the
  # oracle (programmatic) teacher and curator (kace.oracle).
  c.testbed = ml_collections.ConfigDict(
    dict(
      build_solver=False,
      oracle_teacher=False,
      oracle_curator=False,
      oracle_noise=0.0,
      curator_deletes_idle=False,  # the oracle curator also deletes cards of credit 0 (kace.oracle)
      solver_kind="trained",  # trained | scripted (kace.scripted: a program, no model; labelled)
      seed=0,
      per_cell=40,
      test_per_cell=12,
      control="none",  # none | identity | shared | level1 (v1 only)
      variant="v1",  # v1 | conflict (testbed v2: one kind word per level, a rule per domain)
      null_fraction=0.25,  # conflict: share of level >= 2 problems no card helps
      seeds=(0, 1, 2),  # launch/kace_testbed.py: one table per seed, predictions judged on all
      workers=0,  # seeds run at once, one process each; 0: every seed on a 1-process CPU run, else 1
      teacher="oracle",  # oracle | learned (kace.learned_teacher: "learned teacher (tiny model)")
      learned_teacher=dict(  # kace.learned_teacher.LearnedTeacherConfig (testbed.teacher="learned")
        seed=0,
        examples=30_000,
        min_pairs=2,
        max_pairs=8,
        hold_out=False,  # True: conventions of kace.testbed.TRAIN_H only (never the evaluated add 3 / 6 / 9)
        vocab_size=512,
        hidden_size=64,
        intermediate_size=192,
        num_layers=2,
        num_heads=4,
        num_kv_heads=4,
        head_dim=16,
        rope_theta=1_000_000.0,
        steps=1500,
        batch_size=64,
        learning_rate=3e-3,
        warmup_steps=50,
      ),
      solver=dict(
        seed=0,
        examples=40_000,  # build 13 (docs/kace.md): 20,000 / 2,000 steps left 5 of 90 cards unread
        card_fraction=0.7,
        min_distractors=0,
        max_distractors=8,
        hold_out=False,  # True: train on kace.testbed.TRAIN_H only (held-out constants; fails its gates)
        form="keyed",  # kace.testbed.FORMS: keyed | short | long (wording of questions and cards)
        completion="card_first",  # kace.testbed.COMPLETIONS: card_first | rule_first | working
        curriculum_steps=600,  # > 0: first this many steps with at most curriculum_distractors cards
        curriculum_distractors=2,
        vocab_size=768,  # the keyed form adds 219 single tokens (testbed.single_tokens)
        hidden_size=64,
        intermediate_size=192,
        num_layers=2,
        num_heads=4,
        num_kv_heads=4,  # plain MHA: faster than GQA on XLA:CPU
        head_dim=16,
        steps=3500,
        batch_size=32,
        learning_rate=3e-3,
        warmup_steps=50,
        bucket_by_length=True,  # lm.sft: batches of similar lengths, each padded to its own width
        rope_theta=1_000_000.0,
        variant="v1",  # the kind words it is trained on; testbed_v2 trains on "conflict"'s
      ),
    )
  )

  if arg in ("cpu", "testbed", "testbed_v2"):
    c.synthetic.build_solver = True  # fills roles.solver.checkpoint and kace.tree
    c.roles.solver.dtype = "float32"
    c.roles.solver.sampler = ml_collections.ConfigDict(
      dict(min_prompt_bucket=64, step_bucket=16, max_rows=512)
    )
    c.sampling.update(max_tokens=12, temperature=0.7, top_p=1.0, top_k=0, enable_thinking=None)
    c.role_sampling.update(max_tokens=48, temperature=0.7, top_p=1.0, top_k=0, enable_thinking=False)
    c.eval.batch_size = 48
    c.learn.update(train_limit=96, budget_tokens=256, attempt_tokens=64)
    c.ace.update(batch_size=32, budget_tokens=256)
    c.gepa.max_metric_calls = 64
    if arg in ("testbed", "testbed_v2"):
      c.synthetic.build_solver = False
      c.testbed.update(build_solver=True, oracle_teacher=True, oracle_curator=True)
      c.data.name = "testbed"
      c.domains = ("algebra", "number_theory", "combinatorics")
      c.methods = c.table.methods
      c.table.benchmarks = ("testbed",)
      c.benchmarks.testbed = dict(name="testbed")
      c.sampling.max_tokens = 24  # "total=addthree: 7 + 3 -> \\boxed{10}" and EOS: at most 19 tokens
      # every training problem (28 a cell); teacher prompts show enough failures for two per kind
      c.learn.update(train_limit=0, failures_per_prompt=8)
    if arg == "testbed_v2":  # docs/kace.md, "Testbed v2"; noise arms: --config.testbed.oracle_noise
      c.testbed.variant = "conflict"
      c.testbed.solver.variant = "conflict"  # trained on shared kind words (v1's solver fails v2's gates)
      c.learn.accept_rule = "strict"
      c.retrieval.k_candidates = c.router.k_candidates = (1, 2, 4, 8)
  elif arg == "qwen3_4b":
    c.data.update(name="math", source="", test_fraction=0.5)  # set --config.data.source to MATH
    c.roles.solver.update(checkpoint="", tokenizer="", dtype="bfloat16")  # a local Qwen3-4B directory
    c.roles.solver.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tp=1))
    # Qwen3-4B's KV cache is 36 layers x 8 KV heads x 128 x (K, V) x 2 bytes = 144 KiB a position,
    # about 6 GB a row at 40,960 positions: 16 rows a call fit one 141 GB accelerator with the weights.
    c.roles.solver.sampler = ml_collections.ConfigDict(
      dict(min_prompt_bucket=256, step_bucket=512, max_rows=16)
    )
    # Teacher and curator: a separate, stronger local model, thinking on (role_sampling). Set both
    # checkpoints (e.g. Qwen3-32B); identical role configs share one loaded model.
    for role in ("teacher", "curator"):
      c.roles[role] = generator_config(checkpoint="", dtype="bfloat16")
      c.roles[role].mesh = ml_collections.ConfigDict(dict(data=1, fsdp=1, tp=-1))
      c.roles[role].sampler = ml_collections.ConfigDict(
        dict(min_prompt_bucket=1024, step_bucket=512, max_rows=4)
      )
    c.eval.batch_size = 256
  elif arg == "openai":
    c.data.update(name="aime2025", source="", train_name="math")  # set data.train_source to MATH train
    c.roles.solver.update(kind="openai", base_url="http://127.0.0.1:8000/v1", model="Qwen/Qwen3-4B")
    c.roles.solver.cache_dir = ""  # set to cache responses on disk (resume without paying twice)
    # Teacher and curator: a separate, stronger served model (its own server), thinking on.
    for role in ("teacher", "curator"):
      c.roles[role] = generator_config(
        kind="openai", base_url="http://127.0.0.1:8001/v1", model="Qwen/Qwen3-32B"
      )
    c.eval.batch_size = 500
  else:
    raise ValueError(f"configs/kace.py: unknown preset {arg!r} (cpu, testbed, testbed_v2, qwen3_4b, openai)")
  if target:
    known = TARGETS.get(arg, {})
    if target not in known:
      raise ValueError(f"configs/kace.py: unknown target {target!r} for {arg}; known: {sorted(known)}")
    c.update_from_flattened_dict(known[target])
  return c


def get_sweep(h):
  """Three seeds of the evaluation (lm-sweep): the spread a single run's numbers carry."""
  return h.product([h.sweep("config.seed", [0, 1, 2])])


def required_weights(preset: str, config: ml_collections.ConfigDict) -> dict[str, str]:
  """{config field: Hugging Face model id} of the real weights a paper preset's local roles run
  on; the launchers refuse such a preset while a field is empty (launch/common.py)."""
  if preset != "qwen3_4b":
    return {}
  ids = {"solver": "Qwen/Qwen3-4B", "teacher": "Qwen/Qwen3-32B", "curator": "Qwen/Qwen3-32B"}
  return {
    f"roles.{role}.checkpoint": hf_id
    for role, hf_id in ids.items()
    if config.roles[role] is not None and config.roles[role].kind == "jax"
  }


def random_init(preset: str, config: ml_collections.ConfigDict) -> bool:
  """Whether the preset's solver is a small model trained here from random weights (said first)."""
  return (preset or "cpu") in ("cpu", "testbed", "testbed_v2") and not config.roles.solver.checkpoint
