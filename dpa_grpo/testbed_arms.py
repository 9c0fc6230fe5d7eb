"""What the copy-and-check testbed's runner, report and theory share: the arms, the seeds, the
step-0 gates' bounds and how they print, and the run directory layout.

Kept apart from `dpa_grpo.testbed` (the runner) so that `testbed_report` and `testbed_theory`, which
the runner calls, read these without importing the runner back (no import cycle).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from dpa_grpo import config as config_lib

# The step-0 gates, fixed before any comparison was run (docs/dpa_grpo.md, the testbed section).
# They are the testbed's definition of "every role can learn and has room to move": a run whose
# warm start fails one is not a test of the method, so it stops. Never loosen them to pass.
GATE_DRAFT = (0.4, 0.8)  # P(x right) of every line: about 0.5-0.7
GATE_SAC_GAP = (0.1, 0.7)  # SAC rate on wrong drafts minus on right drafts: informative, far from perfect
GATE_FIX = (0.2, 0.6)  # P(z right | x wrong) after a SAC


@dataclasses.dataclass(frozen=True, kw_only=True)
class Arm:
  """One compared training: the method and the config keys it changes, and why."""

  name: str
  method: str
  label: str
  loss: dict[str, Any] = dataclasses.field(default_factory=dict)
  baseline_mode: str = "library"
  rollout: dict[str, Any] = dataclasses.field(default_factory=dict)


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


def arm_config(config: config_lib.ExperimentConfig, arm: Arm, seed: int, checkpoint: str):
  """The experiment config of one arm and seed, from the warm-started `checkpoint`."""
  c = config.for_method(arm.method, checkpoint)
  return dataclasses.replace(
    c,
    seed=seed,
    compare=(),
    warm_start=dataclasses.replace(c.warm_start, steps=0),
    loss=dataclasses.replace(c.loss, **arm.loss),
    baseline=dataclasses.replace(c.baseline, mode=arm.baseline_mode),
    rollout=dataclasses.replace(c.rollout, **arm.rollout),
  )


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
  rows.append("  all gates pass" if not result["failed"] else "  FAILED: " + "; ".join(result["failed"]))
  return "\n".join(rows)


def run_dir(workdir: str, arm: str, seed: int) -> str:
  return os.path.join(workdir, arm, f"seed{seed}")
