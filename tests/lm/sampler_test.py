"""The sampler against transformers' greedy generate, and its sampling contracts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import lm
from lm import sampler as sampler_lib
from lm import scoring, sharding
from tests.lm.hf_helpers import save_tiny

PROMPTS = [[5, 17, 33, 2, 90, 41, 7], [12, 3], [64, 65, 66, 67, 99]]


def _load(tmp_path_factory, kind):
  hf_model, path = save_tiny(tmp_path_factory.mktemp(kind), kind=kind, vocab=128)
  return hf_model, lm.load_hf(path, dtype="float32")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """Qwen3 for the sampling contracts (they do not depend on the family)."""
  return _load(tmp_path_factory, "qwen3")


def _hf_greedy(hf_model, prompts, max_new_tokens, eos_id):
  width = max(len(p) for p in prompts)
  ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
  mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
  with torch.no_grad():
    out = hf_model.generate(
      input_ids=ids,
      attention_mask=mask,
      do_sample=False,
      max_new_tokens=max_new_tokens,
      eos_token_id=eos_id,
      pad_token_id=0,
    )
  rows = []
  for row in out[:, width:].tolist():
    rows.append(row[: row.index(eos_id)] if eos_id in row else row)
  return rows


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen3", "qwen2"])
def test_greedy_equals_transformers_generate(tmp_path_factory, kind):
  hf_model, model = _load(tmp_path_factory, kind)
  sampler = sampler_lib.Sampler(model)
  # Pick as EOS a token greedy decoding actually emits, so stopping is exercised too.
  free = sampler.generate(PROMPTS, max_new_tokens=12, temperature=0.0)
  eos = free.tokens[0][0][4]
  out = sampler.generate(PROMPTS, max_new_tokens=12, temperature=0.0, eos_ids=[eos])
  expected = _hf_greedy(hf_model, PROMPTS, 12, eos)
  assert [s[0] for s in out.tokens] == expected
  assert out.finish_reasons[0][0] == "stop" and eos not in out.tokens[0][0]
  assert all(len(t[0]) == 12 or r[0] == "stop" for t, r in zip(out.tokens, out.finish_reasons, strict=True))


@pytest.mark.slow
def test_sample_is_the_same_alone_and_in_a_batch(checkpoint):
  _, model = checkpoint
  sampler = sampler_lib.Sampler(model)
  kwargs = dict(max_new_tokens=10, n=2, temperature=1.0, seed=7)
  batch = sampler.generate(PROMPTS, **kwargs)
  alone = sampler.generate([PROMPTS[1]], **kwargs)
  assert alone.tokens[0] == batch.tokens[1]
  np.testing.assert_allclose(alone.logprobs[0][1], batch.logprobs[1][1], atol=1e-5)
  assert len({tuple(t) for t in batch.tokens[0]}) > 1  # the n samples differ


def test_seed_reproducibility_and_per_prompt_parameters(checkpoint):
  _, model = checkpoint
  sampler = sampler_lib.Sampler(model)
  a = sampler.generate(PROMPTS, max_new_tokens=8, n=2, seed=3)
  b = sampler.generate(PROMPTS, max_new_tokens=8, n=2, seed=3)
  c = sampler.generate(PROMPTS, max_new_tokens=8, n=2, seed=4)
  assert a.tokens == b.tokens and a.tokens != c.tokens
  mixed = sampler.generate(PROMPTS, max_new_tokens=8, n=2, temperature=[0.0, 1.0, 0.0], seed=[1, 3, 1])
  greedy = sampler.generate(PROMPTS, max_new_tokens=8, n=2, temperature=0.0)
  assert mixed.tokens[0] == greedy.tokens[0] and mixed.tokens[2] == greedy.tokens[2]
  assert mixed.tokens[1] == a.tokens[1]  # sample 0 of seed 3 whatever the batch around it


@pytest.mark.slow
def test_sampler_logprobs_equal_scoring_logprobs(checkpoint):
  _, model = checkpoint
  out = sampler_lib.Sampler(model).generate(PROMPTS, max_new_tokens=9, n=2, temperature=0.8, seed=1)
  prompts = [p for p in PROMPTS for _ in range(2)]
  completions = [t for per_prompt in out.tokens for t in per_prompt]
  batch = {k: jnp.asarray(v) for k, v in scoring.pack_pairs(prompts, completions).items()}
  per_token, _ = scoring.sequence_logprobs(model, batch, chunk=48)
  for i, lp in enumerate(lp for per_prompt in out.logprobs for lp in per_prompt):
    np.testing.assert_allclose(np.asarray(per_token[i])[batch["completion_mask"][i] == 1], lp, atol=1e-4)


def test_stop_sequences_end_rows_early(checkpoint):
  _, model = checkpoint
  sampler = sampler_lib.Sampler(model)
  free = sampler.generate(PROMPTS, max_new_tokens=12, temperature=0.0)
  row = free.tokens[2][0]
  stop = row[3:5]
  out = sampler.generate(PROMPTS, max_new_tokens=12, temperature=0.0, stop=[stop])
  cut = next(i for i in range(len(row) - 1) if row[i : i + 2] == stop)
  assert out.tokens[2][0] == row[:cut]
  assert out.finish_reasons[2][0] == "stop"
  np.testing.assert_allclose(out.logprobs[2][0], free.logprobs[2][0][:cut], atol=1e-6)


def test_first_argmax_is_argmax_with_ties_to_the_first_index():
  logits = jax.random.normal(jax.random.key(0), (6, 50))
  logits = logits.at[1].set(0.0).at[2, 7].set(9.0).at[2, 31].set(9.0).at[3, 49].set(jnp.inf)  # ties, inf
  np.testing.assert_array_equal(sampler_lib.first_argmax(logits), jnp.argmax(logits, axis=-1))
  assert sampler_lib.first_argmax(logits).dtype == jnp.int32


def test_top_k_and_top_p_never_emit_excluded_tokens():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.1, 0.06, 0.04]] * 3, jnp.float32))
  keys = jax.random.split(jax.random.key(0), 2000)
  draw = jax.jit(
    jax.vmap(
      lambda k, tp, tk: sampler_lib.sample_token(logits, jnp.stack([k] * 3), jnp.ones(3), tp, tk),
      in_axes=(0, None, None),
    )
  )
  tokens = np.asarray(draw(keys, jnp.asarray([1.0, 0.7, 0.85]), jnp.asarray([2, 0, 0])))  # [2000, 3]
  assert set(tokens[:, 0]) == {0, 1}  # top-k 2
  assert set(tokens[:, 1]) == {0, 1}  # top-p 0.7: 0.5 + 0.3 covers it
  assert set(tokens[:, 2]) == {0, 1, 2}  # top-p 0.85 needs the third token
  frac = np.mean(tokens[:, 0] == 0)
  assert abs(frac - 0.5 / 0.8) < 0.05  # renormalised within the kept set


def test_the_nucleus_from_candidates_is_the_one_a_full_sort_finds():
  """`_truncate` looks for each row's top-k / top-p set among its 64 largest logits and sorts the
  whole row only when some row's set does not end there: the same sets either way."""
  batch, vocab = 16, 4096
  fast, sort = jax.jit(sampler_lib._truncate), jax.jit(sampler_lib._truncate_sorted)
  candidates = jax.jit(sampler_lib._truncate_candidates)
  taken = {True: 0, False: 0}
  for seed in range(12):
    rng = np.random.default_rng(seed)
    scale = (0.3, 3.0, 30.0)[seed % 3]  # flat rows (nuclei of thousands) to near-greedy ones
    logits = jnp.asarray(rng.normal(size=(batch, vocab)).astype(np.float32) * scale / 0.2)
    top_p = jnp.asarray(rng.choice([0.5, 0.9, 0.99, 1.0], batch).astype(np.float32))
    top_k = jnp.asarray(rng.choice([0, 0, 1, 7, 64] + [100] * (seed % 2), batch).astype(np.int32))
    expected = np.isneginf(np.asarray(sort(logits, top_p, top_k)))
    np.testing.assert_array_equal(np.isneginf(np.asarray(fast(logits, top_p, top_k))), expected)
    masked, found = candidates(logits, top_p, top_k)
    found = np.asarray(found)
    # every row the candidates claim to hold is masked as the full sort masks it
    np.testing.assert_array_equal(np.isneginf(np.asarray(masked))[found], expected[found])
    taken[bool(found.all())] += 1
  assert taken[True] and taken[False]  # both paths ran
  assert np.all(~np.isneginf(np.asarray(fast(logits, jnp.ones(batch), jnp.zeros(batch, jnp.int32)))))


