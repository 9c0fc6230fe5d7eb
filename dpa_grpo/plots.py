"""Figures of the DPA-GRPO theory, and the JSON of every number behind them.

`run_theory(config, workdir)` is the library side of `launch/theory.py`: it computes the phase
portrait, ODE and stochastic-approximation paths, fixed points across β, the 8 case probabilities
and the eigenvalue summary, writes each figure as PNG and PDF and everything into `theory.json`.
`summarize_sweep(workdir)` builds the β-sweep figure from the `theory.json` files of a sweep's
points (see `lm/sweep.py`). docs/theory.md explains what each figure shows.
"""

from __future__ import annotations

import dataclasses
import io
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from dpa_grpo import theory  # noqa: E402
from dpa_grpo.theory_config import TheoryConfig  # noqa: E402
from lm import rundir  # noqa: E402
from lm.plotting import plt  # noqa: E402

FIGURES = ("phase_portrait", "sa_vs_ode", "fixed_points_vs_beta", "case_probabilities", "eigenvalues")


def _save(fig, workdir: str, name: str) -> list[str]:
  paths = []
  for ext in ("png", "pdf"):
    buf = io.BytesIO()
    fig.savefig(buf, format=ext, dpi=110, bbox_inches="tight")
    path = os.path.join(workdir, f"{name}.{ext}")
    rundir.atomic_write_bytes(path, buf.getvalue())
    paths.append(path)
  plt.close(fig)
  return paths


def _jsonable(x):
  """Arrays to nested lists with NaN / ±inf as null (strict JSON)."""
  if isinstance(x, dict):
    return {k: _jsonable(v) for k, v in x.items()}
  if isinstance(x, list | tuple):
    return [_jsonable(v) for v in x]
  if isinstance(x, np.ndarray | jax.Array | np.generic):
    a = np.asarray(x)
    if np.iscomplexobj(a):
      return {"real": _jsonable(a.real), "imag": _jsonable(a.imag)}
    a = a.astype(object) if a.dtype.kind == "f" else a
    if a.dtype == object:
      a = np.where(np.isfinite(np.asarray(x, float)), a, None)
    return a.tolist()
  if isinstance(x, float) and not np.isfinite(x):
    return None
  return x


def _fixed_point_record(fp: theory.FixedPoint) -> dict:
  return {
    "theta": fp.theta,
    "probs": fp.probs,
    "eigenvalues": fp.eigenvalues,
    "stable": fp.stable,
    "residual": fp.residual,
  }


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def _variant_label(weighting: str, kl: str) -> str:
  return f"{weighting}/{kl}"


