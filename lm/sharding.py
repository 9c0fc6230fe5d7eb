"""Device meshes, parameter / activation partitioning, and multi-host start-up.

Scale-out uses JAX's own runtime: `jax.distributed.initialize` on every host, one global `Mesh`
over axes (data, fsdp, tp), and `NamedSharding`s derived from `PartitionSpec`s. Nothing here
moves data between hosts by hand.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


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
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )


def to_host(tree: Any) -> Any:
  """`jax.device_get` that also works for global arrays spanning other hosts' devices.

  A leaf sharded over devices this process cannot address is gathered from every process with
  `multihost_utils.process_allgather` (a collective: every process must call `to_host` on the same
  tree, as every process runs the same program). Fully addressable or fully replicated leaves are
  copied from local devices; other leaves pass through.
  """

  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
      return multihost_utils.process_allgather(x, tiled=True)
    return jax.device_get(x)

  return jax.tree.map(get, tree)


def broadcast_object(obj: Any) -> Any:
  """Process 0's `obj` (any picklable value) on every process; `obj` itself on one host.

  For what only process 0 fetches from outside the job — a serving engine's samples — so that
  every process builds the same batch from the same data. A collective: every process calls it,
  with anything (None) where it is not process 0.
  """
  if jax.process_count() == 1:
    return obj
  import pickle

  import numpy as np

  payload = np.frombuffer(pickle.dumps(obj), np.uint8) if jax.process_index() == 0 else np.zeros(0, np.uint8)
  size = int(multihost_utils.broadcast_one_to_all(np.asarray(payload.size, np.int64)))
  padded = np.zeros(size, np.uint8)
  padded[: payload.size] = payload
  data = np.asarray(multihost_utils.broadcast_one_to_all(padded), np.uint8)
  return pickle.loads(data.tobytes())


# ---- meshes ------------------------------------------------------------------------------------

MESH_AXES = ("data", "fsdp", "tp")
BATCH_AXES = ("data", "fsdp")  # rows of a batch are split over both data-parallel axes


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Mesh shape over (data, fsdp, tp); one size may be -1 to take the remaining devices."""

  data: int = -1
  fsdp: int = 1
  tp: int = 1

  def shape(self, num_devices: int) -> tuple[int, int, int]:
    sizes = [self.data, self.fsdp, self.tp]
    if sizes.count(-1) > 1:
      raise ValueError(f"at most one mesh axis may be -1, got {self}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
      if num_devices % known:
        raise ValueError(f"{num_devices} devices cannot be split as {self}")
      sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
      raise ValueError(f"mesh {tuple(sizes)} needs {math.prod(sizes)} devices, have {num_devices}")
    return tuple(sizes)


def slice_count(devices) -> int:
  """How many TPU slices `devices` span (a multi-slice job over the data-center network, DCN:
  `slice_index`); 1 for one slice, a GPU node or CPU devices."""
  return len({getattr(d, "slice_index", None) or 0 for d in devices})


def device_grid(shape: tuple[int, ...], devices) -> Any:
  """The devices of a (data, fsdp, tp) mesh as an array of that shape. Over several TPU slices the
  data axis is outermost across them (as maxtext's `num_slices`: only data parallelism crosses the
  slow DCN; fsdp and tp stay within a slice's ICI), so data must be a multiple of the slices;
  `jax.make_mesh` refuses devices of several slices, hence `create_hybrid_device_mesh`."""
  slices = slice_count(devices)
  if slices == 1:
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices).devices
  if shape[0] % slices:
    raise ValueError(
      f"mesh {tuple(shape)} over {slices} slices: mesh.data must be a multiple of {slices} (data parallel "
      "across slices; fsdp and tp within one)"
    )
  from jax.experimental import mesh_utils

  per_slice = (shape[0] // slices, *shape[1:])
  dcn = (slices,) + (1,) * (len(shape) - 1)
  return mesh_utils.create_hybrid_device_mesh(per_slice, dcn, devices, process_is_granule=False)


def make_mesh(config: MeshConfig | None = None, devices: list[jax.Device] | None = None) -> Mesh:
  """A global mesh over all devices of all hosts (or the given ones), axes (data, fsdp, tp); over
  several TPU slices the data axis spans them (`device_grid`)."""
  config = config or MeshConfig()
  devices = list(devices) if devices is not None else jax.devices()
  shape = config.shape(len(devices))
  if slice_count(devices) == 1:
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)
  return Mesh(device_grid(shape, devices), MESH_AXES, axis_types=(AxisType.Auto,) * 3)


