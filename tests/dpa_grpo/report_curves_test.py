"""dpa_grpo.report.training_curves: loss, reward, KL and decision rates per step, from metrics.jsonl."""

from dpa_grpo import report
from lm import rundir


def _row(step, loss):
  rollout = {"accuracy": 0.1 * step, "sac_rate": 0.5, "revise_rate": 0.2}
  return {"step": step, "generator/loss": loss, "generator/decision/kl": 0.01 * step, "rollout": rollout}


def test_training_curves_draw_every_panel_and_only_once_there_is_a_curve(tmp_path):
  rundir.append_jsonl(
    tmp_path / "dpa_grpo" / "metrics.jsonl", [{"step": 0, "eval": {"accuracy": 0.2}}, _row(1, 0.5)]
  )
  assert report.training_curves(str(tmp_path), ["dpa_grpo"], str(tmp_path / "figures")) is None  # one point
  rundir.append_jsonl(
    tmp_path / "dpa_grpo" / "metrics.jsonl", [_row(2, 0.4), {"step": 2, "eval": {"accuracy": 0.3}}]
  )
  picks = [pick(_row(2, 0.4)) for _, _, pick in report.CURVE_PANELS]
  assert picks == [
    {"generator": 0.4},
    {"training play": 0.2},
    {"generator/decision": 0.02},
    {"sac_rate": 0.5, "revise_rate": 0.2},
  ]
  path = report.training_curves(str(tmp_path), ["dpa_grpo"], str(tmp_path / "figures"))
  assert (
    path.endswith("figures/training_curves.png")
    and (tmp_path / "figures" / "training_curves.png").stat().st_size
  )
