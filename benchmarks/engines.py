"""One engine of `benchmarks.sampler_bench` in its own process: a worker driven over a pipe.

  PYTHONPATH=TREE <venv>/bin/python benchmarks/engines.py ENGINE CHECKPOINT_DIR

with the interpreter of the engine's virtual environment (the project's `.venv` for `ours` and
`transformers`, `.bench/vllm` and `.bench/tunix` for the others, see `benchmarks/setup_engines.sh`).
Only the `ours` engine imports this project (`lm` from TREE: the working tree, or an older commit
extracted to measure a change against it); every other engine imports nothing but its own library,
so it runs in a virtual environment that lacks the project's dependencies.

The worker reads one JSON command a line on stdin and answers one JSON line on the stdout it was
started with; whatever the engine's library prints goes to stderr instead (fd 1 is redirected), so
log lines never corrupt the protocol. Commands:

  {"cmd": "load"}                 -> {"load_s", "version", "threads"}
  {"cmd": "generate", "new": n}   -> {"seconds", "tokens"}: greedy, n new tokens for every prompt,
                                     EOS ignored; tokens [B][n] generated ids
  {"cmd": "quit"}                 -> exits

(`serve` is the protocol of every benchmark worker: `benchmarks.rl_bench`'s serve it too.)

The checkpoint directory holds a transformers `save_pretrained` float32 Qwen3 checkpoint and
`prompts.json` ([B][P] token ids): every engine reads the same weights and the same prompts, and
converts the weights to `BENCH_DTYPE` (float32 or bfloat16, the run's dtype) as it loads.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _prompts(path: str) -> list[list[int]]:
  with open(os.path.join(path, "prompts.json")) as f:
    return json.load(f)


def _threads() -> int:
  return int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)


def _dtype() -> str:
  """The dtype every engine runs in (`sampler_bench --dtypes`): "float32" or "bfloat16"; the
  checkpoint on disk is float32 and each engine converts it as it loads."""
  dtype = os.environ.get("BENCH_DTYPE", "float32")
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"BENCH_DTYPE must be float32 or bfloat16, got {dtype!r}")
  return dtype


class Ours:
  """`lm.Sampler` (the project itself): weights, activations and KV cache in `_dtype()`."""

  def __init__(self, path: str):
    prompts = _prompts(path)
    import jax

    import lm
    from lm.sampler import Sampler, SamplerConfig

    self.version = f"jax {jax.__version__}"
    print(f"lm from {os.path.dirname(lm.__file__)}", file=sys.stderr)
    try:  # this tree's CPU kernel, built as setup_env.sh builds it (`ours@REF`: REF's source)
      from lm import cpu_gemm

      print(f"lm.cpu_gemm: {cpu_gemm.build()}", file=sys.stderr)
    except (ImportError, RuntimeError) as e:  # a tree before the kernel, or no compiler
      print(f"lm.cpu_gemm not built: {e}", file=sys.stderr)
    # `sampler_bench --variant`: SamplerConfig fields of this engine (none: the defaults)
    overrides = json.loads(os.environ.get("BENCH_SAMPLER_CONFIG") or "{}")
    config = SamplerConfig(**overrides)
    self.sampler = Sampler(lm.load_hf(path, dtype=_dtype()), config=config)
    self.prompts = prompts

  def generate(self, new: int) -> dict:
    out = self.sampler.generate(self.prompts, max_new_tokens=new, temperature=0.0)
    return {"tokens": [t[0] for t in out.tokens]}


class Transformers:
  """transformers `generate` (PyTorch, CPU, weights in `_dtype()`): the reference implementation."""

  def __init__(self, path: str):
    prompts = _prompts(path)
    import torch
    import transformers

    torch.set_num_threads(_threads())
    self.version = f"transformers {transformers.__version__}, torch {torch.__version__}"
    self.torch = torch
    dtype = getattr(torch, _dtype())
    self.model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    self.ids = torch.tensor(prompts)

  def generate(self, new: int) -> dict:
    with self.torch.no_grad():
      out = self.model.generate(
        self.ids,
        attention_mask=self.torch.ones_like(self.ids),
        do_sample=False,
        max_new_tokens=new,
        min_new_tokens=new,
        eos_token_id=None,
        pad_token_id=0,
      )
    return {"tokens": out[:, self.ids.shape[1] :].tolist()}


class Vllm:
  """vLLM's CPU build in `_dtype()`, in this process (no engine-core subprocess), prefix caching off.

  Prefix caching would serve every trial after the first from cached prompt blocks, which none of
  the other engines does; in-process keeps the work on the threads this process is given.
  """

  def __init__(self, path: str):
    prompts = _prompts(path)
    import vllm

    self.version = f"vllm {vllm.__version__}"
    longest = len(prompts[0]) + int(os.environ.get("BENCH_MAX_NEW", "128"))
    self.llm = vllm.LLM(
      model=path,
      dtype=_dtype(),
      skip_tokenizer_init=True,
      enable_prefix_caching=False,
      max_model_len=longest,
      max_num_seqs=len(prompts),
      seed=0,
    )
    self.vllm = vllm
    self.prompts = [{"prompt_token_ids": p} for p in prompts]

  def generate(self, new: int) -> dict:
    params = self.vllm.SamplingParams(
      temperature=0.0, max_tokens=new, min_tokens=new, ignore_eos=True, detokenize=False
    )
    outs = self.llm.generate(self.prompts, params, use_tqdm=False)
    return {"tokens": [list(o.outputs[0].token_ids) for o in outs]}


class _IdTokenizer:
  """A tokenizer over space-separated ids: tunix's sampler takes strings and encodes them itself."""

  def __init__(self, pad_id: int):
    self._pad = pad_id

  def encode(self, text: str, **_) -> list[int]:
    return [int(t) for t in text.split()]

  def decode(self, ids, **_) -> str:
    return " ".join(str(int(i)) for i in ids)

  def pad_id(self) -> int:
    return self._pad

  def eos_id(self) -> int:
    return -1

  def bos_id(self) -> None:
    return None  # the prompts are complete: tunix prepends a BOS only when this is set