# ---- partition specs ---------------------------------------------------------------------------

# Mesh axis for each named model axis: weights are split over fsdp along D and over tp along the
# head / MLP / vocab axes (Megatron-style), never along L or H.
_WEIGHT_AXIS_RULES = {"D": "fsdp", "F": "tp", "N": "tp", "K": "tp", "V": "tp"}


@dataclasses.dataclass(frozen=True)
class ShardingConfig:
  """PartitionSpecs for every parameter and the main activations, derived from named axes.

  Attributes:
    weight_axis_rules: named model axis -> mesh axis (absent = replicated).
    act_btd: the residual stream [B, T, D].
    act_btv: logits [B, T, V].
    cache_bksh: each layer's KV cache [B, K, S, H].
    tokens_bt: token ids and masks [B, T].
  """

  weight_axis_rules: tuple[tuple[str, str | tuple[str, ...]], ...] = tuple(_WEIGHT_AXIS_RULES.items())
  act_btd: P = P(BATCH_AXES, None, None)
  act_btv: P = P(BATCH_AXES, None, "tp")
  cache_bksh: P = P(BATCH_AXES, "tp", None, None)
  tokens_bt: P = P(BATCH_AXES, None)

  def weight_spec(self, axes: tuple[str, ...]) -> P:
    """The PartitionSpec of a weight whose dimensions are the named axes (e.g. ("L","D","N","H"))."""
    rules = dict(self.weight_axis_rules)
    return P(*(rules.get(a) for a in axes))


# The sampler's layout (`lm.sampler.Sampler`): tensor parallel over every model axis, as serving
# engines decode. Weights split over fsdp × tp along the head / MLP / vocabulary axes and never
# along D, so a decode step multiplies by each device's own shard of every weight and exchanges
# activations only; rows split over data alone. Under the training layout (D over fsdp) XLA gathers
# every weight whole before the decode loop, and each device holds the full model while decoding.
MODEL_AXES = ("fsdp", "tp")
DECODE_SHARDING = ShardingConfig(
  weight_axis_rules=tuple((a, MODEL_AXES) for a in ("F", "N", "K", "V")),
  act_btd=P("data", None, None),
  act_btv=P("data", None, MODEL_AXES),
  cache_bksh=P("data", MODEL_AXES, None, None),
  tokens_bt=P("data", None),
)


def fit_spec(spec: P, shape: tuple[int, ...], mesh: Mesh) -> P:
  """Drops mesh axes that do not divide their dimension, replicating it instead.

  Tiny test models (2 kv heads on a tp=4 mesh) and odd vocabularies stay loadable; real
  checkpoints on sensible meshes keep their full spec.
  """
  fitted = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = math.prod(mesh.shape[n] for n in names)
    fitted.append(axes if names and dim % size == 0 else None)
  return P(*fitted)


def named(mesh: Mesh, spec: P, shape: tuple[int, ...]) -> NamedSharding:
  return NamedSharding(mesh, fit_spec(spec, shape, mesh))


def param_shardings(model, mesh: Mesh, config: ShardingConfig | None = None) -> dict[str, Any]:
  """NamedSharding for every parameter of a `lm.model.Qwen`, keyed like `nnx.state(model)`."""
  from lm import model as model_lib

  config = config or ShardingConfig()
  axes = model_lib.param_axes(model.config, tuple(n for n, _ in _iter_params(model)))
  return {
    path: named(mesh, config.weight_spec(axes[path]), tuple(var.shape)) for path, var in _iter_params(model)
  }


def shard_model(model, mesh: Mesh, config: ShardingConfig | None = None):
  """Moves every parameter of `model` onto its sharding in place and returns the model.

  Also records the activation sharding so the forward pass pins the residual stream's layout.
  """
  from lm import model as model_lib

  config = config or ShardingConfig()
  shardings = param_shardings(model, mesh, config)
  for path, var in _iter_params(model):
    var[...] = jax.device_put(var[...], shardings[path])
  model.activation_sharding = model_lib.ActivationSharding(NamedSharding(mesh, config.act_btd))
  return model


def batch_sharding(mesh: Mesh, shape: tuple[int, ...], config: ShardingConfig | None = None):
  """Sharding of a [B, ...] batch array: rows over (data, fsdp), the rest replicated."""
  config = config or ShardingConfig()
  return named(mesh, P(*config.tokens_bt[:1]), shape)


def _iter_params(model):
  from flax import nnx

  for path, var in nnx.iter_graph(model):
    if isinstance(var, nnx.Param):
      yield ".".join(str(p) for p in path), var
