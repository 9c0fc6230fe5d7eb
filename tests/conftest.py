"""Test setup: 8 fake CPU devices for mesh tests, no network, float32 matmuls."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# Compiled programs are cached on disk, shared by the xdist workers and by later runs.
jax.config.update(
  "jax_compilation_cache_dir",
  os.environ.get("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".jax_cache")),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
