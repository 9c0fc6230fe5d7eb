"""One text-generation interface for every LLM role, whatever serves the model.

KACE's solver, teacher, curator and classifier and DPA-GRPO's generator and verifier all call
`TextGenerator.generate(prompts, n, params)`; which model answers is a config choice
(`make_generator`): `JaxGenerator` runs a local `lm.Qwen` through `lm.Sampler`, `OpenAIGenerator`
talks to any OpenAI-compatible server (vLLM, SGLang, `lm.server`), and `CachedGenerator` puts an
on-disk response cache in front of either, so an interrupted experiment resumes without paying for
a response twice.

A prompt is raw text (a completion) or a list of chat messages ({"role", "content"}), whose chat
template is applied by whoever holds the tokenizer (`JaxGenerator` locally, the server remotely).
`n` and `params` are one value for every prompt or one value per prompt, so a caller with many
different requests (a KACE tier over every open problem) still makes one call.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import logging
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from lm import rundir, sharding
from lm.config import ModelConfig
from lm.hf import load_hf
from lm.model import Qwen
from lm.sampler import Sampler, SamplerConfig, TokenListener, per_prompt
from lm.tokenizer import Tokenizer, load_tokenizer

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": ...}
Prompt = str | Sequence[Message]  # raw text (a completion) or a conversation (a chat)


@dataclasses.dataclass(frozen=True)
class GenerationParams:
  """How to sample: the fields every OpenAI-compatible server and `lm.Sampler` understand.

  Attributes:
    max_tokens: most tokens generated per sample.
    temperature: 0 is greedy.
    top_p: nucleus mass (1 disables).
    top_k: keep the k likeliest tokens (0 disables); sent to servers as the vLLM/SGLang extension.
    stop: strings that end a sample (cut off from the text).
    seed: makes sampling reproducible; None draws fresh randomness on every call, as OpenAI does.
    enable_thinking: Qwen3's chat-template switch; None keeps the template's default. Only chat
      prompts use it (sent to servers as `chat_template_kwargs`).
    logprobs: ask a server for token log-probs. `JaxGenerator` always returns them (they cost
      nothing there).
  """

  max_tokens: int = 256
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  stop: tuple[str, ...] = ()
  seed: int | None = None
  enable_thinking: bool | None = None
  logprobs: bool = False

  def __post_init__(self):
    # A list or a single string is accepted for convenience and stored as a tuple (hashable).
    object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
    if self.max_tokens < 1:
      raise ValueError(f"GenerationParams.max_tokens must be >= 1, got {self.max_tokens}")
    if self.temperature < 0:
      raise ValueError(f"GenerationParams.temperature must be >= 0, got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"GenerationParams.top_p must be in (0, 1], got {self.top_p}")
    if self.top_k < 0:
      raise ValueError(f"GenerationParams.top_k must be >= 0, got {self.top_k}")
    if not all(isinstance(s, str) and s for s in self.stop):
      raise ValueError(f"GenerationParams.stop must hold non-empty strings, got {self.stop!r}")
    if self.seed is not None and not 0 <= self.seed < 2**32:
      raise ValueError(f"GenerationParams.seed must be in [0, 2**32), got {self.seed}")


@dataclasses.dataclass(frozen=True)
class Generation:
  """One sample.

  Attributes:
    text: the generated text (stop strings and EOS excluded).
    token_ids: the generated ids, when the generator sees them (`JaxGenerator`).
    logprobs: the model's log-prob of each generated token, when available.
    finish_reason: "stop" (EOS or a stop string) or "length" (or what a server reports).
    prompt_tokens: tokens in the prompt after the chat template.
    completion_tokens: tokens generated for this sample.
  """

  text: str
  token_ids: list[int] | None
  logprobs: list[float] | None
  finish_reason: str
  prompt_tokens: int
  completion_tokens: int


class TextGenerator(Protocol):
  """What every LLM role calls."""

  def generate(
    self,
    prompts: Sequence[Prompt],
    n: int | Sequence[int] = 1,
    params: GenerationParams | Sequence[GenerationParams] = GenerationParams(),
  ) -> list[list[Generation]]:
    """Returns `n` samples for every prompt: result[i][j] is sample j of prompt i.

    Args:
      prompts: raw texts and/or chat conversations.
      n: samples per prompt, for all prompts or one per prompt.
      params: sampling parameters, for all prompts or one per prompt.
    """
    ...


# ---- local JAX model ---------------------------------------------------------------------------


class JaxGenerator:
  """A local `lm.Qwen` behind the generator interface: chat template, tokenizer and `lm.Sampler`.

  Prompts that share `n`, `max_tokens` and `stop` go to the device in one sampler call whatever
  their temperature, top-p, top-k and seed (those are per-row arrays in the sampler); prompts that
  differ in those three are grouped, one sampler call per group, because the sampler takes them as
  one value per call. A KACE tier or a batch of server requests with common settings is thus one
  call.

  Attributes:
    tokenizer: encodes prompts and decodes samples.
    sampler: the `lm.Sampler` doing the work (call `sampler.refresh()` after training steps).
    sampler_calls: how many sampler calls this generator has made (a batching diagnostic).
  """

  def __init__(
    self,
    model: Qwen,
    tokenizer: Tokenizer,
    *,
    sampler_config: SamplerConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
  ):
    self.tokenizer = tokenizer
    self.sampler = Sampler(model, tokenizer=tokenizer, mesh=mesh, config=sampler_config or SamplerConfig())
    self.sampler_calls = 0

  def encode(self, prompt: Prompt, params: GenerationParams) -> list[int]:
    """The prompt's token ids: raw text as is, a conversation through the chat template."""
    if isinstance(prompt, str):
      return self.tokenizer.encode(prompt)
    return self.tokenizer.encode_chat(prompt, enable_thinking=params.enable_thinking)

  def generate(
    self,
    prompts: Sequence[Prompt],
    n: int | Sequence[int] = 1,
    params: GenerationParams | Sequence[GenerationParams] = GenerationParams(),
    *,
    on_tokens: TokenListener | None = None,
    stream_every: int = 16,
  ) -> list[list[Generation]]:
    """`TextGenerator.generate`; with `on_tokens`, also hands out each sample's tokens as they are
    made, every `stream_every` decode steps (`lm.Sampler.generate`), prompts numbered as here."""
    ns = per_prompt(n, len(prompts), "n")
    ps = per_prompt(params, len(prompts), "params")
    ids = [self.encode(p, q) for p, q in zip(prompts, ps, strict=True)]
    empty = [i for i, x in enumerate(ids) if not x]
    if empty:
      raise ValueError(f"prompts {empty} encode to no tokens")
    for i, (x, q) in enumerate(zip(ids, ps, strict=True)):
      try:  # positions past the model's are text it never saw: refuse, as the server does (400)
        self.sampler.model.config.check_context(len(x), q.max_tokens)
      except ValueError as e:
        raise ValueError(f"prompt {i}: {e}") from None
    # seed None means fresh randomness, as with an OpenAI server.
    seeds = [secrets.randbits(32) if q.seed is None else q.seed for q in ps]
    groups = collections.defaultdict(list)
    for i, (k, q) in enumerate(zip(ns, ps, strict=True)):
      groups[(k, q.max_tokens, q.stop)].append(i)
    results: list[list[Generation]] = [[] for _ in prompts]
    for (k, max_tokens, stop), rows in groups.items():
      out = self.sampler.generate(
        [ids[i] for i in rows],
        max_new_tokens=max_tokens,
        n=k,
        temperature=[ps[i].temperature for i in rows],
        top_p=[ps[i].top_p for i in rows],
        top_k=[ps[i].top_k for i in rows],
        seed=[seeds[i] for i in rows],
        eos_ids=self.tokenizer.eos_ids,
        stop=stop,
        on_tokens=None if on_tokens is None else functools.partial(_renumbered, on_tokens, rows),
        stream_every=stream_every,
      )
      self.sampler_calls += 1
      for r, i in enumerate(rows):
        results[i] = [
          Generation(
            text=out.texts[r][j],
            token_ids=out.tokens[r][j],
            logprobs=out.logprobs[r][j],
            finish_reason=out.finish_reasons[r][j],
            prompt_tokens=len(ids[i]),
            completion_tokens=len(out.tokens[r][j]),
          )
          for j in range(k)
        ]
    return results


