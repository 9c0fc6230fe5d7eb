"""Device meshes, parameter / activation partitioning, and multi-host start-up.

Scale-out uses JAX's own runtime: `jax.distributed.initialize` on every host, one global `Mesh`
over axes (data, fsdp, tp), and `NamedSharding`s derived from `PartitionSpec`s. Nothing here
moves data between hosts by hand.
"""

from __future__ import annotations

import os

import jax
from absl import logging


def initialize_distributed() -> None:
  """Initialises JAX's multi-host runtime when launched on several hosts; a no-op on one host.

  Multi-host launches are recognised the way `jax.distributed.initialize` itself auto-detects them
  (TPU pod metadata, SLURM, Open MPI) or from explicit `JAX_COORDINATOR_ADDRESS`,
  `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID` environment variables.
  """
  if getattr(initialize_distributed, "_done", False):
    return
  explicit = os.environ.get("JAX_COORDINATOR_ADDRESS")
  slurm = int(os.environ.get("SLURM_NTASKS", "1")) > 1
  mpi = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
  tpu_pod = bool(os.environ.get("TPU_WORKER_HOSTNAMES", "").count(","))
  if explicit:
    jax.distributed.initialize(
        coordinator_address=explicit,
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
    )
  elif slurm or mpi or tpu_pod:
    jax.distributed.initialize()
  initialize_distributed._done = True
  logging.info(
      "JAX process %d of %d, %d local / %d global devices",
      jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count(),
  )
