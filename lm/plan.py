"""Plan before you rent: a preset's programs compiled ahead of time for a target (docs/scale.md).

As maxtext's `train_compile` does: the weights are `jax.ShapeDtypeStruct`s with the shardings the
run would give them (`nnx.eval_shape`, `lm.sharding`), laid on a mesh of a target's devices —
libtpu's topology descriptions for TPU slices, XLA:GPU's deviceless target (a
`GpuTargetConfigProto`, `lm/targets/*.textproto`) for GPU nodes, or this host's CPU devices (tests)
— and each program is lowered and compiled; nothing is materialised. Per device it reads XLA's
memory analysis (arguments, outputs, aliased, temporaries) and cost analysis (FLOPs, bytes; XLA:GPU
returns none, so those come from `forward_flops`' counts), and a roofline time: max(FLOPs / peak, bytes /
bandwidth). Every figure carries its source: "compile" or "model".

The TPU and CUDA compilers need their own venvs (scripts/plan_venvs.sh); `launch.plan` runs this
module in them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from lm import memory
from lm import model as model_lib
from lm import sharding as sharding_lib
from lm.config import ModelConfig
from lm.model import Qwen

GiB = 2**30
HEADROOM = 0.10  # the share of the memory JAX may use that a plan leaves free (`budget`)
TARGET_DIR = os.path.join(os.path.dirname(__file__), "targets")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
  """A machine to plan for: its devices and their published figures (per chip).

  platform: "tpu" (libtpu topology `topology`, e.g. "v5p:2x2x1"), "cuda" (`target_config`, a text
  proto under lm/targets, `devices` GPUs over `slices` hosts), "cpu" (this host's devices; tests)
  or "local" (this host's accelerators, `local_target`: the device check).
  hbm_bytes: memory per device; hbm_bandwidth: bytes/s; peak_flops: dense bf16 FLOP/s.
  slices: TPU slices joined over the data-center network (DCN), or GPU nodes joined over their
    network; the mesh's data axis is outermost across them (`across_slices`), fsdp and tp within.
  dcn_bandwidth: bytes/s per device between slices or nodes (published; 0: one slice or node).
  """

  name: str
  platform: str
  devices: int
  hbm_bytes: int
  hbm_bandwidth: float
  peak_flops: float
  topology: str = ""
  target_config: str = ""
  note: str = ""
  slices: int = 1
  dcn_bandwidth: float = 0.0


# Published per-chip figures (Google Cloud TPU docs; NVIDIA datasheets, SXM parts). A TPU "-N" name
# counts TensorCores for v5p (2 a chip: v5p-8 is 4 chips) and chips for v5e / v6e. Past one slice or
# node: "2xv5p-64" is two v5p-64 slices over DCN (Cloud TPU's v5p table: 50 Gbps DCN a chip, against
# 1,200 GB/s ICI within a slice); "2xh100x8" two 8-GPU H100 nodes (DGX H100: one 400 Gb/s
# ConnectX-7 NIC a GPU, 50 GB/s, against NVLink's 900 GB/s within a node). CUDA's deviceless
# topology is "<NVLink domains>x<hosts a domain>x<GPUs a host>": each node its own NVLink domain.
TARGETS = {
  t.name: t
  for t in (
    Target(name="v5e-8", platform="tpu", topology="v5e:2x4", devices=8, hbm_bytes=16 * GiB,
           hbm_bandwidth=819e9, peak_flops=197e12),
    Target(name="v6e-8", platform="tpu", topology="v6e:2x4", devices=8, hbm_bytes=32 * GiB,
           hbm_bandwidth=1640e9, peak_flops=918e12),
    Target(name="v5p-8", platform="tpu", topology="v5p:2x2x1", devices=4, hbm_bytes=95 * GiB,
           hbm_bandwidth=2765e9, peak_flops=459e12, note="4 chips"),
    Target(name="v5p-64", platform="tpu", topology="v5p:2x4x4", devices=32, hbm_bytes=95 * GiB,
           hbm_bandwidth=2765e9, peak_flops=459e12, note="32 chips"),
    Target(name="2xv5p-64", platform="tpu", topology="v5p:2x4x4", devices=64, hbm_bytes=95 * GiB,
           hbm_bandwidth=2765e9, peak_flops=459e12, slices=2, dcn_bandwidth=50e9 / 8,
           note="2 slices x 32 chips over DCN"),
    Target(name="h100x1", platform="cuda", target_config="h100_sxm_80gb.textproto", devices=1,
           hbm_bytes=84_942_979_072, hbm_bandwidth=3.35e12, peak_flops=989e12),
    Target(name="h100x8", platform="cuda", target_config="h100_sxm_80gb.textproto", devices=8,
           hbm_bytes=84_942_979_072, hbm_bandwidth=3.35e12, peak_flops=989e12),
    Target(name="2xh100x8", platform="cuda", target_config="h100_sxm_80gb.textproto", devices=16,
           hbm_bytes=84_942_979_072, hbm_bandwidth=3.35e12, peak_flops=989e12, slices=2,
           dcn_bandwidth=400e9 / 8, note="2 nodes x 8 GPUs over InfiniBand"),
    Target(name="h200x1", platform="cuda", target_config="h200_141gb.textproto", devices=1,
           hbm_bytes=150_754_820_096, hbm_bandwidth=4.8e12, peak_flops=989e12),
    Target(name="h200x8", platform="cuda", target_config="h200_141gb.textproto", devices=8,
           hbm_bytes=150_754_820_096, hbm_bandwidth=4.8e12, peak_flops=989e12),
  )
}  # fmt: skip
TPU_TARGETS = tuple(n for n, t in TARGETS.items() if t.platform == "tpu")
GPU_TARGETS = tuple(n for n, t in TARGETS.items() if t.platform == "cuda")


def cpu_target(devices: int, hbm_bytes: int) -> Target:
  """This host's first `devices` CPU devices, each given a `hbm_bytes` budget (tests, smoke runs).
  The roofline figures are nominal (1 TFLOP/s, 100 GB/s)."""
  return Target(name=f"cpu-{devices}", platform="cpu", devices=devices, hbm_bytes=hbm_bytes,
                hbm_bandwidth=100e9, peak_flops=1e12)  # fmt: skip


def pool_bytes(target: Target) -> int:
  """Per device, the memory JAX may use on `target`: on a GPU its allocator's share of the card
  (`lm.memory.gpu_fraction`: what the launchers set, or the user's `XLA_PYTHON_CLIENT_MEM_FRACTION`),
  elsewhere the whole memory. A local target already reports its allocator's limit."""
  if target.platform == "cuda":
    return int(memory.gpu_fraction() * target.hbm_bytes)
  return target.hbm_bytes


def budget(target: Target, headroom: float = HEADROOM) -> int:
  """Per device, the most a planned program's peak may be: `pool_bytes` less `headroom` of it, left
  for what a compile does not see (allocator fragmentation, runtime workspaces)."""
  return int((1 - headroom) * pool_bytes(target))


# `jax.Device.device_kind` as the runtimes report it (exactly: an H100 PCIe or an H200 NVL has other
# figures and no entry) → the chip family of `TARGETS`. A v5p reports "TPU v5", a v5e "TPU v5 lite".
KINDS = {
  "NVIDIA H200": "h200",
  "NVIDIA H100 80GB HBM3": "h100",
  "TPU v5": "v5p",
  "TPU v5p": "v5p",
  "TPU v5 lite": "v5e",
  "TPU v5e": "v5e",
  "TPU v6 lite": "v6e",
  "TPU v6e": "v6e",
}


def kind_target(kind: str, devices: int) -> str:
  """The `TARGETS` name of `devices` local devices of `kind` ("NVIDIA H200", 1 → "h200x1";
  "TPU v5", 4 → "v5p-8": a v5p-N name counts TensorCores, two a chip), "" for an unknown kind. The
  name may be one the table does not plan (`TARGETS` has no "h200x2")."""
  family = KINDS.get(kind, "")
  if not family:
    return ""
  if family.startswith("h"):
    return f"{family}x{devices}"
  return f"{family}-{2 * devices if family == 'v5p' else devices}"


def local_target() -> Target:
  """This host's devices as a target (the device check measures there): per-device memory as the
  device reports it (on a GPU, JAX's allocator pool), bandwidth and peak FLOP/s from the `TARGETS`
  entry of its kind (`KINDS`); CPU devices get `cpu_target`'s nominal figures."""
  devices = jax.local_devices()
  if devices[0].platform == "cpu":
    return cpu_target(len(devices), 16 * GiB)
  kind = devices[0].device_kind
  family = KINDS.get(kind, "")
  known = next((t for name, t in TARGETS.items() if family and name.startswith(family)), None)
  stats = devices[0].memory_stats() or {}
  hbm = stats.get("bytes_limit") or (known.hbm_bytes if known else 0)
  return Target(
    name=kind_target(kind, len(devices)) or f"local {kind} x{len(devices)}",
    platform="local",
    devices=len(devices),
    hbm_bytes=int(hbm),
    hbm_bandwidth=known.hbm_bandwidth if known else float("nan"),
    peak_flops=known.peak_flops if known else float("nan"),
    note=f"figures of {known.name}" if known else f"no published figures for device kind {kind!r}",
  )


def target_devices(target: Target) -> list:
  """The target's devices: abstract ones from a topology description (TPU, CUDA), else this host's."""
  if target.platform == "local":
    return jax.local_devices()[: target.devices]
  if target.platform == "cpu":
    devices = jax.devices("cpu")
    if len(devices) < target.devices:
      raise ValueError(
        f"target {target.name}: {target.devices} CPU devices asked, this host has {len(devices)}"
      )
    return devices[: target.devices]
  from jax.experimental import topologies

  if target.platform == "tpu":
    slices = {"num_slices": target.slices} if target.slices > 1 else {}
    desc = topologies.get_topology_desc(platform="tpu", topology_name=target.topology, **slices)
    return list(desc.devices)
  with open(os.path.join(TARGET_DIR, target.target_config)) as f:
    text = f.read()
  topology = f"{target.slices}x1x{target.devices // target.slices}"  # NVLink domains x hosts x GPUs
  desc = topologies.get_topology_desc(platform="cuda", target_config=text, topology=topology)
  return list(desc.devices)


def across_slices(mesh: sharding_lib.MeshConfig, target: Target) -> sharding_lib.MeshConfig:
  """`mesh` on a target of several slices or nodes: the preset's mesh within one slice, data
  parallel across them (data x slices), so that only the gradients' all-reduce crosses the slow
  network; `mesh` itself on one slice, or when its data axis is already a multiple of the slices."""
  if target.slices == 1:
    return mesh
  data, fsdp, tp = mesh.shape(target.devices)
  if data % target.slices == 0:
    return sharding_lib.MeshConfig(data=data, fsdp=fsdp, tp=tp)
  data, fsdp, tp = mesh.shape(target.devices // target.slices)
  return sharding_lib.MeshConfig(data=data * target.slices, fsdp=fsdp, tp=tp)


def mesh_label(mesh: sharding_lib.MeshConfig, devices: int) -> str:
  data, fsdp, tp = mesh.shape(devices)
  return f"mesh data={data} fsdp={fsdp} tp={tp}"


def mesh_candidates(
  target: Target, config: ModelConfig, first: sharding_lib.MeshConfig
) -> list[tuple[sharding_lib.MeshConfig, str]]:
  """The (data, fsdp, tp) meshes a plan searches over `target`'s devices, in order, each with a note.

  First `first` (the preset's mesh, `across_slices`), so a preset that fits keeps its mesh. Then
  every other factorisation, the least communication first, as the remat candidates run fastest
  first: fewer tp (tp exchanges activations in every layer), then more data (data parallelism
  exchanges only the gradients, fsdp gathers the weights in every layer). On several slices or
  nodes data is a multiple of them (only data parallelism crosses the slow network). tp splits the
  attention heads, so it must divide them; where it does not divide the KV heads the KV projections
  and cache are replicated over it (`lm.sharding.fit_spec`), which the note says.
  """
  n, slices = target.devices, target.slices
  divisors = [d for d in range(1, n + 1) if n % d == 0]
  out = [sharding_lib.MeshConfig(*first.shape(n))]
  for tp in divisors:
    if config.num_heads % tp:
      continue
    for data in sorted((d for d in divisors if (n // tp) % d == 0), reverse=True):
      mesh = sharding_lib.MeshConfig(data=data, fsdp=n // tp // data, tp=tp)
      if data % slices == 0 and mesh not in out:
        out.append(mesh)

  def note(mesh: sharding_lib.MeshConfig) -> str:
    if config.num_kv_heads % mesh.tp:
      kv = config.num_kv_heads
      return f"tp={mesh.tp} does not divide the {kv} KV heads: KV projections and cache replicated"
    return ""

  return [(m, note(m)) for m in out]


def kv_row_bytes(config: ModelConfig, slots: int, itemsize: int) -> int:
  """Bytes of one row's KV cache of `slots` positions: keys and values of every layer's KV heads."""
  return 2 * config.num_layers * config.num_kv_heads * config.head_dim * slots * itemsize


def sampler_floor(
  config: ModelConfig, dtype: Any, shape: tuple[int, int, int], rows: int, length: int
) -> int:
  """A lower bound on the sampler's per-device peak on a (data, fsdp, tp) mesh (a model): its weights
  split over every model axis (the decode layout, `lm.sharding.DECODE_SHARDING`) and the KV cache of
  its rows over data and over the KV heads at most. Replication, bucketing and temporaries only add
  to it, so a mesh whose floor exceeds the budget cannot fit and is not compiled."""
  data, fsdp, tp = shape
  itemsize = jnp.dtype(dtype).itemsize
  weights = param_count(config) * itemsize / (fsdp * tp)
  kv = math.ceil(rows / data) * kv_row_bytes(config, length, itemsize) / min(fsdp * tp, config.num_kv_heads)
  return int(weights + kv)


def target_mesh(devices: Sequence, mesh: sharding_lib.MeshConfig) -> Mesh:
  """The run's (data, fsdp, tp) mesh over the target's devices, in their order (a GPU node's
  devices are contiguous, so data outermost splits nodes first); over several TPU slices as
  `lm.sharding.make_mesh` lays it (data across slices)."""
  shape = mesh.shape(len(devices))
  if sharding_lib.slice_count(devices) > 1:
    return Mesh(sharding_lib.device_grid(shape, devices), sharding_lib.MESH_AXES)
  return Mesh(np.asarray(devices, dtype=object).reshape(shape), sharding_lib.MESH_AXES)


# ---- figures ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProgramPlan:
  """One compiled program's per-device figures.

  arguments, outputs, aliased, temporaries: XLA's memory analysis (bytes; source "compile").
  resident: bytes of run state that lives on the device beside this program but is not one of its
    arguments (the optimiser state while gradients accumulate; source "model": shapes × shardings).
  peak: arguments + outputs − aliased + temporaries + resident.
  flops, bytes_accessed: per device per call, from the compile's cost analysis where the compiler
    gives one, else from `model_flops` (their `*_source` says which).
  seconds: the roofline max(model FLOPs / peak FLOP/s, model bytes / bandwidth) (a model, always:
    XLA's cost analysis counts a while loop's body once, so compile figures of looped programs
    — the scan over layers, the decode loop — under-count by the trip count).
  """

  name: str
  arguments: int
  outputs: int
  aliased: int
  temporaries: int
  resident: int
  flops: float
  flops_source: str
  bytes_accessed: float
  bytes_source: str
  seconds: float
  model_flops: float = 0.0
  model_bytes: float = 0.0
  detail: str = ""

  @property
  def peak(self) -> int:
    return self.arguments + self.outputs - self.aliased + self.temporaries + self.resident


def refusal(error: Exception) -> str | None:
  """The compiler's out-of-memory refusal in `error` (libtpu refuses a program whose temporaries
  exceed the chip's HBM at compile time), else None: a plan treats it as a candidate that does not fit."""
  text = str(error)
  return text.split("\n")[0][:300] if "RESOURCE_EXHAUSTED" in text else None


def tree_bytes(tree: Any) -> int:
  """Bytes per device of a tree of (abstract or real) sharded arrays: each leaf's shard."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.shape
    sharding = getattr(leaf, "sharding", None)
    if sharding is not None:
      shape = sharding.shard_shape(shape)
    total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
  return total


def compile_program(
  name: str,
  fn: Callable,
  args: Sequence[Any],
  kwargs: dict[str, Any],
  target: Target,
  *,
  model: tuple[float, float],
  resident: int = 0,
  detail: str = "",
  describe: Callable[[Any], str] | None = None,
) -> ProgramPlan:
  """Lowers and compiles `fn(*args, **kwargs)` (abstract arguments) and reads its figures; `model`
  = (FLOPs, bytes) per device from `forward_flops`' counts, used where the compile gives none;
  `describe(compiled)` adds to `detail`."""
  with model_lib.lowering_for(target.platform):  # the target's products, not this CPU host's
    compiled = fn.lower(*args, **kwargs).compile()
  return figures(name, compiled, target, model=model, resident=resident, detail=detail, describe=describe)


def release() -> None:
  """Frees what a search's compiles left behind before the next candidate: JAX's in-memory caches
  (traces, lowerings, executables), Python's garbage, and the C heap's free pages (glibc keeps them
  otherwise). Why: a KACE TPU search held 19.7 GB after five compiles of the 32B teacher here, so
  two searches could not share a 24 GiB host (docs/results/2026-12-05-plan-table.md). Measured on
  the 0.6B solver's sampler for v5e-8, four compiles in one process: resident memory 3.9, 5.7,
  6.7, 7.2 GiB after each without this, 3.9, 4.5, 4.7, 4.2 GiB with it (2026-12-05)."""
  jax.clear_caches()
  gc.collect()
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):  # not glibc: the pages stay with the allocator
    pass


def figures(
  name: str,
  compiled: Any,
  target: Target,
  *,
  model: tuple[float, float],
  resident: int = 0,
  detail: str = "",
  describe: Callable[[Any], str] | None = None,
) -> ProgramPlan:
  """The `ProgramPlan` of an already compiled program (`compile_program`'s figures)."""
  if describe is not None:
    detail = f"{detail}; {describe(compiled)}" if detail else describe(compiled)
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  flops, flops_source = model[0], "model"
  bytes_accessed, bytes_source = model[1], "model"
  if cost and cost.get("flops", 0) > 0:
    flops, flops_source = float(cost["flops"]), "compile"
  if cost and cost.get("bytes accessed", 0) > 0:
    bytes_accessed, bytes_source = float(cost["bytes accessed"]), "compile"
  # XLA's cost analysis counts a while loop's body once (the scan over layers, the decode loop), so
  # the compile's figures under-count looped programs: the roofline reads the counted model.
  seconds = roofline_seconds(model, target)
  return ProgramPlan(
    name=name,
    arguments=int(mem.argument_size_in_bytes),
    outputs=int(mem.output_size_in_bytes),
    aliased=int(mem.alias_size_in_bytes),
    temporaries=int(mem.temp_size_in_bytes),
    resident=resident,
    flops=flops,
    flops_source=flops_source,
    bytes_accessed=bytes_accessed,
    bytes_source=bytes_source,
    seconds=seconds,
    model_flops=model[0],
    model_bytes=model[1],
    detail=detail,
  )


def roofline_seconds(model: tuple[float, float], target: Target) -> float:
  """The roofline time of a program's model (FLOPs, bytes) per device on `target`: the larger of its
  FLOPs at the peak FLOP/s and its bytes at the memory bandwidth."""
  return max(model[0] / target.peak_flops, model[1] / target.hbm_bandwidth)


def forward_flops(config: ModelConfig, rows: int, length: int) -> float:
  """Matmul FLOPs of one forward pass over [rows, length] tokens: 2 · (weights in matmuls) per
  token, plus causal attention's 2 · 2 · L · length/2 · heads · head_dim per token."""
  c = config
  attn_proj = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
  mlp = 3 * c.hidden_size * c.intermediate_size
  per_token = 2 * c.num_layers * (attn_proj + mlp) + 2 * c.hidden_size * c.vocab_size
  per_token += 2 * 2 * c.num_layers * (length / 2) * c.num_heads * c.head_dim
  return per_token * rows * length


def param_count(config: ModelConfig) -> int:
  c = config
  attn = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
  layer = attn + 3 * c.hidden_size * c.intermediate_size
  head = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size
  return c.num_layers * layer + c.vocab_size * c.hidden_size + head


# ---- abstract models -----------------------------------------------------------------------------


def abstract_model(config: ModelConfig, dtype: Any, mesh: Mesh, shard: sharding_lib.ShardingConfig) -> Qwen:
  """The model with `ShapeDtypeStruct` parameters carrying their shardings on `mesh`, and the
  activation sharding `lm.sharding.shard_model` would record."""
  from lm import model as model_lib

  model = nnx.eval_shape(lambda: Qwen(config, rngs=nnx.Rngs(0), param_dtype=jnp.dtype(dtype)))
  shardings = sharding_lib.param_shardings(model, mesh, shard)
  for path, var in sharding_lib._iter_params(model):
    value = var.get_value()
    var.set_value(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=shardings[path]))
  model.activation_sharding = model_lib.ActivationSharding(NamedSharding(mesh, shard.act_btd))
  return model


def abstract(tree: Any, mesh: Mesh, spec: P | None = None) -> Any:
  """`ShapeDtypeStruct`s of a tree's leaves, each with sharding `spec` on `mesh` (default: replicated)."""
  spec = P() if spec is None else spec
  return jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x), sharding=NamedSharding(mesh, spec)), tree
  )


def abstract_rows(arrays: dict[str, np.ndarray], mesh: Mesh, shard: sharding_lib.ShardingConfig) -> dict:
  """A batch dict as `ShapeDtypeStruct`s, rows split like `lm.sharding.batch_sharding`."""
  return {
    k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding_lib.batch_sharding(mesh, v.shape, shard))
    if v.ndim
    else jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, P()))
    for k, v in arrays.items()
  }


# ---- the sampler -------------------------------------------------------------------------------


def sampler_platform(target: Target) -> str:
  """Whose form of the sampler's program a target runs: its own; on CPU (a CPU target, tests; a
  dry run on a CPU host) the accelerators' one-program form, so its figures are those of one
  program as on the real targets (XLA:CPU runs the prefill as a program of its own)."""
  platform = jax.default_backend() if target.platform == "local" else target.platform
  return "cuda" if platform == "cpu" else platform


def sampler_held(model: Qwen, mesh: Mesh, config: Any) -> tuple[int, int]:
  """Per device, what one `lm.sampler.Sampler` of `model` keeps between calls beside the model's own
  arrays: (its [D, V] head, the decode layout's copy of the weights where it differs; 0 if none). A
  trainer holds these for every role's sampler through the train step (`ShapedSampler`)."""
  from lm import sampler as sampler_lib

  shaped = sampler_lib.shaped_programs(model, mesh, rows=1, prompt_len=1, new_tokens=1, config=config)
  return shaped.head_bytes, shaped.copy_bytes


def sampler_model(
  config: ModelConfig,
  *,
  prompts: int,
  prompt_len: int,
  steps: int,
  n: int,
  weights_bytes: int,
  devices: int,
  itemsize: int,
  cache_steps: int | None = None,
) -> tuple[float, float]:
  """Per device, the model (FLOPs, bytes) of the sampler's program: the prefill's forward over
  `prompts` prompts of `prompt_len` tokens, then `steps` decode steps of `prompts` x `n` rows, each
  reading this device's weights (`weights_bytes` as sharded; a program that gathers them reads more:
  see the compile's bytes) and its rows' KV cache of `prompt_len` + `cache_steps` positions (default
  `steps`). An accelerator's decode step reads its cache buffer whole, so a run stopped after fewer
  steps than its program was compiled for (the device check's truncated rows) passes the compiled
  `cache_steps`: its model is then the compiled program's, prefill and `steps` of its steps."""
  decode_rows = prompts * n
  kv = kv_row_bytes(config, prompt_len + (steps if cache_steps is None else cache_steps), itemsize)
  flops = forward_flops(config, prompts, prompt_len) + 2 * param_count(config) * decode_rows * steps
  return flops / devices, steps * (weights_bytes + kv * decode_rows / devices)


def sampler_program(
  model: Qwen,
  mesh: Mesh,
  target: Target,
  *,
  rows: int,
  prompt_len: int,
  new_tokens: int,
  n: int,
  config: Any,
  resident: int = 0,
  shaped: Any = None,
  compiled: Any = None,
) -> ProgramPlan:
  """The sampler's prefill-and-decode program (`lm.sampler.shaped_programs`, the target's form)
  for a chunk of `rows` decode rows (`rows // n` prompts of `prompt_len` tokens, `n` samples each,
  `new_tokens` new tokens), as `lm.sampler.Sampler(model, mesh=mesh, config=config)` compiles it:
  the weights in its decode layout, the shapes bucketed as its `generate` buckets them. A caller
  that runs the program (the device check) passes the `shaped` programs it built for those
  arguments and their `compiled` program, which is then read, not compiled again."""
  from lm import sampler as sampler_lib

  shaped = shaped or sampler_lib.shaped_programs(
    model, mesh, rows=rows, prompt_len=prompt_len, new_tokens=new_tokens, n=n, config=config,
    platform=sampler_platform(target),
  )  # fmt: skip
  (call,) = shaped.programs  # the accelerator form: one program, prefill then decode
  cfg, steps, prompts = model.config, shaped.steps, shaped.prompts
  weights = tree_bytes(shaped.weights)
  flops, bytes_model = sampler_model(
    cfg, prompts=prompts, prompt_len=shaped.prompt_len, steps=steps, n=n, weights_bytes=weights,
    devices=mesh.devices.size, itemsize=model.dtype.itemsize,
  )  # fmt: skip
  kv = kv_row_bytes(cfg, shaped.prompt_len + steps, model.dtype.itemsize) * prompts * n / GiB
  detail = (
    f"{prompts} prompts x n={n} compiled ({rows} rows asked), prompt {shaped.prompt_len}, "
    f"{steps} new tokens; KV {kv:.1f} GiB (all rows)"
  )
  model_axes = math.prod(mesh.shape[a] for a in ("fsdp", "tp") if a in mesh.shape)
  replicated_kv = cfg.num_kv_heads % model_axes != 0

  def gathered(compiled) -> str:  # what the program all-gathers outside its loops (held through them)
    outside = sampler_lib.gathered_bytes(compiled.as_text()).get("outside", 0) / GiB
    note = (
      f"; {cfg.num_kv_heads} KV heads do not divide the {model_axes} model-axis devices, so the KV "
      "projections and the prompt cache are replicated and gathered"
      if replicated_kv
      else ""
    )
    return (
      f"weights {weights / GiB:.2f} GiB/device as sharded; all-gather results outside loops "
      f"{outside:.2f} GiB (weights or activations, summed, not all live at once){note}"
    )

  if compiled is not None:
    return figures(
      "sample", compiled, target, model=(flops, bytes_model), resident=resident, detail=detail,
      describe=gathered,
    )  # fmt: skip
  return compile_program(
    "sample", call.fn, call.args, call.kwargs, target, model=(flops, bytes_model), resident=resident,
    detail=detail, describe=gathered,
  )  # fmt: skip


# ---- a generator's sampler, as a config section gives it ----------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checked:
  """A config's programs as given (no search): what a launcher's `--dry_run` prints (`run_plan`)."""

  programs: list[ProgramPlan]
  fits: bool
  overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
  tried: tuple[str, ...] = ()
  notes: tuple[str, ...] = ()  # what was not planned, and why


def generator_model(role: dict) -> ModelConfig | None:
  """The model of a generator section (`lm.generators.GeneratorConfig` fields): its checkpoint's
  config.json where the directory is there, else its `preset`; None when neither names one."""
  checkpoint = os.path.expanduser(role.get("checkpoint") or "")
  if checkpoint and os.path.exists(os.path.join(checkpoint, "config.json")):
    return ModelConfig.from_hf(checkpoint)
  return ModelConfig.preset(role["preset"]) if role.get("preset") else None


def generator_program(
  name: str,
  model_cfg: ModelConfig,
  role: dict,
  target: Target,
  *,
  rows: int,
  prompt_len: int,
  new_tokens: int,
) -> ProgramPlan:
  """The sampler program of a generator section on `target`: its mesh, dtype and sampler settings,
  `rows` rows of `prompt_len` prompt tokens and `new_tokens` new ones (n = 1), named `name`."""
  from lm.sampler import SamplerConfig

  mesh_cfg = sharding_lib.MeshConfig(**role["mesh"])
  devices = target_devices(target)
  if (mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tp) == (1, 1, 1):  # no mesh: the generator's one device
    devices = devices[:1]
  mesh = target_mesh(devices, mesh_cfg)
  model = abstract_model(model_cfg, role["dtype"], mesh, sharding_lib.ShardingConfig())
  sampler = SamplerConfig(**{**role["sampler"], "max_rows": rows})
  program = sampler_program(
    model, mesh, target, rows=rows, prompt_len=prompt_len, new_tokens=new_tokens, n=1, config=sampler
  )
  return dataclasses.replace(program, name=name)


def check_server(
  config: dict, target: Target, *, headroom: float = HEADROOM, prompt_tokens: int = 2048
) -> Checked:
  """`launch.serve --dry_run` (configs/serve.py): the server's sampler at its largest batch
  (`server.max_batch_prompts` prompts, n = 1, `server.max_tokens` new tokens, prompts of
  `prompt_tokens`: an assumption, stated in the program's notes)."""
  model_cfg = generator_model(config["model"])
  if model_cfg is None:
    return Checked(programs=[], fits=False, notes=("model: neither a checkpoint directory nor a preset",))
  server = config["server"]
  program = generator_program(
    "sample", model_cfg, config["model"], target, rows=server["max_batch_prompts"], prompt_len=prompt_tokens,
    new_tokens=server["max_tokens"],
  )  # fmt: skip
  return Checked(programs=[program], fits=program.peak <= budget(target, headroom))


# ---- runs and the table ------------------------------------------------------------------------


def target_names(spec: str) -> list[str]:
  """Target names of a flag value: names, comma-separated, or "tpu" / "gpu" / "all"."""
  groups = {"tpu": list(TPU_TARGETS), "gpu": list(GPU_TARGETS), "all": list(TARGETS)}
  names = [n for part in spec.split(",") for n in groups.get(part.strip(), [part.strip()])]
  unknown = [n for n in names if n not in TARGETS]
  if unknown:
    raise ValueError(f"unknown targets {unknown}; known: {list(TARGETS)} or tpu, gpu, all")
  return names


def target_record(preset: str, target: Target, headroom: float) -> dict:
  """What every plan record says of its preset and target: the devices, the memory and the budget."""
  record = dict(
    preset=preset, target=target.name, platform=target.platform, devices=target.devices,
    hbm_gib=target.hbm_bytes / GiB, pool_gib=pool_bytes(target) / GiB,
    budget_gib=budget(target, headroom) / GiB, headroom=headroom, jax=jax.__version__,
  )  # fmt: skip
  if target.slices > 1:
    record |= dict(slices=target.slices, dcn_gbps=target.dcn_bandwidth * 8 / 1e9)
  if target.platform == "cuda":
    record["mem_fraction"] = memory.gpu_fraction()
  return record


def run_plan(choose: Callable, preset: str, config: dict, target: Target, headroom: float) -> dict:
  """A job's `choose(config, target, headroom=...)` as a JSON-able record (its error, if the
  compiler refused every candidate)."""
  record = target_record(preset, target, headroom)
  try:
    choice = choose(config, target, headroom=headroom)
  except Exception as e:  # noqa: BLE001 -- a compiler's refusal is the plan's finding
    return {**record, "fits": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
  programs = [{**dataclasses.asdict(p), "peak": p.peak} for p in choice.programs]
  flags = [f"--config.{k}={v}" for k, v in choice.overrides.items()]
  tried, notes = list(choice.tried), list(getattr(choice, "notes", ()))
  return {**record, "fits": choice.fits, "overrides": choice.overrides, "flags": flags, "programs": programs,
          "tried": tried, **({"notes": notes} if notes else {})}  # fmt: skip


def record_budget(record: dict) -> float:
  """GiB per device a record's programs had to fit in; records written before the plan knew the
  GPU allocator's pool (no `budget_gib`) were planned against the whole memory."""
  return record.get("budget_gib", (1 - record["headroom"]) * record["hbm_gib"])


def _pool_words(record: dict) -> str:
  if "mem_fraction" in record:
    return f"{record['mem_fraction']:g} of the card, XLA_PYTHON_CLIENT_MEM_FRACTION"
  return "the whole memory"


def summary(record: dict) -> str:
  """A plan record as a few lines of text."""
  head = f"{record['preset']} on {record['target']} ({record['devices']} x {record['hbm_gib']:.1f} GiB"
  if record.get("slices", 1) > 1:
    head += f"; {record['slices']} slices / nodes, {record['dcn_gbps']:g} Gb/s a device between them"
  head += ")"
  if "error" in record:
    return f"{head}: no plan: {record['error']}"
  verdict = "fits" if record["fits"] else "DOES NOT FIT"
  free = f"{record['headroom']:.0%} left free"
  lines = [f"{head}: {verdict} in {record_budget(record):.1f} GiB ({_pool_words(record)}, {free})"]
  for p in record["programs"]:
    lines.append(
      f"  {p['name']:<10} peak {p['peak'] / GiB:7.2f} GiB (args {p['arguments'] / GiB:.2f}, temps "
      f"{p['temporaries'] / GiB:.2f}, resident {p['resident'] / GiB:.2f}); {p['flops']:.3g} FLOPs "
      f"[{p['flops_source']}], {p['bytes_accessed']:.3g} B [{p['bytes_source']}]; "
      f"roofline {p['seconds']:.3g} s" + (f"; {p['detail']}" if p["detail"] else "")
    )
  lines += [f"  tried first: {t}" for t in record.get("tried", [])]
  lines += [f"  note: {n}" for n in record.get("notes", [])]
  lines.append("  overrides: " + " ".join(record["flags"]))
  return "\n".join(lines)


COLUMNS = (
  "target",
  "fit",
  "program",
  "args GiB",
  "temps GiB",
  "peak GiB",
  "of HBM",
  "FLOPs",
  "bytes",
  "roofline s",
  "notes",
)


def render(records: list[dict], *, date: str) -> str:
  """docs/scale.md: every (preset, target) plan, one row per program, the sources marked; of a
  (preset, target) planned more than once, the newest record (the last in `records`)."""
  records = list({(r["preset"], r["target"]): r for r in records}.values())
  out = [
    "# Scale: the paper presets planned for TPU slices and GPU nodes",
    "",
    f"Generated {date} by `scripts/plan_table.sh` (`python -m launch.plan ...",
    "--out=docs/results/plan.jsonl`, then `python -m launch.plan --render=docs/results/plan.jsonl`);",
    "do not edit by hand. Each program is",
    "compiled ahead of time on a CPU host for the target (`lm/plan.py`): TPU through libtpu's topology",
    "descriptions, GPU through XLA:GPU's deviceless compile against `lm/targets/*.textproto`.",
    "",
    "Columns, per device: **args / temps / peak** — XLA's memory analysis of the compiled program",
    "(*compile*); peak = arguments + outputs − aliased + temporaries + resident, where *resident* is",
    "what the trainer keeps beside the program (a *model*, shapes × shardings): the optimiser state,",
    "and every role's sampler copies (its [D, V] output head, the decode layout's weights where they",
    "differ; records from before 2026-12-03's issue 48 leave these copies out). **FLOPs / bytes** — the",
    "compile's cost analysis where the compiler gives one (TPU, CPU: *c*), else counted (*m*: 2 FLOPs per",
    "matmul weight per token plus causal attention; `accumulate` = policy forward + backward +",
    "reference forward (+1 forward under full remat); decode reads the weights and the rows' KV cache",
    "every step). **roofline** — max(FLOPs / bf16 peak, bytes / HBM bandwidth) from the published",
    "figures in `lm/plan.py` (always a *model*). XLA's cost analysis counts a while loop's body once",
    "(the scan over 36 layers, the decode loop), so a *c* figure under-counts looped programs by the",
    'trip count; the roofline always reads the counted model ("—": a record written before the plan',
    "kept the model figures beside compile ones). **fit** — the program's peak within the record's",
    "budget: the memory JAX may use less the plan's headroom (`lm.plan.budget`). On a GPU that memory",
    "is the allocator's pool, `XLA_PYTHON_CLIENT_MEM_FRACTION` of the card (JAX's default 0.75; the",
    "launchers set 0.90 unless you set it, `lm/memory.py`); on a TPU the whole HBM. Records without a",
    "pool (before issue 48) were planned at 75% of the whole memory. A plan fits when every program does.",
    "",
    "Shapes are the presets' with stated assumptions (`dpa_grpo/plan.py`, `kace/plan.py`): prompts of",
    "2,048 tokens; DPA-GRPO's loss rows are prompt + its longest completion, bucketed as packing does,",
    "for the verifier role; its sampler at the config's `sampler.max_rows` rows a call (records before",
    "issue 48: 256), n = 1. KACE's solver at its preset's sampling budget, the most rows a call up to",
    "256 (records before 2026-12-05: up to the preset's `max_rows`), n = 1 (`sample`: what kace_eval",
    "runs); its teacher and curator, one model (Qwen3-32B where the preset names none), at up to their",
    "`max_rows`, a prompt of `learn.failures_per_prompt` failed traces of `learn.attempt_tokens` beside",
    "2,048 tokens and `role_sampling.max_tokens` new ones, with the solver's weights and sampler copies",
    "resident (`sample (teacher, curator)`), and the solver's program again with theirs resident",
    "(`sample (solver, in kace_build)`): kace_build keeps every role it loads. Where that does not fit,",
    "the solver is searched again beside them, and the preset carries the rows both launchers fit (the",
    "notes give kace_eval's own). Candidates whose weights and KV cache alone exceed the budget are not",
    "compiled (the tried lines say so). The",
    "notes give the prompt rows compiled (the sampler buckets them). A target's devices: a v5p-N name",
    "counts TensorCores (v5p-8 = 4 chips, v5p-64 = 32 chips). `--config=<file>:<preset>@<target>`",
    "applies a target's fitting overrides (configs/plan_targets.json, which `launch.plan --render`",
    "writes beside this table from the same records; tests/configs/targets_test.py checks both). The GPU",
    "targets' DPA-GRPO presets train with cuDNN's fused attention, which a deviceless compile cannot",
    "lower (no cuDNN library): their rows compile the blockwise attention in its place (an H200's own",
    "compiles: 119.1 GiB with cuDNN against 117.5 blockwise, the 4B step at 16 pairs;",
    "docs/results/2026-12-04-attention-choice.md).",
    "",
    "Past one host: `2xv5p-64` is two v5p-64 slices over the data-center network (libtpu's topology",
    "with `num_slices=2`; 50 Gb/s a chip), `2xh100x8` two 8-GPU H100 nodes (XLA:GPU's topology",
    '"2x1x8"; 400 Gb/s InfiniBand a GPU). Their mesh keeps the preset\'s within a slice or node and is',
    "data parallel across them (`lm.plan.across_slices`, laid out as `lm.sharding.make_mesh` lays a",
    "multi-slice run), so only the gradients' all-reduce crosses that network: its time is a *model*",
    "in the notes. The mesh: the preset's first; where it does not fit, every (data, fsdp, tp)",
    "factorisation of the devices, least communication first (`lm.plan.mesh_candidates`; tp divides",
    "the attention heads, the KV replicated where it does not divide the KV heads); the overrides",
    "below name each mesh ruled out. Records from before this search (commits before 28113de) tried",
    "the preset's mesh alone.",
    "",
  ]
  for preset in dict.fromkeys(r["preset"] for r in records):
    out += [
      f"## {preset}",
      "",
      "| " + " | ".join(COLUMNS) + " |",
      "|" + "---|" * len(COLUMNS),
    ]
    flags_by_target = []
    order = {name: i for i, name in enumerate(TARGETS)}
    for r in sorted((r for r in records if r["preset"] == preset), key=lambda r: order.get(r["target"], -1)):
      if "error" in r:
        out.append(f"| {r['target']} | no | — | | | | | | | | {r['error'][:160]} |")
        continue
      if not r["programs"]:  # every candidate refused or ruled out: no setting searched fits
        last = (r.get("tried") or ["refused"])[-1][:200]
        out.append(f"| {r['target']} | no | — | | | | | | | | no candidate fits; the last: {last} |")
        flags_by_target.append(f"- {r['target']}: none fits (tried: {'; '.join(r['tried'])})")
        continue
      for p in r["programs"]:
        share, fits = p["peak"] / GiB / r["hbm_gib"], p["peak"] / GiB <= record_budget(r)
        counted = "model_flops" in p or p["flops_source"] == "model"
        roofline = f"{p['seconds']:.3g}" if counted else "—"
        out.append(
          f"| {r['target']} | {'yes' if fits else 'no'} | {p['name']} | {p['arguments'] / GiB:.2f} | "
          f"{p['temporaries'] / GiB:.2f} | {p['peak'] / GiB:.2f} | {share:.0%} | "
          f"{p['flops']:.3g} ({p['flops_source'][0]}) | {p['bytes_accessed']:.3g} ({p['bytes_source'][0]}) | "
          f"{roofline} | {p['detail']} |"
        )
      tried = "".join(f"; before it, {t}" for t in r.get("tried", []))
      if r.get("given"):
        tried += f"; the plan started from `{' '.join(r['given'])}`"
      tried += "".join(f"; note: {n}" for n in r.get("notes", []))
      tried += f" (commit {r['commit']})" if r.get("commit") else ""
      flags_by_target.append(f"- {r['target']}: `{' '.join(r['flags'])}`{tried}")
    missing = [t for t in TARGETS if t not in {r["target"] for r in records if r["preset"] == preset}]
    out += ["", "Overrides the plan chose (`--config.*`):", "", *flags_by_target, ""]
    if missing:
      out += [f"Not in these records (not planned in this run): {', '.join(missing)}.", ""]
    planners: dict[str, list[str]] = {}
    for r in records:
      if r["preset"] == preset:
        planners.setdefault(r.get("planner", "none recorded"), []).append(r["target"])
    if len(planners) == 1 and "none recorded" not in planners:
      (only,) = planners
      out += [f"Every record above was planned by one planning code: `planner` {only} (launch/plan.py).", ""]
    else:
      out += ["The records above come from more than one planning code (`planner`, launch/plan.py):", ""]
      out += [f"- {p}: {', '.join(names)}" for p, names in planners.items()] + [""]
  return "\n".join(out) + "\n"
