"""The scripted solver of the latent-convention testbed (kace.testbed): a program, no model.

Issue 39 asks of every testbed claim whether a few lines that apply the answer rule directly would
already produce it; where they do, the arm tests plumbing, not a mechanism. This is those lines,
labelled "scripted" wherever its numbers appear (`LABEL`; `testbed.solver_kind="scripted"` runs the
whole comparison with it, every role the solver plays included). Per sample it:

- reads the question's kind word and base answer (`testbed.parse_question`, computed symbolically);
- reads every card in the prompt (`testbed.cards_in`, in the order shown) and applies, literally,
  the first whose kind word is the question's: with several such cards (a flat playbook holding
  conflicting rules for one kind word) the first shown wins, right or wrong — interference;
- with no such card, guesses as the trained solver was trained to: a level-1 kind word (the
  identity in every training example) keeps the base answer, any other draws a member of H
  uniformly (seeded per prompt and sample, so samples disagree and problems climb the tiers).

It writes the keyed form's completion ("=totaladdthree: 7 + 3 -> \\boxed{10}"). A prompt without a
testbed question (a teacher, router or reflection prompt it is asked to play) gets a reply no
parser accepts, as the tiny solver's mostly are.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from kace import testbed
from kace.oracle import _generation, _text
from lm import generators, sampler

LABEL = "scripted"
MODEL = "testbed"  # the `model` of the role config that names this stand-in (kind "scripted")


def answer(prompt: str, rng: random.Random) -> str:
  """One sample's completion for `prompt` (module docstring)."""
  body = prompt.rsplit("Problem:", 1)[-1]
  parsed = testbed.parse_question(body)
  if parsed is None:
    return "(no testbed question)"
  kind, base = parsed
  shown = [rule for k, rule in testbed.cards_in(prompt) if k == kind]
  if shown:
    rule = shown[0]
  elif testbed.KIND_OF_WORD.get(kind, (None, 2))[1] == 1:
    rule = testbed.IDENTITY
  else:
    rule = rng.choice(testbed.H)
  return f"{testbed.card_key(kind)}{rule.describe('keyed')}: {rule.working(base)}"


class ScriptedSolver:
  """`lm.generators.TextGenerator` over `answer`: n samples a prompt, drawn from one generator seeded
  by the prompt's `params.seed` and its question (the same request gives the same samples)."""

  label = LABEL

  def __init__(self):
    self.calls = 0

  def generate(self, prompts: Sequence[generators.Prompt], n=1, params=None):
    counts = sampler.per_prompt(n, len(prompts), "n")
    per = sampler.per_prompt(params, len(prompts), "params")
    self.calls += len(prompts)
    out = []
    for prompt, k, p in zip(prompts, counts, per, strict=True):
      text = _text(prompt)
      seed = None if p is None else p.seed
      # seeded by the question, not the notes: a card that does not match changes no guess
      digest = hashlib.sha256(f"{seed}\n{text.rsplit('Problem:', 1)[-1]}".encode()).hexdigest()
      rng = random.Random(int(digest[:16], 16))
      out.append([_generation(answer(text, rng)) for _ in range(k)])
    return out


generators.SCRIPTED[MODEL] = ScriptedSolver
