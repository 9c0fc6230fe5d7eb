"""Oracle (programmatic) teacher and curator for the latent-convention testbed (kace.testbed).

At CPU scale no model is strong enough to play the teacher or the curator: the tiny solver's
replies are almost never valid JSON, so learned trees stay empty. These programs stand in for "a
stronger model" and are labelled "oracle (programmatic)" wherever they appear (records, docs). They
are honest stand-ins, not cheats:

- `OracleTeacher` reads only the teacher prompt the learner sends (`kace.learn.TEACHER_TEMPLATE`):
  the shown failures' questions and gold answers. It computes each base answer symbolically from the
  question, and for each kind among the shown failures fits the member of the declared hypothesis
  set H that agrees with the most of them, abstaining when fewer than two agree. It is never told
  which rule belongs to which block. With `noise` > 0 it replaces a fitted rule by a wrong member of
  H at that rate, so ADD and REFINE have bad cards to reject or remove; given `plausible` (testbed
  v2: the rules each kind word has in other blocks) the wrong rule is drawn from those instead, a
  card that is right somewhere else.
- `OracleCurator` reads only the curator prompt (`kace.learn.CURATOR_TEMPLATE`): it deletes every card
  whose measured credit is negative and, of two cards stating a convention for the same kind in the
  same block, the one with the lower credit.
- ACE's roles (`kace.baselines`; issue 47, item 4: in v1/v2 the oracle answered neither, so ACE's
  playbook stayed empty and `ace_playbook` equalled `best_of_n`): as ACE's reflector the teacher
  states the evidence of the one problem it reviews ("evidence total: 7 -> 10", its base answer and
  gold) and tags each playbook card of that kind helpful or harmful by whether it maps the one to the
  other; as ACE's curator the curator fits H to the evidence of all the batch's reflections per kind
  word (abstaining below two agreeing, as the teacher does) and adds each fitted card the playbook
  lacks. No noise in these roles.
- GEPA's reflection LM (the teacher role; the prompt is the `gepa` library's default instruction
  proposal, `baselines.SolverAdapter.make_reflective_dataset`'s rows in it): it fits H per kind word
  to the examples whose feedback gives the correct answer and returns the current instruction with
  a card line per fitted rule in place of that kind word's earlier lines (`gepa_instruction`).

Both implement `lm.generators.TextGenerator`, so the learner calls them like any model.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Mapping, Sequence

from kace import testbed
from lm import generators, sampler

LABEL = "oracle (programmatic)"

_PROBLEM_RE = re.compile(r"### Problem \d+[^\n]*\n(?P<question>[^\n]*)\nCorrect answer: (?P<gold>[^\n]*)")
_ABSTAIN = json.dumps({"cards": [], "by": LABEL, "note": "no kind with two agreeing failures"})


def _text(prompt: generators.Prompt) -> str:
  if isinstance(prompt, str):
    return prompt
  return "\n".join(m["content"] for m in prompt)


def _generation(text: str) -> generators.Generation:
  return generators.Generation(
    text=text, token_ids=None, logprobs=None, finish_reason="stop", prompt_tokens=0, completion_tokens=0
  )


def shown_failures(prompt: str) -> list[tuple[str, int, int]]:
  """(kind, base answer, gold) of every testbed problem a teacher prompt shows with an integer gold."""
  out = []
  for m in _PROBLEM_RE.finditer(prompt):
    parsed = testbed.parse_question(m.group("question"))
    gold = m.group("gold").strip()
    if parsed is not None and re.fullmatch(r"-?\d+", gold):
      out.append((parsed[0], parsed[1], int(gold)))
  return out


def _existing(prompt: str) -> set[str]:
  """Card texts the prompt lists as already held by the block."""
  section = prompt.split("already holds:", 1)[-1].split("\n\nWrite at most", 1)[0]
  return {line.split("] ", 1)[-1].strip() for line in section.splitlines() if line.startswith("- [")}


_REVIEW = "You review a maths solver's answer."
_MAINTAIN = "You maintain a playbook"
_REVIEWED_RE = re.compile(
  r"Problem: (?P<question>[^\n]*)\nSolver's answer: .*correct answer: (?P<gold>[^)]*)\)"
)
_PLAYBOOK_RE = re.compile(r"^\[(?P<id>card-\d+)\] (?P<text>.*)$", re.M)
_EVIDENCE_RE = re.compile(r"evidence (?P<kind>\w+): (?P<base>-?\d+) -> (?P<gold>-?\d+)")


def reflect(prompt: str) -> str:
  """ACE's reflector reply to `kace.baselines.REFLECTOR_TEMPLATE` (module docstring)."""
  m = _REVIEWED_RE.search(prompt)
  parsed = testbed.parse_question(m.group("question")) if m else None
  gold = m.group("gold").strip() if m else ""
  if parsed is None or not re.fullmatch(r"-?\d+", gold):
    return json.dumps({"reflection": "no testbed evidence", "bullet_tags": [], "by": LABEL})
  kind, base = parsed
  tags = []
  for card in _PLAYBOOK_RE.finditer(prompt.split("Problem:", 1)[0]):
    rule = testbed.parse_card(card.group("text"))
    if rule is None or rule[0] != kind:
      tag = "neutral"
    else:
      tag = "helpful" if rule[1].apply(base) == int(gold) else "harmful"
    tags.append({"id": card.group("id"), "tag": tag})
  return json.dumps({"reflection": f"evidence {kind}: {base} -> {gold}", "bullet_tags": tags, "by": LABEL})


