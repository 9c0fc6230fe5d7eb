"""The Generator–Verifier game of DPA-GRPO: Nash conditions, the training ODE, its fixed points.

One decision unit: the generator's proposal x is right (S_x = 1) with probability `p_x_right`; after
a SAC the generator's revision z is right (S_z = 1) with probability `p_z_right[S_x]`. The verifier
sees the proposal (its policy is a logit per S_x) and chooses NS or SAC; after SAC the generator
chooses KEEP or REVISE (its policy is a logit per (S_x, S_z), or per S_x when it cannot see whether
its revision is right). Each role's paired group is scored with its reward table; the generator's
pair exists only when the verifier raised a SAC.

Parameters are one logit vector θ = [θ_V(S_x=0), θ_V(S_x=1), θ_G(state_0), ...], each the log-odds
of action 1 (SAC, REVISE) over action 0 (NS, KEEP) in one information state.

The ODE is θ̇ = F(θ) = −E_{o ~ P_θ}[∇_θ L(o; θ)]: the expected gradient of the training loss
`dpa_grpo.losses.paired_loss` on one decision unit o = (S_x, S_z, verifier action), with the outcome
distribution P_θ held fixed while differentiating (as stochastic approximation samples it). It is
built with `jax.grad`, never written by hand, so theory and training cannot drift apart; the
closed forms below are derived separately (docs/theory.md) and tested against it.

Averaging (`averaging`): "expected" weights each unit's generator loss by P_θ(o), so the generator
moves at the rate P(SAC) at which its pair exists; "sac_units" is what the trainer does — the
generator's loss is a mean over the SAC'd units of a batch only (`losses.paired_loss` with its
mask), whose expectation is the "expected" loss divided by P_θ(SAC) (the marginal SAC rate). Its
generator clock runs 1/P(SAC) times faster; fixed points and the signs of their eigenvalues are the
same (the generator rows of F are scaled by a positive number), only the time scale differs.

Fixed points, Jacobians and closed forms run in float64: at small β the stable points lie deep in
the sigmoid's tails.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from dpa_grpo import losses
from dpa_grpo.game import CASES, GENERATOR_ACTIONS, VERIFIER_ACTIONS, classify_case

LOSS_VARIANTS = tuple(itertools.product(losses.WEIGHTINGS, losses.KL_CHOICES))
AVERAGINGS = ("expected", "sac_units")


@dataclasses.dataclass(frozen=True)
class Game:
  """A decision-unit type: its chances, the roles' reward tables and reference policies.

  Defaults: the proposal is right as often as Qwen3-4B zero-shot (0.414 per line); a revision of a
  wrong proposal is right 30% of the time and of a right one 90% (assumed); the reference verifier
  raises SAC on 6% of wrong and 34% of right proposals, which with 0.414 reproduces the paper's
  pre-training case rates (case 1 = 27.4%, case 4 = 55.3%); the reference generator revises half
  the time.
  """

  p_x_right: float = 0.414
  p_z_right: tuple[float, float] = (0.3, 0.9)  # P(S_z = 1 | S_x = 0), P(S_z = 1 | S_x = 1)
  verifier_reward: tuple[tuple[float, float], ...] = ((0.0, 1.0), (1.0, 0.0))  # [S_x][NS, SAC]
  generator_reward: tuple[tuple[tuple[float, float], ...], ...] = (  # [S_x][S_z][KEEP, REVISE]
    ((0.0, 0.0), (0.0, 1.0)),
    ((1.0, 0.0), (1.0, 1.0)),
  )
  verifier_ref: tuple[float, float] = (0.06, 0.34)  # P_ref(SAC | S_x = 0), P_ref(SAC | S_x = 1)
  generator_ref: float = 0.5  # P_ref(REVISE) in every generator state
  generator_sees_revision: bool = True
  # Whether the roles' information states include correctness. True: the verifier acts per S_x
  # (and the generator per S_x, S_z). False: a unit no role can check (a control line whose answer
  # the input does not show) — the verifier acts on one state (coordinate 0; coordinate 1 is idle)
  # and so does the generator (its first coordinate).
  observes_correctness: bool = True

  def __post_init__(self):
    probs = {"p_x_right": self.p_x_right, "generator_ref": self.generator_ref}
    probs.update({f"p_z_right[{i}]": p for i, p in enumerate(self.p_z_right)})
    probs.update({f"verifier_ref[{i}]": p for i, p in enumerate(self.verifier_ref)})
    for name, p in probs.items():
      if not 0.0 <= p <= 1.0:
        raise ValueError(f"Game.{name} = {p} is not a probability")
    for name, ref in (("verifier_ref", self.verifier_ref), ("generator_ref", [self.generator_ref])):
      if any(p in (0.0, 1.0) for p in ref):
        raise ValueError(f"Game.{name} = {ref}: reference probabilities must lie strictly inside (0, 1)")
    if np.shape(self.verifier_reward) != (2, 2):
      raise ValueError(f"Game.verifier_reward must be [S_x][NS, SAC] (2x2), got {self.verifier_reward}")
    if np.shape(self.generator_reward) != (2, 2, 2):
      raise ValueError(f"Game.generator_reward must be [S_x][S_z][KEEP, REVISE], got {self.generator_reward}")

  @property
  def num_generator_states(self) -> int:
    return 4 if self.generator_sees_revision else 2

  @property
  def dim(self) -> int:
    return 2 + self.num_generator_states

  def generator_state(self, s_x, s_z):
    """Index of the generator's information state (works on ints and arrays)."""
    if not self.observes_correctness:
      return 0 * s_x
    return 2 * s_x + s_z if self.generator_sees_revision else s_x

  def verifier_state(self, s_x):
    """Index of the verifier's information state: S_x, or 0 when it cannot observe correctness."""
    return s_x if self.observes_correctness else 0 * s_x

  def state_names(self) -> list[str]:
    """One readable name per coordinate of θ."""
    right = ("wrong", "right")
    names = [f"verifier SAC | x {right[s]}" for s in (0, 1)]
    if self.generator_sees_revision:
      names += [f"generator REVISE | x {right[sx]}, z {right[sz]}" for sx in (0, 1) for sz in (0, 1)]
    else:
      names += [f"generator REVISE | x {right[sx]}" for sx in (0, 1)]
    return names

  def portrait_axes(self) -> tuple[int, int]:
    """θ indices of the phase portrait: SAC on wrong proposals, REVISE when the revision fixes it."""
    return 0, 2 + self.generator_state(0, 1)


