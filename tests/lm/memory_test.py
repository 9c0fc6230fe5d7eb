"""lm.memory: the GPU allocator fraction the launchers set and the plan budgets against."""

import pytest

from lm import memory
from lm import plan as plan_lib


def test_launchers_fraction_unless_the_user_set_one(monkeypatch):
  monkeypatch.delenv(memory.ENV, raising=False)
  assert memory.gpu_fraction() == memory.LAUNCH_FRACTION == 0.90
  assert memory.set_gpu_fraction() == 0.90 and memory.os.environ[memory.ENV] == "0.9"
  monkeypatch.setenv(memory.ENV, "0.5")  # the user's own value wins and is what the plan reads
  assert memory.set_gpu_fraction() == 0.5 and memory.os.environ[memory.ENV] == "0.5"
  h100 = plan_lib.TARGETS["h100x1"]
  assert plan_lib.pool_bytes(h100) == int(0.5 * h100.hbm_bytes)
  assert plan_lib.budget(h100, 0.1) == int(0.9 * int(0.5 * h100.hbm_bytes))
  assert plan_lib.pool_bytes(plan_lib.TARGETS["v5p-8"]) == plan_lib.TARGETS["v5p-8"].hbm_bytes  # no pool


@pytest.mark.parametrize("value", ["abc", "0", "1.5"])
def test_a_bad_fraction_names_the_variable(value):
  with pytest.raises(ValueError, match=memory.ENV):
    memory.gpu_fraction({memory.ENV: value})
