"""benchmarks/hlo_dots.py: the matmul FLOPs it reads from XLA:CPU's optimized HLO (dots at the top level and
inside YNNPACK fusions, batch dims, several contracted axes) against the shapes counted by hand."""
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
import hlo_dots  # noqa: E402  pylint: disable=wrong-import-position


def _step(a, b, p, v, x, w):
  plain = a @ b  # [64, 32], K=48
  batched = jnp.einsum("bts,bsd->btd", p, v)  # [3, 16, 8], K=24
  two_axes = jnp.einsum("ijk,jkl->il", x, w)  # [10, 6], K=4*5
  return jnp.sum(plain) + jnp.sum(jnp.tanh(batched)) + jnp.sum(two_axes * two_axes)


def test_counts_every_dot_of_the_compiled_module():
  shapes = [(64, 48), (48, 32), (3, 16, 24), (3, 24, 8), (10, 4, 5), (4, 5, 6)]
  args = [jnp.ones(s, jnp.float32) for s in shapes]
  hlo = jax.jit(_step).lower(*args).compile().as_text()
  flops = hlo_dots.dot_flops(hlo)
  expected = 2 * 64 * 32 * 48 + 2 * 3 * 16 * 8 * 24 + 2 * 10 * 6 * 20
  assert sum(flops.values()) == expected
  assert flops[((64, 32), 48)] == 2 * 64 * 32 * 48
  assert flops[((10, 6), 20)] == 2 * 10 * 6 * 20


def test_step_module_is_the_one_with_the_most_matmul_flops(tmp_path):
  def write(name, m):
    a = jnp.ones((m, 8), jnp.float32)
    (tmp_path / f"{name}.cpu_after_optimizations.txt").write_text(
        jax.jit(lambda a, b: a @ b).lower(a, a.T).compile().as_text())

  write("module_0001.jit_small", 4)
  write("module_0002.jit_step", 32)
  path, flops = hlo_dots.step_module(str(tmp_path))
  assert path.endswith("module_0002.jit_step.cpu_after_optimizations.txt")
  assert sum(flops.values()) == 2 * 32 * 32 * 8
