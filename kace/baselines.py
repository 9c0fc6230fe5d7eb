"""The learned-context baselines and the retrieval ablations, over the same roles, solver and grader.

- ACE playbook: a generator (the solver) answers training problems reading the whole playbook; a
  reflector (the teacher role) reflects on each answer against the gold and tags the bullets it
  read helpful / harmful / neutral; a curator turns the reflections into delta ADD operations that
  are merged into the playbook incrementally. The playbook is one monolithic block of an
  `EpistemicTree` (`tiers=domains=(ANY,)`), so it carries the same helpful/harmful counters,
  history and audit view as a KACE tree.
- GEPA: the real `gepa` library evolves the solver's instruction through `SolverAdapter` (our
  generator and grader behind GEPA's `evaluate` / `make_reflective_dataset`), with the teacher role
  as GEPA's reflection LM.
- Retrieval ablations: `RouterContext` (an LLM picks cards from the whole store) and
  `EmbeddingContext` (the top-k cards by MiniLM similarity to the problem), both reading every live
  card of a learned tree regardless of its block.
Malformed reflector, curator and router replies are parsed against a schema, retried and then
skipped (kace.learn.ask), never raised.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tqdm

from kace import answers, cards, data, embed, learn, projection, solve, tiers
from lm import generators, rundir, seeding
from lm import text as text_lib

# ---- ACE ----------------------------------------------------------------------------------------

REFLECTOR_TEMPLATE = """You review a maths solver's answer. It read this playbook:
{playbook}

Problem: {question}
Solver's answer: {answer} ({verdict}; correct answer: {gold})
Solver's response:
{response}

Say what went right or wrong and what general lesson follows, and tag each playbook bullet it read.
Reply with JSON only: {{"reflection": "...", "bullet_tags": [{{"id": "card-0001", "tag": "helpful"}}]}} \
(tags: helpful, harmful, neutral)."""

ACE_CURATOR_TEMPLATE = """You maintain a playbook of short, general strategies for a maths solver.
Current playbook:
{playbook}

Reflections on recent answers:
{reflections}