def ace_delta(prompt: str, form: str, min_agree: int = 2) -> str:
  """ACE's curator reply to `kace.baselines.ACE_CURATOR_TEMPLATE` (module docstring)."""
  playbook, _, reflections = prompt.partition("Reflections on recent answers:")
  by_kind: dict[str, list[tuple[int, int]]] = {}
  for m in _EVIDENCE_RE.finditer(reflections):
    by_kind.setdefault(m.group("kind"), []).append((int(m.group("base")), int(m.group("gold"))))
  held = {m.group("text").strip() for m in _PLAYBOOK_RE.finditer(playbook)}
  ops = []
  for kind in sorted(by_kind):
    rule, agree = testbed.fit(by_kind[kind])
    text = testbed.card_text(kind, rule, form)
    if agree >= min_agree and text not in held:
      ops.append({"op": "add", "type": testbed.CARD_TYPE, "text": text})
  return json.dumps({"operations": ops, "by": LABEL})


_GEPA = "I provided an assistant with the following instructions"
_GOLD_RE = re.compile(r"the correct answer is (?P<gold>-?\d+)")


def gepa_instruction(prompt: str, form: str, min_agree: int = 2) -> str:
  """GEPA's reflection reply: the new instruction in a ``` block (module docstring)."""
  current = prompt.split("```", 2)[1].strip("\n")
  by_kind: dict[str, list[tuple[int, int]]] = {}
  for example in prompt.split("\n# Example ")[1:]:
    inputs = example.split("## Inputs\n", 1)[-1].split("\n## ", 1)[0]
    parsed, gold = testbed.parse_question(inputs), _GOLD_RE.search(example.split("## Feedback", 1)[-1])
    if parsed is not None and gold:
      by_kind.setdefault(parsed[0], []).append((parsed[1], int(gold.group("gold"))))
  fitted = {}
  for kind in sorted(by_kind):
    rule, agree = testbed.fit(by_kind[kind])
    if agree >= min_agree:
      fitted[kind] = testbed.card_text(kind, rule, form)
  if not fitted:
    return f"```\n{current}\n```"
  kept = [line for line in current.splitlines() if not {k for k, _ in testbed.cards_in(line)} & set(fitted)]
  lines = kept + [f"- [{testbed.CARD_TYPE}] {text}" for text in fitted.values()]
  return "```\n" + "\n".join(lines) + "\n```"


