"""Targets past one slice or node (`lm.plan`, `lm.sharding`): data parallel across slices, fsdp and
tp within one; a mesh over several TPU slices is laid out as a multi-slice run lays it."""

import dataclasses

import pytest

from lm import plan as plan_lib
from lm import sharding


def test_the_multi_slice_targets_name_their_slices_and_network():
  for name, slices, devices in (("2xv5p-64", 2, 64), ("2xh100x8", 2, 16)):
    t = plan_lib.TARGETS[name]
    assert (t.slices, t.devices) == (slices, devices) and t.dcn_bandwidth > 0
    assert t.dcn_bandwidth < t.hbm_bandwidth / 10  # the slow link the data axis alone crosses
  assert "2xv5p-64" in plan_lib.target_names("tpu") and "2xh100x8" in plan_lib.target_names("gpu")


def test_across_slices_keeps_the_presets_mesh_within_a_slice_and_data_across():
  t = plan_lib.TARGETS["2xh100x8"]
  mesh = sharding.MeshConfig(data=1, fsdp=-1, tp=1)  # the DPA-GRPO preset's: fsdp over every device
  assert plan_lib.across_slices(mesh, t) == sharding.MeshConfig(data=2, fsdp=8, tp=1)
  tp = sharding.MeshConfig(data=1, fsdp=-1, tp=4)
  assert plan_lib.across_slices(tp, t) == sharding.MeshConfig(data=2, fsdp=2, tp=4)
  data = sharding.MeshConfig(data=-1, fsdp=1, tp=1)  # already data parallel over every device: kept
  assert plan_lib.across_slices(data, t).shape(16) == (16, 1, 1)
  one = plan_lib.TARGETS["h100x8"]
  assert plan_lib.across_slices(mesh, one) is mesh


@dataclasses.dataclass(frozen=True)
class _Device:  # what mesh layout reads of a device of a multi-slice job
  id: int
  slice_index: int
  process_index: int
  platform: str = "cpu"
  device_kind: str = "cpu"


def test_a_mesh_over_two_slices_puts_the_data_axis_across_them():
  devices = [_Device(id=i, slice_index=i // 4, process_index=i // 4) for i in range(8)]
  assert sharding.slice_count(devices) == 2
  grid = sharding.device_grid((2, 4, 1), devices)
  assert [d.slice_index for d in grid[:, 0, 0]] == [0, 1]
  assert {d.slice_index for d in grid[0].flat} == {0}  # fsdp within one slice
  with pytest.raises(ValueError, match="multiple of 2"):
    sharding.device_grid((1, 8, 1), devices)
