"""The device check with the papers' planned rows (lm/device_check.py; scripts/device_check.sh runs it).

  python -m launch.device_check check            # on the accelerator: parity, bandwidth, decode, and
                                                 # docs/scale.md's row for this device, judged
  python -m launch.device_check check --cpu      # toy sizes here (what CI runs): measured, not judged
  python -m launch.device_check prepare          # rewrites the committed parity inputs (needs torch)

The planned rows are both papers': DPA-GRPO's sampler and train step, KACE's solver (its time a
truncated measurement: `kace.device_check`); the check runs them in ascending order of their own
peaks. The record goes to --out (device_check.json); the exit status is 0 only when every part ran,
parity held and every planned row agreed with the plan within its tolerances (memory 10%, time 2x).
"""

import sys
from collections.abc import Callable

from dpa_grpo import device_check as dpa_device_check
from kace import device_check as kace_device_check
from lm import device_check, memory


def rows(cpu: bool, **options) -> dict[str, Callable[[], device_check.CompiledRow]]:
  """Both papers' planned rows, by name, each compiling its row (`options`: `--attention_impl`)."""
  return {**dpa_device_check.rows(cpu, **options), **kace_device_check.rows(cpu, **options)}


def main(argv: list[str] | None = None) -> int:
  memory.set_gpu_fraction()  # the pool the plan budgets against, before jax starts a backend
  return device_check.main(argv, rows=rows)


if __name__ == "__main__":
  sys.exit(main())
