"""Checkpoint round trips of params + adamw state + PRNG key + metadata, across mesh shapes."""

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lm import checkpoint
from lm.config import ModelConfig
from lm.model import Qwen
from lm.sharding import MeshConfig, make_mesh

CONFIG = ModelConfig.tiny_qwen3()
TX = optax.adamw(1e-2)
METADATA = {"step": 3, "cursor": {"shard": 1, "offset": 4096}, "note": "ünïcode"}


def _abstract_model():
  return nnx.eval_shape(lambda: Qwen(CONFIG, rngs=nnx.Rngs(0)))


def _target(mesh):
  """Abstract (params, adamw state, PRNG key) laid out on `mesh`."""
  params = checkpoint.abstract_params(_abstract_model(), mesh)
  return {
    "params": params,
    "opt_state": checkpoint.abstract_opt_state(TX, params, mesh),
    "rng": jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=NamedSharding(mesh, P())),
  }


@functools.cache
def _host_arrays():
  """Random contents for params and adamw state, as numpy arrays.

  Random rather than trained values: bit-exactness is what is checked, and building on the host
  compiles nothing (eager initialisation costs a compilation per op).
  """
  rng = np.random.default_rng(0)
  target = _target(make_mesh(MeshConfig(data=1), jax.devices()[:1]))
  fill = lambda t: np.asarray(
    rng.integers(1, 1000, t.shape) if t.dtype == jnp.int32 else rng.normal(size=t.shape), t.dtype
  )
  return {k: jax.tree.map(fill, target[k]) for k in ("params", "opt_state")}


def _train_state(mesh):
  """The state laid out on `mesh` as a trainer would hold it there."""
  target = _target(mesh)
  host = _host_arrays()
  arrays = jax.device_put(host, {k: jax.tree.map(lambda t: t.sharding, target[k]) for k in host})
  rng = jax.random.wrap_key_data(jax.device_put(np.array([12345, 678], np.uint32), target["rng"].sharding))
  return {**arrays, "rng": rng}


def _assert_bit_equal(restored, expected):
  assert jax.tree.structure(restored) == jax.tree.structure(expected)
  for (path, a), b in zip(
    jax.tree_util.tree_leaves_with_path(restored), jax.tree.leaves(expected), strict=True
  ):
    if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
      a, b = jax.random.key_data(a), jax.random.key_data(b)
    assert a.dtype == b.dtype, jax.tree_util.keystr(path)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))


def test_round_trip_is_bit_exact(tmp_path):
  mesh = make_mesh(MeshConfig(data=1, fsdp=4, tp=2))
  state = _train_state(mesh)
  with checkpoint.CheckpointManager(tmp_path) as ckpt:
    ckpt.save(3, state, METADATA)
    assert ckpt.latest_step() == 3
    restored, metadata = ckpt.restore(None, checkpoint.abstract_like(state))
  _assert_bit_equal(restored, state)
  assert metadata == METADATA
  assert isinstance(restored["params"], nnx.State)
  assert state["params"]["layers"]["q_dnh"].sharding.spec == P(None, "fsdp", "tp", None)
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
    assert got.sharding == want.sharding


def test_relative_directory_is_the_working_directory(tmp_path, monkeypatch):
  # `--workdir=runs/x` hands relative paths down; orbax itself only takes absolute ones.
  monkeypatch.chdir(tmp_path)
  state = _train_state(make_mesh(MeshConfig(data=8)))
  with checkpoint.CheckpointManager(os.path.join("runs", "ckpt")) as ckpt:
    ckpt.save(1, state, METADATA)
    restored, _ = ckpt.restore(1, checkpoint.abstract_like(state))
  _assert_bit_equal(restored, state)
  assert os.path.isdir(tmp_path / "runs" / "ckpt" / "1")


@pytest.mark.parametrize("saved_on", [dict(data=8), dict(data=1, fsdp=4, tp=2)])
def test_restore_onto_another_mesh(tmp_path, saved_on):
  state = _train_state(make_mesh(MeshConfig(**saved_on)))
  fsdp2_tp4 = _target(make_mesh(MeshConfig(data=1, fsdp=2, tp=4)))
  one_device = _target(make_mesh(MeshConfig(data=1), jax.devices()[:1]))
  with checkpoint.CheckpointManager(tmp_path) as ckpt:
    ckpt.save(1, state, METADATA)
    for target in (fsdp2_tp4, one_device):
      restored, metadata = ckpt.restore(1, target)
      _assert_bit_equal(restored, state)
      assert metadata == METADATA
      for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target), strict=True):
        assert got.sharding == want.sharding
  # Restored onto (fsdp=2, tp=4), an adam moment is split like its parameter q [L, D, N, H].
  assert fsdp2_tp4["opt_state"][0].mu["layers"]["q_dnh"].sharding.spec == P(None, "fsdp", "tp", None)