Add only new, non-redundant bullets (at most {max_cards}).
Reply with JSON only: {{"operations": [{{"op": "add", "type": "strategy", "text": "..."}}]}}"""

TAGS = ("helpful", "harmful", "neutral")


def parse_reflection(reply: str) -> tuple[str, tuple[tuple[str, str], ...]]:
  """(reflection text, ((card id, tag), ...)) from a reflector reply."""
  obj = learn.json_object(reply)
  text = learn.string_field(obj, "reflection", "reply", 2000)
  tags = obj.get("bullet_tags", [])
  if not isinstance(tags, list):
    raise learn.ReplyError("bullet_tags: expected a list")
  pairs = []
  for i, t in enumerate(tags):
    if not isinstance(t, dict) or not isinstance(t.get("id"), str) or t.get("tag") not in TAGS:
      raise learn.ReplyError(f"bullet_tags[{i}]: expected {{'id': str, 'tag': one of {TAGS}}}")
    pairs.append((t["id"], t["tag"]))
  return text, tuple(pairs)


def parse_delta(reply: str, max_cards: int, max_chars: int) -> tuple[tuple[str, str], ...]:
  """(type, text) of the ADD operations of an ACE curator reply."""
  items = learn.json_object(reply).get("operations")
  if not isinstance(items, list):
    raise learn.ReplyError("operations: expected a list")
  out = []
  for i, item in enumerate(items[:max_cards]):
    if not isinstance(item, dict) or item.get("op") != "add":
      raise learn.ReplyError(f"operations[{i}].op: expected 'add'")
    card_type = item.get("type") if isinstance(item.get("type"), str) and item["type"].strip() else "strategy"
    out.append((card_type, learn.string_field(item, "text", f"operations[{i}]", max_chars)))
  return tuple(out)


def _playbook_text(tree: cards.EpistemicTree) -> str:
  return "\n".join(f"[{c.id}] {c.text}" for c in tree.cards) or "(empty)"


def ace_step(
  learner: learn.Learner, tree, batch: Sequence[data.Problem], domains
) -> tuple[cards.EpistemicTree, dict]:
  """One ACE step on a batch: generate (one sample each, whole playbook), reflect, tag, curate."""
  schedule = tiers.Schedule(tiers=(), pool_size=1, pool_reuse=False, pool_reads=cards.ANY)
  solutions = solve.solve(
    batch,
    domains,
    generator=learner.solver,
    grader=learner.grader,
    schedule=schedule,
    params=learner.params,
    context=projection.TreeContext(tree),
    template=learner.template,
    seed=learner.seed,
  )
  cfg, playbook = learner.config, _playbook_text(tree)
  prompts = []
  for p, s in zip(batch, solutions, strict=True):
    sample = s.stages[-1].samples[-1]
    prompts.append(
      REFLECTOR_TEMPLATE.format(
        playbook=playbook,
        question=p.question,
        answer=s.answer,
        verdict="correct" if s.correct else "wrong",
        gold=p.answer,
        response=learn.excerpt(sample.text, cfg.attempt_tokens),
      )
    )
  reflected = learn.ask(
    learner.teacher, prompts, parse_reflection, learner.role_params, retries=cfg.retries, seed=learner.seed
  )
  live = {c.id for c in tree.cards}
  for a in reflected:
    for card_id, tag in a.value[1] if a.value else ():
      if card_id in live:
        tree = tree.count(card_id, uses=1, helpful=int(tag == "helpful"), harmful=int(tag == "harmful"))
  reflections = "\n".join(f"- {a.value[0]}" for a in reflected if a.value) or "(none)"
  (delta,) = learn.ask(
    learner.curator,
    [
      ACE_CURATOR_TEMPLATE.format(
        playbook=_playbook_text(tree), reflections=reflections, max_cards=cfg.max_cards
      )
    ],
    lambda r: parse_delta(r, cfg.max_cards, cfg.max_card_chars),
    learner.role_params,
    retries=cfg.retries,
    seed=learner.seed,
  )
  provenance = cards.Provenance(tuple(p.id for p in batch), (), "ace:curator")
  added, rejected = [], []
  for card_type, text in delta.value or ():
    try:
      tree, card = tree.add(text, card_type, cards.ANY, cards.ANY, provenance, reason="ACE delta")
      added.append(card.id)
    except ValueError as e:
      rejected.append((text, str(e)))
  log = {
    "accuracy": float(np.mean([s.correct for s in solutions])),
    "added": added,
    "rejected": rejected,
    "reflector_errors": [e for a in reflected for e in a.errors],
    "curator_replies": delta.replies,
    "curator_errors": delta.errors,
  }
  return tree, log


def build_playbook(learner, problems, domains, workdir, *, epochs: int, batch_size: int, budget_tokens: int):
  """ACE over `epochs` passes of the training split in batches; resumable per batch like learn.build."""
  state_path = os.path.join(workdir, learn.STATE)
  if os.path.exists(state_path):
    state = rundir.read_json(state_path)
    tree = cards.EpistemicTree.from_json(state["tree"], where=state_path)
  else:
    state = {"steps_done": 0}
    tree = cards.EpistemicTree(tiers=(cards.ANY,), domains=(cards.ANY,), budget_tokens=budget_tokens)
  steps = [problems[i : i + batch_size] for _ in range(epochs) for i in range(0, len(problems), batch_size)]
  for step in tqdm.tqdm(range(state["steps_done"], len(steps)), desc="ace: steps", unit="batch"):
    tree, log = ace_step(learner, tree, steps[step], domains)
    state["steps_done"] = step + 1
    rundir.append_jsonl(os.path.join(workdir, learn.LOG), [{"phase": "ace", "step": step, **log}])
    rundir.write_json(state_path, {**state, "tree": tree.to_json()})
  tree.save(os.path.join(workdir, learn.TREE))
  tree.save_markdown(os.path.join(workdir, learn.AUDIT))
  return tree


# ---- GEPA -----------------------------------------------------------------------------------------

SEED_INSTRUCTION = "Solve the following math problem. Put the final answer in \\boxed{}."


def instruction_template(instruction: str) -> str:
  """A solver template (kace.projection placeholders) from a free-text instruction."""
  escaped = instruction.replace("{", "{{").replace("}", "}}")
  return escaped + "\n{notes}\nProblem: {question}"


class SolverAdapter:
  """GEPA's adapter over our solver and grader; the candidate is {"instruction": text}.

  `evaluate` draws one sample per problem with the candidate's instruction (one batched generator
  call) and scores 1 for a right answer; the trajectories keep question, response, answer and
  gold, which `make_reflective_dataset` turns into GEPA's Inputs / Generated Outputs / Feedback.
  """

  propose_new_texts = None  # GEPA's default reflective proposal, through the reflection LM

  def __init__(self, generator, grader: answers.Grader, params: generators.GenerationParams, seed: int = 0):
    self.generator, self.grader, self.params, self.seed = generator, grader, params, seed

  def evaluate(
    self, batch: Sequence[data.Problem], candidate: Mapping[str, str], capture_traces: bool = False
  ):
    from gepa import EvaluationBatch

    template = instruction_template(candidate["instruction"])
    prompts = [solve.chat(p.question, "", template) for p in batch]
    per = [dataclasses.replace(self.params, seed=seeding.derive_seed(self.seed, p.id, "gepa")) for p in batch]
    replies = [g[0] for g in self.generator.generate(prompts, n=1, params=per)]
    texts = [g.text for g in replies]
    extracted = [self.grader.extract(g.text, g.finish_reason) for g in replies]
    verdicts = self.grader.grade_many([(p.answer, a) for p, a in zip(batch, extracted, strict=True)])
    scores = [float(v.correct) for v in verdicts]
    traces = None
    if capture_traces:
      traces = [
        {"question": p.question, "response": t, "answer": a, "gold": p.answer, "correct": bool(s)}
        for p, t, a, s in zip(batch, texts, extracted, scores, strict=True)
      ]
    return EvaluationBatch(outputs=texts, scores=scores, trajectories=traces)

  def make_reflective_dataset(self, candidate, eval_batch, components_to_update):
    rows = [
      {
        "Inputs": t["question"],
        "Generated Outputs": t["response"][-1500:],
        "Feedback": (
          "Correct" if t["correct"] else f"Wrong: answered {t['answer']}, the correct answer is {t['gold']}"
        )
        + ".",
      }
      for t in eval_batch.trajectories or ()
    ]
    return {name: rows for name in components_to_update}


def role_lm(generator: generators.TextGenerator, params: generators.GenerationParams):
  """A generator role as GEPA's `LanguageModel`: prompt (text or chat) -> reply text."""

  def call(prompt: str | list[dict[str, Any]]) -> str:
    chat = text_lib.user_chat(prompt) if isinstance(prompt, str) else prompt
    return generator.generate([chat], n=1, params=params)[0][0].text

  return call


