"""One LLM role's config section, shared by every config that names a generator (configs/kace.py,
configs/serve.py). Its fields and defaults are those of lm.generators.GeneratorConfig (written out
so that config files import no library module; tests/kace/config_test.py checks that they agree).
"""

import ml_collections


def generator_config(**overrides) -> ml_collections.ConfigDict:
  """One LLM role's section (the fields of lm.generators.GeneratorConfig, at its defaults)."""
  c = ml_collections.ConfigDict(
    dict(
      kind="jax",
      checkpoint="",
      preset="",
      tokenizer="",
      dtype="bfloat16",
      seed=0,
      mesh=dict(data=1, fsdp=1, tp=1),
      sampler=dict(min_prompt_bucket=16, step_bucket=64, max_rows=256),
      base_url="http://127.0.0.1:8000/v1",
      model="",
      api_key_env="OPENAI_API_KEY",
      max_concurrency=8,
      max_retries=5,
      timeout=600.0,
      cache_dir="",
      model_id="",
    )
  )
  c.update(overrides)
  return c
