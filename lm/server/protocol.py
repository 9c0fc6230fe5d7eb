"""What `lm.server` accepts: typed request models whose validators give the 400s, and its errors.

As vLLM's `entrypoints/openai/protocol.py`: each request field is declared once, with its type
(strict: `true` is not an integer, `1` is not a boolean) and its checks, and is validated only
there. The limits a check depends on (`max_tokens`, `max_n`, `max_prompts`, the request budget)
come from the server's `ServerConfig`, passed as pydantic's validation context. A JSON `null` is an
absent field (OpenAI's clients send either). A field the API does not have is a 400 naming it and
the closest field it has (OpenAI answers a misspelt `temprature` so); a field this server cannot
honour (JSON modes, echo, penalties, logit bias, tools, guided decoding, alternatives in log-probs)
is declared and refused by name unless it holds a value that means "not used".

`parse` turns a body into a request or an `ApiError` in OpenAI's error shape, whose message and
`param` name the field (nested as `messages[0].role` or `stream_options.include_usage`).
"""

from __future__ import annotations

import difflib
import json
from typing import Annotated, Any, TypeVar

import pydantic
from pydantic_core import PydanticCustomError

from lm.server.config import ServerConfig


class ApiError(Exception):
  """An error answered to the client in OpenAI's error shape."""

  def __init__(
    self,
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
  ):
    super().__init__(message)
    self.status, self.message, self.param, self.code = status, message, param, code
    self.headers = headers or {}

  def body(self) -> dict[str, Any]:
    return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
  """OpenAI's error object; `type` as OpenAI names it for the status."""
  kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
    status, "invalid_request_error"
  )
  if status >= 500:
    kind = "server_error"
  return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# ---- the body as JSON ---------------------------------------------------------------------------

# Deeper JSON than this is refused before validation (a 100k-deep body must be a 400, not a 500).
MAX_JSON_DEPTH = 32


