"""The training path's products: `lm.model.einsum` (gradients written as their own einsums) and the
unrolled layer loop (`ModelConfig.unroll_layers`) compute what `jnp.einsum` and the scan compute."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lm import model as model_lib
from lm.config import ModelConfig
from lm.model import Qwen

SHAPES = dict(b=2, t=5, s=5, d=6, f=7, n=4, k=2, g=2, h=3, r=2, v=9)


def _operand(axes: str, seed: int) -> jax.Array:
  return jax.random.normal(jax.random.key(seed), tuple(SHAPES[a] for a in axes))


@pytest.mark.parametrize(
  "spec",
  [
    "btd,dnh->btnh",  # q projection
    "btnh,nhd->btd",  # output projection
    "btf,fd->btd",  # MLP down
    "btd,dr->btr",  # LoRA A
    "btkgh,bksh->bkgts",  # attention scores
    "bkgts,bksh->btkgh",  # attention values
    "bd,dv->v",  # an axis of one operand only (b): not expressible as the two einsums, plain einsum
  ],
)
def test_einsum_value_and_gradients_equal_jnp_einsum(spec):
  operands, out = spec.split("->")
  a_axes, b_axes = operands.split(",")
  a, b = _operand(a_axes, 0), _operand(b_axes, 1)
  ct = _operand(out, 2)
  ours, ours_vjp = jax.vjp(lambda a, b: model_lib.einsum(spec, a, b), a, b)
  theirs, theirs_vjp = jax.vjp(lambda a, b: jnp.einsum(spec, a, b), a, b)
  np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
  for mine, ref in zip(ours_vjp(ct), theirs_vjp(ct), strict=True):
    assert mine.shape == ref.shape and mine.dtype == ref.dtype
    np.testing.assert_allclose(mine, ref, rtol=1e-5, atol=1e-5)


def test_unrolled_layers_equal_the_scan_and_leave_no_loop():
  scanned = dataclasses.replace(ModelConfig.tiny_qwen3(), unroll_layers=0)
  unrolled = dataclasses.replace(scanned, unroll_layers=scanned.num_layers)
  tokens = jax.random.randint(jax.random.key(3), (2, 12), 0, scanned.vocab_size)
  mask = jnp.ones((2, 12), bool).at[1, :4].set(False)

  def loss_and_grads(config):
    model = Qwen(config, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)

    def loss(params):
      hidden, _ = nnx.merge(graphdef, params).hidden_states(tokens, attention_mask=mask)
      return jnp.sum(jnp.sin(hidden))

    fn = jax.jit(jax.value_and_grad(loss))
    return fn(params), fn.lower(params).compile().as_text()

  (value_s, grads_s), hlo_s = loss_and_grads(scanned)
  (value_u, grads_u), hlo_u = loss_and_grads(unrolled)
  np.testing.assert_allclose(value_u, value_s, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grads_u), jax.tree.leaves(grads_s), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(b))))  # float reassociation
  assert " while(" in hlo_s and " while(" not in hlo_u


def test_unroll_layers_is_checked():
  with pytest.raises(ValueError, match="unroll_layers"):
    dataclasses.replace(ModelConfig.tiny_qwen3(), unroll_layers=-1)
