"""Test setup: 8 fake CPU devices for mesh tests, no network, float32 matmuls."""

import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

# Compiled programs are cached on disk, shared by the xdist workers, by later runs and, as these are
# environment variables, by the processes tests start (launchers, spawned seed workers), which would
# otherwise compile again what another test or process already compiled. Every program, however
# quick to compile: a tiny model's run compiles about a hundred of under 0.5 s, and with them cached
# too DPA-GRPO's kill-and-resume test (its two launcher processes rerun its in-process run's
# programs) took 147 s against 166 s, alone, from an empty cache.
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".jax_cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_collection_modifyitems(config, items):
  """Under `-n N --dist worksteal` (scripts/test.sh): each worker's first share starts with its part
  of the tests marked slow. worksteal first hands worker i the next len(pending) // (N - i) tests in
  collection order, then lets an idle worker take the back half of another's queue. So the order
  built here is N consecutive shares, each its slow tests (every N-th) then short ones: both workers
  start on minutes-long tests together, stealing moves short tests from queue ends, and the run ends
  on short tests instead of one worker alone on a five-minute one (longest first, the classic
  schedule for parallel machines). Outside xdist, or if the slow tests outnumber a share, the
  collection order stands."""
  workers = getattr(config, "workerinput", {}).get("workercount", 1)
  args = " ".join(config.invocation_params.args)  # a worker's own `dist` option reads "no"
  if workers < 2 or not re.search(r"--dist[= ]worksteal\b", args):
    return
  slow = [item for item in items if item.get_closest_marker("slow")]
  short = [item for item in items if not item.get_closest_marker("slow")]
  order, left = [], len(items)
  for worker in range(workers):
    share = left // (workers - worker)
    mine = slow[worker::workers]
    if len(mine) > share:
      return
    order += mine + short[: share - len(mine)]
    short = short[share - len(mine) :]
    left -= share
  items[:] = order