def parse_json(raw: bytes) -> dict[str, Any]:
  """The body as a JSON object (400 for anything else, or for nesting deeper than MAX_JSON_DEPTH)."""
  try:
    body = json.loads(raw)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ApiError(400, f"request body is not valid JSON: {e}") from None
  except RecursionError:
    raise ApiError(400, f"request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
  if not isinstance(body, dict):
    raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
  if _depth(body) > MAX_JSON_DEPTH:
    raise ApiError(400, f"request body is nested deeper than {MAX_JSON_DEPTH} levels")
  return body


def _depth(value: Any) -> int:
  """Nesting depth of parsed JSON, without recursion (a deep body must not overflow the stack)."""
  deepest, stack = 0, [(value, 1)]
  while stack:
    item, depth = stack.pop()
    deepest = max(deepest, depth)
    if deepest > MAX_JSON_DEPTH:
      return deepest
    children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
    stack.extend((child, depth + 1) for child in children)
  return deepest


# ---- validation ---------------------------------------------------------------------------------


def _invalid(message: str, param: str | None = None) -> PydanticCustomError:
  """A check's failure. `message` follows the field's name ("'n' must be in ..."); a check of the
  whole request (no field of its own) gives its whole message and the `param` to name."""
  return PydanticCustomError("api", message, {"param": param} if param else None)


def _limits(info: pydantic.ValidationInfo) -> ServerConfig:
  return info.context["config"]


def _within(value, lo, hi):
  if not lo <= value <= hi:
    raise _invalid(f"must be in [{lo}, {hi}], got {value}")
  return value


def _range(lo, hi) -> pydantic.AfterValidator:
  return pydantic.AfterValidator(lambda value: _within(value, lo, hi))


class _Object(pydantic.BaseModel):
  """A JSON object of the API: strictly typed, unknown keys refused, `null` the same as absent."""

  model_config = pydantic.ConfigDict(strict=True, extra="forbid")

  @pydantic.model_validator(mode="before")
  @classmethod
  def _null_is_absent(cls, value: Any) -> Any:
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value


class _Options(_Object):
  """A nested object of options: an unknown key is refused with the keys it may hold."""

  @pydantic.model_validator(mode="before")
  @classmethod
  def _known_keys(cls, value: Any) -> Any:
    unknown = sorted(set(value) - set(cls.model_fields)) if isinstance(value, dict) else []
    if unknown:
      allowed = ", ".join(f"'{name}'" for name in cls.model_fields)
      raise _invalid(f"may only hold {allowed}, got {unknown}")
    return value


class StreamOptions(_Options):
  # OpenAI's include_obfuscation pads chunks against side channels; none is added here either way.
  include_usage: bool = False
  continuous_usage_stats: bool = False
  include_obfuscation: bool = False

  @pydantic.field_validator("continuous_usage_stats")
  @classmethod
  def _not_continuous(cls, value: bool) -> bool:
    if value:
      raise _invalid("is not supported")
    return value


class ResponseFormat(_Options):
  """Only plain text: JSON modes are refused by name, never ignored."""

  type: str
  json_schema: dict[str, Any] | None = None

  @pydantic.field_validator("type")
  @classmethod
  def _text_only(cls, value: str) -> str:
    if value != "text":
      raise _invalid(
        f"= {value!r} is not supported by this server (only 'text'; "
        "constrained JSON decoding is not implemented)"
      )
    return value


class ChatTemplateKwargs(_Options):
  enable_thinking: bool | None = None  # Qwen3's switch; None keeps the template's default


class Message(_Object):
  """One chat message. Other keys a client echoes back with an assistant message (`name`,
  `refusal`, `tool_calls`, ...) are ignored, as the chat template has no place for them."""

  model_config = pydantic.ConfigDict(strict=True, extra="ignore")

  role: str
  content: str

  @pydantic.field_validator("role")
  @classmethod
  def _known_role(cls, value: str) -> str:
    if value not in ("system", "user", "assistant"):
      raise _invalid(f"must be system, user or assistant, got {value!r}")
    return value

  @pydantic.field_validator("content", mode="before")
  @classmethod
  def _text_parts(cls, value: Any) -> Any:
    """Content parts (a list) join to one text; only text parts are understood."""
    if not isinstance(value, list):
      return value
    text = lambda p: isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
    if not all(text(p) for p in value):
      raise _invalid("parts must all be {'type': 'text', 'text': ...}")
    return "".join(p["text"] for p in value)


# Fields of OpenAI's and vLLM's APIs that change what is sampled or returned and that this server
# cannot honour, with the values that mean "not used" (null always does).
_REFUSED = {
  "echo": (False,),
  "suffix": ("",),
  "best_of": (1,),
  "logit_bias": ({},),
  "presence_penalty": (0,),
  "frequency_penalty": (0,),
  "tools": ([],),
  "tool_choice": ("none",),
  "functions": ([],),
  "function_call": ("none",),
  "top_logprobs": (0,),
  "guided_json": (),
  "guided_regex": (),
  "guided_choice": (),
  "guided_grammar": (),
  "structured_outputs": (),
  "logits_processors": ([],),
  "min_tokens": (0,),
  "min_p": (0,),
  "repetition_penalty": (1,),
  "use_beam_search": (False,),
  "prompt_logprobs": (),
  "ignore_eos": (False,),
  "stop_token_ids": ([],),
  "bad_words": ([],),
  "allowed_token_ids": (),
  "include_stop_str_in_output": (False,),
  "skip_special_tokens": (True,),
  "add_generation_prompt": (True,),
  "continue_final_message": (False,),
  "return_token_ids": (False,),
  "truncate_prompt_tokens": (),
}


def _refuse(value: Any, info: pydantic.ValidationInfo) -> Any:
  if value not in _REFUSED[info.field_name]:
    raise _invalid(f"= {value!r} is not supported by this server")
  return value


_Refused = pydantic.create_model(
  "_Refused",
  __base__=_Object,
  __doc__="The fields this server refuses unless unused, declared so that they are not unknown.",
  __validators__={"_refuse": pydantic.field_validator(*_REFUSED)(_refuse)},
  **{name: (Any, None) for name in _REFUSED},
)


class _Request(_Refused):
  """Fields common to both routes."""

  model: str
  n: int = 1
  max_tokens: int | None = None
  temperature: Annotated[float, _range(0.0, 2.0)] = 1.0
  top_p: Annotated[float, _range(1e-9, 1.0)] = 1.0
  top_k: Annotated[int, _range(-1, 1 << 30)] = 0  # vLLM's -1 means "off", as 0 does
  seed: Annotated[int, _range(0, 2**32 - 1)] | None = None
  stop: tuple[str, ...] = ()
  stream: bool = False
  stream_options: StreamOptions | None = None
  response_format: ResponseFormat | None = None
  return_tokens_as_token_ids: bool = False  # vLLM's: log-prob tokens as "token_id:<id>"
  user: str | None = None  # OpenAI's end-user id, for abuse monitoring: accepted, unused

  @pydantic.field_validator("n")
  @classmethod
  def _n_within_limit(cls, value: int, info: pydantic.ValidationInfo) -> int:
    return _within(value, 1, _limits(info).max_n)

  @pydantic.field_validator("max_tokens", "max_completion_tokens", check_fields=False)
  @classmethod
  def _tokens_within_limit(cls, value: int, info: pydantic.ValidationInfo) -> int:
    limit = _limits(info).max_tokens
    if not 1 <= value <= limit:
      raise _invalid(f"must be in [1, {limit}] (this server's limit is {limit} tokens), got {value}")
    return value

  @pydantic.field_validator("stop", mode="before")
  @classmethod
  def _stop_strings(cls, value: Any) -> Any:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 16:
      raise _invalid(f"must be a non-empty string or a list of at most 16, got {value!r}")
    return tuple(stops)

  @pydantic.field_validator("stream_options")
  @classmethod
  def _only_when_streaming(cls, value: StreamOptions, info: pydantic.ValidationInfo) -> StreamOptions:
    if not info.data.get("stream"):
      raise _invalid("is only allowed with 'stream': true")
    return value

  @pydantic.model_validator(mode="after")
  def _within_budget(self, info: pydantic.ValidationInfo) -> _Request:
    """prompts × n × max_tokens (`prompt_count`: each route's own): the most tokens the request
    can make the device generate."""
    config = _limits(info)
    field, max_tokens = self.max_tokens_field(), self.max_new_tokens(config)
    cost = self.prompt_count() * self.n * max_tokens
    if cost > config.max_request_tokens:
      raise _invalid(
        f"the request asks for up to {cost} tokens ({self.prompt_count()} prompts x n={self.n} x "
        f"{field}={max_tokens}); at most {config.max_request_tokens} per request",
        param="n" if self.n > 1 else field,
      )
    return self

  def max_tokens_field(self) -> str:
    return "max_tokens"

  def max_new_tokens(self, config: ServerConfig) -> int:
    return self.max_tokens or config.default_max_tokens

  @property
  def include_usage(self) -> bool:
    return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Request):
  """`POST /v1/completions`."""

  prompt: list[str]
  logprobs: int | None = None  # alternatives per token: only 0, the sampled token's log-prob

  @pydantic.field_validator("prompt", mode="before")
  @classmethod
  def _one_or_more_texts(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
    prompts = [value] if isinstance(value, str) else value
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p for p in prompts):
      raise _invalid("must be a non-empty string or a non-empty list of them (token ids are not accepted)")
    if len(prompts) > _limits(info).max_prompts:
      raise _invalid(f"has {len(prompts)} prompts; at most {_limits(info).max_prompts}")
    return prompts

  @pydantic.field_validator("logprobs")
  @classmethod
  def _no_alternatives(cls, value: int) -> int:
    if value != 0:
      raise _invalid(f"= {value}: only 0 (the sampled token's log-prob) is supported")
    return value

  def prompt_count(self) -> int:
    return len(self.prompt)


