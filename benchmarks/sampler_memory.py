"""The sampler's decode memory on a mesh, from compiles on fake CPU devices (docs/sampler.md).

  python -m benchmarks.sampler_memory          # 8 fake CPU devices; prints markdown tables

1. Weights: a model sharded over fsdp 8 (the training layout), its decode program compiled in the
   training layout and in the sampler's own (`lm.sharding.DECODE_SHARDING`, tensor parallel):
   bytes all-gathered outside / inside the decode loop (`lm.sampler.gathered_bytes`) and XLA's
   per-device memory analysis (arguments, temporaries).
2. KV cache: the same decode program with the n samples of a prompt copying its prompt's cache or
   sharing it (`SamplerConfig.share_prefix`), compiled; and the cache of Qwen3-4B computed from its
   dimensions (bf16) at n = 8 and a 1,024-token prompt.
Every figure is from a compile or counted from shapes, as labelled: nothing here is timed.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax
from flax import nnx

from lm import sampler as sampler_lib
from lm import sharding
from lm.config import ModelConfig
from lm.model import Qwen

MiB, GiB = 2**20, 2**30


def kv_bytes(
  config: ModelConfig, *, prompts: int, n: int, prompt_len: int, new: int, shared: bool, itemsize=2
):
  """KV-cache bytes of `prompts` prompts × n samples: copied, every row holds prompt + new slots;
  shared, the prompt's slots once per prompt and each row its new ones."""
  per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize
  if shared:
    return per_token * (prompts * prompt_len + prompts * n * new)
  return per_token * prompts * n * (prompt_len + new)


def _decode(model, mesh, layout, config, prompt_len, n):
  sampler = sampler_lib.Sampler(model, mesh=mesh, sharding=layout, config=config)
  lowered = sampler.lowered([[5] * prompt_len] * 8, max_new_tokens=64, n=n)["decode"]
  compiled = lowered.compile()
  return sampler_lib.gathered_bytes(compiled.as_text()), compiled.memory_analysis()


def main():
  # Every axis divides by 8: heads, kv heads, MLP and vocabulary split evenly over 8 devices.
  config = ModelConfig(1024, 128, 512, 2, 8, 8, 16, bos_token_id=None, eos_token_ids=(1,), pad_token_id=0)
  model = Qwen(config, rngs=nnx.Rngs(0))
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=8, tp=1))
  sharding.shard_model(model, mesh)
  full = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  print(
    f"model {config.num_layers} layers, D {config.hidden_size}, V {config.vocab_size}: weights {full:,} B"
  )
  print("decode of 8 prompts x n=2, prompt 16, 64 new tokens, mesh fsdp=8 (from compiles)\n")
  print("| layout | gathered outside loop | gathered inside loop | arguments | temporaries |")
  print("|---|---|---|---|---|")
  plain = sampler_lib.SamplerConfig(share_prefix=False)
  for name, layout in (
    ("training (D over fsdp)", sharding.ShardingConfig()),
    ("decode (tensor parallel)", None),
  ):
    g, m = _decode(model, mesh, layout, plain, 16, 2)
    row = [g["outside"], g["inside"], m.argument_size_in_bytes, m.temp_size_in_bytes]
    print(f"| {name} | " + " | ".join(f"{v:,} B" for v in row) + " |")

  print("\ndecode of 8 prompts x n=8, prompt 1,024, 64 new tokens, decode layout (from compiles)\n")
  print("| prompt KV | counted KV cache (all devices) | compiled temporaries per device |")
  print("|---|---|---|")
  for share in (False, True):
    _, m = _decode(model, mesh, None, sampler_lib.SamplerConfig(share_prefix=share), 1024, 8)
    kv = kv_bytes(config, prompts=8, n=8, prompt_len=1024, new=64, shared=share, itemsize=4)
    name = "shared" if share else "copied n times"
    print(f"| {name} | {kv / MiB:.1f} MiB | {m.temp_size_in_bytes / MiB:.1f} MiB |")

  big = ModelConfig.qwen3_4b()
  print("\nQwen3-4B KV cache (bf16), one prompt of 1,024 tokens, n = 8 (counted from its dimensions)\n")
  print("| new tokens | copied n times | shared | ratio |")
  print("|---|---|---|---|")
  for new in (512, 1024, 4096):
    copied = kv_bytes(big, prompts=1, n=8, prompt_len=1024, new=new, shared=False)
    shared = kv_bytes(big, prompts=1, n=8, prompt_len=1024, new=new, shared=True)
    print(f"| {new:,} | {copied / GiB:.2f} GiB | {shared / GiB:.2f} GiB | {copied / shared:.2f}x |")


if __name__ == "__main__":
  main()