class OracleTeacher:
  """The teacher role played by a program that fits H to the shown failures (module docstring).

  Attributes:
    noise: probability that a fitted rule is replaced by a random wrong member of H.
    seed: the noise draws (derived per prompt, so a reply depends only on the prompt and the seed).
    min_agree: fewer agreeing failures than this and the oracle abstains for that kind.
    form: the surface form of the cards it writes (`testbed.FORMS`; the testbed's).
    plausible: {kind word: rules}: a noisy card's wrong rule is drawn from its kind's rules other
      than the fitted one (`testbed.TestbedConfig.rules_of_kinds`), else from H.
    calls: prompts answered so far (the learner counts teacher calls itself; this is for tests).
  """

  label = LABEL

  def __init__(
    self,
    noise: float = 0.0,
    seed: int = 0,
    min_agree: int = 2,
    form: str = "short",
    plausible: Mapping[str, Sequence[testbed.Convention]] | None = None,
  ):
    if not 0 <= noise <= 1:
      raise ValueError(f"oracle noise must be in [0, 1], got {noise}")
    self.noise, self.seed, self.min_agree, self.calls = noise, seed, min_agree, 0
    self.form = testbed.check_form(form)
    self.plausible = dict(plausible or {})

  def reply(self, prompt: str) -> str:
    if prompt.startswith(_REVIEW):
      return reflect(prompt)
    if prompt.startswith(_GEPA):
      return gepa_instruction(prompt, self.form, self.min_agree)
    by_kind: dict[str, list[tuple[int, int]]] = {}
    for kind, base, gold in shown_failures(prompt):
      by_kind.setdefault(kind, []).append((base, gold))
    digest = hashlib.sha256(f"{self.seed}\n{prompt}".encode()).hexdigest()
    rng = random.Random(int(digest[:16], 16))
    held, out = _existing(prompt), []
    for kind in sorted(by_kind):
      rule, agree = testbed.fit(by_kind[kind])
      if agree < self.min_agree:
        continue
      if rng.random() < self.noise:
        fitted = rule
        rule = rng.choice(
          [h for h in self.plausible.get(kind, ()) if h != fitted] or [h for h in testbed.H if h != fitted]
        )
      text = testbed.card_text(kind, rule, self.form)
      if text not in held:
        out.append({"type": testbed.CARD_TYPE, "text": text})
    return json.dumps({"cards": out, "by": LABEL}) if out else _ABSTAIN

  def generate(self, prompts: Sequence[generators.Prompt], n=1, params=None):
    counts = sampler.per_prompt(n, len(prompts), "n")
    self.calls += len(prompts)
    return [[_generation(self.reply(_text(p)))] * k for p, k in zip(prompts, counts, strict=True)]


_LISTING_RE = re.compile(
  r"^(?P<id>card-\d+) \| (?P<location>[^|]+) \| (?P<type>[^|]+) \| (?P<readers>-?\d+) \| "
  r"(?P<credit>[+-]?\d+) \| (?P<text>.*)$",
  re.M,
)


class OracleCurator:
  """The curator role played by a program over the card listing and credits (module docstring).
  With `delete_idle` it also deletes every card of credit 0 (no teaching reader's outcome depends on
  it, or it has none): a wrong card whose readers fail with and without it is otherwise never
  touched (docs/kace.md, "Testbed v2: results"); REFINE still rolls a deletion back when it costs
  the acceptance readers."""

  label = LABEL

  def __init__(self, delete_idle: bool = False, form: str = "short"):
    self.calls, self.delete_idle, self.form = 0, delete_idle, testbed.check_form(form)

  def reply(self, prompt: str) -> str:
    if prompt.startswith(_MAINTAIN):
      return ace_delta(prompt, self.form)
    listing = prompt.split("All cards (id | location | type | read by | credit | text):", 1)[-1]
    rows = [m.groupdict() for m in _LISTING_RE.finditer(listing)]
    ops, deleted = [], set()
    for row in rows:
      if int(row["credit"]) < 0 or (self.delete_idle and int(row["credit"]) == 0):
        why = "negative credit" if int(row["credit"]) < 0 else "credit 0"
        ops.append({"op": "delete", "id": row["id"], "reason": f"{LABEL}: {why}"})
        deleted.add(row["id"])
    best: dict[tuple[str, str], dict] = {}
    for row in rows:
      parsed = testbed.parse_card(row["text"])
      if row["id"] in deleted or parsed is None:
        continue
      key = (row["location"].strip(), parsed[0])
      other = best.get(key)
      if other is None:
        best[key] = row
        continue
      worse = min((other, row), key=lambda r: (int(r["credit"]), r["id"]))
      best[key] = row if worse is other else other
      ops.append({"op": "delete", "id": worse["id"], "reason": f"{LABEL}: a second rule for {parsed[0]}"})
      deleted.add(worse["id"])
    return json.dumps({"operations": ops, "by": LABEL})

  def generate(self, prompts: Sequence[generators.Prompt], n=1, params=None):
    counts = sampler.per_prompt(n, len(prompts), "n")
    self.calls += len(prompts)
    return [[_generation(self.reply(_text(p)))] * k for p, k in zip(prompts, counts, strict=True)]
