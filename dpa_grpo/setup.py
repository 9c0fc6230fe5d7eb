"""Run setup shared by the trainer and the warm start: cases, task tokenizer, backbone.

Both `dpa_grpo.train` and `dpa_grpo.warm_start` build their run from these, so neither imports the
other. The warm-start answer constants live here because the task tokenizer is fitted to the
texts the warm start trains on.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax.numpy as jnp
from flax import nnx

from dpa_grpo import config as config_lib
from dpa_grpo import game, rollout
from dpa_grpo.envs import copycheck, forms, taxcalc
from lm import hf
from lm import sharding as sharding_lib
from lm import tokenizer as tokenizer_lib
from lm.config import ModelConfig
from lm.model import Qwen

EXPLANATION = "from the forms"  # the explanation field of every warm-start answer
TEMPLATE_SAC = game.SAC("the amount is wrong", "it does not follow the form", "the input fields")


def load_data(data: config_lib.DataConfig) -> tuple[list[taxcalc.TaxCase], list[taxcalc.TaxCase]]:
  """(train, test) cases: the benchmark at `data.root`, else synthetic cases of
  `data.synthetic.family`; split by seed."""
  if data.root:
    cases = taxcalc.load_cases(data.root)
  elif data.synthetic.family == "copycheck":
    cases = copycheck.generate_cases(data.synthetic.n, seed=data.synthetic.seed)
  else:
    syn = data.synthetic
    cases = forms.generate_cases(syn.n, seed=syn.seed, difficulty=syn.difficulty)
  return taxcalc.split_cases(cases, data.test_fraction, data.split_seed)


def reviewer_sac(case: taxcalc.TaxCase, line_id: str) -> game.SAC:
  """The SAC of every warm-start "wrong" verdict: the family's own (its Evidence quotes the input
  field) on copy-and-check cases, the fixed template elsewhere."""
  return copycheck.sac(case, line_id) if copycheck.is_copycheck(case) else TEMPLATE_SAC


def task_tokenizer(
  path: str, cases: Sequence[taxcalc.TaxCase], cfg: rollout.RolloutConfig, vocab_size: int
) -> str:
  """A byte-level BPE tokenizer fitted to this task's prompts and answers (for models trained from
  scratch: short prompts are what makes CPU-scale runs fast). Written once; reused on resume."""
  if os.path.exists(os.path.join(path, "tokenizer.json")):
    return path
  corpus = list(game.VERIFIER_PAIR + game.GENERATOR_PAIR)
  for case, line_id, prompt in rollout.gold_episodes(cases, cfg):
    answer = cfg.answer(line_id, case.gold[line_id], EXPLANATION)
    sac = reviewer_sac(case, line_id)
    corpus += [
      prompt,
      answer,
      rollout.verifier_prompt(case, line_id, prompt, answer),
      game.render_verifier_reply("wrong", sac),
      rollout.decision_prompt(case, line_id, prompt, answer, sac, answer, cfg),
    ]
  return tokenizer_lib.train_bpe_tokenizer(path, corpus, vocab_size=vocab_size, split_digits=True)


def tokenizer_dir(
  model: config_lib.ModelConfig, path: str, cases: Sequence[taxcalc.TaxCase], cfg: rollout.RolloutConfig
) -> str:
  """The configured tokenizer, else the checkpoint's, else one fitted to `cases` at `path`."""
  return model.tokenizer or model.checkpoint or task_tokenizer(path, cases, cfg, model.tokenizer_vocab)


def load_model(
  model_cfg: config_lib.ModelConfig, seed: int, mesh, tokenizer_dir: str
) -> tuple[Qwen, tokenizer_lib.Tokenizer]:
  """The backbone (an HF checkpoint, or a preset initialised from `seed`) on the mesh."""
  tokenizer = tokenizer_lib.load_tokenizer(tokenizer_dir)
  if model_cfg.checkpoint:
    model = hf.load_hf(
      model_cfg.checkpoint, dtype=model_cfg.dtype, mesh=mesh, attention_impl=model_cfg.attention_impl
    )
  else:
    overrides = dict(model_cfg.overrides)
    overrides.setdefault("vocab_size", tokenizer.vocab_size)
    overrides.setdefault("eos_token_ids", tuple(tokenizer.eos_ids))
    overrides.setdefault("pad_token_id", tokenizer.pad_id)
    overrides["attention_impl"] = model_cfg.attention_impl
    config = ModelConfig.preset(model_cfg.preset, **overrides)
    model = Qwen(config, rngs=nnx.Rngs(seed), param_dtype=jnp.dtype(model_cfg.dtype))
    sharding_lib.shard_model(model, mesh)
  if model.config.vocab_size < tokenizer.vocab_size:
    raise ValueError(f"model vocab {model.config.vocab_size} < tokenizer vocab {tokenizer.vocab_size}")
  return model, tokenizer
