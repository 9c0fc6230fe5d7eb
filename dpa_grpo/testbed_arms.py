"""What the copy-and-check testbed's runner, report and theory share: the arms, the seeds, the
step-0 gates' bounds and how they print, and the run directory layout.

Kept apart from `dpa_grpo.testbed` (the runner) so that `testbed_report` and `testbed_theory`, which
the runner calls, read these without importing the runner back (no import cycle).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from dpa_grpo import config as config_lib

# The step-0 gates, fixed before any comparison was run (docs/dpa_grpo.md, the testbed section).
# They are the testbed's definition of "every role can learn and has room to move": a run whose
# warm start fails one is not a test of the method, so it stops. Never loosen them to pass.
GATE_DRAFT = (0.4, 0.8)  # P(x right) of every line: about 0.5-0.7
GATE_SAC_GAP = (0.1, 0.7)  # SAC rate on wrong drafts minus on right drafts: informative, far from perfect
GATE_FIX = (0.2, 0.6)  # P(z right | x wrong) after a SAC
# Testbed v2's gates (pre-registered: written 2026-12-03 before any v2 run, docs/dpa_grpo.md "Testbed v2"),
# on top of the three above: "the decision has a signal" means wrong revisions look like answers
# (on the line's answer pool, so only a comparison with the field tells them apart), and the
# greedy decision is not constant where REVISE pays: on SAC'd wrong drafts whose revision is right
# it KEEPs sometimes (room to learn) and REVISEs sometimes (it can read the note), on enough units.
GATE_V2_ON_POOL = 0.8  # lower bound: share of wrong revisions (SAC'd wrong drafts) on the answer pool
GATE_V2_KEEP_FIXABLE = (0.2, 0.8)  # greedy KEEP rate on SAC'd wrong drafts with a right revision
GATE_V2_MIN_FIXABLE = 10  # at least this many such units in the greedy play
# Testbed v3's validity gate on a finished run (registered with v3's rows; `testbed_report.v3_format_gate`):
# the share of its training-rollout verdicts that parse in the last fifth of its steps, the
# quantity of the F rows (`testbed_report.training_health`), must reach this bound, or the run's
# comparison measures a verifier that has left the verdict format, not the method.
GATE_V3_FORMAT = 0.9


@dataclasses.dataclass(frozen=True, kw_only=True)
class Arm:
  """One compared training: the method and the config keys it changes, and why."""

  name: str
  method: str
  label: str
  loss: dict[str, Any] = dataclasses.field(default_factory=dict)
  baseline_mode: str = "library"
  rollout: dict[str, Any] = dataclasses.field(default_factory=dict)
  optim: dict[str, Any] = dataclasses.field(default_factory=dict)
  baseline: dict[str, Any] = dataclasses.field(default_factory=dict)  # `config.BaselineConfig` keys


ARMS = {
  a.name: a
  for a in (
    Arm(name="dpa_k1", method="dpa_grpo", label="DPA-GRPO, reference loss (pair / k1)", loss=dict(kl="k1")),
    Arm(name="dpa_k3", method="dpa_grpo", label="DPA-GRPO, anchored loss (pair / k3)", loss=dict(kl="k3")),
    Arm(
      name="grpo_reference",
      method="grpo",
      label="GRPO, the reference's baseline mode (pairs of drafts, pair loss)",
      baseline_mode="reference",
      rollout=dict(group_size=2, group_carry="best"),
    ),
    Arm(name="grpo", method="grpo", label="GRPO, library-standard (groups of 4)"),
  )
}
SEEDS = (0, 1, 2)

# Testbed v2 (`is_v2`): the paper's mechanism against the same method with its revision channel
# off. Both keep the proposal and verifier losses; only the revise turn's group (the reference's
# revision_weight 1.0 with its filter, `_reference_training` in configs/dpa_grpo.py) and the
# KEEP / REVISE pair differ.
V2_ARMS = {
  a.name: a
  for a in (
    Arm(
      name="dpa_paper",
      method="dpa_grpo",
      label="DPA-GRPO, the paper's mechanism (revision weight 1.0, decision pair on)",
      loss=dict(kl="k1", revision_weight=1.0, revision_filter=True, decision_weight=1.0),
    ),
    Arm(
      name="proposal_only",
      method="dpa_grpo",
      label="ablation: revision off (no revise-turn loss, no decision pair)",
      loss=dict(kl="k1", revision_weight=0.0, revision_filter=False, decision_weight=0.0),
    ),
  )
}
# The follow-up registered on 2026-12-03 (docs/dpa_grpo.md, "Testbed v2 follow-up: the k3 anchor"):
# the same two arms with the k3 estimator in place of the reference's k1. On the pair loss's fixed
# counterfactual actions k1's gradient β·½(∇ℓ_a + ∇ℓ_b) lowers both actions' log-probs on every
# unit, ties included, so it is a push away from the reference, not an anchor; k3's,
# β·½Σ(1 − e^{ℓref−ℓ})∇ℓ, pulls ℓ back up once it falls below the reference. Not a preset default:
# run with --arms=dpa_paper_k3,proposal_only_k3 into its own work directory.
V2_K3_ARMS = {
  f"{a.name}_k3": dataclasses.replace(
    a, name=f"{a.name}_k3", label=f"{a.label}; k3 estimator", loss=dict(a.loss, kl="k3")
  )
  for a in V2_ARMS.values()
}
# The collapse ablations registered on 2026-12-03 (docs/dpa_grpo.md, "Testbed v2: the collapse
# ablations", before any of their runs): v2's two arms with one of our choices that the reference
# code does not make undone at a time. Suffix -> (what it changes, loss keys, optimiser keys).
V2_ABLATIONS = {
  "a1": ("no penalty on unparsable replies", dict(invalid_penalty=0.0), {}),
  "a2": (
    "the reference's pair stubs (detached from the sampled reply)",
    dict(pair_actions="reference_stub"),
    {},
  ),
  "a3": ("exact two-action KL with policy weighting", dict(kl="exact", weighting="policy"), {}),
  "a4": ("learning rate 1e-4", {}, dict(lr=1e-4)),
  "a5": ("a1 and a2 together", dict(invalid_penalty=0.0, pair_actions="reference_stub"), {}),
}
V2_ABLATION_ARMS = {
  f"{a.name}_{suffix}": dataclasses.replace(
    a, name=f"{a.name}_{suffix}", label=f"{a.label}; {what}", loss=dict(a.loss, **loss), optim=optim
  )
  for suffix, (what, loss, optim) in V2_ABLATIONS.items()
  for a in V2_ARMS.values()
}
V2_SEEDS = tuple(range(9))
# Testbed v3 (`is_v3`, the `testbed_v3` preset: v2 with the collapse's fix in the preset; registered
# in docs/dpa_grpo.md, "Testbed v3: predictions", before any v3 arm ran): v2's two arms, the paper's
# generator-only GRPO (verifier frozen), and GRPO that trains the verifier as well, with plain group
# advantages on its own sampled verdicts (`config.BaselineConfig.train_verifier`). Budget: G =
# `baseline.verifier_group_size` = 2 sampled verdicts per unit, each a trained verifier sequence —
# the DPA arms train 2 per unit too (the fixed NS and SAC strings), though a sampled SAC is longer
# (its Claim/Argument/Evidence). The generator trains as in the `grpo` arm (groups of
# `rollout.group_size` drafts).
V3_ARMS = {
  a.name: a
  for a in (
    Arm(
      name="grpo_verifier",
      method="grpo",
      label="GRPO, verifier trained too: groups of 2 sampled verdicts per unit (DPA: 2 fixed strings)",
      baseline=dict(train_verifier=True, verifier_group_size=2),
    ),
  )
}
V3_DEFAULT_ARMS = ("dpa_paper", "proposal_only", "grpo", "grpo_verifier")
ALL_ARMS = {**ARMS, **V2_ARMS, **V2_K3_ARMS, **V2_ABLATION_ARMS, **V3_ARMS}


def is_v2(config: config_lib.ExperimentConfig) -> bool:
  """Whether `config` is testbed v2 or v3 (the `testbed_v2` / `testbed_v3` presets): its warm
  start's decision examples are the "habit" style. v3 is v2 with other arms and the fix."""
  return config.warm_start.decide_style == "habit"


