"""The device check with the papers' planned rows (lm/device_check.py; scripts/device_check.sh runs it).

  python -m launch.device_check check            # on the accelerator: parity, bandwidth, decode, and
                                                 # docs/scale.md's row for this device, judged
  python -m launch.device_check check --cpu      # toy sizes here (what CI runs): measured, not judged
  python -m launch.device_check prepare          # rewrites the committed parity inputs (needs torch)

The record goes to --out (device_check.json); the exit status is 0 only when every part ran, parity
held and every planned row agreed with the plan within its tolerances (memory 10%, time 2x).
"""

import sys

from dpa_grpo import device_check as dpa_device_check
from lm import device_check, memory


def main(argv: list[str] | None = None) -> int:
  memory.set_gpu_fraction()  # the pool the plan budgets against, before jax starts a backend
  return device_check.main(argv, rows=dpa_device_check.rows)


if __name__ == "__main__":
  sys.exit(main())