class ChatCompletionRequest(_Request):
  """`POST /v1/chat/completions`; `max_completion_tokens` (OpenAI's newer name) wins over `max_tokens`."""

  messages: list[Message]
  max_completion_tokens: int | None = None
  logprobs: bool = False
  chat_template_kwargs: ChatTemplateKwargs = ChatTemplateKwargs()

  @pydantic.field_validator("messages")
  @classmethod
  def _not_empty(cls, value: list[Message]) -> list[Message]:
    if not value:
      raise _invalid("must be a non-empty list")
    return value

  def max_tokens_field(self) -> str:
    return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

  def max_new_tokens(self, config: ServerConfig) -> int:
    return self.max_completion_tokens or self.max_tokens or config.default_max_tokens

  def prompt_count(self) -> int:
    return 1


class LoadLoraAdapterRequest(_Object):
  """`POST /v1/load_lora_adapter` (vLLM's body); a loaded name is always replaced."""

  lora_name: str
  lora_path: str  # a PEFT LoRA directory
  load_inplace: bool = False  # vLLM's switch to replace; this server always replaces

  @pydantic.field_validator("lora_name")
  @classmethod
  def _not_the_base_model(cls, value: str, info: pydantic.ValidationInfo) -> str:
    if not value:
      raise _invalid("must not be empty")
    if value == _limits(info).model_name:
      raise _invalid(f"{value!r} is the base model's name")
    return value

  @pydantic.field_validator("lora_path")
  @classmethod
  def _path_given(cls, value: str) -> str:
    if not value:
      raise _invalid("must not be empty (a PEFT LoRA directory)")
    return value


class UnloadLoraAdapterRequest(_Object):
  """`POST /v1/unload_lora_adapter` (vLLM's body)."""

  lora_name: str


R = TypeVar("R", bound=pydantic.BaseModel)


def parse(kind: type[R], body: dict[str, Any], config: ServerConfig) -> R:
  """`body` as a `kind` request under `config`'s limits, or the 400 naming its first bad field."""
  try:
    return kind.model_validate(body, context={"config": config})
  except pydantic.ValidationError as e:
    raise _api_error(e.errors()[0], kind) from None


# Pydantic's type errors (strict mode) as this API words what it expected.
_EXPECTED = {
  "int_type": "an integer",
  "float_type": "a number",
  "string_type": "a string",
  "bool_type": "a boolean",
  "dict_type": "an object",
  "model_type": "an object",
  "list_type": "a list",
  "tuple_type": "a list",
}


def _api_error(error: dict[str, Any], kind: type[pydantic.BaseModel]) -> ApiError:
  """One of pydantic's errors as a 400 whose message and `param` name the field."""
  path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]).lstrip(".")
  if error["type"] == "api":  # a check of ours: the message follows the field's name
    param = (error.get("ctx") or {}).get("param") or path
    return ApiError(400, f"'{path}' {error['msg']}" if path else error["msg"], param=param)
  if error["type"] == "missing":
    return ApiError(400, f"missing required field '{path}'", param=path)
  if error["type"] == "extra_forbidden":
    close = difflib.get_close_matches(path, list(kind.model_fields), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return ApiError(400, f"unknown field '{path}'{hint}", param=path)
  expected = _EXPECTED.get(error["type"])
  message = f"'{path}' must be {expected}" if expected else f"'{path}': {error['msg']}"
  return ApiError(400, f"{message}, got {error['input']!r}", param=path)