def test_keeps_newest_n(tmp_path):
  state = {"w": jnp.arange(4.0)}
  with checkpoint.CheckpointManager(tmp_path, checkpoint.CheckpointConfig(max_to_keep=2)) as ckpt:
    for step in range(1, 5):
      ckpt.save(step, jax.tree.map(lambda x, s=step: x + s, state), {"step": step})
    assert ckpt.all_steps() == [3, 4]
    restored, metadata = ckpt.restore(None, checkpoint.abstract_like(state))
  assert sorted(p for p in os.listdir(tmp_path) if p.isdigit()) == ["3", "4"]
  np.testing.assert_array_equal(restored["w"], np.arange(4.0) + 4)
  assert metadata == {"step": 4}


def test_async_saves_are_complete_after_wait_and_close(tmp_path):
  state = {"w": jnp.arange(3.0)}
  with checkpoint.CheckpointManager(tmp_path, checkpoint.CheckpointConfig(async_save=True)) as ckpt:
    ckpt.save(1, state, {"step": 1})
    ckpt.wait_until_finished()
    assert ckpt.latest_step() == 1
    ckpt.save(2, jax.tree.map(lambda x: x + 1, state), {"step": 2})
  with checkpoint.CheckpointManager(tmp_path) as ckpt:  # close() waited for step 2
    restored, metadata = ckpt.restore(None, checkpoint.abstract_like(state))
  np.testing.assert_array_equal(restored["w"], np.arange(3.0) + 1)
  assert metadata == {"step": 2}


@pytest.mark.parametrize("mode,best", [("min", 2), ("max", 4)])
def test_keeps_best_by_metric(tmp_path, mode, best):
  losses = {1: 3.0, 2: 1.0, 3: 2.0, 4: 5.0, 5: 4.0}
  config = checkpoint.CheckpointConfig(max_to_keep=1, best_metric="loss", best_mode=mode)
  with checkpoint.CheckpointManager(tmp_path, config) as ckpt:
    for step, loss in losses.items():
      ckpt.save(step, {"w": jnp.full((2,), float(step))}, {}, metrics={"loss": loss})
    assert ckpt.all_steps() == sorted({best, 5})
    assert ckpt.best_step() == best


