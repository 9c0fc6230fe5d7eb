"""Where the verifier's reply format goes when training loses it: a reading of a finished run.

Two readings, both of a run directory (`dpa_grpo.train.run`'s layout):

- `departures`: for every training-rollout verdict that did not parse, the first part of the schema
  it leaves: the shared prefix `{"verdict": "`, the verdict word, the closing `"}`, the SAC body on
  the next line, or what follows a complete reply (the end of turn). From the records alone.
- `segment_drift`: at each kept checkpoint, the verifier's per-token log-probs, policy minus
  reference (the backbone with adapters off), of well-formed replies (the warm start's own targets:
  "correct", and "wrong" with the case's SAC) on validation prompts, averaged per segment of the
  schema: where the policy has moved mass off the format, and which tokens first.

`python -m dpa_grpo.format_reading --run=<workdir>/<arm>/seed<k>` prints both (markdown); the run's own
`config.json` gives its experiment.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpa_grpo import game

SEGMENTS = ("prefix", "verdict", "closing", "sac_body", "end_of_turn")
PREFIX = '{"verdict": "'
CLOSING = '"}'


def departure(text: str) -> str:
  """The first segment of the verifier's schema that `text` leaves ("none": it follows it all)."""
  for k in range(len(PREFIX)):
    if k >= len(text) or text[k] != PREFIX[k]:
      return "prefix"
  rest = text[len(PREFIX) :]
  word = next((v for v in sorted(game.VERDICTS, key=len, reverse=True) if rest.lower().startswith(v)), None)
  if word is None:
    return "verdict"
  rest = rest[len(word) :]
  if not rest.startswith(CLOSING):
    return "closing"
  rest = rest[len(CLOSING) :]
  if word != "correct":
    line, _, rest = rest.lstrip("\n").partition("\n")
    try:
      sac = json.loads(line)
    except json.JSONDecodeError:
      return "sac_body"
    if not isinstance(sac, dict) or any(not str(sac.get(f, "")).strip() for f in game.SAC_FIELDS):
      return "sac_body"
  return "end_of_turn" if rest.strip() else "none"


def departures(records: Sequence[dict[str, Any]], steps: int, parts: int = 5) -> list[dict[str, Any]]:
  """Per part of the training steps: how many verdicts did not parse, and where they departed."""
  rows = []
  for i in range(parts):
    lo, hi = i * steps / parts, (i + 1) * steps / parts
    part = [r for r in records if lo < r["step"] <= hi and "verifier_valid" in r]
    bad = [r for r in part if not r["verifier_valid"]]
    where = collections.Counter(departure((r.get("verifier") or {}).get("text", "")) for r in bad)
    rows.append(
      {"part": i + 1, "verdicts": len(part), "invalid": len(bad), **{s: where[s] for s in SEGMENTS}}
    )
  return rows


def segment_ids(tokenizer, reply: str) -> tuple[list[int], list[int]]:
  """(token ids of `reply` + end of turn, each token's segment index into `SEGMENTS`), by the
  tokenizer's character offsets: a token belongs to the segment its first character is in."""
  enc = tokenizer.hf(reply, add_special_tokens=False, return_offsets_mapping=True)
  word_end = reply.index(CLOSING, len(PREFIX))
  bounds = (len(PREFIX), word_end, word_end + len(CLOSING), len(reply))  # ends of prefix..sac_body
  segs = [next(i for i, b in enumerate(bounds) if start < b) for start, _ in enc["offset_mapping"]]
  return list(enc["input_ids"]) + [tokenizer.eos_ids[0]], segs + [SEGMENTS.index("end_of_turn")]