def test_top_k_one_is_greedy(checkpoint):
  _, model = checkpoint
  sampler = sampler_lib.Sampler(model)
  assert (
    sampler.generate(PROMPTS, max_new_tokens=6, temperature=1.5, top_k=1, seed=9).tokens
    == sampler.generate(PROMPTS, max_new_tokens=6, temperature=0.0).tokens
  )


@pytest.mark.slow
def test_sharded_sampling_equals_single_device(checkpoint):
  _, model = checkpoint
  expected = sampler_lib.Sampler(model).generate(PROMPTS, max_new_tokens=8, n=2, seed=5)
  mesh = sharding.make_mesh(sharding.MeshConfig(data=4, fsdp=1, tp=2))
  sharded_model = jax.tree.map(lambda x: x, model)  # a second model object over the same arrays
  sharding.shard_model(sharded_model, mesh)
  out = sampler_lib.Sampler(sharded_model, mesh=mesh).generate(PROMPTS, max_new_tokens=8, n=2, seed=5)
  assert out.tokens == expected.tokens
  np.testing.assert_allclose(
    np.concatenate([np.concatenate(x) for x in out.logprobs]),
    np.concatenate([np.concatenate(x) for x in expected.logprobs]),
    atol=1e-5,
  )


def test_rejects_bad_requests(checkpoint):
  _, model = checkpoint
  sampler = sampler_lib.Sampler(model)
  with pytest.raises(ValueError, match="at least one token"):
    sampler.generate([[1], []], max_new_tokens=2)
  with pytest.raises(ValueError, match="temperature has 1 values for 2 prompts"):
    sampler.generate([[1], [2]], max_new_tokens=2, temperature=[0.5])
  with pytest.raises(ValueError, match="stop strings need a Sampler built with a tokenizer"):
    sampler.generate([[1]], max_new_tokens=2, stop=["x"])


