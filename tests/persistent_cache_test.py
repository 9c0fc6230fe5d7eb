"""tests/conftest.py's `no_persistent_cache` keeps a test's compiles out of JAX's persistent cache even
in a worker that already compiled through it (JAX decides once per process whether it uses the
cache, so setting the flag alone changed nothing: a worker crashed in CI reading a half-written
entry inside a test that carried the fixture)."""

import jax
import jax.numpy as jnp
from jax._src import compilation_cache, xla_bridge


def _uses_cache() -> bool:
  return compilation_cache.is_cache_used(xla_bridge.get_backend())


def test_a_compile_before_the_fixture_uses_the_cache():
  jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()
  assert _uses_cache()


def test_the_fixture_turns_it_off_for_its_test(no_persistent_cache):
  jax.jit(lambda x: x * 3)(jnp.ones(3)).block_until_ready()
  assert not _uses_cache()


def test_and_back_on_after_it():
  jax.jit(lambda x: x * 5)(jnp.ones(3)).block_until_ready()
  assert _uses_cache()
