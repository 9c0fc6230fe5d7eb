"""Our DPA-GRPO update against the authors' code, number by number (the golden trace).

`golden/` was written by `tools/dpa_reference_golden.py` (its command, the reference's commit and
the library versions are in `golden.json`): the reference's `_apply_transition_batch_update` ran on
a tiny Qwen3 checkpoint (`lm.save_hf`) with two PEFT adapters, for every update kind it has. Here
the same transitions become our units and groups, go through our packing (`dpa_items`,
`draft_pair_items`), loss and AdamW step with the paper preset's settings and the reference's pair
strings (`loss.pair_actions="reference_stub"`), and every number is compared:

- each scored sequence's length-normalised log-prob, policy and reference: 1e-5 relative;
- each role's loss: within 1e-5 of the sum of its terms' magnitudes (the pair terms cancel to
  ~1e-3, so a relative tolerance on the total would measure float32 cancellation, not the loss);
- each adapter matrix's gradient norm: 1e-4 relative (a difference of two pair gradients);
- each adapter after one step: the move agrees to 1e-5 of the step size.

The reference's DAPO / GSPO surrogates are worth −A at ρ = 1 while ours (the pair loss with β = 0)
is worth −A·ℓ: equal gradients, different values, so their values are not compared.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lm
from configs import dpa_grpo as dpa_config
from dpa_grpo import config as config_lib
from dpa_grpo import game, losses, packing, step
from dpa_grpo.policies import init_policies
from lm import lora, sharding

GOLDEN = pathlib.Path(__file__).parent / "golden"
ROLES = ("generator", "verifier")
DPA_KINDS = ("verifier_pair", "revision_group", "decision_pair", "full_case")
BASELINE_KINDS = {"baseline_grpo": "grpo", "baseline_dapo": "dapo", "baseline_gspo": "gspo"}
PEFT_TO_OURS = {module.split(".")[-1]: lora.PROJECTIONS[t][0] for t, module in lora.PEFT_MODULES.items()}

EPS = 1e-8  # AdamW's ε, ours and the reference's (golden.json "optimizer")

pytestmark = pytest.mark.slow


@functools.cache
def golden() -> dict:
  return json.loads((GOLDEN / "golden.json").read_text())


def experiment(method: str = "dpa_grpo", **loss_overrides) -> config_lib.ExperimentConfig:
  """The qwen3_4b preset's loss and optimiser (the reference's mechanisms) with the fixture's
  adapters, learning rate and the reference's pair strings."""
  c = dpa_config.get_config("qwen3_4b" if method == "dpa_grpo" else f"qwen3_4b_{method}")
  g = golden()
  c.lora.update(rank=g["lora"]["rank"], alpha=g["lora"]["alpha"], dropout=0.0)
  c.optim.update(lr=g["optimizer"]["lr"])
  c.loss.update(pair_actions="reference_stub", vocab_chunk=512, **loss_overrides)
  c.mesh = dict()
  return config_lib.ExperimentConfig.from_dict(c.to_dict())


class _Ids:
  """A tokenizer over the fixture's pair strings: the ids the reference scored for each."""

  def __init__(self, table: dict[str, list[int]]):
    self.table = table

  def encode(self, text: str) -> list[int]:
    return list(self.table[text])


def _case(x_right: bool, challenged: bool, decision: str | None, z_right: bool | None) -> str:
  if not challenged:
    return game.classify_case(x_right, game.NS, None, None)
  return game.classify_case(x_right, game.SAC_ACTION, game.GENERATOR_ACTIONS.index(decision), z_right)


def units_of(transitions: list[dict]) -> tuple[list, _Ids]:
  """Our units (duck-typed: the fields `packing.dpa_items` reads) of the reference's transitions."""
  ns = types.SimpleNamespace
  units, table = [], {}
  for t in transitions:
    ids = t["ids"]
    table.update(ids["stubs"])
    x_right = t["verifier_rewards"]["NO_SAC"] == 1.0
    ap = t["approver"]
    challenged = bool(ap.get("considered"))
    flags = t.get("flags", {})
    decision = ap.get("decision") if challenged else None
    z_right = ("z_right" in flags.get("branch", "")) if challenged else None
    samples = t["revision"]["samples"]
    revision = None
    if t["revision"]["considered"]:
      revision = ns(
        prompt_ids=ids["revise_prompt"],
        samples=[ns(tokens=tuple(x)) for x in ids["revisions"]],
        rights=tuple(bool(s["reward"]) for s in samples),
        amounts=tuple(1.0 if s["parsed"] else None for s in samples),
        z_amount=None if t["revision"]["parsed"] is False else 1.0,
        z_right=z_right,
      )
    action = None if decision is None else game.GENERATOR_ACTIONS.index(decision)
    units.append(
      ns(
        line_id=t["line_id"],
        x_right=x_right,
        z_right=z_right,
        challenged=challenged,
        generator_action=action,
        case=_case(x_right, challenged, decision, z_right),
        draft=ns(amount=1.0 if t["filer_parsed"] else None, prompt_ids=[], x=None),
        verdict=ns(prompt_ids=ids["verifier_prompt"], parsed=ns(valid=True)),
        revision=revision,
        decision=ns(prompt_ids=ids["approver_prompt"], parsed=ns(valid=True)) if challenged else None,
      )
    )
  return units, _Ids(table)


