"""Test setup: 8 fake CPU devices for mesh tests, no network, float32 matmuls."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
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


# The modules whose tests run longest (measured with --durations on 2 cores, 2026-12-03), heaviest
# first; then every other module holding a test marked slow; then the rest, each group in its
# collection order. pytest-xdist hands tests out in this order, so the long ones start early
# instead of one of them running alone at the end of the suite.
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


def pytest_collection_modifyitems(config, items):
  slow = {item.module.__name__ for item in items if item.get_closest_marker("slow")}

  def rank(item):
    name = item.module.__name__
    return (_HEAVIEST.index(name) if name in _HEAVIEST else len(_HEAVIEST), name not in slow)

  items.sort(key=rank)  # stable: a module's tests stay together and in their order
