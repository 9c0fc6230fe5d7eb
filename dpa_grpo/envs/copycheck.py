"""Copy-and-check cases: a tax-form task a tiny model can draft, check and revise.

The synthetic TY24 forms (`dpa_grpo.envs.forms`) need arithmetic and tax tables a 2-layer model
cannot learn at CPU scale, so their verifier can only guess and their revisions are almost never
right. This family keeps the game and the case layout (`taxcalc.TaxCase`, Form 1040 line ids, the
same prompts and parser) but makes every role's job learnable:

  line 1a   = W-2 box 1        a copy: the verifier can check a draft against the field, a SAC's
  line 25d  = W-2 box 2        Evidence quotes it ("W-2 box 1 = 532"), a revision can copy it;
  line 12   = a hidden amount  the control: one of two amounts chosen by a coin the input does not
                               show, so no role can check it (a draft is right half the time).

Amounts have three digits, each W-2 box from its own small pool (`BOX_POOLS`, never a control
amount); a careless draft writes another value of the same pool (`confusion`), a plausible,
well-formed mistake that only a comparison with the input reveals (not its length or its kind).

Each case also names a `desk` ("north" or "south"): a field no line depends on. It is how the warm
start gives the preparer a habit tied to something it can see (`habit`): a role that errs at
random errs with the mode of its training targets, which greedy decoding always gets right, while
a habit tied to a visible field survives greedy decoding and leaves training something to fix.

Pure Python; `generate_cases` is deterministic in (n, seed, split).
"""

from __future__ import annotations

import random

from dpa_grpo import game
from dpa_grpo.envs import taxcalc

FAMILY = "copycheck"
LINES = ("1a", "25d", "12")  # drafting order: the two copy lines, then the control
CONTROL_LINE = "12"
CONTROL_AMOUNTS = (146, 195)  # line 12: one of these, by a coin the input does not show
DESKS = ("north", "south")
# How often each desk's warm-start preparer errs, relative to the configured rate
# (`WarmStartConfig.draft_wrong`): with 0.45, north drafts 72% and south 18% of lines wrong.
DESK_HABIT = {"north": 1.6, "south": 0.4}
_FIELDS = {"1a": ("box1", "W-2 box 1"), "25d": ("box2", "W-2 box 2")}
# W-2 amounts: each box from its own pool of four three-digit values with distinct leading digits
# (none starts like a control amount). Measured on the 2-layer model: with any three-digit amount,
# 600 warm-start steps taught it no copying (P(x right) = 0 on both copy lines); with one pool of
# eight values for both boxes, it learned the values but not which box holds which (P(x right)
# 0.12 and 0.08, a guess). With a pool per box, finding the field is finding the value of its pool.
BOX_POOLS = {"box1": (245, 380, 415, 560), "box2": (675, 730, 825, 960)}


def is_copycheck(case: taxcalc.TaxCase) -> bool:
  return case.case_id.startswith(FAMILY + "-")


def _case(case_id: str, rng: random.Random) -> taxcalc.TaxCase:
  box1, box2 = rng.choice(BOX_POOLS["box1"]), rng.choice(BOX_POOLS["box2"])
  forms = {"desk": rng.choice(DESKS), "w2": {"box1": box1, "box2": box2}}
  gold = dict.fromkeys(taxcalc.LINE_IDS, 0.0)
  gold.update({"1a": float(box1), "25d": float(box2), CONTROL_LINE: float(rng.choice(CONTROL_AMOUNTS))})
  return taxcalc.TaxCase(case_id=case_id, forms=forms, gold=gold)


def generate_cases(n: int, seed: int = 0, split: str = "all") -> list[taxcalc.TaxCase]:
  """`n` cases, the same for the same (seed, split); case `i` has its own generator, so the first
  k of a larger request are the same k cases. `split` only names an independent draw (e.g. a
  validation set beside the train/test cases)."""
  if n <= 0:
    raise ValueError(f"n must be > 0, got {n}")
  rng = lambda i: random.Random(f"copycheck:{seed}:{split}:{i}")
  return [_case(f"{FAMILY}-{split}-s{seed}-{i:05d}", rng(i)) for i in range(n)]


def field_of(line_id: str) -> tuple[str, str] | None:
  """(forms key, printed name) of the input field a copy line copies; None for the control."""
  return _FIELDS.get(line_id)


def confusion(case: taxcalc.TaxCase, line_id: str) -> float:
  """The wrong amount a careless preparer writes: on a copy line the next value of the field's
  pool (a misread row: the same kind of amount, so only a comparison with the field catches it),
  on the control line the other hidden amount. Never the gold."""
  if line_id == CONTROL_LINE:
    a, b = CONTROL_AMOUNTS
    return float(b if case.gold[line_id] == a else a)
  if line_id not in _FIELDS:
    raise ValueError(f"copy-and-check cases have lines {LINES}, got {line_id!r}")
  pool = BOX_POOLS[_FIELDS[line_id][0]]
  return float(pool[(pool.index(int(case.gold[line_id])) + 1) % len(pool)])


def answer_pool(line_id: str) -> tuple[int, ...]:
  """The amounts a line's answers take: its W-2 box's pool on a copy line, the two hidden amounts
  on the control line."""
  if line_id == CONTROL_LINE:
    return CONTROL_AMOUNTS
  if line_id not in _FIELDS:
    raise ValueError(f"copy-and-check cases have lines {LINES}, got {line_id!r}")
  return BOX_POOLS[_FIELDS[line_id][0]]


