"""The DPA-GRPO game on tax-form lines: roles, actions, the SAC object, replies and the 8 cases.

A decision unit is one Form 1040 line of one case, drafted in the fixed order of
`taxcalc.LINE_IDS`. The Generator proposes an answer x; the Verifier either stays silent (NS) or
raises a Safety Assurance Case (SAC: Claim, Argument, Evidence); after a SAC the Generator submits x
(KEEP) or a revision z (REVISE). The oracle scores x and z (S_x, S_z ∈ {0, 1}).

Replies are JSON so that each role's two actions have canonical short strings, both of which the
loss scores whichever was sampled (`VERIFIER_PAIR`, `GENERATOR_PAIR`):

  verifier:  {"verdict": "suspicious"}                      first line: the decision
             {"claim": "...", "argument": "...", "evidence": "..."}   then the SAC (not after "correct")
  generator: {"decision": "KEEP"}  or  {"decision": "REVISE"}

The verdict takes one of `VERDICTS`; as in the reference code, anything but "correct" is a SAC.
The decision line is a complete JSON object on its own, so the canonical pair strings
`{"verdict": "correct"}` (NS) and `{"verdict": "wrong"}` (SAC) are exact prefixes of well-formed
replies. A reply the parser cannot read is an *invalid action*: it never raises, the text is kept
for audit, the game continues with a configured fallback action, and training penalises the text.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

from lm import stats
from lm import text as text_lib

ROLES = ("generator", "verifier")
VERIFIER_ACTIONS = ("NS", "SAC")  # index = the action's slot in the verifier's pair
GENERATOR_ACTIONS = ("KEEP", "REVISE")  # index = the action's slot in the generator's pair
NS, SAC_ACTION = 0, 1
KEEP, REVISE = 0, 1
VERDICTS = ("correct", "plausible", "suspicious", "wrong")
CASES = ("1", "2", "3", "4", "5a", "5b", "6a", "6b")
SAC_FIELDS = ("claim", "argument", "evidence")

# JSON schemas of the two objects a verifier reply holds (draft 2020-12), for prompts and docs.
VERDICT_SCHEMA: dict[str, Any] = {
  "type": "object",
  "properties": {"verdict": {"enum": list(VERDICTS)}},
  "required": ["verdict"],
}
SAC_SCHEMA: dict[str, Any] = {
  "type": "object",
  "description": "Safety Assurance Case against a proposed line amount",
  "properties": {
    "claim": {"type": "string", "description": "what is wrong with the proposed amount"},
    "argument": {"type": "string", "description": "why, from the form's rules"},
    "evidence": {"type": "string", "description": "the input fields and lines that show it"},
  },
  "required": list(SAC_FIELDS),
}
DECISION_SCHEMA: dict[str, Any] = {
  "type": "object",
  "properties": {"decision": {"enum": list(GENERATOR_ACTIONS)}},
  "required": ["decision"],
}


@dataclasses.dataclass(frozen=True)
class SAC:
  """A Safety Assurance Case: the verifier's structured objection to a proposal."""

  claim: str
  argument: str
  evidence: str

  def to_dict(self) -> dict[str, str]:
    return {"claim": self.claim, "argument": self.argument, "evidence": self.evidence}


def render_verdict(verdict: str) -> str:
  """The decision line of a verifier reply; also the canonical string of its action."""
  if verdict not in VERDICTS:
    raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
  return json.dumps({"verdict": verdict})


def render_verifier_reply(verdict: str, sac: SAC | None = None) -> str:
  """A well-formed verifier reply (warm-start targets, tests): the verdict line, then the SAC."""
  if (verdict == "correct") != (sac is None):
    raise ValueError("a SAC goes with every verdict but 'correct', and only with those")
  head = render_verdict(verdict)
  return head if sac is None else head + "\n" + json.dumps(sac.to_dict(), ensure_ascii=False)


def render_decision(action: int) -> str:
  """The generator's KEEP/REVISE reply; also the canonical string of that action."""
  return json.dumps({"decision": GENERATOR_ACTIONS[action]})


VERIFIER_PAIR = (render_verdict("correct"), render_verdict("wrong"))  # [NS, SAC]
GENERATOR_PAIR = (render_decision(KEEP), render_decision(REVISE))  # [KEEP, REVISE]


