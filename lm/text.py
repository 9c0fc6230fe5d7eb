"""What every role does with a model's reply text: strip reasoning, find JSON, build a chat.

One rule for each, shared by KACE (solver, teacher, curator, classifier) and DPA-GRPO (generator,
verifier), so a reply is read the same way wherever it goes.
"""

from __future__ import annotations

import json
import re
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def after_think(text: str) -> str:
  """The reply's final part: the text after the last `</think>`.

  A reply that opens `<think>` and never closes it was cut off mid-reasoning and has no final part
  (""): a draft number from unfinished reasoning must not count as an answer. A reply with no
  think tags is all final part. (Qwen3's chat template opens `<think>` in the prompt, so a thinking
  reply may hold only the closing tag.)
  """
  if not isinstance(text, str):
    return ""
  if THINK_CLOSE in text:
    return text.rsplit(THINK_CLOSE, 1)[1]
  return "" if THINK_OPEN in text else text


def json_objects(text: str) -> list[dict[str, Any]]:
  """Every top-level JSON object embedded in `text` (e.g. inside a ```json fence), in order."""
  decoder, found, i = json.JSONDecoder(), [], text.find("{")
  while i != -1:
    try:
      obj, end = decoder.raw_decode(text, i)
    except (json.JSONDecodeError, RecursionError):
      i = text.find("{", i + 1)
      continue
    if isinstance(obj, dict):
      found.append(obj)
    i = text.find("{", end)
  return found


def json_object(reply: str) -> dict[str, Any] | None:
  """The JSON object a role was asked for: the first one in the reply's final part, read inside a
  ``` fence when there is one; None when there is none."""
  text = after_think(reply)
  fenced = _FENCE.search(text)
  found = json_objects(fenced.group(1) if fenced else text)
  return found[0] if found else None


def user_chat(content: str) -> list[dict[str, str]]:
  """A chat of one user message: how every role of both papers is prompted."""
  return [{"role": "user", "content": content}]