class Tunix:
  """tunix's `Sampler` (its own JAX / flax NNX Qwen3, loaded from the safetensors files)."""

  def __init__(self, path: str):
    prompts = _prompts(path)
    import importlib.metadata

    import jax
    import jax.numpy as jnp
    from tunix.generate import sampler as sampler_lib
    from tunix.models.qwen3 import model as model_lib
    from tunix.models.qwen3 import params as params_lib

    with open(os.path.join(path, "config.json")) as f:
      hf = json.load(f)
    config = model_lib.ModelConfig(
      num_layers=hf["num_hidden_layers"],
      vocab_size=hf["vocab_size"],
      embed_dim=hf["hidden_size"],
      hidden_dim=hf["intermediate_size"],
      num_heads=hf["num_attention_heads"],
      head_dim=hf["head_dim"],
      num_kv_heads=hf["num_key_value_heads"],
      rope_theta=int(hf["rope_theta"]),  # unused by tunix 0.1.7's attention, which takes 1e6
      norm_eps=hf["rms_norm_eps"],
      use_tied_embedding=hf["tie_word_embeddings"],
    )
    model = params_lib.create_model_from_safe_tensors(path, config, None, dtype=jnp.dtype(_dtype()))
    longest = len(prompts[0]) + int(os.environ.get("BENCH_MAX_NEW", "128"))
    self.sampler = sampler_lib.Sampler(
      model,
      _IdTokenizer(0),
      sampler_lib.CacheConfig(
        cache_size=longest,
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
      ),
    )
    self.version = f"tunix {importlib.metadata.version('google-tunix')}, jax {jax.__version__}"
    self.strings = [" ".join(map(str, p)) for p in prompts]
    self.prompt_len = len(prompts[0])  # no padding to a power of two: every engine sees P tokens

  def generate(self, new: int) -> dict:
    out = self.sampler(
      self.strings,
      max_generation_steps=new,
      max_prompt_length=self.prompt_len,
      temperature=0.0,
      eos_tokens=[-1],
    )
    return {"tokens": [[int(t) for t in row] for row in out.tokens]}


ENGINES = {"ours": Ours, "transformers": Transformers, "vllm": Vllm, "tunix": Tunix}


def serve(runners: dict, kind: str, path: str) -> None:
  """Answers commands on stdin until "quit": "load" builds `runners[kind](path)`; any other command
  calls the runner's method of that name with the command's other fields, timed, and answers
  {"seconds": ..., **what it returned}. Standard library only: it runs in every engine's venv."""
  protocol = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)  # the engine's own prints go to stderr
  sys.stdout = sys.stderr
  runner = None
  for line in sys.stdin:
    command = json.loads(line)
    name = command.pop("cmd")
    if name == "quit":
      return
    start = time.perf_counter()
    if name == "load":
      runner = runners[kind](path)
      reply = {"load_s": time.perf_counter() - start, "version": runner.version, "threads": _threads()}
    elif runner is not None and not name.startswith("_") and hasattr(runner, name):
      result = getattr(runner, name)(**command)
      reply = {"seconds": time.perf_counter() - start, **result}
    else:
      reply = {"error": f"unknown command {name!r}"}
    protocol.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
  serve(ENGINES, sys.argv[1], sys.argv[2])