def groups_of(transitions: list[dict]) -> list:
  ns = types.SimpleNamespace
  return [
    ns(
      prompt_ids=t["ids"]["filer_prompt"],
      samples=[ns(tokens=tuple(x)) for x in t["ids"]["filer_samples"]],
      rewards=tuple(t["filer_pair"]["rewards"]),
    )
    for t in transitions
  ]


@functools.cache
def backbone():
  model = lm.load_hf(GOLDEN / "model", dtype="float32")
  adapters = {role: lora.load_peft(GOLDEN / "adapters" / role, model.config) for role in ROLES}
  return model, adapters


def policies_for(exp: config_lib.ExperimentConfig, roles):
  """(policies, trainable, frozen) with the fixture's initial adapters in place of fresh ones."""
  model, adapters = backbone()
  mesh = sharding.make_mesh(sharding.MeshConfig())
  policies, trainable, frozen = init_policies(model, exp.lora, roles, mesh, seed=0)
  for role in roles:
    weights = {
      name: var[...] for name, var in vars(adapters[role]).items() if isinstance(var, lora.LoRAParam)
    }
    trainable[role] = jax.tree_util.tree_map_with_path(
      lambda path, x, w=weights: jnp.asarray(w[_name(path)], x.dtype), trainable[role]
    )
  return policies, trainable, frozen


def run_ours(kind_name: str, **loss_overrides) -> dict:
  """Our update of one kind: role losses, per-sequence log-probs, gradients, adapters after."""
  kind = golden()["kinds"][kind_name]
  if kind_name in BASELINE_KINDS:
    method = BASELINE_KINDS[kind_name]
    exp = experiment(method, **loss_overrides)
    items = {"generator": packing.draft_pair_items(groups_of(kind["transitions"]))}
    roles = ("generator",)
  else:
    method = "dpa_grpo"
    exp = experiment(**loss_overrides)
    units, tokenizer = units_of(kind["transitions"])
    items = packing.dpa_items(units, tokenizer, exp.loss)
    roles = ROLES
  cfgs = step.loss_configs(method, exp.loss, exp.baseline, max_new_tokens=exp.rollout.max_new_tokens)
  policies, trainable, frozen = policies_for(exp, roles)
  grads = jax.tree.map(jnp.zeros_like, trainable)
  out = {"loss": {}, "logp": {}}
  for role in roles:
    cfg = cfgs[role]
    out["loss"][role] = 0.0
    out["logp"][role] = []
    chunks = packing.dpa_chunks(items[role], len(cfg.components), 8, pad_id=0, aggregate=exp.loss.aggregate)
    for chunk in chunks if items[role] else []:
      batch = {k: jnp.asarray(v) for k, v in chunk.items()}
      grads, value, _ = step.accumulate(
        grads,
        trainable,
        frozen,
        batch,
        policies=policies,
        role=role,
        method=step.loss_method(method, exp.baseline),
        loss_cfg=cfg,
      )
      out["loss"][role] += float(value)
      model = policies.policy(trainable, frozen, role)
      logp = losses.pair_logprobs(model, batch, vocab_chunk=cfg.vocab_chunk)
      ref = losses.pair_logprobs(policies.reference(frozen), batch, vocab_chunk=cfg.vocab_chunk)
      out["logp"][role].append(
        (
          np.asarray(logp),
          np.asarray(ref),
          chunk["completion_mask"].reshape(-1, 2, chunk["completion_mask"].shape[-1]).sum(-1),
        )
      )
  out["grads"] = {role: jax.tree.map(np.asarray, grads[role]) for role in roles}
  before = {role: jax.tree.map(np.asarray, trainable[role]) for role in roles}
  tx = step.optimizer(exp.optim, exp.train.steps)
  new, _, _ = step.apply(trainable, tx.init(trainable), grads, tx=tx)
  out["after"] = {role: jax.tree.map(np.asarray, new[role]) for role in roles}
  out["before"] = before
  return out


def _name(path) -> str:
  """The factor's name ("q_dnh_lora_a") in an adapter state's tree path."""
  return next(k.key for k in path if isinstance(getattr(k, "key", None), str) and "_lora_" in k.key)


def _flat(state) -> dict[str, np.ndarray]:
  return {_name(path): np.asarray(x) for path, x in jax.tree_util.tree_leaves_with_path(state)}


def _reference_logps(kind: dict) -> list[float]:
  return sorted(m["logp"] for g in kind["groups"] for m in g["members"])


