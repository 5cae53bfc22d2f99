"""The convolutions of S members and of M noise draws stay the three convolutions of one run, with
S (or S x M) times the channels: forward and input gradient with feature_group_count, the kernel
gradient with batch_group_count (the form GPUs run as cuDNN's backward-filter kernel). vmap's
generic rule would compute each kernel gradient as a grouped *forward* convolution whose filter is
the whole output gradient. The steps (model.conv_backward='xla', what 'auto' takes on a GPU) are
lowered for CUDA here, on the CPU (no GPU needed), and the batching rule of models/resnet.py is checked
against per-member gradients in float64.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from f2m_jax import base as base_lib
from f2m_jax import optim
from f2m_jax.data import synthetic
from f2m_jax.models import build_model, noise_set_paths, resnet, split_block

CONV = re.compile(r'stablehlo\.convolution.*dim_numbers = \[(\w), .*?\]x\[.*?batch_group_count = (\d+) : i64, '
                  r'feature_group_count = (\d+) : i64')


def convolutions(fn, *args) -> list:
  """(kind, batch_group_count, feature_group_count) of every convolution of `fn` lowered for CUDA;
  kind 'kernel_grad' where the lhs holds the features first (jax's transpose in the kernel, with the
  images' batch as the contracted axis), 'other' for forward and input-gradient convolutions."""
  text = jax.jit(fn).trace(*args).lower(lowering_platforms=('cuda',)).as_text()
  found = [CONV.search(line) for line in text.splitlines() if 'stablehlo.convolution' in line]
  assert found and all(found), 'a convolution the pattern does not parse'
  return [('kernel_grad' if m.group(1) == 'f' else 'other', int(m.group(2)), int(m.group(3))) for m in found]


def slow_kernel_grads(convs) -> list:
  return [c for c in convs if c[0] == 'kernel_grad' and c[2] > 1]


def test_the_check_catches_vmaps_generic_kernel_gradient():
  """The detector itself: vmap of a plain convolution's gradient is the pattern we avoid."""
  conv = lambda k, x: jnp.sum(jax.lax.conv_general_dilated(x, k, (1, 1), 'SAME', dimension_numbers=resnet.LAYOUT) ** 2)
  args = (jnp.ones((2, 3, 3, 4, 8)), jnp.ones((2, 5, 8, 8, 4)))
  assert slow_kernel_grads(convolutions(jax.vmap(jax.grad(conv)), *args))
  assert not slow_kernel_grads(convolutions(jax.grad(lambda k, x: jnp.sum(jax.vmap(conv)(k, x))), *args))


def _step_setup(num_draws: int, draw_map: str):
  data = synthetic.make_synthetic(num_base=4, way=1, num_sessions=1, train_per_class=2, test_per_class=1,
                                  image_size=16)
  model = build_model('resnet20', 4, 4, clean_backward=False, conv_backward='xla')
  paths = tuple(noise_set_paths(model, 4))
  objective = base_lib.BaseObjective(model=model, noise_paths=paths, split=split_block(model, paths),
                                     num_draws=num_draws, distribution='uniform', pf_weight=1.0,
                                     std_weight=2.0, shared_trunk=True, draw_map=draw_map)
  tx = optim.sgd(0.1, 0.9, 5e-4, (), 0.1)
  step = base_lib.make_train_step(objective, tx, 'crop_flip', 16, data.mean, data.std)
  state = jax.jit(lambda k: base_lib.init_state(model, k, 16, tx))(jax.random.key(0))
  return step, state, data.train.images[:8], data.train.labels[:8]


@pytest.mark.parametrize('members, draws', [(1, 2), (2, 2), (3, 1)])
def test_member_and_draw_steps_keep_kernel_gradients_on_backward_filter_convolutions(members, draws):
  step, state, images, labels = _step_setup(draws, 'vmap')
  stacked = jax.tree_util.tree_map(lambda x: np.stack([x] * members), state)  # on the host: no op-by-op compiles
  fn = base_lib.map_members(step, 'vmap')
  convs = convolutions(fn, stacked, np.stack([images] * members), np.stack([labels] * members),
                       jnp.stack([jax.random.key(i) for i in range(members)]), jnp.full((members,), 0.01))
  assert not slow_kernel_grads(convs)
  # the members (and the noised layers' draws) really are folded into the groups
  groups = {c[1] for c in convs if c[0] == 'kernel_grad'}
  assert groups == ({members, members * draws} if draws > 1 else {members})
  assert {c[2] for c in convs if c[0] == 'other'} >= {members}


@pytest.mark.parametrize('shared_x', [False, True])
def test_the_batching_rule_equals_per_member_gradients_in_float64(shared_x):
  """vmap over members and over draws (nested) of the GPU backward, against each member's own
  XLA gradient; shared_x: the input is the same for every draw (the trunk shared by the draws)."""
  with jax.enable_x64(True):
    strides, padding = (2, 2), ((1, 1), (1, 1))
    grads = lambda x, k, g: resnet._xla_conv_grads(x, k, g, strides, padding, jnp.float64)  # pylint: disable=protected-access
    ref = lambda x, k, g: jax.vjp(lambda a, b: resnet._conv(a, b, strides, padding, jnp.float64), x, k)[1](g)  # pylint: disable=protected-access
    rng = np.random.default_rng(0)
    s, m = 3, 2
    x = rng.normal(size=(s, m, 4, 8, 8, 5))
    k, g = rng.normal(size=(s, m, 3, 3, 5, 6)), rng.normal(size=(s, m, 4, 4, 4, 6))
    if shared_x:
      x = x[:, :1]
      out = jax.jit(jax.vmap(jax.vmap(grads, in_axes=(None, 0, 0))))(x[:, 0], k, g)
    else:
      out = jax.jit(jax.vmap(jax.vmap(grads)))(x, k, g)
    for i in range(s):
      for j in range(m):
        gx, gk = ref(x[i, 0 if shared_x else j], k[i, j], g[i, j])
        np.testing.assert_allclose(out[0][i, j], gx, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(out[1][i, j], gk, rtol=1e-12, atol=1e-12)