def pair_strings(line_id: str, style: str) -> tuple[tuple[str, str], tuple[str, str]]:
  """(verifier [NS, SAC], generator [KEEP, REVISE]) canonical strings of one unit's pairs.

  "reply_prefix": `VERIFIER_PAIR` / `GENERATOR_PAIR`, prefixes of the replies the roles sample.
  "reference_stub": the reference code's `{"target_line": L, "decision": ...}` stubs (`updates.py`,
  `json.dumps(..., ensure_ascii=False)`), a schema neither role samples, so the pair loss never
  touches a sampled reply's tokens.
  """
  if style == "reply_prefix":
    return VERIFIER_PAIR, GENERATOR_PAIR
  if style != "reference_stub":
    raise ValueError(f"pair style must be 'reply_prefix' or 'reference_stub', got {style!r}")
  stub = lambda decision: json.dumps({"target_line": line_id, "decision": decision}, ensure_ascii=False)
  return (stub("NO_SAC"), stub("SAC")), (stub("KEEP"), stub("REVISE"))


@dataclasses.dataclass(frozen=True)
class VerifierReply:
  """A parsed verifier reply.

  Attributes:
    action: NS (0) or SAC (1) as played: from the verdict, or the fallback when there is none.
    verdict: one of `VERDICTS`, None when no verdict could be read.
    sac: the SAC when the action is SAC and its fields were readable (missing fields read "").
    valid: the reply follows the format (a verdict; a complete SAC after a non-"correct" verdict).
    error: why it is invalid ("" when valid).
    text: the reply as sampled.
  """

  action: int
  verdict: str | None
  sac: SAC | None
  valid: bool
  error: str
  text: str


@dataclasses.dataclass(frozen=True)
class GeneratorDecision:
  """A parsed KEEP/REVISE reply; `action` is the fallback when the reply is invalid."""

  action: int
  valid: bool
  error: str
  text: str


def _objects(text: Any) -> list[dict[str, Any]]:
  """JSON objects in the final part of a reply (`lm.text.after_think`); non-strings hold none."""
  if not isinstance(text, str):
    return []
  return text_lib.json_objects(text_lib.after_think(text))


def _field(obj: Mapping[str, Any], name: str) -> Any:
  for key, value in obj.items():
    if str(key).strip().lower() == name:
      return value
  return None


def parse_verifier_reply(text: Any, invalid_action: int = SAC_ACTION) -> VerifierReply:
  """Reads a verifier reply; never raises on model output.

  The first object with a "verdict" key decides; the SAC fields are read from that object or the
  next one. Verdicts are matched case-insensitively. An unreadable verdict plays `invalid_action`
  (default SAC, the reference code's "anything but correct" rule) with an empty SAC.
  """
  raw = text if isinstance(text, str) else repr(text)
  objects = _objects(text)
  index = next((i for i, o in enumerate(objects) if _field(o, "verdict") is not None), None)
  if index is None:
    sac = SAC("", "", "") if invalid_action == SAC_ACTION else None
    return VerifierReply(invalid_action, None, sac, False, "no JSON object with a verdict", raw)
  verdict = str(_field(objects[index], "verdict")).strip().lower()
  if verdict not in VERDICTS:
    sac = SAC("", "", "") if invalid_action == SAC_ACTION else None
    return VerifierReply(invalid_action, None, sac, False, f"unknown verdict {verdict[:40]!r}", raw)
  if verdict == "correct":
    return VerifierReply(NS, verdict, None, True, "", raw)
  source = objects[index]
  if not any(_field(source, f) is not None for f in SAC_FIELDS) and index + 1 < len(objects):
    source = objects[index + 1]
  values = {f: _field(source, f) for f in SAC_FIELDS}
  missing = [f for f, v in values.items() if not isinstance(v, str) or not v.strip()]
  sac = SAC(*(v.strip() if isinstance(v, str) else "" for v in values.values()))
  error = f"SAC lacks {', '.join(missing)}" if missing else ""
  return VerifierReply(SAC_ACTION, verdict, sac, not missing, error, raw)


def parse_decision(text: Any, invalid_action: int = KEEP) -> GeneratorDecision:
  """Reads a KEEP/REVISE reply (the last decision object counts); never raises on model output."""
  raw = text if isinstance(text, str) else repr(text)
  decisions = [_field(o, "decision") for o in _objects(text)]
  decisions = [str(d).strip().upper() for d in decisions if d is not None]
  if not decisions:
    return GeneratorDecision(invalid_action, False, "no JSON object with a decision", raw)
  if decisions[-1] not in GENERATOR_ACTIONS:
    return GeneratorDecision(invalid_action, False, f"unknown decision {decisions[-1][:40]!r}", raw)
  return GeneratorDecision(GENERATOR_ACTIONS.index(decisions[-1]), True, "", raw)


# ---- prompts of the roles' later turns (the draft prompt is `taxcalc.line_prompt`) --------------


