"""DPA-GRPO theory (docs/theory.md); presets: default (the paper's code: pair/k1), paper_theory
(policy/exact, the paper's theorem), k3 (pair/k3), smoke (tiny, for tests). `launch/theory.py` turns
the ConfigDict into `dpa_grpo.theory_config.TheoryConfig`."""

import ml_collections

# Each preset with one line (launchers' --help lists them; an unknown one is refused naming the closest).
PRESETS = {
  "default": "the paper's code: pair weighting, k1 estimator",
  "paper_theory": "policy weighting, exact KL: the paper's theorem",
  "k3": "pair weighting, k3 estimator",
  "smoke": "tiny grids and few steps, for tests (seconds)",
}


def get_config(arg: str = "default") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # Fields of dpa_grpo.theory.Game; see its docstring for where the defaults come from.
  c.game = ml_collections.ConfigDict(
    dict(
      p_x_right=0.414,
      p_z_right=(0.3, 0.9),  # P(revision right | proposal wrong), P(... | proposal right)
      verifier_reward=((0.0, 1.0), (1.0, 0.0)),  # [S_x][NS, SAC]
      generator_reward=(((0.0, 0.0), (0.0, 1.0)), ((1.0, 0.0), (1.0, 1.0))),  # [S_x][S_z][KEEP, REVISE]
      verifier_ref=(0.06, 0.34),  # P_ref(SAC | proposal wrong), P_ref(SAC | proposal right)
      generator_ref=0.5,  # P_ref(REVISE)
      generator_sees_revision=True,
    )
  )
  # averaging: "expected" (the generator weighted by P(SAC), the game's ODE) or "sac_units" (its loss
  # averaged over SAC'd units, as the trainer does: the generator's clock runs 1/P(SAC) times faster).
  c.loss = ml_collections.ConfigDict(dict(beta=0.04, kl="k1", weighting="pair", averaging="expected"))
  # ODE: RK4 steps to t_end; `grid`² trajectory starts and a `quiver`² arrow grid in the portrait.
  c.ode = ml_collections.ConfigDict(dict(t_end=300.0, steps=3000, save_every=10, grid=4, quiver=17))
  # Stochastic approximation: step sizes a_n = a0 / (1 + n / n0)^kappa, `seeds` runs, `shown` drawn.
  c.sa = ml_collections.ConfigDict(
    dict(seeds=256, steps=4000, save_every=20, a0=0.5, n0=50.0, kappa=0.7, shown=6)
  )
  c.fixed_points = ml_collections.ConfigDict(
    dict(beta_min=0.01, beta_max=10.0, num_betas=13, compare_variants=True)
  )
  if arg == "paper_theory":
    c.loss.weighting, c.loss.kl = "policy", "exact"
  elif arg == "k3":
    c.loss.kl = "k3"
  elif arg == "smoke":
    c.ode.update(t_end=50.0, steps=200, save_every=10, grid=2, quiver=5)
    c.sa.update(seeds=8, steps=200, save_every=20, shown=2)
    c.fixed_points.update(num_betas=3, compare_variants=False)
  elif arg != "default":
    raise ValueError(f"configs/theory.py: unknown preset {arg!r}; valid presets: {', '.join(PRESETS)}")
  return c


def get_sweep(h):
  """β × KL estimator: the summary (dpa_grpo.plots.summarize_sweep) draws one line per estimator."""
  return h.product(
    [h.sweep("config.loss.kl", ["k1", "k3", "exact"]), h.sweep("config.loss.beta", [0.04, 0.2, 1.0])]
  )