def is_v3(config: config_lib.ExperimentConfig) -> bool:
  """Whether `config` is testbed v3 (the `testbed_v3` preset): v2 whose preset trains the
  reference's pair stubs (the collapse ablations' fix), not an ablation arm on v2."""
  return is_v2(config) and config.loss.pair_actions == "reference_stub"


def default_arms(config: config_lib.ExperimentConfig) -> tuple[str, ...]:
  if is_v3(config):
    return V3_DEFAULT_ARMS
  return tuple(V2_ARMS if is_v2(config) else ARMS)


def arm_config(config: config_lib.ExperimentConfig, arm: Arm, seed: int, checkpoint: str):
  """The experiment config of one arm and seed, from the warm-started `checkpoint`."""
  c = config.for_method(arm.method, checkpoint)
  return dataclasses.replace(
    c,
    seed=seed,
    compare=(),
    warm_start=dataclasses.replace(c.warm_start, steps=0),
    loss=dataclasses.replace(c.loss, **arm.loss),
    baseline=dataclasses.replace(c.baseline, mode=arm.baseline_mode, **arm.baseline),
    rollout=dataclasses.replace(c.rollout, **arm.rollout),
    optim=dataclasses.replace(c.optim, **arm.optim),
  )


GATE_NAMES = ("draft", "sac_gap", "fix", "on_pool", "decision")  # what --waive_gates may name