def on_pool(line_id: str, amount: float | None) -> bool:
  """Whether an amount is one of the line's answer pool (`answer_pool`); False when unparsed."""
  return amount is not None and float(amount) in {float(a) for a in answer_pool(line_id)}


def wrong_on_pool(case: taxcalc.TaxCase, line_id: str, rng: random.Random) -> float:
  """A wrong amount a reviser writes in testbed v2: any other value of the line's answer pool
  (well formed and plausible; only a comparison with the field tells it from the gold)."""
  gold = int(case.gold[line_id])
  return float(rng.choice([a for a in answer_pool(line_id) if a != gold]))


def habit(case: taxcalc.TaxCase) -> float:
  """The factor on the warm-start preparer's error rate for this case's desk (1.0 off-family)."""
  return DESK_HABIT[case.forms["desk"]] if is_copycheck(case) else 1.0


def checkable(line_id: str) -> bool:
  """Whether a draft of this line can be checked against the input (false for the control)."""
  return line_id in _FIELDS


def sac(case: taxcalc.TaxCase, line_id: str) -> game.SAC:
  """The SAC a careful reviewer raises against a draft of this line: on a copy line its Evidence
  quotes the field ("W-2 box 1 = 532"); on the control line there is nothing to quote."""
  if line_id == CONTROL_LINE:
    return game.SAC(f"line {line_id} may be wrong", "no input field gives it", "none")
  key, name = _FIELDS[line_id]
  value = taxcalc.format_amount(case.gold[line_id])
  return game.SAC(f"line {line_id} is not {name}", f"line {line_id} copies {name}", f"{name} = {value}")


def draft_equals_field(case: taxcalc.TaxCase, line_id: str, amount: float | None) -> bool | None:
  """What the verifier can observe of a draft: whether it equals the input field the line copies
  (None on the control line, where no field says)."""
  if not checkable(line_id):
    return None
  key, _ = _FIELDS[line_id]
  return amount is not None and float(amount) == float(case.forms["w2"][key])


def decision_note(case: taxcalc.TaxCase, line_id: str, proposal: str, revision: str) -> str:
  """The last line of the KEEP / REVISE prompt when `RolloutConfig.decision_note` is on: both
  amounts, the field, and which of them matches it ("Earlier 380, revised 415; the line copies
  W-2 box 1 = 415; the earlier differs, the revision matches"); "" off-family.

  Why (a post-hoc exploration, docs/dpa_grpo.md, "Exploration after the registered
  comparison"): the decision has to compare the revision with the field quoted in the SAC's
  Evidence, the same equality the verifier's verdict could not learn without `verifier_note`; in
  the registered comparison the greedy decision never turned REVISE on a right revision. With this
  note the generator observes what the verifier does.
  """
  if not is_copycheck(case):
    return ""
  (x, x_same), (z, z_same) = (_observed(case, line_id, text) for text in (proposal, revision))
  head = f"Earlier {x}, revised {z}"
  if not checkable(line_id):
    return f"{head}; no input field gives this line."
  said = lambda same: "matches" if same else "differs"
  return f"{head}; {_copies(case, line_id)}; the earlier {said(x_same)}, the revision {said(z_same)}."


def _observed(case: taxcalc.TaxCase, line_id: str, answer: str) -> tuple[str, bool | None]:
  """An answer's amount as a note shows it ("none" when unparsable) and `draft_equals_field`."""
  amount = taxcalc.parse_line_answer(answer, line_id).value
  shown = "none" if amount is None else taxcalc.format_amount(amount)
  return shown, draft_equals_field(case, line_id, amount)


def _copies(case: taxcalc.TaxCase, line_id: str) -> str:
  """ "the line copies W-2 box 1 = 415": the field a copy line copies, with its amount."""
  key, name = _FIELDS[line_id]
  return f"the line copies {name} = {taxcalc.format_amount(case.forms['w2'][key])}"


def verifier_note(case: taxcalc.TaxCase, line_id: str, proposal: str) -> str:
  """The last line of the verifier's prompt (`game.verifier_prompt`): the amount the proposal
  gives and the input field the line copies, with its amount ("Proposed 380; the line copies W-2
  box 1 = 415"), or that no field gives the control line; "" off-family (other prompts stay as
  they were).

  Why: with the field only inside the forms, the verdict's first token has to find the field the
  line copies, read the proposed amount and compare them in one step, and a 2-layer model did not
  learn that in 2,000 warm-start steps (64 or 128 wide: a SAC on about half of all drafts, right or
  wrong); with the field shown below the answer, 60 tokens before the verdict, it did not either.
  Here the two amounts stand side by side just before the verdict. What the verifier can tell is
  still exactly `draft_equals_field` (the ODE's information state): line and whether the draft
  equals the field, nothing about the control line.
  """
  if not is_copycheck(case):
    return ""
  shown, same = _observed(case, line_id, proposal)
  if not checkable(line_id):
    return f"Proposed {shown}; no input field gives this line."
  return f"Proposed {shown}; {_copies(case, line_id)}; {'they match' if same else 'they differ'}."