@pytest.mark.parametrize("kind_name", [*DPA_KINDS, *BASELINE_KINDS])
def test_our_update_matches_the_reference(kind_name):
  kind = golden()["kinds"][kind_name]
  ours = run_ours(kind_name)
  # 1. Every sequence the reference scored, ours scored too, at the same length-normalised log-prob.
  ref_seq = sorted((m["logp"], m["ref_logp"]) for g in kind["groups"] for m in g["members"])
  our_seq = sorted(
    (float(lp), float(rf))
    for chunks in ours["logp"].values()
    for logp, ref, n in chunks
    for lp, rf, k in zip(logp.ravel(), ref.ravel(), n.ravel(), strict=True)
    if k > 0
  )
  assert len(our_seq) == len(ref_seq), (len(our_seq), len(ref_seq))
  np.testing.assert_allclose(np.array(our_seq), np.array(ref_seq), rtol=1e-5)
  # 2. Each role's loss, within 1e-5 of its terms' scale.
  if kind_name not in ("baseline_dapo", "baseline_gspo"):
    scale = {
      r: sum(
        abs(m["logp"]) * g["loss_scale"] / len(g["members"]) * (1 + g["beta"])
        for g in kind["groups"]
        for m in g["members"]
        if (g["adapter"] == "theta") == (r == "verifier")
      )
      for r in ROLES
    }
    for role, value in ours["loss"].items():
      assert abs(value - kind["totals"][role]) <= 1e-5 * max(scale[role], 1.0), (
        role,
        value,
        kind["totals"][role],
      )
  # 3. Each adapter matrix's gradient norm.
  compared = 0
  for role, norms in kind["grad_norms"].items():
    grads = _flat(ours["grads"][role])
    for key, ref_norm in norms.items():  # "0.self_attn.q_proj.lora_A"
      layer, _, module, factor = key.split(".")
      ours_norm = np.linalg.norm(grads[f"{PEFT_TO_OURS[module]}_lora_{factor[-1].lower()}"][int(layer)])
      np.testing.assert_allclose(ours_norm, ref_norm, rtol=1e-4, err_msg=f"{kind_name} {role} {key}")
      compared += 1
  assert compared > 0
  # 4. The adapters after one step: the move, to 1e-5 of the step size.
  lr = golden()["optimizer"]["lr"]
  model, _ = backbone()
  for role in ours["after"]:
    ref_after = {
      n: v[...]
      for n, v in vars(lora.load_peft(GOLDEN / kind["after"][role], model.config)).items()
      if isinstance(v, lora.LoRAParam)
    }
    before, after = _flat(ours["before"][role]), _flat(ours["after"][role])
    if role not in kind["grad_norms"]:
      # The reference's torch AdamW skips a parameter without a gradient; ours decays it (the
      # fidelity table's one remaining deviation of the step): by exactly lr · weight decay.
      for name in before:
        np.testing.assert_allclose(np.asarray(ref_after[name]), before[name], rtol=0, atol=0)
        np.testing.assert_allclose(after[name], before[name] * (1 - lr * 0.01), rtol=1e-6)
      continue
    grads = _flat(ours["grads"][role])
    for name in before:
      # Adam's first move is −lr·g/(|g| + ε) per element: saturated (±lr) where |g| ≫ ε, but an
      # element whose gradient is near ε moves by lr·ε/(|g| + ε)² per unit of gradient error. The
      # tolerance is 1e-5 of the step plus that sensitivity times a float32 noise floor on the
      # gradient (1e-4 of the matrix's largest element: two pair gradients' difference).
      g = np.abs(grads[name])
      noise = 1e-4 * g.max()
      tol = lr * (1e-5 + EPS * noise / (g + EPS) ** 2)
      moved_ours, moved_ref = after[name] - before[name], np.asarray(ref_after[name]) - before[name]
      bad = np.abs(moved_ours - moved_ref) > tol
      assert not bad.any(), (kind_name, role, name, moved_ours[bad][:3], moved_ref[bad][:3], g[bad][:3])


def test_the_fixture_records_its_origin():
  g = golden()
  assert len(g["reference"]["commit"]) == 40 and "dpa_reference_golden" in g["command"]
  assert set(g["kinds"]) == {*DPA_KINDS, *BASELINE_KINDS} and g["optimizer"]["eps"] == EPS


def test_our_shaped_rewards_are_the_reference_rule():
  """The reference computes its KEEP / REVISE rewards inline in its rollout; the fixture keeps its
  branch values as literals, and ours must give them."""
  loss = experiment().loss
  ns = types.SimpleNamespace
  for branch, expected in golden()["shaped_rewards"].items():
    unit = ns(
      x_right=branch.startswith("x_right"),
      z_right="z_right" in branch,
      revision=ns(z_amount=None if branch == "z_unparsable" else 1.0),
    )
    assert packing.decision_rewards(unit, loss) == pytest.approx(tuple(expected)), branch


def test_dataclass_replace_keeps_pair_actions():
  """The reference pair strings are a loss option (the CPU presets keep the reply prefixes)."""
  loss = experiment().loss
  assert dataclasses.replace(loss, pair_actions="reply_prefix").pair_actions == "reply_prefix"
  (ns_s, sac_s), (keep_s, rev_s) = game.pair_strings("16", "reference_stub")
  assert (
    json.loads(sac_s) == {"target_line": "16", "decision": "SAC"}
    and json.loads(rev_s)["decision"] == "REVISE"
  )