def run_theory(config: TheoryConfig, workdir: str) -> dict:
  """Computes every theory result for `config` and writes figures + `theory.json` into `workdir`."""
  start = time.time()
  game = config.game
  beta, kl, weighting = float(config.loss.beta), config.loss.kl, config.loss.weighting
  names, (ix, iy) = game.state_names(), game.portrait_axes()
  theta_ref = theory.reference_logits(game)
  with jax.enable_x64(True):
    paths = lambda starts, t_end: theory.ode_paths(
      jnp.asarray(starts),
      game,
      beta,
      kl=kl,
      weighting=weighting,
      averaging=config.loss.averaging,
      t_end=t_end,
      steps=config.ode.steps,
      save_every=config.ode.save_every,
    )
    result = {
      "config": config.to_dict(),
      "game": dataclasses.asdict(game),
      "states": names,
      "portrait_axes": [ix, iy],
      "reference_probs": _sigmoid(theta_ref),
      "expected_advantages": theory.expected_advantages(game),
      "action_values": theory.action_values(game),
      "best_responses": theory.best_responses(game),
    }

    # Phase portrait: F on a grid of the two portrait coordinates, the others at the reference.
    grid = np.linspace(0.02, 0.98, config.ode.quiver)
    gx, gy = np.meshgrid(grid, grid)
    thetas = np.tile(theta_ref, (gx.size, 1))
    thetas[:, ix], thetas[:, iy] = theory.logit(gx.ravel()), theory.logit(gy.ravel())
    field = np.asarray(
      theory.vector_fields(
        jnp.asarray(thetas), game, beta, kl=kl, weighting=weighting, averaging=config.loss.averaging
      )
    )
    p = _sigmoid(thetas)
    p_dot = p * (1 - p) * field  # dp/dt = p(1 − p) dθ/dt
    starts_p = np.linspace(0.05, 0.95, config.ode.grid)
    sx, sy = (a.ravel() for a in np.meshgrid(starts_p, starts_p))
    starts = np.tile(theta_ref, (sx.size, 1))
    starts[:, ix], starts[:, iy] = theory.logit(sx), theory.logit(sy)
    times, traj = jax.device_get(paths(starts, config.ode.t_end))
    result["portrait"] = {
      "grid": grid,
      "p_dot_x": p_dot[:, ix].reshape(gx.shape),
      "p_dot_y": p_dot[:, iy].reshape(gx.shape),
      "times": times,
      "trajectories": _sigmoid(traj),
    }

    # Fixed points at the configured β for every loss variant, and across β.
    betas = np.geomspace(
      config.fixed_points.beta_min, config.fixed_points.beta_max, config.fixed_points.num_betas
    )
    variants = theory.LOSS_VARIANTS if config.fixed_points.compare_variants else ((weighting, kl),)
    result["betas"] = betas
    result["variants"] = {}
    for w, k in variants:
      per_beta = theory.fixed_points_over_beta(game, np.append(betas, beta), kl=k, weighting=w)
      closed = [theory.closed_form_fixed_points(game, b, kl=k, weighting=w) for b in np.append(betas, beta)]
      stable = np.full((len(betas), game.dim), np.nan)
      for b, fps in enumerate(per_beta[:-1]):
        if fps and fps[0].stable:
          stable[b] = fps[0].probs
      result["variants"][_variant_label(w, k)] = {
        "fixed_points": [_fixed_point_record(fp) for fp in per_beta[-1]],
        "closed_form": None if closed[-1] is None else [list(r) for r in closed[-1]],
        "stable_probs_over_beta": stable,
        "closed_form_over_beta": [None if c is None else [list(r) for r in c] for c in closed[:-1]],
      }

    # Stochastic approximation from the reference, against the ODE path over the same ODE time.
    sa = config.sa
    sa_times, sa_theta = jax.device_get(
      theory.stochastic_approximation(
        jax.random.key(config.seed),
        jnp.asarray(theta_ref),
        game,
        beta,
        kl=kl,
        weighting=weighting,
        steps=sa.steps,
        seeds=sa.seeds,
        save_every=sa.save_every,
        a0=sa.a0,
        n0=sa.n0,
        kappa=sa.kappa,
        averaging=config.loss.averaging,
      )
    )
    ode_times, ode_theta = jax.device_get(paths(theta_ref[None], float(sa_times[-1])))
    ode_theta = ode_theta[0]
    sa_p = _sigmoid(sa_theta)  # [seeds, S, dim]
    result["sa"] = {
      "times": sa_times,
      "mean": sa_p.mean(0),
      "std": sa_p.std(0),
      "paths": sa_p[: sa.shown],
      "ode_times": ode_times,
      "ode": _sigmoid(ode_theta),
    }

    # The 8 cases along the ODE path from the reference.
    cases = np.asarray(theory.case_probabilities(game, jnp.asarray(ode_theta)))
    accuracy = np.asarray(theory.final_accuracy(game, jnp.asarray(ode_theta)))
  result["cases"] = {"names": theory.CASES, "times": ode_times, "probs": cases, "final_accuracy": accuracy}
  result["deviations_at_reference"] = [
    dataclasses.asdict(d) for d in theory.deviations(game, _sigmoid(theta_ref))
  ]
  result["case_deviations"] = {
    c: [dataclasses.asdict(d) for d in ds] for c, ds in theory.case_deviations(game).items()
  }

  figures = []
  figures += _plot_portrait(result, game, workdir, (weighting, kl))
  figures += _plot_sa(result, names, (ix, iy), workdir)
  figures += _plot_beta(result, game, workdir)
  figures += _plot_cases(result, workdir)
  figures += _plot_eigenvalues(result, beta, workdir)
  result["figures"] = [os.path.basename(f) for f in figures]
  result["wall_seconds"] = time.time() - start
  rundir.write_json(os.path.join(workdir, "theory.json"), _jsonable(result))
  return result