def test_per_prompt_max_new_tokens(checkpoint):
  _, model = checkpoint
  sampler = sampler_lib.Sampler(model)
  full = sampler.generate(PROMPTS, max_new_tokens=12, temperature=0.0)
  out = sampler.generate(PROMPTS, max_new_tokens=[3, 12, 7], temperature=0.0)
  assert [len(t[0]) for t in out.tokens] == [3, 12, 7]
  assert [t[0] for t in out.tokens] == [f[0][:m] for f, m in zip(full.tokens, [3, 12, 7], strict=True)]
  assert {r[0] for r in out.finish_reasons} == {"length"}


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU compiler options")
def test_cpu_decode_options_give_skinny_dots_to_eigen():
  # The sampler's speed on CPU rests on these options (see `_CPU_DECODE_OPTIONS`): by default
  # XLA:CPU wraps a decode-shaped product in a YNNPACK fusion; with them it is a plain dot. If a
  # jax upgrade changes either side, this fails and the options need revisiting.
  x, w = jnp.ones((8, 512)), jnp.ones((512, 1536))
  product = lambda x, w: x @ w

  def compiled_text(options):
    return jax.jit(product, compiler_options=options).lower(x, w).compile().as_text()

  assert "__ynn_fusion" in compiled_text(None)
  assert "__ynn_fusion" not in compiled_text(sampler_lib._CPU_DECODE_OPTIONS)
  np.testing.assert_allclose(
    jax.jit(product, compiler_options=sampler_lib._CPU_DECODE_OPTIONS)(x, w), jnp.full((8, 1536), 512.0)
  )


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU compiler options")
def test_cpu_decode_reductions_go_to_ynnpack_only_with_grouped_queries():
  # A decode step's attention reductions (`lm.model.attention`, t = 1): YNNPACK's where queries are
  # grouped, XLA's own where there are as many kv heads as query heads (see
  # `_CPU_DECODE_OPTIONS_NO_GROUPS` for the measurements). Both compute the same scores.
  q, k = jnp.ones((8, 4, 1, 16)), jnp.ones((8, 4, 64, 16))
  scores = lambda q, k: jnp.sum(q[:, :, :, None, :] * k[:, :, None], axis=-1)

  def run(grouped):
    fn = jax.jit(scores, compiler_options=sampler_lib._decode_options(grouped))
    return fn.lower(q, k).compile().as_text(), fn(q, k)

  (with_groups, a), (without, b) = run(True), run(False)
  assert "__ynn_fusion" in with_groups and "__ynn_fusion" not in without
  np.testing.assert_allclose(a, jnp.full((8, 4, 1, 64), 16.0))
  np.testing.assert_allclose(b, a)