def optimize_instruction(learner: learn.Learner, train, val, workdir: str, *, max_metric_calls: int) -> str:
  """The best instruction GEPA finds (`gepa.optimize`, run directory `workdir/gepa` for resuming);
  writes `prompt.json` with it and the solver template built from it."""
  import gepa

  result = gepa.optimize(
    seed_candidate={"instruction": SEED_INSTRUCTION},
    trainset=list(train),
    valset=list(val),
    adapter=SolverAdapter(learner.solver, learner.grader, learner.params, learner.seed),
    reflection_lm=role_lm(learner.teacher, learner.role_params),
    max_metric_calls=max_metric_calls,
    run_dir=os.path.join(workdir, "gepa"),
    seed=learner.seed,
    raise_on_exception=False,
  )
  best = result.best_candidate
  instruction = best["instruction"] if isinstance(best, dict) else str(best)
  rundir.write_json(
    os.path.join(workdir, "prompt.json"),
    {
      "instruction": instruction,
      "template": instruction_template(instruction),
      "val_scores": result.val_aggregate_scores,
    },
  )
  return instruction


# ---- retrieval ablations ----------------------------------------------------------------------------

ROUTER_TEMPLATE = """Pick the notes most useful for solving this maths problem (at most {k}).

Problem: {question}

Notes:
{notes}

Reply with JSON only: {{"ids": ["card-0001", ...]}} (an empty list if none helps)."""


def parse_router(reply: str, known: Sequence[str], k: int) -> tuple[str, ...]:
  """The card ids a router reply picks (known ids only, at most k, in its order)."""
  ids = learn.json_object(reply).get("ids")
  if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
    raise learn.ReplyError("ids: expected a list of card ids")
  return tuple(dict.fromkeys(i for i in ids if i in set(known)))[:k]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RouterContext:
  """`llm_router`: a router LLM picks up to `k` cards from every live card of `tree`, once per
  problem (reused at every stage); an unusable reply after retries gives no cards."""

  tree: cards.EpistemicTree
  router: generators.TextGenerator
  k: int
  params: generators.GenerationParams
  retries: int = 2
  picks: dict = dataclasses.field(default_factory=dict, compare=False)  # problem id -> card ids

  def project(self, problems, domains, tier) -> list[projection.Projection]:
    store = self.tree.cards
    known = [c.id for c in store]
    todo = [p for p in problems if p.id not in self.picks]
    if todo and store:
      listing = "\n".join(f"[{c.id}] {c.text}" for c in store)
      prompts = [ROUTER_TEMPLATE.format(k=self.k, question=p.question, notes=listing) for p in todo]
      parse = lambda r: parse_router(r, known, self.k)
      for p, a in zip(
        todo, learn.ask(self.router, prompts, parse, self.params, retries=self.retries, seed=0), strict=True
      ):
        self.picks[p.id] = a.value or ()
    return [_rendered(self.tree, [self.tree.card(i) for i in self.picks.get(p.id, ())]) for p in problems]


@dataclasses.dataclass(frozen=True)
class EmbeddingContext:
  """`embedding_retrieval`: the `k` live cards of `tree` most similar to the problem (MiniLM)."""

  tree: cards.EpistemicTree
  embedder: embed.Embedder
  k: int

  def project(self, problems, domains, tier) -> list[projection.Projection]:
    store = self.tree.cards
    if not store:
      return [projection.NO_CARDS] * len(problems)
    chosen = embed.top_k(
      self.embedder.embed([p.question for p in problems]),
      self.embedder.embed([c.text for c in store]),
      self.k,
    )
    return [_rendered(self.tree, [store[i] for i in row]) for row in chosen]


def _rendered(tree: cards.EpistemicTree, chosen: Sequence[cards.Card]) -> projection.Projection:
  kept = cards.fit_cards(chosen, tree.budget_tokens, tree.count_tokens)
  return projection.Projection(kept, "\n".join(cards.render_card(c) for c in kept))


def load_prompt(path: str) -> str:
  """The solver template a GEPA build wrote (`prompt.json`)."""
  return rundir.read_json(path)["template"]
