"""lm.tokenizer on tiny tokenizers built in tmp dirs: round trips, chat templates, eos / pad ids."""

import json
import os
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lm import tokenizer as tokenizer_lib
from tests.lm.tokenizer_helpers import make_tiny_tokenizer

MESSAGES = [
  {"role": "system", "content": "Put the final answer in \\boxed{}."},
  {"role": "user", "content": "What is 2 + 2?"},
]
CHATML = (
  "<|im_start|>system\nPut the final answer in \\boxed{}.<|im_end|>\n"
  "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
  "<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = make_tiny_tokenizer(tmp_path_factory.mktemp("tok"), vocab_words=("Paris", "seventeen"))
  return tokenizer_lib.load_tokenizer(path)


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_decode_inverts_encode(tok, text):
  ids = tok.encode(text)
  assert all(0 <= i < tok.vocab_size for i in ids)
  assert tok.decode(ids) == text


def test_everything_a_tiny_model_writes_is_encodable(tok):
  text = string.printable + " \\boxed{-3/4} x^2 = 0.5, {a} (b) [c]  twin  spaces \u00e9\u4e2d"
  assert tok.decode(tok.encode(text)) == text
  assert tok.vocab_size <= 320
  assert len(tok.encode("Paris")) == 1 and len(tok.encode(" seventeen")) == 1  # vocab_words merged
  assert tok.encode("<|im_end|><think>") == [
    tok.hf.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<think>")
  ]


def test_eos_and_pad_ids(tok):
  assert [tok.decode([i]) for i in tok.eos_ids] == ["<|im_end|>", "<|endoftext|>"]
  assert tok.decode([tok.pad_id]) == "<|endoftext|>"
  assert tok.eos_ids == (1, 0) and tok.pad_id == 0  # what ModelConfig.tiny_qwen3() declares
  assert tok.decode(tok.encode("ok<|im_end|>"), skip_special_tokens=True) == "ok"


def test_eos_ids_follow_generation_config(tmp_path):
  path = make_tiny_tokenizer(tmp_path / "no_gen")
  os.remove(os.path.join(path, "generation_config.json"))
  assert tokenizer_lib.load_tokenizer(path).eos_ids == (1,)
  os.makedirs(tmp_path / "model")
  with open(tmp_path / "model" / "generation_config.json", "w") as f:
    json.dump({"eos_token_id": 0}, f)  # a model saved there first keeps its own
  assert tokenizer_lib.load_tokenizer(make_tiny_tokenizer(tmp_path / "model")).eos_ids == (1, 0)


def test_chat_template_thinking_switch(tok):
  assert tok.has_thinking_switch
  assert tok.apply_chat_template(MESSAGES) == CHATML
  assert tok.apply_chat_template(MESSAGES, enable_thinking=True) == CHATML
  assert tok.apply_chat_template(MESSAGES, enable_thinking=False) == CHATML + "<think>\n\n</think>\n\n"
  assert tok.apply_chat_template(MESSAGES, add_generation_prompt=False) == CHATML.removesuffix(
    "<|im_start|>assistant\n"
  )
  ids = tok.encode_chat(MESSAGES, enable_thinking=False)
  assert ids == tok.encode(CHATML + "<think>\n\n</think>\n\n")
  assert ids[:1] == tok.encode("<|im_start|>") and tok.encode("</think>") == ids[-3:-2]


def test_chatml_fallback_without_template(tmp_path):
  tok = tokenizer_lib.load_tokenizer(make_tiny_tokenizer(tmp_path, chat_template=None))
  assert tok.chat_template == tokenizer_lib.CHATML_TEMPLATE
  assert not tok.has_thinking_switch
  # enable_thinking is ignored where the template has no such switch (as for Qwen2.5).
  assert tok.apply_chat_template(MESSAGES, enable_thinking=False) == CHATML
  assert tok.encode_chat(MESSAGES) == tok.encode(CHATML)


def test_missing_tokenizer_names_the_directory(tmp_path):
  with pytest.raises(FileNotFoundError, match="nowhere"):
    tokenizer_lib.load_tokenizer(tmp_path / "nowhere")
  os.makedirs(tmp_path / "empty")
  with pytest.raises(FileNotFoundError, match="no loadable tokenizer in .*empty"):
    tokenizer_lib.load_tokenizer(tmp_path / "empty")