def gate_failures(m: dict[str, Any]) -> dict[str, list[str]]:
  """The failed gates of `gate_measures` output by name (`GATE_NAMES`), each as sentences."""
  failed: dict[str, list[str]] = {}
  add = lambda name, sentence: failed.setdefault(name, []).append(sentence)
  inside = lambda v, bounds: bounds[0] <= v <= bounds[1]
  for line, r in m["x_right"].items():
    if not inside(r["rate"], GATE_DRAFT):
      add("draft", f"P(x right) of line {line} is {r['rate']:.3f}, outside {GATE_DRAFT}")
  gap = m["sac_on_wrong"]["rate"] - m["sac_on_right"]["rate"]
  if not inside(gap, GATE_SAC_GAP):
    add(
      "sac_gap",
      f"SAC rate on wrong drafts {m['sac_on_wrong']['rate']:.3f} minus on right drafts "
      f"{m['sac_on_right']['rate']:.3f} = {gap:.3f}, outside {GATE_SAC_GAP}",
    )
  fix = m["z_right_given_x_wrong"]["rate"]
  if not inside(fix, GATE_FIX):  # nan (no SAC'd wrong draft) fails too
    add("fix", f"P(z right | x wrong) is {fix:.3f}, outside {GATE_FIX}")
  if "v2" in m:
    pool, keep = m["v2"]["wrong_revision_on_pool"], m["v2"]["greedy_keep_fixable"]
    if not pool["rate"] >= GATE_V2_ON_POOL:  # nan fails
      add("on_pool", f"wrong revisions on the answer pool {pool['rate']:.3f}, below {GATE_V2_ON_POOL}")
    if keep["n"] < GATE_V2_MIN_FIXABLE:
      add(
        "decision",
        f"{keep['n']} greedy SAC'd wrong drafts with a right revision, fewer than {GATE_V2_MIN_FIXABLE}",
      )
    elif not inside(keep["rate"], GATE_V2_KEEP_FIXABLE):
      add(
        "decision",
        f"greedy KEEP rate on SAC'd wrong drafts with a right revision {keep['rate']:.3f}, "
        f"outside {GATE_V2_KEEP_FIXABLE}",
      )
  return failed


def judged(result: dict[str, Any], waive: Sequence[str]) -> dict[str, Any]:
  """gates.json's `result` with "failed" judged again under `waive` and the waived failures kept
  under "waived" (what the gates print and the report shows)."""
  failures = gate_failures(result["measures"])
  waived = [s for name in waive for s in failures.get(name, [])]
  return {**result, "failed": judge_gates(result["measures"], waive), "waived": waived}


def judge_gates(m: dict[str, Any], waive: Sequence[str] = ()) -> list[str]:
  """The failed gates of `gate_measures` output, each as a sentence (empty: all pass), less the
  gates named in `waive` (`GATE_NAMES`)."""
  return [s for name, sentences in gate_failures(m).items() if name not in waive for s in sentences]


def format_gates(result: dict[str, Any]) -> str:
  """The gates as printed at step 0 and shown in the report."""
  m = result["measures"]
  fmt = lambda r: f"{r['rate']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] ({r['k']}/{r['n']})"
  rows = [f"step-0 gates on {m['units']} validation units:"]
  rows += [f"  P(x right), line {line}: {fmt(r)}  gate {GATE_DRAFT}" for line, r in m["x_right"].items()]
  rows.append(f"  SAC rate on wrong drafts: {fmt(m['sac_on_wrong'])}")
  rows.append(f"  SAC rate on right drafts: {fmt(m['sac_on_right'])}  gap gate {GATE_SAC_GAP}")
  for line, r in m["sac_by_line"].items():
    rows.append(f"    line {line}: on wrong {fmt(r['on_wrong'])}, on right {fmt(r['on_right'])}")
  rows.append(f"  P(z right | x wrong): {fmt(m['z_right_given_x_wrong'])}  gate {GATE_FIX}")
  if "v2" in m:
    v2 = m["v2"]
    rows.append(
      f"  wrong revisions on the answer pool: {fmt(v2['wrong_revision_on_pool'])}  gate >= {GATE_V2_ON_POOL}"
    )
    rows.append(
      f"  greedy KEEP on SAC'd wrong drafts, revision right: {fmt(v2['greedy_keep_fixable'])}  "
      f"gate {GATE_V2_KEEP_FIXABLE}, n >= {GATE_V2_MIN_FIXABLE}"
    )
    rows += [f"  greedy {name}: {fmt(r)}" for name, r in v2["greedy_decision"].items()]
  rows.append("  all gates pass" if not result["failed"] else "  FAILED: " + "; ".join(result["failed"]))
  if result.get("waived"):
    rows.append("  WAIVED by a dated amendment (docs/dpa_grpo.md): " + "; ".join(result["waived"]))
  return "\n".join(rows)


def run_dir(workdir: str, arm: str, seed: int) -> str:
  return os.path.join(workdir, arm, f"seed{seed}")
