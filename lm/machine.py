"""The machine a measurement ran on, as reports print it beside their numbers (STYLE: every number
says its machine): the CPU's model and the SIMD flags that decide XLA:CPU's and PyTorch's kernels."""

import os

_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_description() -> str:
  """The CPU's model name and the SIMD flags that matter for these kernels, from /proc/cpuinfo
  ("unknown CPU" where it cannot be read, e.g. off Linux)."""
  model, flag_set = "unknown CPU", set()
  try:
    for line in open("/proc/cpuinfo"):
      key, _, value = line.partition(":")
      if key.strip() == "model name":
        model = value.strip()
      elif key.strip() == "flags":
        flag_set = set(value.split())
        break
  except OSError:
    pass
  return f"{model} ({' '.join(f for f in _FLAGS if f in flag_set) or 'no AVX2'})"


def summary() -> str:
  """One line: CPU count, model and flags, and the load average now (1 / 5 / 15 minutes)."""
  load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
  return f"{os.cpu_count()} CPUs, {cpu_description()}; load average {load}"
