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