def test_phase_ends_halve_down_from_the_step_bucket():
  assert sampler_lib._phase_ends(128, 3) == (32, 64, 128)
  assert sampler_lib._phase_ends(64, 1) == (64,)
  assert sampler_lib._phase_ends(2, 3) == (1, 2)
  # The default floor: buckets up to 2 × 128 steps decode in one phase, longer ones in up to 3.
  config = sampler_lib.SamplerConfig()
  ends = lambda steps: sampler_lib._phase_ends(steps, config.decode_phases, config.decode_phase_min_steps)
  assert ends(128) == (128,) and ends(192) == (192,) and ends(256) == (128, 256)
  assert ends(1024) == (256, 512, 1024) and ends(2048) == (512, 1024, 2048)


@pytest.mark.slow
def test_decode_in_phases_equals_one_phase_over_the_whole_cache_and_streamed(checkpoint):
  # 40 new tokens in a 64-step bucket cross every phase boundary (16, 32); greedy rows also match
  # transformers across them, and sampled rows (same seeds) match the single-phase decode.
  hf_model, model = checkpoint
  phased = sampler_lib.Sampler(
    model, config=sampler_lib.SamplerConfig(decode_phases=3, decode_phase_min_steps=16)
  )
  whole = sampler_lib.Sampler(model, config=sampler_lib.SamplerConfig(decode_phases=1))
  greedy = phased.generate(PROMPTS, max_new_tokens=40, temperature=0.0)
  assert [t[0] for t in greedy.tokens] == _hf_greedy(hf_model, PROMPTS, 40, eos_id=-1)
  kwargs = dict(max_new_tokens=40, n=2, temperature=1.0, seed=3)
  a, b = phased.generate(PROMPTS, **kwargs), whole.generate(PROMPTS, **kwargs)
  assert a.tokens == b.tokens and all(len(t) == 40 for per in a.tokens for t in per)
  for la, lb in zip(a.logprobs, b.logprobs, strict=True):
    np.testing.assert_allclose(np.array(la), np.array(lb), atol=1e-5)
  # Streamed (a device call per 8 steps, across the phase boundaries): the same samples, and the
  # tokens handed out as they were made join to them.
  made, calls = {}, []

  def on_tokens(prompt, sample, start, token_ids, logprobs):
    assert start == len(made.setdefault((prompt, sample), [])) and len(token_ids) == len(logprobs)
    made[prompt, sample] += token_ids
    calls.append(len(token_ids))

  streamed = phased.generate(PROMPTS, **kwargs, on_tokens=on_tokens, stream_every=8)
  assert streamed.tokens == a.tokens
  for la, ls in zip(a.logprobs, streamed.logprobs, strict=True):
    np.testing.assert_allclose(np.array(ls), np.array(la), atol=1e-6)
  assert made == {(i, j): a.tokens[i][j] for i in range(3) for j in range(2)}
  assert max(calls) <= 8 and len(calls) == 6 * 6  # the first token, then 5 chunks of at most 8, per row