def logit(p):
  return np.log(p) - np.log1p(-np.asarray(p, dtype=np.float64))


def reference_logits(game: Game) -> np.ndarray:
  """θ_ref: [dim] the reference policies' logits."""
  return np.concatenate(
    [logit(np.array(game.verifier_ref)), np.full(game.num_generator_states, logit(game.generator_ref))]
  )


# -------------------------------------------------------------------------------------------------
# Outcomes of one decision unit.


def _unit_types(game: Game):
  """The four (S_x, S_z) types with their probabilities and both roles' paired rewards."""
  s_x, s_z = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])
  p_x = np.where(s_x == 1, game.p_x_right, 1.0 - game.p_x_right)
  p_z = np.asarray(game.p_z_right)[s_x]
  prior = p_x * np.where(s_z == 1, p_z, 1.0 - p_z)  # [4]
  verifier_rewards = np.asarray(game.verifier_reward, np.float64)[s_x]  # [4, 2]
  generator_rewards = np.asarray(game.generator_reward, np.float64)[s_x, s_z]  # [4, 2]
  return s_x, s_z, prior, verifier_rewards, generator_rewards


def _pair_logp(theta_s):
  """[..., 2] log-probs of actions (0, 1) of the logit policy θ_s."""
  return jax.nn.log_softmax(jnp.stack([jnp.zeros_like(theta_s), theta_s], axis=-1), axis=-1)


