"""KACE testbed v3's trained comparison (docs/kace_v3.md; `kace.v3_run.V3RunConfig` types it in
launch/kace_v3.py). Presets: default (the registered run: ten builds), smoke (tiny solver and
teacher, one build: the launcher's test; its solver fails the gates, so the run stops there).

The solver's and the teacher's fields are those of `kace.v3_solver.V3SolverConfig` and
`kace.v3_teacher.V3TeacherConfig`, written out so that this file imports no library module;
tests/kace/v3_run_test.py checks that they agree with the libraries' defaults.
"""

import ml_collections

PRESETS = {
  "default": "the registered comparison: trained solver, learned teacher, ten builds (tens of minutes)",
  "smoke": "a tiny solver and teacher, one build, for tests (it stops at the solver's gates)",
}

SOLVER = dict(
  seed=0,
  examples=40_000,
  large_share=0.25,
  card_fraction=0.75,
  conflict_fraction=0.3,
  max_cards=6,
  curriculum_steps=500,
  curriculum_cards=2,
  vocab_size=768,
  hidden_size=64,
  intermediate_size=192,
  num_layers=2,
  num_heads=4,
  num_kv_heads=4,
  head_dim=16,
  rope_theta=1_000_000.0,
  steps=3000,
  batch_size=32,
  learning_rate=3e-3,
  warmup_steps=50,
  bucket_by_length=True,
)
TEACHER = dict(
  seed=0,
  examples=80_000,
  min_pairs=1,
  max_pairs=4,
  hold_out=False,
  vocab_size=1024,
  hidden_size=128,
  intermediate_size=512,
  num_layers=2,
  num_heads=4,
  num_kv_heads=4,
  head_dim=32,
  rope_theta=1_000_000.0,
  steps=3000,
  batch_size=64,
  learning_rate=3e-3,
  warmup_steps=50,
  operands="v3",
  mixed=0.25,
)


def get_config(arg: str = "default") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.builds = tuple(range(10))
  c.cache_dir = "~/.cache/kace"
  c.bootstrap = 2000
  c.solver = ml_collections.ConfigDict(dict(SOLVER))
  c.teacher = ml_collections.ConfigDict(dict(TEACHER))
  if arg == "smoke":
    c.builds = (0,)
    c.bootstrap = 200
    c.solver.update(examples=64, steps=2, curriculum_steps=0, vocab_size=512)
    c.teacher.update(
      examples=400, steps=20, vocab_size=1024, hidden_size=32, intermediate_size=64, head_dim=8
    )
  elif arg != "default":
    raise ValueError(f"configs/kace_v3.py: unknown preset {arg!r}; valid presets: {', '.join(PRESETS)}")
  return c
