"""Packing rollouts into fixed-shape loss chunks [rows, T].

T is bucketed to a power of two and rows to a multiple of the mesh's batch axes, so compiled
shapes repeat across steps; each chunk carries its `share` of the step's aggregation unit, so the
chunks' losses add up to the step's loss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dpa_grpo import game, rollout
from lm import scoring, shapes


@dataclasses.dataclass(frozen=True, kw_only=True)
class Item:
  """One loss item: a pair of rows sharing a prompt, its rewards, component and row penalties."""

  prompt: Sequence[int]
  completions: tuple[Sequence[int], Sequence[int]]
  rewards: tuple[float, float] = (0.0, 0.0)
  component: int = -1
  penalty: tuple[float, float] = (0.0, 0.0)


def pack_rows(prompts, completions, pad_id: int) -> dict[str, np.ndarray]:
  """`scoring.pack_pairs` with the width bucketed to a power of two (few compiled shapes)."""
  width = shapes.width_bucket(max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True)))
  return scoring.pack_pairs(prompts, completions, pad_id=pad_id, length_multiple=width)


def dpa_items(
  units: Sequence[rollout.Unit], tokenizer, *, invalid_penalty: float, proposal_weight: float
) -> dict[str, list[Item]]:
  """Each role's items: verdict pairs for every unit; decision and proposal pairs after a SAC.

  Verifier: [NS, SAC] canonical strings on the verifier prompt, rewards [S_x, 1 − S_x].
  Generator: [KEEP, REVISE] canonical strings on the decision prompt, rewards [S_x, S_z]; and the
  proposal pair [x, z] on the *draft* prompt, rewards [S_x, S_z] — the generator's proposal itself
  is trained on the two candidate answers the unit produced (see docs/dpa_grpo.md). An invalid reply
  adds an item whose first row is that reply, penalised (component −1).
  """
  encode = tokenizer.encode
  verdict_pair = tuple(encode(s) for s in game.VERIFIER_PAIR)
  decision_pair = tuple(encode(s) for s in game.GENERATOR_PAIR)
  penalty = invalid_penalty
  items: dict[str, list[Item]] = {"verifier": [], "generator": []}
  for u in units:
    sx = float(u.x_right)
    verify_ids = u.verdict.prompt_ids
    items["verifier"].append(
      Item(prompt=verify_ids, completions=verdict_pair, rewards=(sx, 1.0 - sx), component=0)
    )
    if penalty > 0 and not u.verdict.parsed.valid:
      items["verifier"].append(
        Item(prompt=verify_ids, completions=(u.verdict.reply.tokens, ()), penalty=(penalty, 0.0))
      )
    if not u.challenged:
      continue
    sz = float(u.z_right)
    decide_ids = u.decision.prompt_ids
    items["generator"].append(
      Item(prompt=decide_ids, completions=decision_pair, rewards=(sx, sz), component=0)
    )
    if proposal_weight > 0:
      items["generator"].append(
        Item(
          prompt=u.draft.prompt_ids,
          completions=(u.draft.x.tokens, u.revision.z.tokens),
          rewards=(sx, sz),
          component=1,
        )
      )
    if penalty > 0 and not u.decision.parsed.valid:
      items["generator"].append(
        Item(prompt=decide_ids, completions=(u.decision.reply.tokens, ()), penalty=(penalty, 0.0))
      )
  return items


def dpa_chunks(
  items: Sequence[Item], num_components: int, pairs: int, pad_id: int
) -> list[dict[str, np.ndarray]]:
  """Fixed-size chunks of `pairs` items; `share` and penalties make chunk losses add to the step's."""
  counts = np.bincount([i.component for i in items if i.component >= 0], minlength=num_components)
  units = max(1, sum(1 for i in items if i.component == 0) or len(items))
  chunks = []
  for start in range(0, len(items), pairs):
    chunk = list(items[start : start + pairs])
    chunk += [Item(prompt=[pad_id], completions=((), ()))] * (pairs - len(chunk))
    prompts = [i.prompt for i in chunk for _ in range(2)]
    completions = [c for i in chunk for c in i.completions]
    batch = pack_rows(prompts, completions, pad_id)
    component = np.array([i.component for i in chunk], np.int32)
    in_chunk = np.bincount(component[component >= 0], minlength=num_components)
    batch.update(
      rewards=np.array([i.rewards for i in chunk], np.float32),
      component=component,
      share=(in_chunk / np.maximum(counts, 1)).astype(np.float32),
      row_penalty=np.array([i.penalty for i in chunk], np.float32) / units,
    )
    chunks.append(batch)
  return chunks


def group_chunks(
  groups: Sequence[rollout.Group], method: str, per_chunk: int, pad_id: int
) -> list[dict[str, np.ndarray]]:
  """Fixed-size chunks of `per_chunk` groups, `share` = the chunk's part of the aggregation unit."""
  size = len(groups[0].samples)
  kept = lambda g: max(g.rewards) > min(g.rewards)
  if method == "dapo":  # token-level mean over the kept groups
    weight = lambda g: sum(len(s.tokens) for s in g.samples) if kept(g) else 0
  else:  # mean over sequences
    weight = lambda g: size
  total = max(sum(weight(g) for g in groups), 1)
  chunks = []
  for start in range(0, len(groups), per_chunk):
    chunk = list(groups[start : start + per_chunk])
    real = len(chunk)
    prompts = [g.prompt_ids for g in chunk for _ in range(size)] + [[pad_id]] * (per_chunk - real) * size
    completions = [s.tokens for g in chunk for s in g.samples] + [()] * (per_chunk - real) * size
    batch = pack_rows(prompts, completions, pad_id)
    rewards = [g.rewards for g in chunk] + [(0.0,) * size] * (per_chunk - real)
    batch.update(
      rewards=np.array(rewards, np.float32),
      group_mask=np.array([1.0] * real + [0.0] * (per_chunk - real), np.float32),
      share=np.float32(sum(weight(g) for g in chunk) / total),
    )
    chunks.append(batch)
  return chunks