def _unit_loss(theta, s_x, s_z, sac, game: Game, beta, kl: str, weighting: str):
  """The training loss of one decision unit: the verifier's pair plus, after SAC, the generator's."""
  _, _, _, verifier_rewards, generator_rewards = _unit_types(game)
  theta_ref = jnp.asarray(reference_logits(game), theta.dtype)
  unit = 2 * s_x + s_z
  g = 2 + game.generator_state(s_x, s_z)
  loss_fn = functools.partial(losses.paired_loss, beta=beta, kl=kl, weighting=weighting)
  loss_v, _ = loss_fn(
    _pair_logp(theta[game.verifier_state(s_x)])[None],
    _pair_logp(theta_ref[game.verifier_state(s_x)])[None],
    jnp.asarray(verifier_rewards, theta.dtype)[unit][None],
  )
  loss_g, _ = loss_fn(
    _pair_logp(theta[g])[None],
    _pair_logp(theta_ref[g])[None],
    jnp.asarray(generator_rewards, theta.dtype)[unit][None],
    mask=jnp.asarray(sac, theta.dtype)[None],
  )
  return loss_v + loss_g


def _outcome_table(game: Game):
  """The 8 loss-relevant outcomes (S_x, S_z, verifier action) and their priors (before the policy)."""
  s_x, s_z, prior, _, _ = _unit_types(game)
  sac = np.repeat(np.array([0, 1])[None], 4, axis=0).reshape(-1)  # [8]
  return np.repeat(s_x, 2), np.repeat(s_z, 2), sac, np.repeat(prior, 2)


def sac_rate(theta: jax.Array, game: Game) -> jax.Array:
  """P_θ(SAC): the marginal probability that the verifier raises a SAC on a unit."""
  p_x = jnp.asarray([1.0 - game.p_x_right, game.p_x_right], theta.dtype)
  return jnp.sum(p_x * jax.nn.sigmoid(theta[game.verifier_state(np.array([0, 1]))]))


def _averaging_scale(theta: jax.Array, game: Game, averaging: str) -> jax.Array:
  """Per-coordinate factor of the field: 1, or 1/P(SAC) on the generator's coordinates under
  "sac_units" (the trainer's mean over SAC'd units).  # [dim]"""
  if averaging not in AVERAGINGS:
    raise ValueError(f"averaging must be one of {AVERAGINGS}, got {averaging!r}")
  ones = jnp.ones_like(theta)
  if averaging == "expected":
    return ones
  rate = jax.lax.stop_gradient(sac_rate(theta, game))
  return ones.at[2:].set(1.0 / jnp.maximum(rate, 1e-12))


@functools.partial(jax.jit, static_argnames=("game", "kl", "weighting", "averaging"))
def vector_field(
  theta: jax.Array, game: Game, beta, *, kl: str, weighting: str = "pair", averaging: str = "expected"
) -> jax.Array:
  """F(θ) = −Σ_o P_θ(o) ∇_θ L(o; θ), by `jax.grad` of the training loss; under
  averaging="sac_units" the generator's rows divided by P_θ(SAC).  # [dim] -> [dim]"""
  s_x, s_z, sac, prior = _outcome_table(game)
  p_sac = jax.nn.sigmoid(theta[game.verifier_state(s_x)])  # [8]
  weight = jax.lax.stop_gradient(jnp.asarray(prior, theta.dtype) * jnp.where(sac == 1, p_sac, 1.0 - p_sac))

  def expected_loss(t):
    unit = jax.vmap(lambda a, b, c: _unit_loss(t, a, b, c, game, beta, kl, weighting))
    return jnp.sum(weight * unit(s_x, s_z, sac))

  return -jax.grad(expected_loss)(theta) * _averaging_scale(theta, game, averaging)


def _central_jacobian(fn, theta, h=1e-6):
  """∂fn/∂θ by central differences, all 2·dim evaluations in one vmap.  # [dim, dim]

  Autodiff cannot give this Jacobian: F holds stop-gradients (the sampling distribution, the
  "policy" weights) whose values depend on θ, and forward mode would treat them as constants.
  """
  eye = h * jnp.eye(theta.shape[0], dtype=theta.dtype)
  values = jax.vmap(fn)(jnp.concatenate([theta + eye, theta - eye]))  # [2·dim, dim]
  return ((values[: theta.shape[0]] - values[theta.shape[0] :]) / (2 * h)).T


