"""A scripted stand-in for the testbed solver (a rule, not a model), for tests of the oracle roles,
the gates and the testbed pipeline that must not train a model."""

import random

from kace import testbed
from lm import generators, sampler
from tests.kace import learn_helpers


class ConventionSolver:
  """A scripted solver that does what the trained solver is meant to: it computes the base answer and
  applies the card of its question's kind when the notes hold one; level-1 kinds are the identity;
  otherwise each sample guesses a training convention (seeded by the sampling seed)."""

  def generate(self, prompts, n=1, params=None):
    out = []
    per = sampler.per_prompt(params, len(prompts), "params")
    for prompt, count, par in zip(prompts, sampler.per_prompt(n, len(prompts), "n"), per, strict=True):
      text = learn_helpers._text(prompt)
      notes, question = text.rsplit("Problem: ", 1)
      kind, base = testbed.parse_question(question)
      held = dict(filter(None, (testbed.parse_card(line) for line in notes.splitlines())))
      rng = random.Random(par.seed)
      if testbed.KIND_OF_WORD[kind][1] == 1:
        rules = [testbed.IDENTITY] * count
      elif kind in held:
        rules = [held[kind]] * count
      else:
        rules = [rng.choice(testbed.TRAIN_H) for _ in range(count)]
      out.append(
        [generators.Generation(f"\\boxed{{{r.apply(base)}}}", None, None, "stop", 10, 4) for r in rules]
      )
    return out