def _plot_portrait(result, game, workdir, variant):
  r, (ix, iy) = result["portrait"], result["portrait_axes"]
  names = result["states"]
  fig, ax = plt.subplots(figsize=(6, 5.5))
  grid = r["grid"]
  speed = np.hypot(r["p_dot_x"], r["p_dot_y"])
  ax.quiver(
    grid,
    grid,
    r["p_dot_x"] / (speed + 1e-12),
    r["p_dot_y"] / (speed + 1e-12),
    np.log10(speed + 1e-12),
    cmap="Greys",
    alpha=0.6,
    scale=35,
    width=0.003,
  )
  for traj in r["trajectories"]:
    ax.plot(traj[:, ix], traj[:, iy], color="tab:blue", lw=1)
    ax.plot(traj[0, ix], traj[0, iy], "o", color="tab:blue", ms=3)
  ref = result["reference_probs"]
  ax.plot(ref[ix], ref[iy], "s", color="tab:orange", label="reference π_ref")
  fps = result["variants"].get(_variant_label(*variant), {}).get("fixed_points", [])
  for fp in fps:
    ax.plot(
      fp["probs"][ix],
      fp["probs"][iy],
      "*" if fp["stable"] else "x",
      ms=12,
      color="tab:green" if fp["stable"] else "tab:red",
      label="stable fixed point" if fp["stable"] else "unstable fixed point",
    )
  beta = result["config"]["loss"]["beta"]
  ax.set(
    xlabel=f"P({names[ix]})",
    ylabel=f"P({names[iy]})",
    xlim=(0, 1),
    ylim=(0, 1),
    title=f"ODE phase portrait, {_variant_label(*variant)} loss, β = {beta:g}",
  )
  handles, labels = ax.get_legend_handles_labels()
  unique = dict(zip(labels, handles, strict=True))
  ax.legend(unique.values(), unique.keys(), loc="lower left", fontsize=8)
  return _save(fig, workdir, "phase_portrait")


def _plot_sa(result, names, axes, workdir):
  r = result["sa"]
  fig, panels = plt.subplots(1, 3, figsize=(15, 4.5))
  ix, iy = axes
  for path in r["paths"]:
    panels[0].plot(path[:, ix], path[:, iy], color="tab:gray", lw=0.6, alpha=0.7)
  panels[0].plot(r["mean"][:, ix], r["mean"][:, iy], color="tab:blue", lw=2, label="SA mean over seeds")
  panels[0].plot(r["ode"][:, ix], r["ode"][:, iy], "--", color="k", lw=1.5, label="ODE")
  panels[0].set(
    xlabel=f"P({names[ix]})",
    ylabel=f"P({names[iy]})",
    xlim=(0, 1),
    ylim=(0, 1),
    title="sampled paired updates vs ODE",
  )
  panels[0].legend(fontsize=8)
  for panel, i in zip(panels[1:], axes, strict=True):
    panel.fill_between(
      r["times"],
      r["mean"][:, i] - r["std"][:, i],
      r["mean"][:, i] + r["std"][:, i],
      color="tab:blue",
      alpha=0.2,
      label="SA mean ± sd",
    )
    panel.plot(r["times"], r["mean"][:, i], color="tab:blue")
    panel.plot(r["ode_times"], r["ode"][:, i], "--", color="k", label="ODE")
    panel.set(xlabel="ODE time t_n = Σ a_k", ylabel=f"P({names[i]})", ylim=(0, 1))
    panel.legend(fontsize=8)
  return _save(fig, workdir, "sa_vs_ode")


def _plot_beta(result, game, workdir):
  names, betas = result["states"], result["betas"]
  br = result["best_responses"]
  fig, panels = plt.subplots(2, 3, figsize=(13, 7), sharex=True)
  for s, panel in enumerate(panels.ravel()[: game.dim]):
    for c, (label, v) in enumerate(result["variants"].items()):
      color = f"C{c}"
      panel.plot(
        betas, v["stable_probs_over_beta"][:, s], "-", color=color, label=f"{label} (numeric, stable)"
      )
      closed = [(b, r) for b, cf in zip(betas, v["closed_form_over_beta"], strict=True) if cf for r in cf[s]]
      if closed:
        panel.plot(*zip(*closed, strict=True), "o", mfc="none", color=color, ms=4)
    limit = br[s] if br[s] >= 0 else result["reference_probs"][s]
    panel.axhline(
      limit, color="k", ls=":", lw=1, label="β → 0: best response" if br[s] >= 0 else "tie: π_ref"
    )
    panel.set(xscale="log", title=names[s], ylim=(-0.03, 1.03))
  for panel in panels[-1]:
    panel.set_xlabel("β")
  panels[0, 0].legend(fontsize=7)
  fig.suptitle(
    "Fixed point vs β. Lines: stable roots of the jax.grad ODE (numeric); "
    "circles: closed-form roots (pair/k1's repel)"
  )
  return _save(fig, workdir, "fixed_points_vs_beta")


