"""Shared substrate: the Qwen-family model, checkpoints, sharding, sampling and scoring.

The package-level names are imported on first use (PEP 562), not with the package: importing any
submodule imports this file first, and a process that needs only `lm.text` (the math-verify grader
workers `kace.answers` starts, one per evaluation or build) would otherwise import JAX, Flax and
transformers, about 2 s of each worker's start.
"""

import importlib

_LAZY = {"ModelConfig": "lm.config", "Qwen": "lm.model", "load_hf": "lm.hf", "save_hf": "lm.hf"}

__all__ = list(_LAZY)


def __getattr__(name: str):
  if name not in _LAZY:
    raise AttributeError(f"module 'lm' has no attribute {name!r}")
  return getattr(importlib.import_module(_LAZY[name]), name)
