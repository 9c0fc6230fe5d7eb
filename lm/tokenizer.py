"""Hugging Face tokenizers from a local directory, with chat templates and Qwen3's thinking switch.

`load_tokenizer(path)` reads `tokenizer.json` / `tokenizer_config.json` (and the chat template
stored there or in `chat_template.jinja`) through `transformers.AutoTokenizer` with
`local_files_only=True`, so nothing is ever fetched from the hub. The `Tokenizer` wrapper gives
the rest of the project one small surface: ids in, text out, the ids that end a generation, and
chat prompts.

Chat templates: Qwen3's template has an `enable_thinking` switch (False puts an empty
`<think>\\n\\n</think>\\n\\n` block after the assistant prompt, so the model answers without
reasoning); Qwen2.5's has none. `enable_thinking` is handed to the template only when the
template mentions it, so one config value works for both families. A tokenizer with no template
gets `CHATML_TEMPLATE`, the plain ChatML layout that Qwen models are trained on.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import tokenizers
import transformers
from tokenizers import decoders, models, pre_tokenizers, trainers

from lm import rundir

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": ...}

# The fallback for tokenizers without a chat template: minimal ChatML, one
# `<|im_start|>{role}\n{content}<|im_end|>\n` block per message and, for a generation prompt,
# `<|im_start|>assistant\n`. No system prompt is added and no thinking is handled.
CHATML_TEMPLATE = (
  "{%- for message in messages %}"
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
  "{%- endfor %}"
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """A loaded HF tokenizer plus the generation ids read from its directory.

  Attributes:
    hf: the `transformers` tokenizer (for anything this wrapper does not cover).
    eos_ids: every id that ends a generation: the tokenizer's eos token and the
      `eos_token_id`(s) of generation_config.json when the directory has one (Qwen lists both
      `<|im_end|>` and `<|endoftext|>` there). The tokenizer's own eos comes first.
    pad_id: the pad token's id, or `eos_ids[0]` when the tokenizer defines no pad token.
    chat_template: the Jinja template in use (the tokenizer's, or `CHATML_TEMPLATE`).
  """

  hf: Any
  eos_ids: tuple[int, ...]
  pad_id: int
  chat_template: str

  @property
  def vocab_size(self) -> int:
    """Ids are in [0, vocab_size): the base vocabulary plus added and special tokens."""
    return len(self.hf)

  @property
  def has_thinking_switch(self) -> bool:
    return "enable_thinking" in self.chat_template

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`; special tokens written in it (`<|im_end|>`) become their ids.

    No BOS/EOS is added: prompts come from chat templates, which already hold every marker.
    """
    return list(self.hf.encode(text, add_special_tokens=False))

  def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
    return self.hf.decode(
      list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
    )

  def apply_chat_template(
    self,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
  ) -> str:
    """The prompt text for a conversation.

    Args:
      messages: the conversation, oldest first.
      add_generation_prompt: end with the assistant's turn header so the model replies.
      enable_thinking: Qwen3's switch; None leaves the template's default (thinking on for
        Qwen3). Ignored when the template has no such switch (Qwen2.5, the ChatML fallback).
    """
    kwargs = {}
    if enable_thinking is not None and self.has_thinking_switch:
      kwargs["enable_thinking"] = enable_thinking
    return self.hf.apply_chat_template(
      [dict(m) for m in messages],
      chat_template=self.chat_template,
      add_generation_prompt=add_generation_prompt,
      tokenize=False,
      **kwargs,
    )

  def encode_chat(
    self,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
  ) -> list[int]:
    """Token ids of `apply_chat_template(...)`."""
    text = self.apply_chat_template(
      messages, add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking
    )
    return self.encode(text)


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
  """Loads the tokenizer saved in the local directory `path` (never from the hub)."""
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"tokenizer directory {path} does not exist")
  try:
    hf = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
  except (OSError, ValueError) as e:
    raise FileNotFoundError(f"no loadable tokenizer in {path} ({sorted(os.listdir(path))}): {e}") from e
  eos_ids = [] if hf.eos_token_id is None else [hf.eos_token_id]
  eos_ids += [i for i in _generation_eos_ids(path) if i not in eos_ids]
  if not eos_ids:
    raise ValueError(f"tokenizer in {path} defines no eos token and no generation_config.json eos_token_id")
  pad_id = hf.pad_token_id if hf.pad_token_id is not None else eos_ids[0]
  try:
    template = hf.get_chat_template()  # the default one where a tokenizer names several
  except ValueError:  # the tokenizer has no chat template
    template = CHATML_TEMPLATE
  return Tokenizer(hf=hf, eos_ids=tuple(eos_ids), pad_id=pad_id, chat_template=template)


