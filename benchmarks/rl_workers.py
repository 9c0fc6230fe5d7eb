"""The two sides of `benchmarks.rl_bench`, each a worker process of `benchmarks.engines.serve`.

  python -m benchmarks.rl_workers jax|jax_xla_attention|jax_shared|torch|torch_window DIR [float32|bfloat16]

`jax_xla_attention` is `jax` with its train step's attention in XLA's ops instead of
`lm.cpu_gemm`'s kernel (`lm.model.cpu_attention(0)`): the kernel's share of the step, measured in
the same interleaved run (its rollout is `jax`'s: the sampler picks its own kernels). `jax_shared`
is `jax` with the trainer's `loss.share_prompts`: each pair one row, its prompt computed once.

The last argument is the step's dtype (float32 unless given): "bfloat16" keeps float32 master
weights, gradients and AdamW state on both sides and runs the products on bfloat16 operands (JAX:
`lm.load_hf(..., dtype="float32", compute_dtype="bfloat16")`, whose sampler then also keeps its
KV cache in bfloat16; PyTorch: `torch.autocast("cpu", dtype=torch.bfloat16)` around every
forward pass, the rollout's `generate` included).

DIR holds a transformers `save_pretrained` float32 Qwen3 checkpoint, `batch.npz` (the packed pairs
of `train_step_bench.make_batch`) and `rollout.json` (prompts, samples per prompt, new tokens,
temperature, top-p, gradient-accumulation chunks), so both sides read the same weights and inputs.
Commands, besides "load" and "quit":

  {"cmd": "greedy", "new": n} -> {"seconds", "tokens"}: greedy, n tokens a prompt, EOS ignored
  {"cmd": "rollout"}          -> {"seconds", "tokens"}: the rollout's sampling call; tokens = how
                                 many were generated in all
  {"cmd": "train"}            -> {"seconds", "loss", "grad_norm"}: one train step; loss and the
                                 gradient's global norm are those before its update
"""

from __future__ import annotations

import functools
import json
import os
import sys

import numpy as np

from benchmarks import engines


def _settings(path: str) -> tuple[dict, dict[str, np.ndarray]]:
  with open(os.path.join(path, "rollout.json")) as f:
    settings = json.load(f)
  with np.load(os.path.join(path, "batch.npz")) as data:
    batch = {k: data[k] for k in data.files}
  return settings, batch


class JaxSide:
  """This project: `lm.Sampler` over the policy (the trainer's sampler settings) for the rollout,
  `dpa_grpo.step` for the update; after each update the sampler is rebuilt from the new parameters
  (`Sampler.refresh`, as `dpa_grpo.train` does, counted in the train step: `step.apply` donates
  the buffers the sampler viewed)."""

  def __init__(
    self, path: str, dtype: str = "float32", attention_threads: int | None = None, share_prompts: bool = False
  ):
    import jax

    from benchmarks.train_step_bench import JaxStep
    from dpa_grpo import config as config_lib
    from lm import sampler as sampler_lib

    self.version = f"jax {jax.__version__}"
    self.settings, batch = _settings(path)
    chunks = self.settings["chunks"]
    self.trainer = JaxStep(path, batch, chunks, compute_dtype=dtype, share_prompts=share_prompts)
    self.sampler = sampler_lib.Sampler(self.trainer.policy(), config=config_lib.ExperimentConfig().sampler)
    self.calls = 0
    self.attention_threads = attention_threads  # None: `lm.model`'s default (the kernel, one device)

  def greedy(self, new: int) -> dict:
    out = self.sampler.generate(self.settings["prompts"], max_new_tokens=new, temperature=0.0)
    return {"tokens": [t[0] for t in out.tokens]}

  def rollout(self) -> dict:
    s = self.settings
    self.calls += 1
    out = self.sampler.generate(
      s["prompts"],
      max_new_tokens=s["new_tokens"],
      n=s["samples"],
      temperature=s["temperature"],
      top_p=s["top_p"],
      seed=[self.calls * len(s["prompts"]) + i for i in range(len(s["prompts"]))],
    )
    return {"tokens": sum(len(t) for per_prompt in out.tokens for t in per_prompt)}

  def train(self) -> dict:
    from lm import model as model_lib

    with model_lib.cpu_attention(self.attention_threads):  # read as the step is first traced
      loss, norm = self.trainer.step()
    self.sampler.model = self.trainer.policy()
    self.sampler.refresh()
    return {"loss": loss, "grad_norm": norm}


class TorchSide:
  """PyTorch: transformers `generate` (sampling, the same temperature and top-p, `n` return
  sequences a prompt) for the rollout, `train_step_bench.TorchStep` for the update (`window`: its
  logits only at the batch's completion window, as the JAX side scores; `dtype` "bfloat16":
  both under `torch.autocast`)."""

  def __init__(self, path: str, window: bool = False, dtype: str = "float32"):
    import torch
    import transformers

    from benchmarks.train_step_bench import TorchStep

    torch.set_num_threads(engines._threads())
    self.torch = torch
    self.version = f"transformers {transformers.__version__}, torch {torch.__version__}"
    self.settings, batch = _settings(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    self.autocast = {"float32": None, "bfloat16": torch.bfloat16}[dtype]
    self.trainer = TorchStep(model, batch, window=window, autocast=self.autocast)
    self.model = model
    self.ids = torch.tensor(self.settings["prompts"])  # equal lengths: no padding
    self.calls = 0

  def _generate(self, new: int, **sampling):
    autocast = self.torch.autocast("cpu", dtype=self.autocast, enabled=self.autocast is not None)
    with self.torch.no_grad(), autocast:
      out = self.model.generate(
        self.ids,
        attention_mask=self.torch.ones_like(self.ids),
        max_new_tokens=new,
        min_new_tokens=new,
        eos_token_id=None,
        pad_token_id=0,
        **sampling,
      )
    return out[:, self.ids.shape[1] :]

  def greedy(self, new: int) -> dict:
    return {"tokens": self._generate(new, do_sample=False).tolist()}

  def rollout(self) -> dict:
    s = self.settings
    self.calls += 1
    self.torch.manual_seed(self.calls)
    out = self._generate(
      s["new_tokens"],
      do_sample=True,
      temperature=s["temperature"],
      top_p=s["top_p"],
      top_k=0,
      num_return_sequences=s["samples"],
    )
    return {"tokens": int(out.numel())}

  def train(self) -> dict:
    loss, norm = self.trainer.step()
    return {"loss": loss, "grad_norm": norm}


SIDES = {
  "jax": JaxSide,
  "jax_xla_attention": functools.partial(JaxSide, attention_threads=0),
  "jax_shared": functools.partial(JaxSide, share_prompts=True),
  "torch": TorchSide,
  "torch_window": functools.partial(TorchSide, window=True),
}


if __name__ == "__main__":
  dtype = sys.argv[3] if len(sys.argv) > 3 else "float32"
  engines.serve({k: functools.partial(v, dtype=dtype) for k, v in SIDES.items()}, sys.argv[1], sys.argv[2])
