"""Test doubles for learning: scripted generators (a teacher that returns this JSON, a solver that is
right exactly when a given card is in its prompt, a solver whose answers are a table of (problem,
stage, cards in the prompt)) and a tiny random BERT in MiniLM's file layout. Every role here is
scripted, not a model: numbers measured with them show the learning rules, not a model's gains."""

import itertools
import json
import os

import numpy as np
import tokenizers
from safetensors.numpy import save_file
from tokenizers import models, normalizers, pre_tokenizers, processors

from kace import solve
from lm import generators, seeding


def _text(prompt) -> str:
  return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)


class Scripted:
  """A `TextGenerator` whose every sample for a prompt is `reply(prompt_text, attempt)`; `attempt`
  counts earlier calls with the same text, so a script can answer badly first and well on a retry."""

  def __init__(self, reply):
    self.reply, self.prompts = reply, []

  def generate(self, prompts, n=1, params=None):
    out = []
    for p, count in zip(prompts, generators.per_prompt(n, len(prompts), "n"), strict=True):
      text = _text(p)
      attempt = self.prompts.count(text)
      self.prompts.append(text)
      replies = [self.reply(text, attempt) for _ in range(count)]
      out.append([generators.Generation(r, None, None, "stop", len(text) // 4, len(r) // 4) for r in replies])
    return out


def oracle_solver(problems, key: str, poison: str = "") -> Scripted:
  """Right (`\\boxed{gold}`) exactly when `key` is in the prompt and `poison` is not, and never on
  level-4 problems; a wrong reply is a new negative number each time, so wrong samples never agree."""
  by_question = {p.question: p for p in problems}
  wrong = itertools.count(1)

  def reply(text, attempt):
    p = by_question[text.rsplit("Problem: ", 1)[-1].strip()]
    right = key in text and not (poison and poison in text) and p.level != 4
    return f"\\boxed{{{p.answer if right else -next(wrong)}}}"

  return Scripted(reply)


class StageSolver:
  """A scripted solver: the `n` answers it gives a problem are `rule(problem, stage, notes)`, where
  the stage is recovered from the sampling seed (`lm.seeding.derive_seed(seed, problem id, stage)`,
  as `kace.solve` derives it) and `notes` is the prompt's text before the question (the cards).
  Replies depend on nothing else, so a re-solve with the same tree gives the same answers."""

  def __init__(self, problems, rule, seed: int = 0):
    self.by_question = {p.question: p for p in problems}
    self.rule, self.seed, self.calls = rule, seed, 0

  def generate(self, prompts, n=1, params=None):
    self.calls += 1
    out = []
    counts = generators.per_prompt(n, len(prompts), "n")
    per = generators.per_prompt(params, len(prompts), "params")
    for prompt, count, par in zip(prompts, counts, per, strict=True):
      text = _text(prompt)
      notes, question = text.rsplit("Problem: ", 1)
      p = self.by_question[question.strip()]
      stage = {seeding.derive_seed(self.seed, p.id, s): s for s in solve.STAGE_ORDER}[par.seed]
      answers = list(self.rule(p, stage, notes))
      assert len(answers) == count, (p.id, stage, answers, count)
      out.append([generators.Generation(f"\\boxed{{{a}}}", None, None, "stop", 10, 5) for a in answers])
    return out


WORDS = [
  "[PAD]",
  "[UNK]",
  "[CLS]",
  "[SEP]",
  "[MASK]",
  *"abcdefghijklmnopqrstuvwxyz0123456789",
  "the",
  "sum",
  "of",
]


def tiny_bert(path: str, seed: int = 0) -> str:
  """A random 2-layer, 32-wide BERT with a WordPiece tokenizer, saved like all-MiniLM-L6-v2."""
  os.makedirs(path, exist_ok=True)
  vocab = {w: i for i, w in enumerate(WORDS)}
  vocab.update({f"##{c}": len(vocab) + i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz0123456789")})
  tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.post_processor = processors.TemplateProcessing(
    single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
  )
  tok.save(os.path.join(path, "tokenizer.json"))
  d, inner, layers = 32, 64, 2
  config = dict(
    architectures=["BertModel"], model_type="bert", vocab_size=len(vocab), hidden_size=d,
    num_hidden_layers=layers,
    num_attention_heads=4, intermediate_size=inner, max_position_embeddings=128, type_vocab_size=2,
    layer_norm_eps=1e-12, hidden_act="gelu", pad_token_id=0, hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
  )  # fmt: skip
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  rng = np.random.default_rng(seed)
  w = lambda *shape: rng.normal(0, 0.2, shape).astype(np.float32)
  weights = {
    "embeddings.word_embeddings.weight": w(len(vocab), d),
    "embeddings.position_embeddings.weight": w(128, d),
    "embeddings.token_type_embeddings.weight": w(2, d),
    "embeddings.LayerNorm.weight": 1 + w(d),
    "embeddings.LayerNorm.bias": w(d),
  }
  shapes = {
    "attention.self.query": (d, d), "attention.self.key": (d, d), "attention.self.value": (d, d),
    "attention.output.dense": (d, d), "intermediate.dense": (inner, d), "output.dense": (d, inner),
  }  # fmt: skip
  for i in range(layers):
    for name, shape in shapes.items():
      weights[f"encoder.layer.{i}.{name}.weight"] = w(*shape)
      weights[f"encoder.layer.{i}.{name}.bias"] = w(shape[0])
    for name in ("attention.output.LayerNorm", "output.LayerNorm"):
      weights[f"encoder.layer.{i}.{name}.weight"] = 1 + w(d)
      weights[f"encoder.layer.{i}.{name}.bias"] = w(d)
  save_file(weights, os.path.join(path, "model.safetensors"))
  return path