def _plot_cases(result, workdir):
  r = result["cases"]
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for c, name in enumerate(r["names"]):
    ax.plot(r["times"], r["probs"][:, c], label=f"case {name}", color=f"C{c}")
  ax.plot(r["times"], r["final_accuracy"], "k--", label="final output right")
  ax.set(
    xlabel="ODE time", ylabel="probability", ylim=(0, 1), title="The 8 cases along the ODE path from π_ref"
  )
  ax.legend(fontsize=8, ncol=2)
  return _save(fig, workdir, "case_probabilities")


def _plot_eigenvalues(result, beta, workdir):
  fig, ax = plt.subplots(figsize=(8, 4.5))
  labels = list(result["variants"])
  for x, label in enumerate(labels):
    fps = result["variants"][label]["fixed_points"]
    if not fps:
      ax.text(x, 0, "none", ha="center", va="center", fontsize=8, color="tab:gray")
    for fp in fps:
      real = np.real(fp["eigenvalues"])
      ax.plot(
        np.full(real.shape, x),
        real,
        "o" if fp["stable"] else "x",
        color="tab:green" if fp["stable"] else "tab:red",
        ms=5,
      )
  ax.axhline(0, color="k", lw=0.8)
  ax.set_yscale("symlog", linthresh=1e-4)
  ax.set_xticks(range(len(labels)), labels)
  ax.set(ylabel="Re λ of ∂F/∂θ", title=f"Jacobian eigenvalues at every isolated fixed point, β = {beta:g}")
  return _save(fig, workdir, "eigenvalues")


def summarize_sweep(workdir: str) -> str:
  """Fixed point and ODE end point vs β for each loss variant, from a finished sweep's points.

  Reads `<workdir>/index.json` (written by `lm.sweep`) and each finished point's `theory.json`;
  writes `sweep_summary.{png,pdf,json}` into `workdir`. Returns the JSON path.
  """
  index = rundir.read_json(os.path.join(workdir, "index.json"))
  rows = []
  for point in index["points"]:
    path = os.path.join(workdir, point["subdir"], "theory.json")
    if point["status"] != "done" or not os.path.exists(path):
      continue
    r = rundir.read_json(path)
    loss = r["config"]["loss"]
    fps = r["variants"][_variant_label(loss["weighting"], loss["kl"])]["fixed_points"]
    stable = [fp for fp in fps if fp["stable"]]
    rows.append(
      {
        "point": point["name"],
        "beta": loss["beta"],
        "variant": _variant_label(loss["weighting"], loss["kl"]),
        "stable_fixed_point": stable[0]["probs"] if stable else None,
        "ode_end": r["sa"]["ode"][-1],
        "states": r["states"],
        "portrait_axes": r["portrait_axes"],
      }
    )
  if not rows:
    raise ValueError(f"{workdir}: no finished sweep point has a theory.json")
  states, axes = rows[0]["states"], rows[0]["portrait_axes"]
  fig, panels = plt.subplots(1, 2, figsize=(12, 4.5))
  for c, variant in enumerate(sorted({r["variant"] for r in rows})):
    mine = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["beta"])
    b = [r["beta"] for r in mine]
    for panel, i in zip(panels, axes, strict=True):
      fixed = [np.nan if r["stable_fixed_point"] is None else r["stable_fixed_point"][i] for r in mine]
      panel.plot(b, fixed, "o-", color=f"C{c}", label=f"{variant}: stable fixed point")
      panel.plot(
        b, [r["ode_end"][i] for r in mine], "s--", mfc="none", color=f"C{c}", label=f"{variant}: ODE end"
      )
  for panel, i in zip(panels, axes, strict=True):
    panel.set(xscale="log", xlabel="β", ylabel=f"P({states[i]})", ylim=(-0.03, 1.03))
  panels[0].legend(fontsize=7)
  fig.suptitle(f"β sweep: {len(rows)} points from {workdir}")
  _save(fig, workdir, "sweep_summary")
  out = os.path.join(workdir, "sweep_summary.json")
  rundir.write_json(out, _jsonable({"rows": rows}))
  return out
