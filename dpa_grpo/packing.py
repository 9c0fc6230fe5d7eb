"""Packing rollouts into fixed-shape loss chunks [rows, T].

T is bucketed to a power of two and rows to a multiple of the mesh's batch axes, so compiled
shapes repeat across steps; each chunk carries its `share` of the step's aggregation unit, so the
chunks' losses add up to the step's loss.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

import numpy as np

from dpa_grpo import config as config_lib
from dpa_grpo import game, rollout
from lm import scoring, shapes

# The reference code's advantage ε: (r − μ)/(σ + 1e-8) over a group.
_REFERENCE_EPS = 1e-8


@dataclasses.dataclass(frozen=True, kw_only=True)
class Item:
  """One loss item: a pair of rows sharing a prompt, its rewards, component and row penalties.

  `weight` scales the item's paired loss (inverse-frequency case weights); `coef` and `kl_coef`
  are per-row coefficients already normalised over the step, adding coef·ℓ + kl_coef·(ℓ − ℓ_ref)
  to the loss (the revise turn's group, whose advantages are computed here over the K revisions).
  """

  prompt: Sequence[int]
  completions: tuple[Sequence[int], Sequence[int]]
  rewards: tuple[float, float] = (0.0, 0.0)
  component: int = -1
  penalty: tuple[float, float] = (0.0, 0.0)
  weight: float = 1.0
  coef: tuple[float, float] = (0.0, 0.0)
  kl_coef: tuple[float, float] = (0.0, 0.0)


def pack_rows(prompts, completions, pad_id: int) -> dict[str, np.ndarray]:
  """`scoring.pack_pairs` with the width bucketed to a power of two (few compiled shapes)."""
  width = shapes.width_bucket(max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True)))
  return scoring.pack_pairs(prompts, completions, pad_id=pad_id, length_multiple=width)


def decision_rewards(
  unit: rollout.Unit, loss: config_lib.LossConfig, revise_bonus: float = 0.0
) -> tuple[float, float]:
  """[KEEP, REVISE] rewards of a SAC'd unit.

  "outcome": [S_x, S_z] — the action whose submitted line is right; a tie when x and z are both
  right (case 2/3 with z right) or both wrong (5b / 6a), so the decision learns nothing there.
  "shaped": the reference code's counterfactual rewards (`dpa_grpo/dual_rollout.py`), with b the
  outcome bonus, in the order the reference tests them:
    z unparsable           KEEP 1          REVISE −format penalty
    x right (cases 2/3)    KEEP 1 + b      REVISE b if z is right, else −cave penalty
    x wrong, z right       KEEP −miss      REVISE 1 + b
    x wrong, z wrong       KEEP 1          REVISE 0
  plus `revise_bonus` on REVISE (`balance_bonus`, the same for every unit of an update). With a
  group of two the advantage is ±1 whatever the magnitudes (the bonus never exceeds
  strength · target = 0.45 < the smallest gap, 1, at the reference's values): the rule decides which
  action is preferred, the case weights how much a unit counts.
  """
  sx, sz = float(unit.x_right), float(bool(unit.z_right))
  if loss.decision_rewards == "outcome":
    return sx, sz
  bonus = loss.outcome_bonus
  if unit.revision.z_amount is None:
    keep, revise = 1.0, -loss.revise_format_penalty
  elif unit.x_right:
    keep, revise = 1.0 + bonus, (bonus if unit.z_right else -loss.cave_penalty)
  elif unit.z_right:
    keep, revise = -loss.miss_penalty, 1.0 + bonus
  else:
    keep, revise = 1.0, 0.0
  return keep, revise + revise_bonus


def balance_bonus(units: Sequence[rollout.Unit], loss: config_lib.LossConfig) -> float:
  """The reference's homeostatic REVISE bonus of one update (`dpa_grpo/updates.py`):
  strength · max(target − share, 0), share = the fraction of the update's SAC'd units on which
  REVISE was played (forced REVISEs included); 0 without SAC'd units or under the outcome rule."""
  played = [u.generator_action == game.REVISE for u in units if u.challenged]
  if loss.decision_rewards != "shaped" or not played or loss.balance_strength <= 0:
    return 0.0
  return loss.balance_strength * max(loss.balance_target - float(np.mean(played)), 0.0)


def case_key(case: str, by: str) -> str:
  """The class a unit's case weight counts it in: its case ("case": the 8 cases) or the
  reference's integer case id ("case_id": 5a/5b → 5, 6a/6b → 6)."""
  return case.rstrip("ab") if by == "case_id" else case


def case_weights(cases: Sequence[str], power: float = 1.0) -> list[float]:
  """Inverse-frequency weights over a update's SAC'd units: (mean count / count of the unit's
  class)^power (the reference's `approver_rare_case_weight` is the power). At power 1 the mean
  weight is 1 and every class present carries the same total weight, so a rare case (6a, 6b) is
  not drowned by a common one."""
  counts = collections.Counter(cases)
  mean = len(cases) / max(len(counts), 1)
  return [(mean / counts[c]) ** power for c in cases]


def revision_items(units: Sequence[rollout.Unit], loss: config_lib.LossConfig) -> list[Item]:
  """The revise turn's GRPO group per SAC'd unit: the K revisions on the revise prompt, reward S_z
  of each, advantages (r − μ)/(σ + 1e-8) over the K, the per-revision loss −A·ℓ + β(ℓ − ℓ_ref)
  averaged over the K and over the update's groups (summed over them under
  `loss.aggregate="sum"`), times `loss.revision_weight` (the reference code's `updates.py`). With
  `loss.revision_filter` (the reference's `skip_filer_revise_update_on_invalid_revise`),
  unparsable revisions leave the group, and a group with fewer than two left or no reward contrast
  is skipped, its KL term included. Revisions are paired two to an item (a missing partner is an
  empty row)."""
  groups = []
  for u in units:
    r = u.revision
    if r is None or not r.samples:
      continue
    members = list(zip(r.samples, r.rights, strict=True))
    if loss.revision_filter:
      members = [m for m, a in zip(members, r.amounts, strict=True) if a is not None]
      if len(members) < 2 or len({right for _, right in members}) < 2:
        continue
    groups.append((r.prompt_ids, members))
  items = []
  for prompt_ids, members in groups:
    rewards = np.array([right for _, right in members], np.float64)
    advantages = (rewards - rewards.mean()) / (rewards.std() + _REFERENCE_EPS)
    per_group = len(groups) if loss.aggregate == "mean" else 1
    scale = loss.revision_weight / (len(members) * per_group)
    rows = [(s.tokens, -a * scale) for (s, _), a in zip(members, advantages, strict=True)]
    for k in range(0, len(rows), 2):
      (t0, c0), (t1, c1) = rows[k], rows[k + 1] if k + 1 < len(rows) else ((), 0.0)
      kl1 = loss.beta * scale if k + 1 < len(rows) else 0.0
      items.append(
        Item(
          prompt=prompt_ids,
          completions=(t0, t1),
          coef=(float(c0), float(c1)),
          kl_coef=(loss.beta * scale, kl1),
        )
      )
  return items


def dpa_items(units: Sequence[rollout.Unit], tokenizer, loss: config_lib.LossConfig) -> dict[str, list[Item]]:
  """Each role's items: verdict pairs for every unit; decision and proposal pairs after a SAC.

  Verifier: [NS, SAC] canonical strings (`game.pair_strings` of `loss.pair_actions`) on the
  verifier prompt, rewards [S_x, 1 − S_x] (none on a
  unit whose draft is unparsable under `skip_verifier_on_invalid_draft`).
  Generator: [KEEP, REVISE] canonical strings on the decision prompt, rewards `decision_rewards`
  with the update's `balance_bonus`, weighted by `case_weights` over the update's SAC'd units (none
  on a unit whose kept revision is unparsable under `skip_decision_on_invalid_revision`); the
  proposal pair [x, z] on the *draft* prompt, rewards [S_x, S_z] — the generator's proposal
  trained on the two candidate answers the unit produced (see docs/dpa_grpo.md; off with
  proposal_weight 0); the revise turn's group of K revisions (`revision_items`, with
  revision_weight > 0). An invalid reply adds an item whose first row is that reply, penalised
  (component −1).
  """
  encoded: dict[str, tuple[list[int], list[int]]] = {}

  def pairs(line_id: str):  # (verifier, generator) token ids of the unit's canonical pairs
    if line_id not in encoded:
      strings = game.pair_strings(line_id, loss.pair_actions)
      encoded[line_id] = tuple(tuple(tokenizer.encode(s) for s in pair) for pair in strings)
    return encoded[line_id]

  penalty = loss.invalid_penalty
  challenged = [u for u in units if u.challenged]
  keys = [case_key(u.case, loss.case_weight_by) for u in challenged]
  weights = case_weights(keys, loss.case_weight_power) if loss.case_weights else [1.0] * len(challenged)
  weight_of = {id(u): w for u, w in zip(challenged, weights, strict=True)}
  bonus = balance_bonus(units, loss)
  items: dict[str, list[Item]] = {"verifier": [], "generator": []}
  for u in units:
    sx = float(u.x_right)
    verdict_pair, decision_pair = pairs(u.line_id)
    verify_ids = u.verdict.prompt_ids
    if not (loss.skip_verifier_on_invalid_draft and u.draft.amount is None):
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
    if not (loss.skip_decision_on_invalid_revision and u.revision.z_amount is None):
      items["generator"].append(
        Item(
          prompt=decide_ids,
          completions=decision_pair,
          rewards=decision_rewards(u, loss, bonus),
          component=0,
          weight=weight_of[id(u)],
        )
      )
    if loss.proposal_weight > 0:
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
  if loss.revision_weight > 0:
    items["generator"].extend(revision_items(units, loss))
  return items


def verdict_reward(parsed: game.VerifierReply, x_right: bool, invalid_reward: float = 0.0) -> float:
  """The reward of one sampled verdict on a draft: 1 when it is right (SAC on a wrong draft, NS on
  a right one), 0 when wrong, and `invalid_reward` when the reply does not parse as a verdict
  (`parsed.valid` false, whatever its fallback action plays; `baseline.verifier_invalid_reward`,
  default 0: as a wrong verdict)."""
  if not parsed.valid:
    return float(invalid_reward)
  return float((parsed.action == game.SAC_ACTION) != x_right)


def verifier_groups(
  units: Sequence[rollout.Unit], *, invalid_reward: float = 0.0, skip_invalid_draft: bool = False
) -> list[rollout.Group]:
  """Testbed v3's verifier under a generator-only method: each unit's G sampled verdicts
  (`Verdict.group`; the played reply alone when it has none) as one GRPO group on the verifier
  prompt, rewards `verdict_reward`, for `group_chunks` and the method's own group loss (whose
  group-normalised advantages are zero on a tied group). The DPA arms' verifier trains on the two
  fixed verdict strings of the same units instead (`dpa_items`); `skip_invalid_draft`
  (`loss.skip_verifier_on_invalid_draft`) leaves out the same units as there."""
  groups = []
  for u in units:
    if skip_invalid_draft and u.draft.amount is None:
      continue
    v = u.verdict
    samples, parsed = (v.group, v.group_parsed) if v.group else ((v.reply,), (v.parsed,))
    groups.append(
      rollout.Group(
        case_id=u.draft.case_id,
        line_id=u.line_id,
        gold=u.draft.gold,
        prompt=v.prompt,
        prompt_ids=v.prompt_ids,
        samples=tuple(samples),
        amounts=(),
        rewards=tuple(verdict_reward(p, u.x_right, invalid_reward) for p in parsed),
      )
    )
  return groups


def draft_pair_items(groups: Sequence[rollout.Group]) -> list[Item]:
  """The reference code's generator-only baseline: each line's two drafts as one pair on the draft
  prompt, rewards [S_1, S_2]; a tied pair (both right or both wrong) carries no advantage and is
  skipped, KL term included."""
  items = []
  for g in groups:
    if len(g.samples) != 2:
      raise ValueError(f"the reference baseline pairs two drafts per line, got a group of {len(g.samples)}")
    if g.rewards[0] == g.rewards[1]:
      continue
    items.append(
      Item(
        prompt=g.prompt_ids,
        completions=(g.samples[0].tokens, g.samples[1].tokens),
        rewards=(g.rewards[0], g.rewards[1]),
        component=0,
      )
    )
  return items


def dpa_chunks(
  items: Sequence[Item],
  num_components: int,
  pairs: int,
  pad_id: int,
  aggregate: str = "mean",
  share_prompts: bool = False,
) -> list[dict[str, np.ndarray]]:
  """Fixed-size chunks of `pairs` items; `share` and penalties make chunk losses add to the step's.

  `aggregate`: "mean" — each component's loss is the mean over its units in the update; "sum" —
  the sum (the reference code's: every group's loss, ÷ its size, summed over the update's
  transitions), through `component_total`, and penalties not divided by the units.
  `share_prompts` (`loss.share_prompts`): each item one row [prompt, first, second]
  (`scoring.pack_shared_pairs`) instead of two rows [prompt, first], [prompt, second]; the same
  loss and gradient with each prompt computed once."""
  counts = np.bincount([i.component for i in items if i.component >= 0], minlength=num_components)
  units = max(1, sum(1 for i in items if i.component == 0) or len(items)) if aggregate == "mean" else 1
  weighted = any(i.weight != 1.0 for i in items)
  with_rows = any(i.coef != (0.0, 0.0) or i.kl_coef != (0.0, 0.0) for i in items)
  chunks = []
  for start in range(0, len(items), pairs):
    chunk = list(items[start : start + pairs])
    chunk += [Item(prompt=[pad_id], completions=((), ()))] * (pairs - len(chunk))
    if share_prompts:
      width = shapes.width_bucket(max(len(i.prompt) + sum(map(len, i.completions)) for i in chunk))
      prompts, completions = [i.prompt for i in chunk], [tuple(i.completions) for i in chunk]
      batch = scoring.pack_shared_pairs(prompts, completions, pad_id=pad_id, length_multiple=width)
    else:
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
    # Keys only where a mechanism uses them, so a run without them compiles today's program.
    if aggregate == "sum":
      batch["component_total"] = counts.astype(np.float32)
    if weighted:
      batch["item_weight"] = np.array([i.weight for i in chunk], np.float32)
    if with_rows:
      batch["row_coef"] = np.array([i.coef for i in chunk], np.float32)
      batch["row_kl"] = np.array([i.kl_coef for i in chunk], np.float32)
    chunks.append(batch)
  return chunks


def chunk_tokens(chunk: dict[str, np.ndarray]) -> int:
  """A chunk's tokens as two rows a pair count them, whichever layout packed it (a shared row's
  prompt counts twice), so a run's tokens a second compare across `loss.share_prompts`."""
  tokens = int(chunk["attention_mask"].sum())
  if "branch" in chunk:
    tokens += int(((chunk["branch"] == 0) & (chunk["attention_mask"] == 1)).sum())
  return tokens


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