def _renumbered(on_tokens: TokenListener, rows: list[int], prompt: int, *rest) -> None:
  """`on_tokens` for a sampler call over the prompts `rows` of a generate call."""
  on_tokens(rows[prompt], *rest)


# ---- OpenAI-compatible server ------------------------------------------------------------------


class OpenAIGenerator:
  """Any OpenAI-compatible server (vLLM, SGLang, `lm.server`, OpenAI) through the `openai` client.

  Each prompt is one request carrying its `n` (text → /completions, messages →
  /chat/completions); up to `max_concurrency` requests are in flight at once, so a server that
  batches (they all do) sees the whole call.

  Failed requests are retried by the `openai` client itself (`openai/_base_client.py`), configured
  with `max_retries` and `timeout`: it retries 408, 409, 429, 5xx, timeouts and connection errors,
  waits the server's Retry-After (or Retry-After-Ms) when that is between 0 and 2 minutes, and
  otherwise backs off exponentially from 0.5 s, doubling up to 8 s, each wait shortened by a random
  0-25% so concurrent requests spread out; other 4xx are raised at once. Nothing is added on top.
  What the client does not offer, and this class does not rebuild: a configurable backoff base and
  cap (they are module constants), and waiting out a Retry-After longer than 2 minutes (it raises
  instead). Retries are logged by the `openai` logger at INFO.

  Per-sample `completion_tokens` is the number of log-probs when the server returns them; otherwise
  the response's total spread evenly over its n samples (servers report usage per request), so sums
  over samples match the server's count either way.

  `token_ids=True` asks text completions that request log-probs for the sampled token ids too
  (vLLM's `return_tokens_as_token_ids`, which `lm.server` also honours: each logprobs token is
  "token_id:<int>"), so a trainer can rescore exactly what was sampled (`dpa_grpo.rollout`).
  """

  def __init__(
    self,
    base_url: str,
    model: str,
    *,
    api_key_env: str = "OPENAI_API_KEY",
    max_concurrency: int = 8,
    max_retries: int = 5,
    timeout: float = 600.0,
    token_ids: bool = False,
  ):
    # Local servers usually need no key; "EMPTY" is vLLM's convention for that case.
    api_key = os.environ.get(api_key_env) or "EMPTY"
    import openai  # here, not at the top: a second of start-up for every run that serves no API

    self.client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=max_retries, timeout=timeout)
    self.model = model
    self.max_concurrency = max_concurrency
    self.token_ids = token_ids

  def generate(
    self,
    prompts: Sequence[Prompt],
    n: int | Sequence[int] = 1,
    params: GenerationParams | Sequence[GenerationParams] = GenerationParams(),
  ) -> list[list[Generation]]:
    ns = per_prompt(n, len(prompts), "n")
    ps = per_prompt(params, len(prompts), "params")
    if not prompts:
      return []
    with concurrent.futures.ThreadPoolExecutor(min(self.max_concurrency, len(prompts))) as pool:
      return list(pool.map(self._request, prompts, ns, ps))

  def _request(self, prompt: Prompt, n: int, params: GenerationParams) -> list[Generation]:
    kwargs: dict[str, Any] = dict(
      model=self.model, n=n, max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p
    )
    if params.stop:
      kwargs["stop"] = list(params.stop)
    if params.seed is not None:
      kwargs["seed"] = params.seed
    extra_body = {}
    if params.top_k:
      extra_body["top_k"] = params.top_k
    if isinstance(prompt, str):
      if params.logprobs:
        kwargs["logprobs"] = 0  # the sampled token's log-prob, no alternatives
        if self.token_ids:
          extra_body["return_tokens_as_token_ids"] = True
      response = self.client.completions.create(prompt=prompt, extra_body=extra_body or None, **kwargs)
      choices = [(c.text, c.finish_reason, _completion_logprobs(c)) for c in _by_index(response.choices)]
      ids = [
        _completion_token_ids(c, self.model) if self.token_ids and params.logprobs else None
        for c in _by_index(response.choices)
      ]
    else:
      if params.enable_thinking is not None:
        extra_body["chat_template_kwargs"] = {"enable_thinking": params.enable_thinking}
      if params.logprobs:
        kwargs["logprobs"] = True
      response = self.client.chat.completions.create(
        messages=[dict(m) for m in prompt], extra_body=extra_body or None, **kwargs
      )
      choices = [
        (c.message.content or "", c.finish_reason, _chat_logprobs(c)) for c in _by_index(response.choices)
      ]
      ids = [None] * len(choices)
    usage = response.usage
    spread = _spread(usage.completion_tokens if usage else 0, len(choices))
    return [
      Generation(
        text=text,
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=reason,
        prompt_tokens=usage.prompt_tokens if usage else 0,
        completion_tokens=len(logprobs) if logprobs is not None else count,
      )
      for (text, reason, logprobs), token_ids, count in zip(choices, ids, spread, strict=True)
    ]


