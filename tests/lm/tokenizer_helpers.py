"""A tiny Qwen-style tokenizer directory built locally with `tokenizers` (no hub), for tests.

The tokenizer is byte-level BPE like Qwen's: the 256 byte symbols are always in the vocabulary,
so every string (digits, letters, punctuation, `\\boxed{...}`, spaces, newlines, any UTF-8) is
encodable and decodes back exactly; a few merges learnt from a small corpus (plus `vocab_words`)
keep common words short. Special tokens are Qwen's `<|endoftext|>` (pad), `<|im_start|>` and
`<|im_end|>` (eos), with `<think>` / `</think>` as ordinary added tokens. The whole vocabulary
fits in `vocab_size` ids, so a tiny model built with `ModelConfig.tiny_qwen3(vocab_size=...)` of
at least that size can emit every token.
"""

import os

from lm.tokenizer import QWEN_SPECIAL_TOKENS as SPECIAL_TOKENS
from lm.tokenizer import train_bpe_tokenizer

THINK_TOKENS = ("<think>", "</think>")

# Modelled on Qwen3's template: a leading system turn, reasoning stripped from earlier assistant
# turns, and an empty think block in the generation prompt when enable_thinking is false.
QWEN3_LIKE_CHAT_TEMPLATE = (
  "{%- for message in messages %}"
  "{%- if message.role == 'assistant' %}"
  "{%- set content = message.content %}"
  "{%- if '</think>' in content %}"
  "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
  "{%- endif %}"
  "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
  "{%- else %}"
  "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
  "{%- endif %}"
  "{%- endfor %}"
  "{%- if add_generation_prompt %}"
  "{{- '<|im_start|>assistant\\n' }}"
  "{%- if enable_thinking is defined and enable_thinking is false %}"
  "{{- '<think>\\n\\n</think>\\n\\n' }}"
  "{%- endif %}"
  "{%- endif %}"
)

_CORPUS = (
  "The answer is \\boxed{42}. Let x = 3 and y = 4, so x + y = 7.",
  "Solve for n: 2n + 5 = 17, hence n = 6. The final answer is \\boxed{6}.",
  "Compute the sum of the digits 0 1 2 3 4 5 6 7 8 9; it is 45.",
  "A tax return lists wages, deductions and the total tax owed.",
  "Claim: the form is correct. Argument: every line adds up. Evidence: line 11 equals 9 + 2.",
  "What is the probability that a fair coin lands heads twice? It is 1/4.",
)


def make_tiny_tokenizer(
  path: str | os.PathLike,
  vocab_words: tuple[str, ...] | list[str] = (),
  *,
  vocab_size: int = 320,
  chat_template: str | None = QWEN3_LIKE_CHAT_TEMPLATE,
) -> str:
  """Writes tokenizer.json, tokenizer_config.json and generation_config.json under `path`.

  Args:
    path: directory to create (it may already hold a model saved by `lm.save_hf`, whose
      generation_config.json is then kept).
    vocab_words: words to learn merges for (repeated in the training corpus), e.g. the answers a
      test expects a tiny model to emit in few tokens.
    vocab_size: upper bound on every id (256 bytes + special/added tokens + merges); at most 512.
    chat_template: the Jinja template stored in tokenizer_config.json; None stores none (to
      exercise the ChatML fallback of `lm.tokenizer`).

  Returns:
    `path` as a string, ready for `lm.tokenizer.load_tokenizer`.
  """
  if not 256 + len(SPECIAL_TOKENS) + len(THINK_TOKENS) <= vocab_size <= 512:
    raise ValueError(f"vocab_size must be in [{256 + len(SPECIAL_TOKENS) + len(THINK_TOKENS)}, 512]")
  return train_bpe_tokenizer(
    path,
    list(_CORPUS) + [" ".join(vocab_words)] * 8,
    vocab_size=vocab_size,
    chat_template=chat_template,
    added_tokens=THINK_TOKENS,
  )