def test_missing_checkpoints_name_the_directory(tmp_path):
  target = {
    "w": jax.ShapeDtypeStruct((2,), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  }
  with checkpoint.CheckpointManager(tmp_path / "nothing") as ckpt:
    assert ckpt.latest_step() is None
    with pytest.raises(FileNotFoundError, match="no complete checkpoint in .*nothing"):
      ckpt.restore(None, target)
    ckpt.save(1, {"w": jnp.ones(2)})
    with pytest.raises(FileNotFoundError, match=r"step 2 .*have \[1\]"):
      ckpt.restore(2, target)


def test_mismatched_target_names_the_array(tmp_path):
  with checkpoint.CheckpointManager(tmp_path) as ckpt:
    ckpt.save(1, {"w": jnp.ones((2, 3)), "b": jnp.ones(3)})
    bad = checkpoint.abstract_like({"w": jnp.ones((2, 4)), "extra": jnp.ones(3)})
    with pytest.raises(
      checkpoint.CheckpointError,
      match=r"'extra' is not in the checkpoint; 'w' has shape \(2, 3\).*target \(2, 4\)",
    ):
      ckpt.restore(1, bad)


@pytest.mark.parametrize("garbled", ["", "ocdbt.process_0/d"])  # every file / only array chunks
def test_corrupt_checkpoint_raises_naming_the_step(tmp_path, garbled):
  state = {"w": jnp.arange(1000.0)}
  with checkpoint.CheckpointManager(tmp_path) as ckpt:
    ckpt.save(1, state)
  for root, _, files in os.walk(tmp_path / "1" / "state" / garbled):
    for name in files:  # truncated in place, as a failing disk or a bad copy would leave them
      with open(os.path.join(root, name), "r+b") as f:
        f.truncate(os.path.getsize(f.name) // 2)
  with checkpoint.CheckpointManager(tmp_path) as ckpt:
    with pytest.raises(checkpoint.CheckpointError, match=f"checkpoint {tmp_path}/1"):
      ckpt.restore(1, checkpoint.abstract_like(state))


_KILLED_WRITER = textwrap.dedent(
  """
  import sys
  import jax.numpy as jnp
  from lm import checkpoint
  ckpt = checkpoint.CheckpointManager(sys.argv[1])
  ckpt.save(1, {"w": jnp.full((2_000_000,), 1.0)}, {"step": 1})
  print("saved 1", flush=True)
  while True:  # saves until killed; the parent kills it while a step is half written
    step = ckpt.latest_step() + 1
    ckpt.save(step, {"w": jnp.full((2_000_000,), float(step))}, {"step": step})
  """
)


def test_kill_during_save_leaves_latest_complete_step(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  child = subprocess.Popen(
    [sys.executable, "-c", _KILLED_WRITER, str(tmp_path)],
    stdout=subprocess.PIPE,
    env=env,
    cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
  )
  try:
    assert child.stdout.readline() == b"saved 1\n"
    deadline = time.monotonic() + 30
    while not any(".orbax-checkpoint-tmp" in p for p in os.listdir(tmp_path)):
      assert time.monotonic() < deadline, "the writer never started a second save"
    os.kill(child.pid, signal.SIGKILL)
  finally:
    child.wait()
  half_written = [p for p in os.listdir(tmp_path) if ".orbax-checkpoint-tmp" in p]
  assert half_written, "killed too late to leave a partial step"
  partial_step = int(half_written[0].split(".")[0])
  with checkpoint.CheckpointManager(tmp_path) as ckpt:
    assert ckpt.latest_step() == partial_step - 1
    target = checkpoint.abstract_like({"w": jnp.zeros((2_000_000,))})
    restored, metadata = ckpt.restore(None, target)
    assert float(restored["w"][-1]) == partial_step - 1 and metadata == {"step": partial_step - 1}
    assert not any(".orbax-checkpoint-tmp" in p for p in os.listdir(tmp_path))  # cleaned up
    ckpt.save(partial_step, {"w": jnp.zeros((2_000_000,))}, {"step": partial_step})
    assert ckpt.latest_step() == partial_step


def _damage(step_dir, how):
  """Damages a saved step as a failing disk, a bad copy or a stray `rm` would."""
  files = [os.path.join(root, name) for root, _, names in os.walk(step_dir) for name in names]
  if how == "truncated data":
    victims = [f for f in files if os.sep + "d" + os.sep in f]
    for path in victims:
      with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
  elif how == "zeroed file":
    victims = [f for f in files if os.sep + "d" + os.sep in f]
    for path in victims:
      size = os.path.getsize(path)
      with open(path, "r+b") as f:
        f.write(b"\0" * size)
  else:  # deleted manifest
    victims = [f for f in files if os.path.basename(f) == "manifest.ocdbt"]
    for path in victims:
      os.remove(path)
  assert victims, f"nothing to damage for {how!r} in {files}"


@pytest.mark.parametrize("how", ["truncated data", "zeroed file", "deleted manifest"])
def test_a_damaged_newest_step_falls_back_to_the_previous_one(tmp_path, how, caplog):
  with checkpoint.CheckpointManager(tmp_path) as ckpt:
    for step in (1, 2, 3):
      ckpt.save(step, {"w": jnp.full((1000,), float(step))}, {"step": step})
  _damage(tmp_path / "3", how)
  target = checkpoint.abstract_like({"w": jnp.zeros((1000,))})
  with checkpoint.CheckpointManager(tmp_path) as ckpt:
    with pytest.raises(checkpoint.DamagedCheckpointError, match=f"{tmp_path}/3"):
      ckpt.restore(3, target)
    with caplog.at_level("WARNING"):
      step, restored, metadata = ckpt.restore_latest(target)
    assert step == 2 and metadata == {"step": 2} and float(restored["w"][0]) == 2.0
    ours = [r for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(ours) == 1 and "step 3 in" in ours[0].getMessage()
    assert ckpt.all_steps() == [1, 2] and os.path.isdir(tmp_path / "3.damaged")
    ckpt.save(3, {"w": jnp.full((1000,), 30.0)}, {"step": 3})  # the run goes on past it
  with checkpoint.CheckpointManager(tmp_path) as ckpt:
    assert ckpt.restore_latest(target)[0] == 3


def test_restore_latest_without_steps_or_with_only_damaged_ones(tmp_path):
  target = checkpoint.abstract_like({"w": jnp.zeros((10,))})
  with checkpoint.CheckpointManager(tmp_path) as ckpt:
    assert ckpt.restore_latest(target) is None
    ckpt.save(1, {"w": jnp.ones((10,))})
    with pytest.raises(checkpoint.CheckpointError, match="does not match") as mismatch:
      ckpt.restore_latest(checkpoint.abstract_like({"w": jnp.zeros((11,))}))
    assert not isinstance(mismatch.value, checkpoint.DamagedCheckpointError)  # no fallback for that
  _damage(tmp_path / "1", "deleted manifest")
  with checkpoint.CheckpointManager(tmp_path) as ckpt:
    with pytest.raises(checkpoint.DamagedCheckpointError, match="no checkpoint step .* restores"):
      ckpt.restore_latest(target)