def _generation_eos_ids(path: str) -> list[int]:
  file = os.path.join(path, "generation_config.json")
  if not os.path.exists(file):
    return []
  with open(file, encoding="utf-8") as f:
    eos = json.load(f).get("eos_token_id")
  if eos is None:
    return []
  return [eos] if isinstance(eos, int) else list(eos)


# Ids 0, 1, 2 in this order, as `ModelConfig.tiny_qwen3()` declares pad 0 and eos 1.
QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|im_start|>")


def train_bpe_tokenizer(
  path: str | os.PathLike,
  corpus: Sequence[str],
  *,
  vocab_size: int,
  chat_template: str | None = CHATML_TEMPLATE,
  added_tokens: Sequence[str] = (),
  split_digits: bool = False,
  model_max_length: int = 4096,
) -> str:
  """Trains a small byte-level BPE tokenizer (Qwen's kind) and writes it as an HF tokenizer dir.

  For the project's own tiny models (tests, CPU-scale defaults): the 256 byte symbols are always
  in the vocabulary, so every string encodes and decodes back exactly; special tokens are Qwen's
  `<|endoftext|>` (pad, id 0), `<|im_end|>` (eos, id 1) and `<|im_start|>` (id 2); merges are
  learnt from `corpus` up to `vocab_size` ids in all (added tokens included).

  Args:
    path: output directory (created); an existing `generation_config.json` is kept.
    corpus: training texts.
    vocab_size: largest vocabulary (ids < vocab_size).
    chat_template: stored in tokenizer_config.json (None stores none).
    added_tokens: ordinary tokens appended after training (e.g. `<think>`).
    split_digits: one token per digit, as Qwen's pre-tokenizer does.
    model_max_length: recorded in tokenizer_config.json.

  Returns:
    `path` as a string, ready for `load_tokenizer`.
  """
  path = os.fspath(path)
  os.makedirs(path, exist_ok=True)
  tok = tokenizers.Tokenizer(models.BPE())
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.pre_tokenizer = (
    pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if split_digits
    else byte_level
  )
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size - len(added_tokens),
    special_tokens=list(QWEN_SPECIAL_TOKENS),
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(list(corpus), trainer=trainer)
  if added_tokens:
    tok.add_tokens(list(added_tokens))
  rundir.atomic_write_text(os.path.join(path, "tokenizer.json"), tok.to_str())
  config = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "bos_token": None,
    "unk_token": None,
    "clean_up_tokenization_spaces": False,
    "model_max_length": model_max_length,
  }
  if chat_template is not None:
    config["chat_template"] = chat_template
  rundir.write_json(os.path.join(path, "tokenizer_config.json"), config)
  generation_config = os.path.join(path, "generation_config.json")
  if not os.path.exists(generation_config):  # a model's own (from `lm.save_hf`) is kept
    # Qwen checkpoints end chat turns with <|im_end|> and raw text with <|endoftext|>.
    rundir.write_json(generation_config, {"eos_token_id": [tok.token_to_id("<|im_end|>"), 0]})
  return path