def _by_index(choices):
  return sorted(choices, key=lambda c: c.index)


def _completion_logprobs(choice) -> list[float] | None:
  lp = choice.logprobs
  return None if lp is None or lp.token_logprobs is None else [float(x) for x in lp.token_logprobs]


def _completion_token_ids(choice, model: str) -> list[int]:
  """The sampled ids of a completion asked with `return_tokens_as_token_ids` ("token_id:<int>")."""
  tokens = None if choice.logprobs is None else choice.logprobs.tokens
  if tokens is None or not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
    raise ValueError(
      f"model {model!r}: the server returned no token ids (logprobs.tokens {str(tokens)[:80]}); it must "
      "support return_tokens_as_token_ids (vLLM, lm.server)"
    )
  return [int(t.split(":", 1)[1]) for t in tokens]


def _chat_logprobs(choice) -> list[float] | None:
  lp = choice.logprobs
  return None if lp is None or lp.content is None else [float(t.logprob) for t in lp.content]


def _spread(total: int, parts: int) -> list[int]:
  return [total // parts + (i < total % parts) for i in range(parts)]


# ---- response cache ----------------------------------------------------------------------------


class CachedGenerator:
  """An on-disk response cache in front of another generator.

  The key is a SHA-256 of (model id, prompt, n, every `GenerationParams` field including the
  seed); one request's n samples are stored together because they come back together, and `n`
  is part of the key because a server need not make sample j independent of n. Only misses go to
  the inner generator, all in one call (identical missing requests are sent once).

  Storage is one JSON file per key (`<dir>/<key[:2]>/<key>.json`, also holding the request for
  auditing), written with `lm.rundir.write_json` (temporary file + atomic rename). That is safe with any
  number of processes sharing the directory without locks: a reader sees a whole file or none, and
  two writers of one key both write a complete response, the last rename winning. SQLite with WAL
  would give one file instead of many but breaks on network filesystems (NFS, GCS fuse), where
  shared experiment directories often live.

  A request with `seed=None` is cached too: a resumed run replays the stored samples. Change the
  seed or the model id to draw new ones.
  """

  def __init__(self, inner: TextGenerator, cache_dir: str | os.PathLike, model_id: str):
    if not model_id:
      raise ValueError("CachedGenerator needs a model_id (it is part of every cache key)")
    self.inner = inner
    self.cache_dir = os.fspath(cache_dir)
    self.model_id = model_id

  def generate(
    self,
    prompts: Sequence[Prompt],
    n: int | Sequence[int] = 1,
    params: GenerationParams | Sequence[GenerationParams] = GenerationParams(),
  ) -> list[list[Generation]]:
    ns = per_prompt(n, len(prompts), "n")
    ps = per_prompt(params, len(prompts), "params")
    requests = [self._request(p, k, q) for p, k, q in zip(prompts, ns, ps, strict=True)]
    keys = [_key(r) for r in requests]
    results = [self._read(key) for key in keys]
    missing = collections.defaultdict(list)  # key -> indices of the prompts asking for it
    for i, (key, result) in enumerate(zip(keys, results, strict=True)):
      if result is None:
        missing[key].append(i)
    if missing:
      first = [rows[0] for rows in missing.values()]
      fresh = self.inner.generate(
        [prompts[i] for i in first], n=[ns[i] for i in first], params=[ps[i] for i in first]
      )
      for (key, rows), generations in zip(missing.items(), fresh, strict=True):
        rundir.write_json(self._path(key), {"request": requests[rows[0]], "generations": generations})
        for i in rows:
          results[i] = list(generations)
    return results

  def _request(self, prompt: Prompt, n: int, params: GenerationParams) -> dict[str, Any]:
    text_or_messages = prompt if isinstance(prompt, str) else [dict(m) for m in prompt]
    return {"model": self.model_id, "prompt": text_or_messages, "n": n, "params": dataclasses.asdict(params)}

  def _path(self, key: str) -> str:
    return os.path.join(self.cache_dir, key[:2], key + ".json")

  def _read(self, key: str) -> list[Generation] | None:
    path = self._path(key)
    if not os.path.exists(path):
      return None
    try:
      return [Generation(**g) for g in rundir.read_json(path)["generations"]]
    except (ValueError, KeyError, TypeError) as e:  # not written by this class: regenerate
      logging.warning("ignoring unreadable cache entry %s: %s", path, e)
      return None


def _key(request: dict[str, Any]) -> str:
  canonical = json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
  return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# ---- config ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class GeneratorConfig:
  """One LLM role (solver, teacher, ...), read by `make_generator`; built once from a config section.

  Attributes:
    kind: "jax" (a local model), "openai" (an OpenAI-compatible server) or "scripted" (a program
      standing in for a model, `SCRIPTED[model]`; labelled as such wherever its numbers appear).
    checkpoint: jax: an HF checkpoint directory (`lm.load_hf`).
    preset: jax, without a checkpoint: a `ModelConfig` preset with random weights (smoke runs);
      its vocabulary is grown to cover the tokenizer's.
    tokenizer: jax: tokenizer directory (default: the checkpoint's).
    dtype: jax: parameter dtype.
    seed: jax: random-weight seed for `preset`.
    mesh: jax: (data, fsdp, tp) sizes; all 1 runs on one device, -1 takes the remaining devices.
    sampler: jax: `SamplerConfig` fields (only those set; the others keep `SamplerConfig`'s
      defaults, so the resolved config lists what was chosen).
    base_url, model, api_key_env, max_concurrency, max_retries, timeout: openai (`OpenAIGenerator`).
    cache_dir: when set, responses are cached there (`CachedGenerator`).
    model_id: the cache's model identity (default: the checkpoint, the preset and seed, or the
      model name). Set it when different weights live under one path (e.g. successive training
      checkpoints).
  """

  kind: str = "jax"
  checkpoint: str = ""
  preset: str = ""
  tokenizer: str = ""
  dtype: str = "bfloat16"
  seed: int = 0
  mesh: sharding.MeshConfig = dataclasses.field(default_factory=lambda: sharding.MeshConfig(1, 1, 1))
  sampler: Mapping[str, Any] = dataclasses.field(
    default_factory=lambda: dict(min_prompt_bucket=16, step_bucket=64, max_rows=256)
  )
  base_url: str = "http://127.0.0.1:8000/v1"
  model: str = ""
  api_key_env: str = "OPENAI_API_KEY"
  max_concurrency: int = 8
  max_retries: int = 5
  timeout: float = 600.0
  cache_dir: str = ""
  model_id: str = ""

  def __post_init__(self):
    if self.kind not in ("jax", "openai", "scripted"):
      raise ValueError(f"generator config: kind must be 'jax', 'openai' or 'scripted', got {self.kind!r}")
    object.__setattr__(self, "sampler", dict(self.sampler))
    unknown = sorted(set(self.sampler) - {f.name for f in dataclasses.fields(SamplerConfig)})
    if unknown:
      raise ValueError(f"generator config: unknown sampler key(s) {unknown} (SamplerConfig fields)")
    if self.max_concurrency < 1:
      raise ValueError(f"generator config: max_concurrency must be >= 1, got {self.max_concurrency}")
    if self.max_retries < 0:
      raise ValueError(f"generator config: max_retries must be >= 0, got {self.max_retries}")

  @classmethod
  def from_dict(cls, config: Mapping[str, Any]) -> GeneratorConfig:
    """From a config section (a dict or a ConfigDict); an unknown key fails with its name."""
    if isinstance(config, GeneratorConfig):
      return config
    fields = dict(config.to_dict() if hasattr(config, "to_dict") else config)
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
      raise ValueError(f"generator config: unknown key(s) {unknown}")
    if "mesh" in fields:
      mesh = dict(fields["mesh"])
      extra = sorted(set(mesh) - {"data", "fsdp", "tp"})
      if extra:
        raise ValueError(f"generator config: unknown mesh key(s) {extra} (data, fsdp, tp)")
      fields["mesh"] = sharding.MeshConfig(**mesh)
    return cls(**fields)

  def sampler_config(self) -> SamplerConfig:
    return SamplerConfig(**self.sampler)

  def to_dict(self) -> dict[str, Any]:
    """The config section this was built from (what a run directory's config.json records)."""
    return dataclasses.asdict(self)


def default_config(**overrides: Any) -> ml_collections.ConfigDict:
  """A `GeneratorConfig` as a ConfigDict section (for code that edits a role before typing it)."""
  c = ml_collections.ConfigDict(GeneratorConfig().to_dict())
  c.update(overrides)
  return c


# Programmatic stand-ins for a model (kind "scripted"), by the `model` name that picks them; a package
# registers its own when imported (kace.scripted: "testbed").
SCRIPTED: dict[str, Callable[[], TextGenerator]] = {}


def make_generator(config: GeneratorConfig | Mapping[str, Any]) -> TextGenerator:
  """The generator a role's config describes, cached when `cache_dir` is set.

  A mapping (a ConfigDict section) is typed here with `GeneratorConfig.from_dict`, for callers
  that hold an untyped section.
  """
  config = GeneratorConfig.from_dict(config)
  if config.kind == "scripted":
    if config.model not in SCRIPTED:
      raise ValueError(
        f"generator config: kind='scripted' needs `model` among the registered stand-ins {sorted(SCRIPTED)}, "
        f"got {config.model!r}"
      )
    return SCRIPTED[config.model]()
  if config.kind == "jax":
    generator = load_jax_generator(config)
    random_id = f"random:{config.preset}:seed={config.seed}"
    model_id = config.model_id or config.checkpoint or random_id
  else:
    if not config.model:
      raise ValueError("generator config: kind='openai' needs `model` (the served model's name)")
    generator = OpenAIGenerator(
      config.base_url,
      config.model,
      api_key_env=config.api_key_env,
      max_concurrency=config.max_concurrency,
      max_retries=config.max_retries,
      timeout=config.timeout,
    )
    model_id = config.model_id or config.model
  if config.cache_dir:
    return CachedGenerator(generator, config.cache_dir, model_id)
  return generator


def load_jax_generator(config: GeneratorConfig | Mapping[str, Any]) -> JaxGenerator:
  """A `JaxGenerator` from a `GeneratorConfig` (checkpoint or random preset); a mapping is typed first."""
  config = GeneratorConfig.from_dict(config)
  if not (config.tokenizer or config.checkpoint):
    raise ValueError("generator config: kind='jax' needs `tokenizer` or `checkpoint`")
  tokenizer = load_tokenizer(config.tokenizer or config.checkpoint)
  mesh_config = config.mesh
  mesh = (
    None
    if (mesh_config.data, mesh_config.fsdp, mesh_config.tp) == (1, 1, 1)
    else sharding.make_mesh(mesh_config)
  )
  if config.checkpoint:
    model = load_hf(config.checkpoint, dtype=config.dtype, mesh=mesh)
  elif config.preset:
    model_config = ModelConfig.preset(config.preset)
    vocab = max(model_config.vocab_size, tokenizer.vocab_size)
    model_config = dataclasses.replace(model_config, vocab_size=vocab)
    model = random_model(model_config, seed=config.seed, dtype=config.dtype, mesh=mesh)
  else:
    raise ValueError("generator config: kind='jax' needs `checkpoint` (or `preset` for random weights)")
  return JaxGenerator(model, tokenizer, sampler_config=config.sampler_config(), mesh=mesh)


def random_model(model_config: ModelConfig, *, seed: int = 0, dtype: str = "float32", mesh=None) -> Qwen:
  """A model with random weights for smoke runs and tests: N(0, 0.02) matrices, unit norm scales.

  The weights are drawn with numpy one tensor at a time and put on their devices (sharded over
  `mesh` when given) instead of by the model's jitted initialisers: on a CPU, compiling those
  costs more than a smoke run's sampling, and the statistics of random weights do not matter here.
  """
  abstract = nnx.eval_shape(lambda: Qwen(model_config, rngs=nnx.Rngs(0), param_dtype=dtype))
  graphdef, state = nnx.split(abstract)
  rng = np.random.default_rng(seed)

  def draw(x):
    value = rng.normal(0.0, 0.02, x.shape) if len(x.shape) > 1 else np.ones(x.shape)
    return jnp.asarray(value, x.dtype)

  model = nnx.merge(graphdef, jax.tree.map(draw, state))
  return sharding.shard_model(model, mesh) if mesh is not None else model
