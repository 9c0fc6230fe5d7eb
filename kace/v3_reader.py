"""The trained v3 solver (`kace.v3_solver`) as a reader of testbed v3: the scripted readers' interface
(`kace.readers`: `name`, `answer(problem, shown, rng)`, `answers(asks)`), played by a tiny model.

Why a module of its own: `kace.v3_solver`'s code is its model's cache key (`lm.code_digest`), so how
the model is read (prompts, sampling, batching) lives here and can change without retraining it.

Every ask's prompt is the v3 solver's chat (`v3_solver.solver_messages`: the question and the shown
cards as notes, as the v1/v2 solver reads them); its samples come from one `generate` call for all
asks (`answers`), each ask's own seed drawn from its rng, so the arms' common random numbers hold (a
stage's rng is seeded by (build, reader, problem, stage): `v3_arms.Solver`). Answers are extracted
with `kace.answers.extract_answer` (None when a sample has none: it votes for nothing). Sampling is
the v1/v2 testbed runs' (`configs/kace.py`, testbed presets): temperature 0.7, top-p 1, top-k 0;
`max_tokens` 24 covers the longest v3 completion ("=totaltimesnine: 270 * 9 -> \\boxed{2430}", 19
tokens with a tokenizer trained on a few hundred examples) and its end token. Labelled `LABEL`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from kace import answers as answers_lib
from kace import readers, testbed_v3, v3_arms, v3_solver
from lm import generators

LABEL = "trained v3 solver (tiny model)"
PARAMS = generators.GenerationParams(max_tokens=24, temperature=0.7, top_p=1.0, top_k=0)
SAMPLER = dict(min_prompt_bucket=64, step_bucket=8, max_rows=512)


class ModelReader:
  """A trained v3 solver read as a `kace.readers` reader.

  Attributes:
    name: the reader's name (it seeds the arms' samples, with the build, problem and stage).
    path: the model's checkpoint directory (`v3_solver.ensure_v3_solver`).
    params: sampling (`PARAMS`); each ask's seed replaces `params.seed`.
    generator: the `lm.generators.JaxGenerator` over the checkpoint.
  """

  label = LABEL

  def __init__(self, path: str, name: str = "v3_solver", params: generators.GenerationParams = PARAMS):
    self.name, self.path, self.params = name, path, params
    config = generators.GeneratorConfig(checkpoint=path, dtype="float32", sampler=SAMPLER)
    self.generator = generators.load_jax_generator(config)

  @classmethod
  def build(cls, cache_dir: str, config: v3_solver.V3SolverConfig, **kwargs) -> ModelReader:
    """The reader of `config`'s solver, trained first (into `cache_dir`) when not cached."""
    return cls(v3_solver.ensure_v3_solver(cache_dir, config), **kwargs)

  def answers(self, asks: Sequence[readers.Ask]) -> list[list[str | None]]:
    """Each ask's `n` samples' answers, every ask in one `generate` call; each ask's seed is the
    next 32 bits of its rng (asks that share one rng draw from it in order)."""
    if not asks:
      return []
    prompts = [v3_solver.solver_messages(a.problem.problem.question, a.shown) for a in asks]
    params = [dataclasses.replace(self.params, seed=a.rng.getrandbits(32)) for a in asks]
    out = self.generator.generate(prompts, n=[a.n for a in asks], params=params)
    return [[answers_lib.extract_answer(g.text, g.finish_reason) for g in gens] for gens in out]

  def answer(self, problem: testbed_v3.Problem, shown: readers.Shown, rng: random.Random) -> str | None:
    """One sample's answer (a generate call of its own: use `answers` for many)."""
    return self.answers([readers.Ask(problem, shown, 1, rng)])[0][0]


def calibration_gates(reader, builds: Sequence[int] = range(10)) -> list[dict]:
  """`v3_arms.gates` of `reader` on the calibration split of each build in `builds` (never the test
  split): one row per build, {"build", "rates", "passed", "all_passed"}."""
  rows = []
  for b in builds:
    solver = v3_arms.Solver(reader, b, v3_arms.Budget())
    rows.append({"build": b, **v3_arms.gates(solver, testbed_v3.WorldConfig(seed=b))})
  return rows
