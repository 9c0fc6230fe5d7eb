"""Test setup: 8 fake CPU devices for mesh tests, no network, float32 matmuls."""

import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# LLVM at -O1 for XLA:CPU's programs (inherited by the processes tests start; the benchmarks' tests
# drop XLA_FLAGS, so what they measure is unaffected): the suite is mostly compiles of small
# programs, and O1 compiles them faster than the default at a small cost in run time. The README's
# smoke command with an empty compilation cache (tests/dpa_grpo/smoke_test.py alone, 2026-12-05):
# 74.5 s by default, 66.4 s at O1, 83.1 s at O0. LLVM's level changes neither the HLO nor XLA's
# buffer assignment (the plans' memory figures).
_FLAGS = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=1"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAGS).strip()
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

# Compiled programs are cached on disk, shared by the xdist workers, by later runs and, as these are
# environment variables, by the processes tests start (launchers, spawned seed workers), which would
# otherwise compile again what another test or process already compiled. Every program, however
# quick to compile: a process a test starts traces and compiles hundreds of small ones (slices,
# casts, initialisers) at tens of milliseconds each, which add up across the suite's processes.
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".jax_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Also an environment variable, not a `jax.config.update`: a launcher or spawned worker a test starts
# then traces the same programs as the tests in this process (the precision is part of each dot, so
# of each program's cache key), and finds the ones they compiled in the cache above.
os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
# One OpenMP thread a process (PyTorch's intra-op pool, OpenBLAS), unless set: the two xdist workers
# already keep both cores busy, and a second OpenMP thread spins waiting on a core the other worker
# holds. tests/lm/{hf,lora_peft,lora,sampler}_test.py, alone on a 2-core machine at load ~3 (three
# runs each, alternated): 47.8, 54.6, 47.4 s with 2 threads; 33.2, 35.4, 33.7 s with 1.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# The tests that run longest (call seconds, --durations of `.ci/run` on a fresh clone, 2 cores,
# 2026-12-06), heaviest first; then
# the modules whose tests run longest, heaviest first; then every other module holding a test marked
# slow; then the rest, each group in its collection order. With the scheduler handing tests out one
# at a time (pytest_configure below), this is longest-first list scheduling: each worker takes the
# next longest test when it finishes one, and the suite ends on short tests on both workers.
_SLOWEST = {  # seconds, by the test's id under tests/
  "multihost/two_process_test.py::test_dpa_grpo_two_processes_killed_and_resumed_match_one_process": 199,
  "benchmarks/rl_bench_test.py::test_quick_run_measures_both_sides_of_a_dpa_grpo_step_in"
  "_both_dtypes_and_they_agree": 93,
  "dpa_grpo/reference_path_test.py::test_reference_settings_with_their_skips_train_every_kind_of_update": 92,
  "launch/main_test.py::test_the_main_job_at_smoke_size_reports_both_parts_stopped_at_their_gates": 83,
  "dpa_grpo/smoke_test.py::test_qwen3_4b_preset_code_path_runs_two_steps_on_cpu": 79,
  "kace/methods_test.py::test_every_method_runs_end_to_end_into_the_table": 78,
  "dpa_grpo/engine_test.py::test_two_steps_from_our_server_with_adapters_reloaded": 66,
  "kace/testbed_pipeline_test.py::test_testbed_comparison_runs_every_method_with_the_oracle_roles": 65,
  "dpa_grpo/testbed_test.py::test_smoke_pipeline_runs_arms_resumes_and_refuses_a_changed_config": 56,
  "multihost/two_process_test.py::test_kace_eval_two_processes_killed_and_resumed_match_one_process": 56,
  "kace/plan_test.py::test_where_the_solver_does_not_fit_beside_the_teacher_the"
  "_preset_carries_rows_that_do": 55,
  "benchmarks/sampler_bench_test.py::test_quick_run_measures_ours_transformers_and_a_baseline"
  "_commit_in_both_dtypes": 45,
  "launch/readme_commands_test.py::test_kace_build_and_table_smoke_runs": 41,
  "dpa_grpo/device_check_test.py::test_the_cpu_check_runs_the_planned_row_and_a_planted_mismatch_fails": 41,
}
_HEAVIEST = (
  "tests.multihost.two_process_test",
  "tests.dpa_grpo.reference_path_test",
  "tests.dpa_grpo.engine_test",
  "tests.kace.testbed_pipeline_test",
  "tests.dpa_grpo.testbed_test",
  "tests.dpa_grpo.reproduce_test",
  "tests.dpa_grpo.smoke_test",
  "tests.kace.methods_test",
)


def pytest_configure(config):
  """pytest-xdist's load scheduling hands each worker a first chunk of a quarter of the suite (about
  120 tests each on 2 workers), consecutive in the order below, so the first worker got nearly every
  long test and the second the short ones; one test at a time instead (`--maxschedchunk=1`, unless
  given) lets whichever worker is free take the next longest."""
  if getattr(config.option, "dist", "no") == "load" and getattr(config.option, "maxschedchunk", 0) is None:
    config.option.maxschedchunk = 1


def pytest_collection_modifyitems(config, items):
  slow = {item.module.__name__ for item in items if item.get_closest_marker("slow")}

  def rank(item):
    name = item.module.__name__
    return (
      -_SLOWEST.get(item.nodeid.removeprefix("tests/"), 0.0),
      _HEAVIEST.index(name) if name in _HEAVIEST else len(_HEAVIEST),
      name not in slow,
    )

  items.sort(key=rank)  # stable: a module's other tests stay together and in their order


@pytest.fixture
def no_persistent_cache():
  """Compiles kept out of JAX's persistent cache: the plan's (never run), and the device profile's,
  which compiles the device check's planned row while tests/dpa_grpo/device_check_test.py may be
  compiling it in the other worker. JAX writes a cache entry in place (`LRUCache.put` is a plain
  `write_bytes` when the cache has no size limit), so a read in another process can deserialise a
  half-written executable: a worker crashed so in full suite runs (2026-12-04 a write, 2026-12-05 a
  read, twice) and never when the test ran alone.

  The flag alone is not enough: JAX decides once per process whether it uses the cache
  (`compilation_cache.is_cache_used`), so a worker that compiled anything before this test kept
  reading and writing the cache through it. Resetting that decision makes the flag take effect."""
  import jax
  from jax._src import compilation_cache, xla_bridge

  def use(enabled: bool) -> None:
    jax.config.update("jax_enable_compilation_cache", enabled)
    compilation_cache.reset_cache()  # the next compile decides again, under the flag just set

  use(False)
  assert not compilation_cache.is_cache_used(xla_bridge.get_backend()), "the persistent cache is still in use"
  yield
  use(True)
