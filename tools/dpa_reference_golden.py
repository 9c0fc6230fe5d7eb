"""The DPA-GRPO authors' update code run on fixed inputs: the golden trace our update is tested against.

Not part of CI. Run by hand where a checkout of the reference repository
(stevenyu97/Generator_Verifier_Multi_Agent) and peft are present:

    bash scripts/ref_venv.sh
    .venv-ref/bin/python -m tools.dpa_reference_golden --reference=/path/to/checkout

It writes `tests/dpa_grpo/golden/` (`--out`): a tiny Qwen3 checkpoint written by `lm.save_hf`, the
two roles' initial LoRA adapters as PEFT directories (B ≠ 0, so every factor has a gradient), and
`golden.json`. For each update kind the reference has, the script hands the reference's own
`dpa_grpo.updates._apply_transition_batch_update` a batch of transitions (the dicts its rollout
builds) and records, by wrapping the reference's functions (never re-implementing them):

- every group the update scored: token ids and prompt length of each sequence (the reference's
  `_build_seq_from_prompt_and_action`), its advantages, β and loss scale, and the value the
  reference's `grpo_group_accumulate_gradients` / `ppo_clip_accumulate_gradients` returned;
- each sequence's length-normalised log-prob under the policy and under the reference policy
  (adapters off), by the reference's `completion_token_logprobs`;
- the role totals the update returned (generator = "filer" + "approver", verifier);
- each adapter matrix's gradient norm (captured in the optimiser's `step`, before it moves);
- each adapter after the one AdamW step (PEFT safetensors under `after/<kind>/<role>/`).

`tests/dpa_grpo/golden_test.py` runs our loss and step on the same ids and compares. The import of
our `lm` comes first; the reference's package (also named `dpa_grpo`) is then imported from
`--reference`, so the two never mix (checked).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import types

import numpy as np

import lm
from lm import lora as lora_lib
from lm import tokenizer as tokenizer_lib
from lm.config import ModelConfig

# The reference's role assignment without role swaps (`sampling._role_assignment`): the filer and
# the approver share adapter "default" (our generator), the verifier has "theta".
ROLES = {"filer_adapter": "default", "verifier_adapter": "theta", "approver_adapter": "default"}
ADAPTER_OF = {"generator": "default", "verifier": "theta"}
RANK, ALPHA = 4, 8.0
SYSTEM = {
  "filer": "You file one Form 1040 line as JSON.",
  "verifier": "You check one line.",
  "approver": "Decide KEEP or REVISE.",
}


def _draft(line: str, amount: float) -> str:
  return json.dumps({"form": "1040", "line": line, "description": "d", "amount": amount, "rationale": "r"})


def _transition(line: str, *, sx: float, parsed=True, verifier=None, revision=None, approver=None, case_id=1):
  """One transition dict as the reference's dual rollout writes it (the fields its update reads)."""
  return {
    "line_id": line,
    "roles": ROLES,
    "filer_parsed": parsed,
    "verifier_rewards": verifier or {"SAC": 1.0 - sx, "NO_SAC": sx},
    "revision": revision or {"considered": False, "parsed": None, "samples": []},
    "approver": approver or {"considered": False},
    "prompts": {
      "verifier_user": f"Line {line}: check the amount.",
      "revise_user": f"Line {line}: the checker objected; revise.",
      "approver_user": f"Line {line}: keep the draft or take the revision?",
    },
    "case_id": case_id,
  }


def _revision(rewards, parsed=None, line="16"):
  parsed = parsed or [True] * len(rewards)
  samples = [
    {"text": _draft(line, 100.0 + i) if ok else "not json", "parsed": ok, "S_z": r, "reward": r}
    for i, (r, ok) in enumerate(zip(rewards, parsed, strict=True))
  ]
  return {"considered": True, "parsed": True, "samples": samples}


def _approver(decision: str, keep: float, revise: float):
  return {"considered": True, "decision": decision, "keep_reward": keep, "revise_reward": revise}


def _filer_only(line: str, rewards):
  return {
    "line_id": line,
    "roles": ROLES,
    "filer_only": True,
    "filer_pair": {
      "user": f"Line {line}: file it.",
      "samples": [_draft(line, 10.0 * (i + 1)) for i in range(len(rewards))],
      "rewards": list(rewards),
    },
  }