def verifier_prompt(line_prompt: str, proposal: str, note: str = "") -> str:
  """The verifier sees the generator's task and its proposed answer; a task family's `note`, when
  it has one (`copycheck.verifier_note`), is the prompt's last line, nearest the verdict ("" : the
  prompt is the same text as without the argument)."""
  return (
    f"A preparer was given this task:\n---\n{line_prompt}\n---\n"
    f"The preparer answered:\n{proposal.strip() or '(empty answer)'}\n\n"
    "Check the answer. Reply with one line of JSON giving your verdict, "
    f'{{"verdict": one of {", ".join(VERDICTS)}}}. Unless the verdict is "correct", add a second '
    'line of JSON with your safety assurance case: {"claim": "...", "argument": "...", '
    '"evidence": "..."}.' + (f"\n{note}" if note else "")
  )


def _sac_block(sac: SAC | None) -> str:
  if sac is None:
    return "(none)"
  return f"Claim: {sac.claim}\nArgument: {sac.argument}\nEvidence: {sac.evidence}"


def revision_prompt(line_prompt: str, proposal: str, sac: SAC | None) -> str:
  """The generator revises its proposal in answer to the verifier's SAC."""
  return (
    f"{line_prompt}\n\nYour earlier answer was:\n{proposal.strip() or '(empty answer)'}\n\n"
    f"A reviewer objected:\n{_sac_block(sac)}\n\n"
    "Write a revised answer for the same line, in the same format."
  )


def decision_prompt(line_prompt: str, proposal: str, sac: SAC | None, revision: str, note: str = "") -> str:
  """The generator chooses between submitting its proposal and its revision; a task family's
  `note` (`copycheck.decision_note`, when `RolloutConfig.decision_note` asks for it) is the last
  line, nearest the decision ("": the same text as without the argument)."""
  return (
    f"{line_prompt}\n\nYour earlier answer was:\n{proposal.strip() or '(empty answer)'}\n\n"
    f"A reviewer objected:\n{_sac_block(sac)}\n\n"
    f"Your revised answer is:\n{revision.strip() or '(empty answer)'}\n\n"
    'Submit the earlier answer with {"decision": "KEEP"} or the revised one with '
    '{"decision": "REVISE"}. Reply with that JSON only.' + (f"\n{note}" if note else "")
  )


# ---- the 8 cases -------------------------------------------------------------------------------


def classify_case(
  x_right: bool, verifier_action: int, generator_action: int | None, z_right: bool | None
) -> str:
  """The case (the DPA-GRPO paper's 8-case table: 1, 2, 3, 4, 5a, 5b, 6a, 6b) of one played unit.

  Args:
    x_right: S_x.
    verifier_action: NS (0) or SAC (1).
    generator_action: KEEP (0) or REVISE (1) after a SAC; None after NS (the generator does not act).
    z_right: S_z of the kept revision; needed after a SAC on a wrong proposal (cases 5a–6b).

  Raises:
    ValueError: the arguments describe no playable unit (e.g. a generator action after NS).
  """
  if verifier_action not in (NS, SAC_ACTION):
    raise ValueError(f"verifier_action must be 0 (NS) or 1 (SAC), got {verifier_action!r}")
  if verifier_action == NS:
    if generator_action is not None:
      raise ValueError("the generator does not act after NS")
    return "1" if x_right else "4"
  if generator_action not in (KEEP, REVISE):
    raise ValueError(f"after a SAC generator_action must be 0 (KEEP) or 1 (REVISE), got {generator_action!r}")
  if x_right:
    return "2" if generator_action == REVISE else "3"
  if z_right is None:
    raise ValueError("cases 5a-6b need z_right")
  if generator_action == REVISE:
    return "5a" if z_right else "5b"
  return "6b" if z_right else "6a"


def submitted_right(
  x_right: bool, verifier_action: int, generator_action: int | None, z_right: bool | None
) -> bool:
  """Whether the submitted output is right: z after REVISE, x otherwise (post-revision accuracy)."""
  if verifier_action == SAC_ACTION and generator_action == REVISE:
    if z_right is None:
      raise ValueError("a revised unit needs z_right")
    return bool(z_right)
  return bool(x_right)


def case_table(cases: Iterable[str]) -> dict[str, dict[str, float]]:
  """Count, rate and Wilson 95% interval of each case over the played units."""
  cases = list(cases)
  unknown = sorted(set(cases) - set(CASES))
  if unknown:
    raise ValueError(f"unknown cases {unknown}; cases are {CASES}")
  n = len(cases)
  table = {}
  for name in CASES:
    k = cases.count(name)
    low, high = stats.wilson_interval(k, n)
    table[name] = {"count": k, "rate": k / n if n else 0.0, "ci_low": low, "ci_high": high}
  return table
