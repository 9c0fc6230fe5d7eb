"""A real generator with a log of its calls: what the batching claims of the solver are about."""

from lm import generators


class CountingGenerator:
  """Forwards to `inner` and logs every call as (number of prompts, n)."""

  def __init__(self, inner: generators.TextGenerator):
    self.inner, self.calls = inner, []

  def generate(self, prompts, n=1, params=None):
    self.calls.append((len(prompts), n))
    return self.inner.generate(prompts, n, generators.GenerationParams() if params is None else params)
