"""The shared-trunk objective equals the naive one (whole network under vmap), and the vmapped
objective equals the per-draw losses computed one draw at a time (docs/method.md, 'The equations and where they live').

Small networks (width 4-8, 16x16 or 32x32 images, batch 16) keep this to seconds on a CPU.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import init_variables, noise_view
from f2m_jax import base as base_lib
from f2m_jax import noise as noise_lib
from f2m_jax import optim
from f2m_jax import sharding
from f2m_jax import trees
from f2m_jax.models import build_model, noise_set_paths, split_block

_NOISE = dict(distribution='uniform', pf_weight=1.0, bn_updates='clean')

BATCH, CLASSES = 16, 4


def setup(arch: str, width: int, image_size: int, num_layers: int, num_draws: int = 2,
          std_weight: float = 0.0, dtype=jnp.float32):
  """(model, noise, params, batch_stats, images, labels, eps) for a random network and batch."""
  model = build_model(arch, CLASSES, width, dtype)
  variables = init_variables(model, image_size)
  paths = tuple(noise_set_paths(model, num_layers))
  noise = noise_view(num_layers=num_layers, M=num_draws, std_weight=std_weight, **_NOISE)
  k1, k2 = jax.random.split(jax.random.key(1))
  images = jax.random.normal(k1, (BATCH, image_size, image_size, 3))
  labels = jnp.arange(BATCH) % CLASSES
  eps = noise_lib.sample_noise(k2, variables['params'], paths, num_draws, 0.05)
  return model, noise, variables['params'], variables['batch_stats'], images, labels, eps


_value_and_grad = jax.jit(jax.value_and_grad(base_lib.base_loss, has_aux=True), static_argnums=(5, 6))
_forward = jax.jit(base_lib.base_loss, static_argnums=(5, 6))


def loss_and_grad(model, noise, params, batch_stats, images, labels, eps):
  """(loss, new batch_stats, grads wrt params) of base_loss, jitted with the network and noise static."""
  (loss, (stats, _)), grads = _value_and_grad(params, batch_stats, images, labels, eps, model, noise)
  return loss, stats, grads


def changed(noise, **fields):
  return noise_view(**{**noise, **fields})


def assert_trees_close(a, b, rtol=2e-5, scale_tol=1e-5):
  """Leafwise allclose; the absolute tolerance is scale_tol times the leaf's largest magnitude, since
  float32 sums in another order differ by that much relative to the largest terms."""
  flat_a, flat_b = trees.flatten(a), trees.flatten(b)
  assert flat_a.keys() == flat_b.keys()
  for path in flat_a:
    want = np.asarray(flat_b[path])
    atol = scale_tol * float(np.abs(want).max(initial=0.0)) + 1e-7
    np.testing.assert_allclose(np.asarray(flat_a[path]), want, rtol=rtol, atol=atol, err_msg='/'.join(path))


# Each network once, with a deep (K = 8) and a shallow (K = 4) noise set, and each way of mapping the
# draws once (compared directly below); each case costs two slow compiles, so the grid is not crossed.
# ResNet-18, the unrolled draws and bfloat16 are slow (each compiles a whole network anew).
CASES = [('resnet20', 8, 16, 8, 'vmap'), pytest.param('resnet18', 8, 32, 4, 'unroll', marks=pytest.mark.slow)]


@pytest.mark.parametrize('arch,width,size,num_layers,draw_map', CASES)
def test_shared_trunk_equals_naive(arch, width, size, num_layers, draw_map):
  model, noise, params, stats, images, labels, eps = setup(arch, width, size, num_layers)
  noise = changed(noise, draw_map=draw_map)
  assert 0 < split_block(model, list(eps)) < model.num_blocks  # a real trunk/suffix split
  shared = loss_and_grad(model, noise, params, stats, images, labels, eps)
  naive_noise = changed(noise, shared_trunk=False)
  naive = loss_and_grad(model, naive_noise, params, stats, images, labels, eps)
  np.testing.assert_allclose(float(shared[0]), float(naive[0]), rtol=1e-6)
  assert_trees_close(shared[1], naive[1])  # running statistics: clean pass only, same in both
  assert_trees_close(shared[2], naive[2])
  if arch == 'resnet20':  # BN statistics from every pass: the shared trunk counts M + 1 updates too
    every = [_forward(params, stats, images, labels, eps, model, changed(n, bn_updates='all_passes'))[1][0]
             for n in (noise, naive_noise)]  # the statistics need no backward pass
    assert_trees_close(every[0], every[1])
    assert float(jnp.abs(every[0]['bn1']['mean'] - shared[1]['bn1']['mean']).max()) > 0  # and they differ
  # The gradient reaches the trunk and the noise set (it is not trivially zero).
  g = trees.flatten(shared[2])
  assert float(jnp.abs(g[('conv1', 'kernel')]).max()) > 0
  assert float(jnp.abs(g[max(eps)]).max()) > 0


@pytest.mark.parametrize('std_weight,draw_map', [pytest.param(0.0, 'unroll', marks=pytest.mark.slow), (2.0, 'vmap')])
def test_mapped_draws_equal_a_loop_over_draws(std_weight, draw_map):
  """Eq. 3 with M = 3 draws (vmapped or unrolled) equals the loss and gradient assembled from M
  one-draw evaluations: mean_j L_j (+ gamma * unbiased std_j L_j, whose gradient is computed by hand)."""
  m = 3
  model, noise, params, stats, images, labels, eps = setup('resnet20', 4, 16, 4, num_draws=m, std_weight=std_weight)
  loss, new_stats, grads = loss_and_grad(model, changed(noise, draw_map=draw_map), params, stats, images, labels, eps)

  one = changed(noise, M=1, std_weight=0.0, draw_map='unroll')
  per_draw = [loss_and_grad(model, one, params, stats, images, labels, {p: e[j:j + 1] for p, e in eps.items()})
              for j in range(m)]
  losses = np.asarray([float(l) for l, _, _ in per_draw], np.float64)
  mean, std = losses.mean(), losses.std(ddof=1)
  # d std / d L_j = (L_j - mean) / ((M - 1) std); d mean / d L_j = 1 / M.
  weights = 1.0 / m + std_weight * (losses - mean) / ((m - 1) * std)
  want_grads = jax.tree_util.tree_map(lambda *g: sum(w * x for w, x in zip(weights, g)),
                                      *[g for _, _, g in per_draw])
  np.testing.assert_allclose(float(loss), mean + std_weight * std, rtol=1e-5)
  assert_trees_close(grads, want_grads, rtol=1e-4, scale_tol=2e-5)
  assert_trees_close(new_stats, per_draw[0][1])


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_state():
  """model.dtype='bfloat16': the loss is close to float32's on the same batch and draws, and a train
  step runs, with a finite loss, leaving the parameters, BN statistics and optimizer state float32."""
  from f2m_jax.data import synthetic
  cases = {dtype: setup('resnet20', 8, 16, 4, dtype=dtype) for dtype in (jnp.float32, jnp.bfloat16)}
  losses = {dtype: float(_forward(*case[2:], *case[:2])[0]) for dtype, case in cases.items()}
  np.testing.assert_allclose(losses[jnp.bfloat16], losses[jnp.float32], rtol=5e-2)
  assert losses[jnp.bfloat16] != losses[jnp.float32]  # computed in bfloat16 indeed
  bench = synthetic.make_synthetic(num_base=CLASSES, way=1, num_sessions=1, train_per_class=4,
                                   test_per_class=1, image_size=16)
  tx = optim.sgd(0.1, 0.9, 5e-4, (), 0.1)
  model, noise = cases[jnp.bfloat16][:2]
  state = jax.jit(lambda k: base_lib.init_state(model, k, 16, tx))(jax.random.key(0))
  program = base_lib.make_train_program(model, noise, tx, bench, 'unroll', sharding.data_mesh())
  states, metrics = program(trees.stack([state]), bench.train.images, bench.train.labels,
                            np.arange(len(bench.train.labels), dtype=np.int32)[None, None], np.int32(1),
                            jnp.stack([jax.random.key(3)]), np.float32([0.05]))
  state = trees.index(states, 0)
  assert np.isfinite(float(metrics['loss'][0, 0]))
  leaves = jax.tree_util.tree_leaves((state.params, state.batch_stats, state.opt_state))
  assert all(leaf.dtype == jnp.float32 for leaf in leaves if jnp.issubdtype(leaf.dtype, jnp.floating))