@functools.partial(jax.jit, static_argnames=("game", "kl", "weighting", "averaging"))
def vector_fields(
  thetas, game: Game, beta, *, kl: str, weighting: str = "pair", averaging: str = "expected"
) -> jax.Array:
  """F at every row of θ.  # [N, dim] -> [N, dim]"""
  return jax.vmap(lambda t: vector_field(t, game, beta, kl=kl, weighting=weighting, averaging=averaging))(
    thetas
  )


@functools.partial(jax.jit, static_argnames=("game", "kl", "weighting"))
def jacobian(theta, game: Game, beta, *, kl: str, weighting: str = "pair") -> jax.Array:
  """∂F/∂θ at θ (central differences; use float64).  # [dim, dim]"""
  return _central_jacobian(lambda t: vector_field(t, game, beta, kl=kl, weighting=weighting), theta)


# -------------------------------------------------------------------------------------------------
# ODE paths.


@functools.partial(jax.jit, static_argnames=("game", "kl", "weighting", "steps", "save_every", "averaging"))
def ode_paths(
  starts,
  game: Game,
  beta,
  *,
  kl: str,
  weighting: str,
  t_end,
  steps: int,
  save_every: int,
  averaging: str = "expected",
):
  """Classical RK4 from each start to t_end (`averaging`: see the module docstring).

  Args:
    starts: [N, dim] initial logits.

  Returns:
    (times [S], θ [N, S, dim]), S = steps // save_every + 1.
  """
  dt = t_end / steps
  field = lambda t: vector_field(t, game, beta, kl=kl, weighting=weighting, averaging=averaging)

  def rk4(theta, _):
    k1 = field(theta)
    k2 = field(theta + 0.5 * dt * k1)
    k3 = field(theta + 0.5 * dt * k2)
    k4 = field(theta + dt * k3)
    return theta + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4), None

  def block(theta, _):
    theta, _ = jax.lax.scan(rk4, theta, None, length=save_every)
    return theta, theta

  def path(theta0):
    _, saved = jax.lax.scan(block, theta0, None, length=steps // save_every)
    return jnp.concatenate([theta0[None], saved], axis=0)

  times = dt * save_every * jnp.arange(steps // save_every + 1)
  return times, jax.vmap(path)(starts)


# -------------------------------------------------------------------------------------------------
# Stochastic approximation.


def step_sizes(n, a0: float, n0: float, kappa: float):
  """a_n = a0 / (1 + n / n0)^κ; Σ a_n = ∞ and Σ a_n² < ∞ for ½ < κ ≤ 1."""
  return a0 / (1.0 + n / n0) ** kappa


@functools.partial(
  jax.jit, static_argnames=("game", "kl", "weighting", "steps", "seeds", "save_every", "averaging")
)
def stochastic_approximation(
  key,
  theta0,
  game: Game,
  beta,
  *,
  kl: str,
  weighting: str,
  steps: int,
  seeds: int,
  save_every: int,
  a0: float,
  n0: float,
  kappa: float,
  averaging: str = "expected",
):
  """Sampled paired updates θ ← θ − a_n ∇L(o_n; θ), one decision unit o_n ~ P_θ per step.

  Every seed is an independent run (vmapped). Returns (ODE times t_n = Σ_{k<n} a_k [S],
  θ [seeds, S, dim]), S = steps // save_every + 1: the interpolation the ODE theorem compares.
  """
  _, _, prior, _, _ = _unit_types(game)
  s_x_of, s_z_of = jnp.array([0, 0, 1, 1]), jnp.array([0, 1, 0, 1])
  grad = jax.grad(lambda t, sx, sz, sac: _unit_loss(t, sx, sz, sac, game, beta, kl, weighting))

  def step(theta, inputs):
    n, k = inputs
    k_type, k_sac = jax.random.split(k)
    unit = jax.random.choice(k_type, 4, p=jnp.asarray(prior, theta.dtype))
    s_x, s_z = s_x_of[unit], s_z_of[unit]
    sac = jax.random.bernoulli(k_sac, jax.nn.sigmoid(theta[game.verifier_state(s_x)])).astype(jnp.int32)
    scale = _averaging_scale(theta, game, averaging)  # "sac_units": the generator step / P(SAC)
    return theta - step_sizes(n, a0, n0, kappa) * scale * grad(theta, s_x, s_z, sac), None

  def run(key):
    keys = jax.random.split(key, steps).reshape(steps // save_every, save_every)
    ns = jnp.arange(steps, dtype=theta0.dtype).reshape(steps // save_every, save_every)

    def block(theta, inputs):
      theta, _ = jax.lax.scan(step, theta, inputs)
      return theta, theta

    _, saved = jax.lax.scan(block, theta0, (ns, keys))
    return jnp.concatenate([theta0[None], saved], axis=0)

  times = jnp.concatenate([jnp.zeros(1), jnp.cumsum(step_sizes(jnp.arange(steps), a0, n0, kappa))])
  return times[::save_every], jax.vmap(run)(jax.random.split(key, seeds))


# -------------------------------------------------------------------------------------------------
# Fixed points.


@dataclasses.dataclass(frozen=True)
class FixedPoint:
  theta: np.ndarray  # [dim] logits
  probs: np.ndarray  # [dim] probability of action 1 in each state
  eigenvalues: np.ndarray  # [dim] complex, of ∂F/∂θ
  residual: float  # max |F(θ)|

  @property
  def stable(self) -> bool:
    return bool(np.all(self.eigenvalues.real < 0))


@functools.partial(jax.jit, static_argnames=("game", "kl", "weighting", "iters"))
def _continuation(starts, signs, game: Game, betas, *, kl: str, weighting: str, iters: int):
  """Pseudo-transient continuation on s·F from each start: θ ← θ + (I/Δt − s·J)⁻¹ s·F.

  Implicit-Euler steps with Δt growing geometrically to ∞ (then it is Newton's method): globally
  convergent towards the attractors of s·F, so s = +1 finds the stable points of the ODE and s = −1
  its repellers, and neither is lured into the sigmoid's tails, where F vanishes spuriously and plain
  Newton stalls. Steps are clipped to 2 logits per coordinate. Returns, for every β of `betas` [B]
  and start of `starts` [N, dim]: (θ [B, N, dim], max |F| [B, N], ∂F/∂θ [B, N, dim, dim]).
  """
  eye = jnp.eye(starts.shape[-1], dtype=starts.dtype)

  def solve(theta0, sign, beta):
    field = lambda t: vector_field(t, game, beta, kl=kl, weighting=weighting)

    def body(theta, dt):
      lhs = eye / dt - sign * _central_jacobian(field, theta)
      step = jnp.linalg.solve(lhs, sign * field(theta))
      return theta + jnp.where(jnp.all(jnp.isfinite(step)), jnp.clip(step, -2.0, 2.0), 0.0), None

    dts = jnp.minimum(2.0 ** jnp.arange(iters, dtype=starts.dtype), 1e12)
    theta, _ = jax.lax.scan(body, theta0, dts)
    return theta, jnp.max(jnp.abs(field(theta))), _central_jacobian(field, theta)

  return jax.vmap(lambda beta: jax.vmap(lambda t, s: solve(t, s, beta))(starts, signs))(betas)


def fixed_points(game: Game, beta: float, *, kl: str, weighting: str = "pair", **kwargs) -> list[FixedPoint]:
  """Isolated zeros of F at one β; see `fixed_points_over_beta`."""
  return fixed_points_over_beta(game, [beta], kl=kl, weighting=weighting, **kwargs)[0]


def fixed_points_over_beta(
  game: Game,
  betas,
  *,
  kl: str,
  weighting: str = "pair",
  num_starts: int = 8,
  seed: int = 0,
  tol: float = 1e-10,
  min_eigenvalue: float = 1e-8,
  iters: int = 50,
) -> list[list[FixedPoint]]:
  """Isolated zeros of F for each β, by continuation from a spread of starts, with eigenvalues.

  Starts: θ_ref, θ_ref shifted by −6 … 6 logits along the diagonal, then random around θ_ref (when
  num_starts > 8). A zero counts only if |F| < tol and every |Re λ| > min_eigenvalue: the second
  condition drops non-isolated zeros (a continuum of neutral points) and "zeros" in the sigmoid's
  tails where F underflows. Each β's list is sorted stable first.
  """
  theta_ref = reference_logits(game)
  rng = np.random.default_rng(seed)
  diagonal = theta_ref[None] + np.linspace(-6.0, 6.0, 7)[:, None]
  scattered = theta_ref[None] + rng.normal(scale=4.0, size=(num_starts - 8, game.dim))
  starts = np.concatenate([[theta_ref], diagonal, scattered])  # [N, dim]
  starts = np.concatenate([starts, starts])  # [2N, dim]: once towards attractors, once repellers
  signs = np.repeat([1.0, -1.0], num_starts)
  betas = np.asarray(betas, np.float64)
  # β padded to a multiple of 4, so that calls with a few β values share one compiled program.
  padded = np.concatenate([betas, np.full(-len(betas) % 4, betas[-1])])
  with jax.enable_x64(True):
    thetas, residuals, jacobians = jax.device_get(
      _continuation(
        jnp.asarray(starts),
        jnp.asarray(signs),
        game,
        jnp.asarray(padded),
        kl=kl,
        weighting=weighting,
        iters=iters,
      )
    )  # [B, 2N, dim], [B, 2N], [B, 2N, dim, dim]
  out = []
  for b in range(len(betas)):
    found: list[FixedPoint] = []
    for theta, residual, jac in zip(thetas[b], residuals[b], jacobians[b], strict=True):
      if not (np.isfinite(residual) and residual < tol):
        continue
      if any(np.allclose(theta, f.theta, rtol=1e-6, atol=1e-6) for f in found):
        continue
      eig = np.linalg.eigvals(jac).astype(complex)
      if np.min(np.abs(eig.real)) <= min_eigenvalue:
        continue
      found.append(FixedPoint(theta, 1.0 / (1.0 + np.exp(-theta)), eig, float(residual)))
    out.append(sorted(found, key=lambda f: (not f.stable, tuple(f.theta))))
  return out


def expected_advantages(game: Game, eps: float = losses.ADVANTAGE_EPS) -> np.ndarray:
  """ā_s = E[A(action 1) | state s reached]: [dim], the only way rewards enter the ODE."""
  s_x, s_z, prior, verifier_rewards, generator_rewards = _unit_types(game)
  adv = lambda r: (r[:, 1] - r[:, 0]) / 2 / (np.abs(r[:, 1] - r[:, 0]) / 2 + eps)  # A_1 of a pair
  out = np.zeros(game.dim)
  for s in (0, 1):
    sel = s_x == s
    out[s] = np.sum(prior[sel] * adv(verifier_rewards)[sel]) / np.sum(prior[sel])
  states = game.generator_state(s_x, s_z)
  for g in range(game.num_generator_states):
    sel = states == g
    if prior[sel].sum() > 0:
      out[2 + g] = np.sum(prior[sel] * adv(generator_rewards)[sel]) / np.sum(prior[sel])
  return out


def closed_form_fixed_points(
  game: Game, beta: float, *, kl: str, weighting: str = "pair"
) -> list[np.ndarray] | None:
  """Interior zeros of each state's coordinate of F, in probabilities, from docs/theory.md.

  Because F_s = reach_s(θ)·h(θ_s; ā_s) with reach_s > 0 inside the simplex, the fixed points are the
  products of each state's roots of h. Returns one array of roots per state (empty: none, so the
  logit runs off to ±∞), or None for ("pair", "exact"), whose root is implicit (numeric only). A
  state with ā_s = 0 under ("policy", "k1") has h ≡ 0 (every p is a fixed point); it is reported as
  no isolated root.
  """
  a_bar = expected_advantages(game)
  p_ref = 1.0 / (1.0 + np.exp(-reference_logits(game)))
  if (weighting, kl) == ("pair", "exact"):
    return None
  roots = []
  for a, q in zip(a_bar, p_ref, strict=True):
    if (weighting, kl) == ("policy", "exact"):  # 2ā = β(θ − θ_ref)
      z = logit(q) + 2.0 * a / beta
      r = np.array([np.exp(-np.logaddexp(0.0, -z))])
    elif (weighting, kl) == ("policy", "k3"):  # 2ā p(1−p) = β(p − p_ref)
      r = np.roots([-2.0 * a, 2.0 * a - beta, beta * q]) if a else np.array([q])
    elif (weighting, kl) == ("pair", "k3"):  # ā p(1−p) = β(p − p_ref)(p² + (1−p)²)
      r = np.roots([-2.0 * beta, 2.0 * beta * (1.0 + q) - a, a - beta * (1.0 + 2.0 * q), beta * q])
    elif (weighting, kl) == ("pair", "k1"):  # ā = β(1 − 2p)
      r = np.array([0.5 - a / (2.0 * beta)])
    else:  # ("policy", "k1"): 2ā p(1−p) = 0
      r = np.array([])
    r = np.real(r[np.abs(np.imag(r)) < 1e-9]) if np.iscomplexobj(r) else r
    roots.append(
      r if kl == "exact" else np.sort(r[(r > 0.0) & (r < 1.0)])
    )  # exact: interior, maybe 1.0 in floats
  return roots


# -------------------------------------------------------------------------------------------------
# The unregularised game: best responses, deviations and the 8 cases.


def action_values(game: Game) -> np.ndarray:
  """[dim, 2] each state's expected reward of actions (0, 1), conditional on reaching the state."""
  s_x, s_z, prior, verifier_rewards, generator_rewards = _unit_types(game)
  values = np.zeros((game.dim, 2))
  for s in (0, 1):
    sel = s_x == s
    values[s] = prior[sel] @ verifier_rewards[sel] / prior[sel].sum()
  states = game.generator_state(s_x, s_z)
  for g in range(game.num_generator_states):
    sel = states == g
    if prior[sel].sum() > 0:  # a state the game never produces keeps values 0 (a tie)
      values[2 + g] = prior[sel] @ generator_rewards[sel] / prior[sel].sum()
  return values


def best_responses(game: Game) -> np.ndarray:
  """[dim] the best action (0 or 1) in each state, or −1 where both are equally good."""
  v = action_values(game)
  return np.where(v[:, 1] > v[:, 0], 1, np.where(v[:, 1] < v[:, 0], 0, -1))


def reach_probabilities(game: Game, probs: np.ndarray) -> np.ndarray:
  """[dim] probability that each state is reached under the profile `probs` (P(action 1) per state)."""
  s_x, s_z, prior, _, _ = _unit_types(game)
  reach = np.zeros(game.dim)
  for s in (0, 1):
    reach[s] = prior[s_x == s].sum()
  states = game.generator_state(s_x, s_z)
  for g in range(game.num_generator_states):
    sel = states == g
    reach[2 + g] = np.sum(prior[sel] * np.asarray(probs)[s_x[sel]])  # the generator acts after SAC
  return reach


@dataclasses.dataclass(frozen=True)
class Deviation:
  """A profitable unilateral deviation: move `mass` from `action` to `better` in `state`."""

  role: str
  state: str
  action: str
  better: str
  mass: float  # probability on the worse action in that state
  gap: float  # expected reward of `better` minus `action`, given the state
  gain: float  # the role's expected-reward gain: reach · mass · gap


def deviations(game: Game, probs) -> list[Deviation]:
  """Every profitable unilateral deviation from a mixed profile of the unregularised game.

  Args:
    game: the game.
    probs: [dim] P(action 1) in each state (SAC for the verifier, REVISE for the generator).

  A deviation is profitable exactly when its state is reached, carries mass on an action, and the
  other action has a strictly higher conditional expected reward.
  """
  probs = np.asarray(probs, np.float64)
  values, reach, names = action_values(game), reach_probabilities(game, probs), game.state_names()
  found = []
  for s in range(game.dim):
    role, actions = ("verifier", VERIFIER_ACTIONS) if s < 2 else ("generator", GENERATOR_ACTIONS)
    for worse, mass in ((0, 1.0 - probs[s]), (1, probs[s])):
      gap = values[s, 1 - worse] - values[s, worse]
      if gap > 0 and mass > 0 and reach[s] > 0:
        found.append(
          Deviation(
            role,
            names[s],
            actions[worse],
            actions[1 - worse],
            float(mass),
            float(gap),
            float(reach[s] * mass * gap),
          )
        )
  return found


def _full_outcomes(game: Game):
  """All 16 outcomes (S_x, S_z, verifier action, generator action) with their case index."""
  rows = list(itertools.product((0, 1), (0, 1), (0, 1), (0, 1)))
  s_x, s_z, a_v, a_g = (np.array(c) for c in zip(*rows, strict=True))
  # The taxonomy is game.classify_case's; after NS both a_g rows get the NS case.
  case = np.array(
    [CASES.index(classify_case(bool(x), int(v), int(g) if v else None, bool(z))) for x, z, v, g in rows]
  )
  return s_x, s_z, a_v, a_g, case


@functools.partial(jax.jit, static_argnames=("game",))
def case_probabilities(game: Game, theta: jax.Array) -> jax.Array:
  """Probabilities of cases 1 … 6b under the logit profile θ.  # [..., dim] -> [..., 8]"""
  s_x, s_z, a_v, a_g, case = _full_outcomes(game)
  p_z = np.asarray(game.p_z_right)[s_x]
  prior = np.where(s_x == 1, game.p_x_right, 1 - game.p_x_right) * np.where(s_z == 1, p_z, 1 - p_z)  # [16]
  p_v = jax.nn.sigmoid(theta[..., game.verifier_state(s_x)])  # [..., 16]
  p_g = jax.nn.sigmoid(theta[..., 2 + game.generator_state(s_x, s_z)])  # [..., 16]
  generator = jnp.where(a_v == 1, jnp.where(a_g == 1, p_g, 1 - p_g), 0.5)  # NS: both a_g rows, half each
  weight = prior * jnp.where(a_v == 1, p_v, 1 - p_v) * generator  # [..., 16]
  return weight @ jax.nn.one_hot(case, len(CASES), dtype=weight.dtype)


def final_accuracy(game: Game, theta: jax.Array) -> jax.Array:
  """Probability the submitted output is right: cases 1, 3 (x kept right) and 5a (fixed).  # [...]"""
  return case_probabilities(game, theta)[..., jnp.array([0, 2, 4])].sum(-1)


def case_deviations(game: Game) -> dict[str, list[Deviation]]:
  """The deviations each case signals: per acting role, a strictly better action given the case.

  A case fixes S_x and the actions; what it leaves open (S_z in cases 1–4) is averaged with its
  prior, and the gap is the expected-reward advantage of the other action given what the role saw.
  """
  s_x, s_z, a_v, a_g, case = _full_outcomes(game)
  _, _, prior4, verifier_rewards, generator_rewards = _unit_types(game)
  unit = 2 * s_x + s_z
  g_values = action_values(game)[2:]
  out = {}
  for c, name in enumerate(CASES):
    sel = (case == c) & (a_g == np.where(a_v == 1, a_g, 0))  # NS outcomes once, not per a_g
    w = prior4[unit[sel]]
    w = w / w.sum()
    found = []
    v_action = a_v[sel][0]
    v_gap = w @ (verifier_rewards[unit[sel], 1 - v_action] - verifier_rewards[unit[sel], v_action])
    if v_gap > 0:
      found.append(
        Deviation(
          "verifier",
          name,
          VERIFIER_ACTIONS[v_action],
          VERIFIER_ACTIONS[1 - v_action],
          1.0,
          float(v_gap),
          float(v_gap),
        )
      )
    if v_action == 1:
      g_action = a_g[sel][0]
      states = game.generator_state(s_x[sel], s_z[sel])
      g_gap = w @ (g_values[states, 1 - g_action] - g_values[states, g_action])
      if g_gap > 0:
        found.append(
          Deviation(
            "generator",
            name,
            GENERATOR_ACTIONS[g_action],
            GENERATOR_ACTIONS[1 - g_action],
            1.0,
            float(g_gap),
            float(g_gap),
          )
        )
    out[name] = found
  return out
