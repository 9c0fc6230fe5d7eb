"""How much of a GPU's memory JAX may use: the allocator fraction the launchers set and the plan
budgets against (docs/scale.md).

On a GPU, JAX's allocator takes `XLA_PYTHON_CLIENT_MEM_FRACTION` of the card when the backend starts
(0.75 when the variable is unset) and can use no more: a program whose peak fits the card but not
that pool runs out of memory. So the launchers set the fraction (`set_gpu_fraction`, before any
backend starts; a user's own value wins) and the plan budgets against the same pool
(`gpu_fraction`), minus its headroom. TPUs and CPUs do not read the variable.
"""

from __future__ import annotations

import os

ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
JAX_DEFAULT = 0.75  # JAX's own fraction when the variable is unset
LAUNCH_FRACTION = 0.90  # what the launchers set: the rest is left to CUDA, cuBLAS/cuDNN and NCCL


def gpu_fraction(environ: dict[str, str] | None = None) -> float:
  """The share of a GPU's memory JAX's allocator will take in a process the launchers start: the
  variable's value where it is set, else `LAUNCH_FRACTION`. Raises ValueError naming the variable
  when its value is not a number in (0, 1]."""
  environ = os.environ if environ is None else environ
  value = environ.get(ENV)
  if value is None:
    return LAUNCH_FRACTION
  try:
    fraction = float(value)
  except ValueError:
    raise ValueError(f"{ENV}={value!r} is not a number") from None
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"{ENV}={value} must be in (0, 1]")
  return fraction


def set_gpu_fraction() -> float:
  """Sets `XLA_PYTHON_CLIENT_MEM_FRACTION` to `LAUNCH_FRACTION` unless the user set it (checked);
  returns the fraction in force. Called by every launcher before jax starts a backend."""
  fraction = gpu_fraction()
  os.environ.setdefault(ENV, f"{fraction:g}")
  return fraction
