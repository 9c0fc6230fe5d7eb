"""Shared substrate: the Qwen-family model, checkpoints, sharding, sampling and scoring."""

from lm.config import ModelConfig
from lm.hf import load_hf, save_hf
from lm.model import Qwen

__all__ = ["ModelConfig", "Qwen", "load_hf", "save_hf"]