@pytest.mark.slow
def test_samples_sharing_their_prompts_cache_equal_samples_with_copies_of_it(checkpoint):
  # share_prefix: the n samples of a prompt read its prompt's KV once (lm.model.shared_prefix_attention)
  # instead of n copies. Greedy rows match transformers at n = 3; sampled rows (same seeds) match the
  # copies, across the phase boundaries of a 64-step bucket.
  hf_model, model = checkpoint
  config = lambda share: sampler_lib.SamplerConfig(share_prefix=share, decode_phase_min_steps=16)
  kwargs = dict(max_new_tokens=40, n=3, temperature=[0.0, 1.0, 0.7], seed=4)
  shared = sampler_lib.Sampler(model, config=config(True)).generate(PROMPTS, **kwargs)
  copies = sampler_lib.Sampler(model, config=config(False)).generate(PROMPTS, **kwargs)
  assert shared.tokens == copies.tokens
  for a, b in zip(shared.logprobs, copies.logprobs, strict=True):
    np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5)
  assert shared.tokens[0] == [_hf_greedy(hf_model, PROMPTS[:1], 40, eos_id=-1)[0]] * 3
  assert len({tuple(t) for t in shared.tokens[1]}) > 1  # the sampled rows differ


def test_one_new_token_is_the_first_token_of_a_longer_call_without_a_loop(checkpoint):
  # max_new_tokens 1 is a step bucket of its own (`Sampler._prepare`): `begin` alone, no decode loop
  # and no cache grown for it; its token, log-prob and finish reason are a longer call's first.
  _, model = checkpoint
  sampler = sampler_lib.Sampler(model)
  longer = sampler.generate(PROMPTS, max_new_tokens=6, temperature=0.0)
  eos = longer.tokens[1][0][0]  # the second prompt's first token ends that row at once
  one = sampler.generate(PROMPTS, max_new_tokens=1, temperature=0.0, eos_ids=[eos])
  for row in (0, 2):
    assert one.tokens[row][0] == longer.tokens[row][0][:1]
    np.testing.assert_allclose(one.logprobs[row][0], longer.logprobs[row][0][:1], atol=1e-5)
    assert one.finish_reasons[row][0] == "length"
  assert one.tokens[1][0] == [] and one.finish_reasons[1][0] == "stop"
  # no decode loop in the one-token program (its other loops are the sampling's random bits)
  text = {n: sampler.lowered(PROMPTS, max_new_tokens=n)["decode"].compile().as_text() for n in (1, 2)}
  assert text[1].count(" while(") < text[2].count(" while(")


@pytest.mark.parametrize("fused", [False, True], ids=["per_weight", "fused"])
@pytest.mark.parametrize("kernels", [None, 0], ids=["cpu_kernels", "xla_ops"])
def test_a_prefill_runs_its_last_layer_past_attention_at_the_last_position_only(checkpoint, fused, kernels):
  """`hidden_states(..., last_only=True)` (the sampler's prefill, which reads the last position's
  logits only): [B, 1, D], the last position's hidden state and every layer's cache as the whole
  prefill has them (the fused weights with the CPU kernels take the attention block's path)."""
  from lm import model as model_lib

  _, model = checkpoint
  width = max(len(p) for p in PROMPTS)
  tokens = jnp.asarray([[0] * (width - len(p)) + p for p in PROMPTS])
  mask = jnp.asarray([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
  weights = model_lib.fuse_projections(model.stacked_layer_weights()) if fused else None
  got = {}
  with model_lib.cpu_attention(kernels):
    for last_only in (False, True):
      got[last_only] = model.hidden_states(
        tokens,
        positions=model_lib.default_positions(mask),
        attention_mask=mask,
        cache=model.init_cache(len(PROMPTS), width, jnp.float32),
        cache_index=0,
        layer_weights=weights,
        last_only=last_only,
      )
  (full, full_cache), (last, last_cache) = got[False], got[True]
  assert last.shape == (len(PROMPTS), 1, full.shape[-1])
  np.testing.assert_allclose(last[:, 0], full[:, -1], atol=1e-5)
  assert np.abs(np.asarray(last[:, 0] - full[:, 0])).max() > 1e-2  # not any position's
  for a, b in zip(jax.tree.leaves(last_cache), jax.tree.leaves(full_cache), strict=True):
    np.testing.assert_array_equal(a, b)