# The reference's shaped KEEP / REVISE rewards (dual_rollout.py, "Counterfactual approver reward")
# at the paper run's magnitudes: cave 0.2, miss 0.3, outcome bonus 0.5, format penalty 0.25.
# Written out per branch, as literals, so the test can check our rule against them.
SHAPED = {
  "x_right_z_wrong": (1.5, -0.2),
  "x_right_z_right": (1.5, 0.5),
  "x_wrong_z_right": (-0.3, 1.5),
  "x_wrong_z_wrong": (1.0, 0.0),
  "z_unparsable": (1.0, -0.25),
}


def update_kinds() -> dict[str, dict]:
  """Each update kind: its transitions, the args it runs under, and the flags our test rebuilds
  its rewards from (x right, z right, z parsed, the decision played)."""
  base = dict(
    beta_kl=0.04,
    verifier_loss_scale=0.5,
    approver_balance_strength=1.5,
    approver_target_revise_rate=0.3,
    approver_rare_case_weight=1.0,
    skip_verifier_update_on_invalid_filer=True,
    skip_filer_revise_update_on_invalid_revise=True,
  )
  decision_units = [  # (shaped branch, decision, case id, z parsed)
    ("x_right_z_wrong", "KEEP", 3, True),
    ("x_wrong_z_right", "REVISE", 5, True),
    ("x_wrong_z_wrong", "KEEP", 6, True),
    ("x_wrong_z_right", "KEEP", 6, True),
    ("z_unparsable", "KEEP", 6, False),
  ]
  decisions = []
  for i, (branch, decision, case_id, z_parsed) in enumerate(decision_units):
    keep, revise = SHAPED[branch]
    t = _transition(
      f"{i + 1}",
      sx=float(branch.startswith("x_right")),
      parsed=False,
      revision={"considered": True, "parsed": z_parsed, "samples": []},
      approver=_approver(decision, keep, revise),
      case_id=case_id,
    )
    t["flags"] = {"branch": branch, "decision": decision}
    decisions.append(t)
  full = [
    _transition("1a", sx=1.0),
    _transition(
      "9",
      sx=0.0,
      revision=_revision([1.0, 0.0, 1.0]),
      approver=_approver("REVISE", *SHAPED["x_wrong_z_right"]),
      case_id=5,
    ),
    _transition(
      "11",
      sx=1.0,
      revision=_revision([1.0, 1.0]),
      approver=_approver("KEEP", *SHAPED["x_right_z_right"]),
      case_id=3,
    ),
    _transition(
      "16",
      sx=0.0,
      parsed=False,
      revision=_revision([0.0, 1.0, 0.0, 0.0, 1.0]),
      approver=_approver("KEEP", *SHAPED["x_wrong_z_right"]),
      case_id=6,
    ),
  ]
  full[1]["flags"] = {"branch": "x_wrong_z_right", "decision": "REVISE"}
  full[2]["flags"] = {"branch": "x_right_z_right", "decision": "KEEP"}
  full[3]["flags"] = {"branch": "x_wrong_z_right", "decision": "KEEP"}
  return {
    "verifier_pair": dict(
      args=base,
      transitions=[
        _transition("1a", sx=1.0),
        _transition("9", sx=0.0),
        _transition("16", sx=0.0, parsed=False),
      ],
    ),
    "revision_group": dict(
      args=base,
      transitions=[
        _transition(
          "16",
          sx=0.0,
          parsed=False,
          revision=_revision([1.0, 0.0, 0.0, 1.0, 0.0], [True, True, False, True, True]),
        ),
        _transition("24", sx=0.0, parsed=False, revision=_revision([0.0, 0.0, 0.0])),
      ],
    ),
    "decision_pair": dict(args=base, transitions=decisions),
    "full_case": dict(args=base, transitions=full),
    "baseline_grpo": dict(
      args=base,
      transitions=[
        _filer_only("16", [1.0, 0.0]),
        _filer_only("24", [0.0, 0.0]),
        _filer_only("11", [0.0, 1.0]),
      ],
    ),
    "baseline_dapo": dict(args={**base, "use_dapo": True}, transitions=[_filer_only("16", [1.0, 0.0])]),
    "baseline_gspo": dict(args={**base, "use_gspo": True}, transitions=[_filer_only("16", [0.0, 1.0])]),
  }