def segment_drift(policy, reference, tokenizer, prompts: Sequence[list[int]], replies: Sequence[str]) -> dict:
  """Mean per-token log-prob, policy − reference, of each segment over (prompt, reply) pairs."""
  import jax.numpy as jnp

  from lm import scoring

  encoded = [segment_ids(tokenizer, r) for r in replies]
  batch = scoring.pack_pairs(
    prompts, [ids for ids, _ in encoded], pad_id=tokenizer.pad_id, length_multiple=16
  )
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  pol, _ = scoring.sequence_logprobs(policy, batch)
  ref, _ = scoring.sequence_logprobs(reference, batch)
  diff = np.asarray(pol - ref)  # [B, T], right-aligned completions
  sums, counts = np.zeros(len(SEGMENTS)), np.zeros(len(SEGMENTS))
  for row, (ids, segs) in zip(diff, encoded, strict=True):
    for value, seg in zip(row[-len(ids) :], segs, strict=True):
      sums[seg] += value
      counts[seg] += 1
  return {s: float(sums[i] / max(counts[i], 1)) for i, s in enumerate(SEGMENTS)}


def read_run(run: str, config, units: int = 24) -> dict[str, Any]:
  """Both readings of the copy-and-check run at `run` (`config`: its experiment, as built), the
  drift on the first `units` validation units, each with a right and a wrong proposal."""
  from dpa_grpo import rollout, setup, testbed, train, warm_start
  from dpa_grpo.envs import copycheck
  from lm import checkpoint as ckpt_lib
  from lm import rundir

  records = list(rundir.read_jsonl(os.path.join(run, "records", "train.jsonl")))
  out: dict[str, Any] = {"departures": departures(records, config.train.steps)}
  trainer = train.Trainer(config, run)
  cases = testbed.validation_cases(config)
  replies, prompts = [], []
  cfg = trainer.rollout_cfg
  for case, line_id, prompt in list(rollout.gold_episodes(cases, cfg))[:units]:
    right = cfg.answer(line_id, case.gold[line_id], warm_start.EXPLANATION)
    wrong = cfg.answer(line_id, copycheck.confusion(case, line_id), warm_start.EXPLANATION)
    for proposal, verdict in ((right, "correct"), (wrong, "wrong")):  # the warm start's own targets
      text = rollout.verifier_prompt(case, line_id, prompt, proposal)
      prompts.append(trainer.samplers["verifier"].prompt_ids(text))
      replies.append(
        game.render_verifier_reply(verdict, setup.reviewer_sac(case, line_id) if verdict == "wrong" else None)
      )
  target = ckpt_lib.abstract_like({"params": trainer.trainable, "opt_state": trainer.opt_state})
  out["drift"] = {}
  reference = trainer.policies.reference(trainer.frozen)
  for step in sorted(trainer.checkpoints.all_steps()):
    restored, _ = trainer.checkpoints.restore(step, target)
    policy = trainer.policies.policy(restored["params"], trainer.frozen, "verifier")
    out["drift"][step] = segment_drift(policy, reference, trainer.tokenizer, prompts, replies)
  return out


def markdown(reading: dict[str, Any]) -> list[str]:
  md = [
    "Where unparsable training verdicts first leave the schema (per fifth of the steps):",
    "",
    "| fifth | verdicts | invalid | " + " | ".join(SEGMENTS) + " |",
    "|---" * (3 + len(SEGMENTS)) + "|",
  ]
  for r in reading["departures"]:
    md.append(
      f"| {r['part']} | {r['verdicts']} | {r['invalid']} | " + " | ".join(str(r[s]) for s in SEGMENTS) + " |"
    )
  md += [
    "",
    "Verifier log-prob per token, policy − reference, of well-formed replies, per segment:",
    "",
    "| step | " + " | ".join(SEGMENTS) + " |",
    "|---" * (1 + len(SEGMENTS)) + "|",
  ]
  for step, d in reading["drift"].items():
    md.append(f"| {step} | " + " | ".join(f"{d[s]:+.3f}" for s in SEGMENTS) + " |")
  return md


def main(argv):
  from absl import flags

  from dpa_grpo import config as config_lib
  from lm import rundir

  del argv
  run = flags.FLAGS.run
  config = config_lib.ExperimentConfig.from_dict(rundir.read_json(os.path.join(run, "config.json")))
  print("\n".join(markdown(read_run(run, config))))


if __name__ == "__main__":
  from absl import app, flags

  flags.DEFINE_string(
    "run", None, "a finished testbed run directory (<workdir>/<arm>/seed<k>)", required=True
  )
  app.run(main)
