"""A supervised warm start on tax-form cases, so both roles start non-trivial but imperfect.

A model trained from scratch knows neither the answer format nor the game's reply formats, and a
role that never emits a valid reply gives the RL stage nothing to compare: every draft fails, every
verdict is unreadable. CPU-scale reproductions therefore begin with a short supervised stage on
the *training* cases (never the test split) that teaches each turn of an episode its format and
some of its content:

  draft     line prompt (earlier lines drafted correctly)      -> the gold line answer
            (a wrong one with probability `draft_wrong`)
  verify    verifier prompt with a right or a corrupted answer -> "correct", or "wrong" + the SAC
            (the verdict flipped with probability `verify_flip`; with `verify_pairs`, both a right
            and a wrong answer on every prompt)
  revise    revision prompt after a corrupted answer           -> the gold line answer
            (the corrupted one again with probability `revise_wrong`)
  decide    decision prompt with a (proposal, revision) pair   -> REVISE iff only the revision is
            right, else KEEP (the oracle's label); `decide_style="habit"` (testbed v2): the wrong
            revision from the line's answer pool, and a REVISE label turned KEEP with probability
            `decide_keep` x the desk's habit, so the greedy decision differs by desk

Corrupted answers are what a weak preparer gets wrong: a digit changed, dropped or swapped, the
amount off by a small or large margin, a zero where there is an amount and an amount where there
is a zero. On copy-and-check cases (`dpa_grpo.envs.copycheck`) the corrupted answer is the family's
one consistent mistake (the other field), the SAC's Evidence quotes the input field, and the
draft's error rate is scaled by the case's desk (`copycheck.habit`): random errors average out
under greedy decoding, a habit tied to a visible field does not, so the warm-started roles keep
room to improve in greedy evaluation too.

The stage is short on purpose (`WarmStartConfig.steps`): the roles come out able to play but far
from right, which is the regime DPA-GRPO is about. The result is a plain HF checkpoint plus
tokenizer directory, so the RL stage loads it like any real checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
from collections.abc import Sequence

from dpa_grpo import config as config_lib
from dpa_grpo import game, rollout, setup
from dpa_grpo.config import TURNS, WarmStartConfig
from dpa_grpo.envs import copycheck, taxcalc
from lm import hf, rundir, sft
from lm import sharding as sharding_lib
from lm import text as text_lib
from lm import tokenizer as tokenizer_lib

_log = logging.getLogger(__name__)

# The answer texts of every warm-start example; `setup` owns them (the task tokenizer is fitted to them).
EXPLANATION = setup.EXPLANATION
TEMPLATE_SAC = setup.TEMPLATE_SAC
__all__ = ["TURNS", "WarmStartConfig", "corrupt", "examples", "run"]


def corrupt(amount: float, rng: random.Random) -> float:
  """A wrong amount of the kind a weak preparer writes; never equal to `amount`."""
  value = int(round(amount))
  if value == 0:
    return float(rng.choice([1, 10, 100]) * rng.randint(1, 99))
  sign = 1 if value > 0 else -1
  digits = list(str(abs(value)))
  kind = rng.randrange(6)
  if kind == 0:  # one digit changed
    i = rng.randrange(len(digits))
    digits[i] = rng.choice([d for d in "0123456789" if d != digits[i]])
    wrong = sign * int("".join(digits))
  elif kind == 1 and len(digits) > 1:  # one digit dropped
    del digits[rng.randrange(len(digits))]
    wrong = sign * int("".join(digits))
  elif kind == 2 and len(digits) > 1:  # two neighbours swapped
    i = rng.randrange(len(digits) - 1)
    digits[i], digits[i + 1] = digits[i + 1], digits[i]
    wrong = sign * int("".join(digits))
  elif kind == 3:  # off by a small margin
    wrong = value + rng.choice([-1, 1]) * rng.randint(1, 99)
  elif kind == 4:  # off by a large margin
    wrong = round(value * rng.uniform(0.5, 1.5))
  else:  # a zero where there is an amount
    wrong = 0
  return float(wrong if wrong != value else value + 1)


def examples(
  cases: Sequence[taxcalc.TaxCase],
  tokenizer: tokenizer_lib.Tokenizer,
  rollout_cfg: rollout.RolloutConfig,
  config: WarmStartConfig,
) -> dict[str, list[sft.Example]]:
  """(prompt ids, completion ids) examples of every turn, from episodes drafted with gold lines.

  Prompts and answers are in `rollout_cfg`'s style over its lines. Completions end with EOS.
  """
  rng = random.Random(config.seed)
  eos = [tokenizer.eos_ids[0]]
  chat = lambda text: tokenizer.encode_chat(text_lib.user_chat(text))
  out: dict[str, list[sft.Example]] = {turn: [] for turn in config.turns}

  def add(turn: str, prompt: str, completion: str) -> None:
    if turn in out:
      out[turn].append((chat(prompt), tokenizer.encode(completion) + eos))

  def chance(p: float) -> bool:  # draws only when p > 0, so zero knobs leave the stream as it was
    return p > 0 and rng.random() < p

  for case, line_id, prompt in rollout.gold_episodes(cases, rollout_cfg):
    gold = case.gold[line_id]
    answer = lambda amount: rollout_cfg.answer(line_id, amount, EXPLANATION)  # noqa: B023
    right, wrong = answer(gold), answer(corrupt(gold, rng))
    if copycheck.is_copycheck(case):  # one consistent mistake (the other field), which greedy keeps
      wrong = answer(copycheck.confusion(case, line_id))
    sac = setup.reviewer_sac(case, line_id)
    add("draft", prompt, wrong if chance(config.draft_wrong * copycheck.habit(case)) else right)
    shown = (False, True) if config.verify_pairs else (rng.random() < config.wrong_fraction,)
    for proposal_wrong in shown:
      verdict = "wrong" if proposal_wrong != chance(config.verify_flip) else "correct"
      reply = game.render_verifier_reply(verdict, sac if verdict == "wrong" else None)
      add("verify", rollout.verifier_prompt(case, line_id, prompt, wrong if proposal_wrong else right), reply)
    add("revise", game.revision_prompt(prompt, wrong, sac), wrong if chance(config.revise_wrong) else right)
    x_right, z_right = rng.random() < 0.5, rng.random() < 0.5
    proposal = right if x_right else wrong
    revise = z_right and not x_right
    if config.decide_style == "habit" and copycheck.is_copycheck(case):  # testbed v2
      revision = right if z_right else answer(copycheck.wrong_on_pool(case, line_id, rng))
      revise = revise and not chance(config.decide_keep * copycheck.habit(case))
    else:
      revision = right if z_right else answer(corrupt(gold, rng))
    decision = rollout.decision_prompt(case, line_id, prompt, proposal, sac, revision, rollout_cfg)
    add("decide", decision, game.render_decision(revise))
  return out


def run(config: config_lib.ExperimentConfig, workdir: str, cases: Sequence[taxcalc.TaxCase]) -> str:
  """Trains the backbone of `config.model` on `cases` and writes it (HF weights + tokenizer) to
  `workdir`; returns that directory. A directory that already holds the result is reused."""
  done = os.path.join(workdir, "warm_start.json")
  if os.path.exists(done):
    return workdir
  ws = config.warm_start
  rollout_cfg = config.rollout
  tokenizer_dir = setup.tokenizer_dir(config.model, os.path.join(workdir, "tokenizer"), cases, rollout_cfg)
  tokenizer = tokenizer_lib.load_tokenizer(tokenizer_dir)
  mesh = sharding_lib.make_mesh(config.mesh)
  model, _ = setup.load_model(config.model, config.seed, mesh, tokenizer_dir)
  by_turn = examples(cases, tokenizer, rollout_cfg, ws)
  pooled = [e for turn in ws.turns for e in by_turn[turn]]
  sft_cfg = sft.SFTConfig(
    steps=ws.steps,
    batch_size=ws.batch_size,
    learning_rate=ws.learning_rate,
    warmup_steps=ws.warmup_steps,
    seed=ws.seed,
    length_multiple=64,
    log_every=max(ws.steps // 10, 1),
    vocab_chunk=config.loss.vocab_chunk,
  )
  model, history = sft.train_sft(model, pooled, sft_cfg, pad_id=tokenizer.pad_id, label="warm start")
  hf.save_hf(model, workdir)
  tokenizer.hf.save_pretrained(workdir)
  rundir.write_json(
    done,
    {
      "examples": {turn: len(v) for turn, v in by_turn.items()},
      "config": dataclasses.asdict(ws),
      "history": history,
    },
  )
  _log.info("warm start: %s", json.dumps(history[-1]))
  return workdir