def _import_reference(path: str):
  """The reference's `dpa_grpo` modules, imported from `path` (ours is never imported here)."""
  if "dpa_grpo" in sys.modules:
    raise RuntimeError("our dpa_grpo is already imported; the reference's cannot be")
  sys.path.insert(0, os.path.abspath(path))
  from dpa_grpo import losses, sampling, updates  # the reference's

  if not os.path.abspath(updates.__file__).startswith(os.path.abspath(path)):
    raise RuntimeError(f"dpa_grpo.updates came from {updates.__file__}, not from {path}")
  return types.SimpleNamespace(losses=losses, sampling=sampling, updates=updates)


def _commit(path: str) -> str:
  try:
    return subprocess.run(
      ["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    marker = os.path.join(path, "COMMIT")  # a checkout without .git names its commit here
    return open(marker).read().strip() if os.path.exists(marker) else "unknown"


def _note(path: str) -> str:
  """What the checkout is, where it says (CHECKOUT_NOTE: e.g. a partial transcription), else ""."""
  marker = os.path.join(path, "CHECKOUT_NOTE")
  return open(marker).read().strip() if os.path.exists(marker) else ""


def build_inputs(out: str, seed: int) -> tuple[str, str, dict[str, str]]:
  """The tiny checkpoint, the tokenizer (in a temporary directory: the fixture keeps ids, not the
  tokenizer) and the two initial adapters as PEFT directories."""
  tok_dir = tempfile.mkdtemp(prefix="golden_tok_")
  corpus = [
    *SYSTEM.values(),
    _draft("16", 123.0),
    "Line 16: check the amount. revise keep take the revision",
    json.dumps({"target_line": "16", "decision": "NO_SAC"}),
    "KEEP REVISE SAC",
  ] * 4
  tokenizer_lib.train_bpe_tokenizer(tok_dir, corpus, vocab_size=320)
  from flax import nnx

  cfg = ModelConfig.tiny_qwen3(vocab_size=320)
  model = lm.Qwen(cfg, rngs=nnx.Rngs(seed))
  model_dir = os.path.join(out, "model")
  lm.save_hf(model, model_dir, dtype="float32")
  rng = np.random.default_rng(seed)
  adapters = {}
  for role in ADAPTER_OF:
    adapter = lora_lib.Adapter(cfg, lora_lib.LoRAConfig(rank=RANK, alpha=ALPHA), rngs=nnx.Rngs(seed + 1))
    factors = {}
    for name, var in vars(adapter).items():
      if isinstance(var, lora_lib.LoRAParam):
        factors[name] = (0.1 * rng.standard_normal(var[...].shape)).astype(np.float32)
    adapters[role] = os.path.join(out, "adapters", role)
    lora_lib.save_peft(
      factors,
      adapters[role],
      rank=RANK,
      alpha=ALPHA,
      target_modules=tuple(lora_lib.PROJECTIONS),
      base_model_name="golden-tiny-qwen3",
    )
  return model_dir, tok_dir, adapters


def _peft_model(model_dir: str, adapters: dict[str, str]):
  import torch
  from peft import PeftModel
  from transformers import AutoModelForCausalLM

  base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
  model = PeftModel.from_pretrained(base, adapters["generator"], adapter_name="default", is_trainable=True)
  model.load_adapter(adapters["verifier"], adapter_name="theta", is_trainable=True)
  return model


def _transition_ids(ref, tokenizer, t: dict) -> dict:
  """The token ids our side needs to rebuild the transition's units, by the reference's own
  tokenisation (`_build_seq_from_prompt_and_action`: the chat prompt, then prompt + action
  tokenised together and cut at the prompt's length)."""
  build = ref.sampling._build_seq_from_prompt_and_action

  def prompt(system: str, user: str) -> list[int]:
    return build(tokenizer, system, user, "", "cpu")[0][0].tolist()

  def completion(system: str, user: str, text: str) -> list[int]:
    seq, plen = build(tokenizer, system, user, text, "cpu")
    return seq[0, plen:].tolist()

  if t.get("filer_only"):
    fp = t["filer_pair"]
    return {
      "filer_prompt": prompt(SYSTEM["filer"], fp["user"]),
      "filer_samples": [completion(SYSTEM["filer"], fp["user"], x) for x in fp["samples"]],
    }
  p = t["prompts"]
  line = t["line_id"]
  stubs = {
    d: json.dumps({"target_line": line, "decision": d}, ensure_ascii=False)
    for d in ("SAC", "NO_SAC", "KEEP", "REVISE")
  }
  return {
    "verifier_prompt": prompt(SYSTEM["verifier"], p["verifier_user"]),
    "revise_prompt": prompt(SYSTEM["filer"], p["revise_user"]),
    "approver_prompt": prompt(SYSTEM["approver"], p["approver_user"]),
    "revisions": [completion(SYSTEM["filer"], p["revise_user"], x["text"]) for x in t["revision"]["samples"]],
    "stubs": {
      text: completion(
        SYSTEM["verifier" if d in ("SAC", "NO_SAC") else "approver"],
        p["verifier_user" if d in ("SAC", "NO_SAC") else "approver_user"],
        text,
      )
      for d, text in stubs.items()
    },
  }


def run_kind(
  ref, kind: dict, model_dir: str, tokenizer, adapters: dict[str, str], lr: float, out_dir: str
) -> dict:
  """One call of the reference's update on a fresh copy of the initial adapters."""
  import torch
  from peft import get_peft_model_state_dict
  from safetensors.torch import save_file

  model = _peft_model(model_dir, adapters)
  params = {n: p for n, p in model.named_parameters() if "lora_" in n}
  grads: dict[str, float] = {}

  class RecordingAdamW(torch.optim.AdamW):
    def step(self, closure=None):
      for name, p in params.items():
        if p.grad is not None:
          grads[name] = float(p.grad.norm())
      return super().step(closure)

  optimizer = RecordingAdamW(list(params.values()), lr=lr, weight_decay=0.01)
  groups: list[dict] = []
  seqs: list[dict] = []
  originals = {}

  def record_seq(orig):
    def wrapped(tok, system_prompt, user_text, action_text, device):
      seq, plen = orig(tok, system_prompt, user_text, action_text, device)
      seqs.append({"ids": seq[0].tolist(), "prompt_len": int(plen)})
      return seq, plen

    return wrapped

  def record_group(orig, name):
    def wrapped(model_, sequences, prompt_lengths, advantages, *args, **kwargs):
      value = orig(model_, sequences, prompt_lengths, advantages, *args, **kwargs)
      active = model_.active_adapter if isinstance(model_.active_adapter, str) else model_.active_adapter[0]
      members = seqs[-len(sequences) :]
      groups.append(
        {
          "fn": name,
          "adapter": active,
          "members": members,
          "advantages": [float(a) for a in advantages],
          "beta": float(args[0]) if name == "grpo_group_accumulate_gradients" else 0.0,
          "loss_scale": float(kwargs.get("loss_scale", 1.0)),
          "value": float(value),
        }
      )
      return value

    return wrapped

  u = ref.updates
  patches = {
    "_build_seq_from_prompt_and_action": record_seq(u._build_seq_from_prompt_and_action),
    "grpo_group_accumulate_gradients": record_group(
      u.grpo_group_accumulate_gradients, "grpo_group_accumulate_gradients"
    ),
    "ppo_clip_accumulate_gradients": record_group(
      u.ppo_clip_accumulate_gradients, "ppo_clip_accumulate_gradients"
    ),
    "_filer_line_prompt": lambda: SYSTEM["filer"],
    "_approver_line_prompt": lambda: SYSTEM["approver"],
    "_verifier_system_prompt_for": lambda args: SYSTEM["verifier"],
  }
  for name, fn in patches.items():
    originals[name] = getattr(u, name)
    setattr(u, name, fn)
  try:
    args = argparse.Namespace(**kind["args"])
    lf, lv = u._apply_transition_batch_update(
      model, tokenizer, optimizer, None, kind["transitions"], args, "cpu", False
    )
  finally:
    for name, fn in originals.items():
      setattr(u, name, fn)
  # Each scored sequence's length-normalised log-prob, policy and reference, at the initial adapters.
  fresh = _peft_model(model_dir, adapters)
  fresh.eval()
  for g in groups:
    fresh.set_adapter(g["adapter"])
    for m in g["members"]:
      ids = torch.tensor([m["ids"]])
      m["logp"] = float(
        ref.sampling.completion_token_logprobs(fresh, ids, m["prompt_len"], enable_grad=False).mean()
      )
      with fresh.disable_adapter():
        m["ref_logp"] = float(
          ref.sampling.completion_token_logprobs(fresh, ids, m["prompt_len"], enable_grad=False).mean()
        )
  for t in kind["transitions"]:
    t["ids"] = _transition_ids(ref, tokenizer, t)
  after = {}
  for role, adapter in ADAPTER_OF.items():
    state = get_peft_model_state_dict(model, adapter_name=adapter)
    directory = os.path.join(out_dir, role)
    os.makedirs(directory, exist_ok=True)
    save_file(
      {k: v.detach().contiguous() for k, v in state.items()},
      os.path.join(directory, "adapter_model.safetensors"),
    )
    with open(os.path.join(adapters[role], "adapter_config.json")) as f:
      config = json.load(f)
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
      json.dump(config, f, indent=2)
    after[role] = os.path.relpath(directory, os.path.dirname(os.path.dirname(out_dir)))
  grad_norms = {}
  for name, norm in grads.items():  # "...layers.{i}.self_attn.q_proj.lora_A.theta.weight"
    adapter = "theta" if ".theta." in name else "default"
    role = {v: k for k, v in ADAPTER_OF.items()}[adapter]
    key = name.split("model.layers.")[1].replace(f".{adapter}.weight", "")
    grad_norms.setdefault(role, {})[key] = norm
  return {
    "args": kind["args"],
    "transitions": kind["transitions"],
    "groups": groups,
    "totals": {"generator": float(lf), "verifier": float(lv)},
    "grad_norms": grad_norms,
    "after": after,
  }


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--reference", required=True, help="a checkout of stevenyu97/Generator_Verifier_Multi_Agent"
  )
  parser.add_argument("--out", default="tests/dpa_grpo/golden")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--lr", type=float, default=1e-2, help="large, so one step's move is far above float32 noise"
  )
  a = parser.parse_args(argv)
  import jax

  jax.config.update("jax_platforms", "cpu")
  ref = _import_reference(a.reference)
  import peft
  import torch
  import transformers

  torch.manual_seed(a.seed)
  os.makedirs(a.out, exist_ok=True)
  model_dir, tok_dir, adapters = build_inputs(a.out, a.seed)
  tokenizer = transformers.AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
  kinds = {}
  for name, kind in update_kinds().items():
    with contextlib.redirect_stdout(sys.stderr):
      kinds[name] = run_kind(
        ref, kind, model_dir, tokenizer, adapters, a.lr, os.path.join(a.out, "after", name)
      )
    print(f"{name}: totals {kinds[name]['totals']}, {len(kinds[name]['groups'])} groups", file=sys.stderr)
  golden = {
    "reference": {
      "repository": "stevenyu97/Generator_Verifier_Multi_Agent",
      "commit": _commit(a.reference),
      "functions": "dpa_grpo.updates._apply_transition_batch_update (and the losses it calls)",
      "checkout_note": _note(a.reference),
    },
    "command": "bash scripts/ref_venv.sh && .venv-ref/bin/python -m tools.dpa_reference_golden "
    f"--reference=<checkout> --out={a.out} --seed={a.seed} --lr={a.lr}",
    "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    "versions": {
      "torch": torch.__version__,
      "transformers": transformers.__version__,
      "peft": peft.__version__,
      "python": platform.python_version(),
    },
    "lora": {"rank": RANK, "alpha": ALPHA, "dropout": 0.0},
    "optimizer": {
      "name": "torch.optim.AdamW",
      "lr": a.lr,
      "weight_decay": 0.01,
      "betas": [0.9, 0.999],
      "eps": 1e-8,
    },
    "shaped_rewards": {k: list(v) for k, v in SHAPED.items()},
    "kinds": kinds,
  }
  with open(os.path.join(a.out, "golden.json"), "w") as f:
    json.dump(golden, f, indent=1)
  print(f"wrote {a.out}/golden.json", file=sys.stderr)


if __name__ == "__main__":
  main()
