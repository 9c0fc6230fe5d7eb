"""Orbax checkpoints of a train state that restore onto a mesh of any shape.

A checkpoint step holds two items: `state`, any pytree of arrays (model parameters as an
`nnx.State`, optax optimiser state, typed PRNG keys, counters), and `metadata`, a small JSON
dict (step, data cursor, anything a resumed run needs to pick up exactly where it stopped).

Why it is safe to resume after `kill -9`: orbax writes every step into a temporary directory
(`<step>.orbax-checkpoint-tmp-*`) and renames it to `<step>` only once every array and the
metadata are on disk (on object stores without atomic rename it writes `commit_success.txt`
last instead). A step without that finalisation is never listed, so `latest_step()` and
`restore(None, ...)` always see the newest *complete* checkpoint; leftovers of an interrupted
save are deleted when the next `CheckpointManager` opens the directory.

Why restoring onto another mesh works: arrays are stored as global arrays (tensorstore chunks,
independent of the writer's device layout) and `restore` reads each one straight onto the
`sharding` of its `jax.ShapeDtypeStruct` in the target, each host reading only its own shards.
The target is built by `abstract_params` / `abstract_opt_state` from a (possibly abstract) model
and a mesh, or by `abstract_like` from arrays that already live where the restored ones should.

In a multi-host job every process calls `save` and `restore` with the same arguments; orbax
coordinates the writes (each host writes its shards, the primary host the metadata).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Literal

import jax
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from orbax.checkpoint import checkpoint_managers

from lm import sharding as sharding_lib

PyTree = Any

_STATE = "state"
_METADATA = "metadata"


class CheckpointError(RuntimeError):
  """A checkpoint exists but cannot be restored into the requested target."""


class DamagedCheckpointError(CheckpointError):
  """A checkpoint step's files cannot be read (truncated, zeroed, missing): an older step may."""


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Which steps to keep and how to write them.

  Attributes:
    max_to_keep: the newest this many steps are kept (None keeps every step).
    best_metric: key of the `metrics` dict passed to `save` by which the best steps are kept in
      addition to the newest ones; None keeps no best steps.
    best_mode: "min" if a smaller `best_metric` is better (a loss), "max" if larger is (accuracy).
    keep_best: how many best steps to keep when `best_metric` is set.
    async_save: return from `save` once arrays are copied to host memory and write them in a
      background thread (the next `save`, `wait_until_finished` or `close` waits for it). A kill
      before the write finishes loses only that step: it was never finalised.
  """

  max_to_keep: int | None = 3
  best_metric: str | None = None
  best_mode: Literal["min", "max"] = "min"
  keep_best: int = 1
  async_save: bool = False

  def __post_init__(self):
    if self.best_mode not in ("min", "max"):
      raise ValueError(f"best_mode must be 'min' or 'max', got {self.best_mode!r}")
    if self.max_to_keep is not None and self.max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1 or None, got {self.max_to_keep}")

  def preservation_policy(self) -> checkpoint_managers.PreservationPolicy:
    latest = checkpoint_managers.LatestN(n=self.max_to_keep)
    if self.best_metric is None:
      return latest
    metric = self.best_metric
    best = checkpoint_managers.BestN(
      get_metric_fn=lambda metrics: metrics[metric],
      reverse=self.best_mode == "min",  # BestN keeps the tail of an ascending sort
      n=self.keep_best,
      keep_checkpoints_without_metrics=False,
    )
    return checkpoint_managers.AnyPreservationPolicy([latest, best])


class CheckpointManager:
  """Saves and restores (state pytree, JSON metadata) steps under one directory.

  Example (exact resume in a trainer):
    ```
    ckpt = CheckpointManager(os.path.join(workdir, "checkpoints"), CheckpointConfig(max_to_keep=2))
    params = abstract_params(nnx.eval_shape(lambda: Qwen(config, rngs=nnx.Rngs(0))), mesh)
    target = {"params": params, "opt_state": abstract_opt_state(tx, params, mesh)}
    if (latest := ckpt.restore_latest(target)) is not None:  # skips a damaged newest step
      step, state, meta = latest  # meta: {"step": ..., "cursor": ...}
    ...
    ckpt.save(step, {"params": params, "opt_state": opt_state}, {"step": step, "cursor": cursor})
    ckpt.close()  # waits for an asynchronous save
    ```
  """

  def __init__(self, directory: str | os.PathLike, config: CheckpointConfig | None = None):
    directory = os.fspath(directory)
    # Orbax wants absolute paths; a relative run directory (`--workdir=runs/x`) is the caller's cwd.
    self.directory = directory if "://" in directory else os.path.abspath(directory)
    self.config = config or CheckpointConfig()
    if self.config.best_metric is not None:
      # Orbax ranks steps by this; its default (None) would rank none and disable `best_step`.
      metric, mode = self.config.best_metric, self.config.best_mode
      best = dict(best_fn=lambda metrics: metrics[metric], best_mode=mode)
    else:
      best = {}
    options = ocp.CheckpointManagerOptions(
      preservation_policy=self.config.preservation_policy(),
      enable_async_checkpointing=self.config.async_save,
      cleanup_tmp_directories=True,
      create=True,
      **best,
    )
    # Handlers named up front, so a fresh manager can read metadata before the first restore.
    handlers = {_STATE: ocp.StandardCheckpointHandler(), _METADATA: ocp.JsonCheckpointHandler()}
    unopenable = _unopenable_steps(self.directory)
    if unopenable:
      # Orbax reads every step's metadata file when a manager opens (to rank steps by metric), so
      # one garbled file would stop the run from opening its checkpoints at all.
      self._set_aside([s for s, _ in unopenable], reload=False)
      logging.warning(
        "checkpoint step%s %s in %s cannot be read (%s); renamed to <step>.damaged, older steps remain",
        "s" if len(unopenable) > 1 else "",
        ", ".join(str(s) for s, _ in unopenable),
        self.directory,
        unopenable[0][1],
      )
    self._manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

  def all_steps(self) -> list[int]:
    """Every complete (finalised) step on disk, ascending; an asynchronous save in flight is not."""
    return sorted(ocp.step.checkpoint_steps(self.directory))

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def best_step(self) -> int | None:
    """The kept step with the best `best_metric` (None without one or without metrics)."""
    if self.config.best_metric is None:
      return None
    return self._manager.best_step()

  def save(
    self,
    step: int,
    state: PyTree,
    metadata: dict[str, Any] | None = None,
    *,
    metrics: dict[str, float] | None = None,
  ) -> None:
    """Writes `state` (a pytree of arrays) and `metadata` (JSON) as checkpoint `step`.

    `metrics` feed `best_metric`; a step saved without them is kept only while it is among the
    newest `max_to_keep`. Saving a step that already exists raises orbax's StepAlreadyExistsError.
    """
    if self.config.best_metric is not None and metrics is not None and self.config.best_metric not in metrics:
      raise KeyError(f"metrics {sorted(metrics)} lack best_metric {self.config.best_metric!r}")
    args = ocp.args.Composite(
      **{_STATE: ocp.args.StandardSave(state), _METADATA: ocp.args.JsonSave(dict(metadata or {}))}
    )
    self._manager.save(step, args=args, metrics=metrics, force=True)

  def restore(self, step: int | None, abstract_state: PyTree) -> tuple[PyTree, dict[str, Any]]:
    """Reads checkpoint `step` (None: the latest complete one) onto the target's shardings.

    Args:
      step: the step to read, or None for the newest complete step.
      abstract_state: a pytree with the structure of the saved state whose leaves are
        `jax.ShapeDtypeStruct`s carrying a `sharding` (see `abstract_params`,
        `abstract_opt_state`, `abstract_like`). Each array is read directly onto that sharding,
        whatever mesh it was saved from; dtypes are cast to the target's.

    Returns:
      (state, metadata): the state with the target's structure, and the JSON metadata.

    Raises:
      FileNotFoundError: the directory has no complete checkpoint, or not that step.
      CheckpointError: the step is unreadable or does not match the target (names the array).
    """
    steps = self.all_steps()
    if not steps:
      raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
    if step is None:
      step = steps[-1]
    elif step not in steps:
      raise FileNotFoundError(f"no complete checkpoint for step {step} in {self.directory}; have {steps}")
    path = os.path.join(self.directory, str(step))
    try:
      saved = self._manager.item_metadata(step)[_STATE]
    except Exception as e:  # orbax raises assorted types for missing or garbled files
      raise DamagedCheckpointError(f"cannot read the metadata of checkpoint {path}: {e}") from e
    if saved is None:
      raise DamagedCheckpointError(f"checkpoint {path} has no '{_STATE}' item")
    _check_target(saved, abstract_state, path)
    args = ocp.args.Composite(
      **{_STATE: ocp.args.StandardRestore(abstract_state), _METADATA: ocp.args.JsonRestore()}
    )
    try:
      restored = self._manager.restore(step, args=args)
    except Exception as e:
      raise DamagedCheckpointError(f"cannot restore checkpoint {path}: {type(e).__name__}: {e}") from e
    return restored[_STATE], dict(restored[_METADATA] or {})

  def restore_latest(self, abstract_state: PyTree) -> tuple[int, PyTree, dict[str, Any]] | None:
    """(step, state, metadata) of the newest step that restores; None when there is no step.

    A damaged newer step (truncated or zeroed files, a deleted manifest) does not block resuming:
    it is renamed `<step>.damaged` (kept for inspection, and so that step can be saved again), one
    warning names it and the error, and the next older step is tried. A step that is intact but
    does not match `abstract_state` is an error at once (every older step would mismatch too), as
    is having no step that restores.
    """
    damaged = []
    for step in reversed(self.all_steps()):
      try:
        state, metadata = self.restore(step, abstract_state)
      except DamagedCheckpointError as e:
        damaged.append((step, e))
        continue
      if damaged:
        self._set_aside([s for s, _ in damaged])
        logging.warning(
          "checkpoint step%s %s in %s cannot be read (%s); resumed from step %d instead and renamed "
          "the damaged step%s to <step>.damaged",
          "s" if len(damaged) > 1 else "",
          ", ".join(str(s) for s, _ in damaged),
          self.directory,
          str(damaged[0][1]).splitlines()[0][:300],
          step,
          "s" if len(damaged) > 1 else "",
        )
      return step, state, metadata
    if damaged:
      steps = ", ".join(str(s) for s, _ in damaged)
      raise DamagedCheckpointError(
        f"no checkpoint step in {self.directory} restores (tried {steps}): {damaged[0][1]}"
      ) from damaged[0][1]
    return None

  def _set_aside(self, steps: list[int], reload: bool = True) -> None:
    """Renames damaged step directories out of orbax's view (digits-only names are steps)."""
    if jax.process_index() == 0:
      for step in steps:
        path = os.path.join(self.directory, str(step))
        aside, n = path + ".damaged", 1
        while os.path.exists(aside):
          aside, n = f"{path}.damaged.{n}", n + 1
        os.rename(path, aside)
    if reload:
      self._manager.reload()

  def wait_until_finished(self) -> None:
    """Blocks until an asynchronous save is finalised on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> CheckpointManager:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _unopenable_steps(directory: str) -> list[tuple[int, str]]:
  """Finalised steps whose orbax metadata file (`_CHECKPOINT_METADATA`) is not a JSON object."""
  if "://" in directory or not os.path.isdir(directory):
    return []
  found = []
  for name in sorted(os.listdir(directory), key=lambda n: (len(n), n)):
    path = os.path.join(directory, name, "_CHECKPOINT_METADATA")
    if not name.isdigit() or not os.path.isfile(path):
      continue
    try:
      with open(path, encoding="utf-8") as f:
        if not isinstance(json.load(f), dict):
          raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
      found.append((int(name), f"{path}: {type(e).__name__}: {str(e)[:200]}"))
  return found


def _check_target(saved: PyTree, target: PyTree, path: str) -> None:
  """Raises CheckpointError naming each target array the checkpoint lacks or has another shape."""
  saved_shapes = {m.name: tuple(m.shape) for m in jax.tree.leaves(saved) if hasattr(m, "shape")}
  problems = []
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(target):
    name = ".".join(ocp.tree.str_keypath(key_path))  # how orbax names the array it stores
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      leaf = jax.eval_shape(jax.random.key_data, leaf)  # typed keys are stored as their raw data
    if name not in saved_shapes:
      problems.append(f"'{name}' is not in the checkpoint")
    elif saved_shapes[name] != tuple(leaf.shape):
      problems.append(
        f"'{name}' has shape {saved_shapes[name]} in the checkpoint, target {tuple(leaf.shape)}"
      )
  if problems:
    raise CheckpointError(f"checkpoint {path} does not match the target: " + "; ".join(problems))


# ---- abstract targets --------------------------------------------------------------------------


def abstract_like(tree: PyTree) -> PyTree:
  """ShapeDtypeStructs with the shape, dtype and sharding of each array in `tree`.

  For restoring over a state that already lives where it should (e.g. freshly initialised on the
  target mesh); typed PRNG keys are kept as key-typed structs.
  """
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def abstract_params(
  model: nnx.Module, mesh: Mesh, config: sharding_lib.ShardingConfig | None = None
) -> nnx.State:
  """`nnx.state(model, nnx.Param)` as ShapeDtypeStructs sharded as `lm.sharding` would on `mesh`.

  `model` may be abstract (`nnx.eval_shape(lambda: Qwen(config, rngs=nnx.Rngs(0)))`), so no
  parameter is allocated before the checkpoint is read.
  """
  shardings = sharding_lib.param_shardings(model, mesh, config)

  def leaf(key_path, x):
    name = ".".join(str(k.key) for k in key_path if isinstance(k, jax.tree_util.DictKey))
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shardings[name])

  return jax.tree_util.tree_map_with_path(leaf, nnx.state(model, nnx.Param))


def abstract_opt_state(tx: optax.GradientTransformation, params: PyTree, mesh: Mesh) -> PyTree:
  """Abstract `tx.init(params)`: per-parameter buffers (moments) take their parameter's sharding,
  everything else (step counts, scalars) is replicated over `mesh`.

  `params` is the abstract parameter tree (e.g. from `abstract_params`).
  """
  replicated = NamedSharding(mesh, P())
  return optax.tree_map_params(
    tx,
    lambda x, p: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=p.sharding),
    jax.eval_shape(tx.init, params),
    params,
    transform_non_params=lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
  )
