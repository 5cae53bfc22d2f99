"""The authors' behaviours as config fields: defaults, the pieces the fixtures do not cover (the
CPU kernel gradient, the BN fold, the TaskSampler epochs through the pipeline), and that the model selection on the test
set is opt-in (its outputs: tests/test_checkpoint.py). Saved configs' compatibility:
tests/test_saved_configs.py."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import cifar100, cub200, mini
from f2m_jax import experiment as experiment_lib
from f2m_jax.models import resnet
from f2m_jax.models.resnet import BN_MOMENTUM, fold_batch_stats
from f2m_jax.run import pipeline


def test_defaults_are_the_authors_code_and_baseline_turns_them_off():
  """The authors' code as the paper's runs computed it: their behaviours, and the noisy passes
  differentiated at the noisy weights (PyTorch <= 1.9; docs/method.md)."""
  for config in (cifar100.get_config(), mini.get_config(), cub200.get_config()):
    n = config.noise
    assert (n.distribution, n.std_weight, n.pf_gradient, n.bn_updates, n.backward_weights, n.M) == (
        'discrete_beta', 2.0, False, 'all_passes', 'noisy', 2)
    assert config.base.sampler == 'task_epochs' and config.base.batch_size == 256
    assert config.incremental.round_steps and not config.base.select_on_test
  assert [c.noise.bound for c in (cifar100.get_config(), mini.get_config(), cub200.get_config())] == [
      0.005, 0.008, 0.0001]
  assert [pipeline.resolve(c(), reads_data=False).base.shots for c in (mini.get_config, cub200.get_config)] == [16, 8]
  # their test-set selection every val_freq iterations (read only with base.select_on_test)
  assert [c.base.select_every for c in (cifar100.get_config(), mini.get_config(), cub200.get_config())] == [
      1500, 1500, 200]
  base = cifar100.get_config()
  base.method = 'baseline'
  resolved = pipeline.resolve(base)
  assert not resolved.noise.enabled and not resolved.incremental.finetune
  assert resolved.base.sampler == 'shuffle' and not resolved.incremental.round_steps


CONV_SHAPES = [  # every conv shape of the ResNets: 3x3 stride 1 and 2, the 1x1/2 shortcut, the 7x7/2 stem
    ((3, 3), (1, 1), ((1, 1), (1, 1)), 12), ((3, 3), (2, 2), ((1, 1), (1, 1)), 12),
    ((1, 1), (2, 2), ((0, 0), (0, 0)), 12), ((7, 7), (2, 2), ((3, 3), (3, 3)), 15)]


@pytest.mark.parametrize('kernel,strides,padding,size', CONV_SHAPES)
def test_kernel_gradient_by_shifts_equals_autodiff(kernel, strides, padding, size):
  kx, kk, kg = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (3, size, size, 5))
  w = jax.random.normal(kk, kernel + (5, 4))
  y, vjp = jax.vjp(lambda w_: resnet._conv(x, w_, strides, padding, jnp.float32), w)
  g = jax.random.normal(kg, y.shape)
  want, = vjp(g)
  got = resnet._kernel_grad_by_shifts(x, g, w.shape, strides, padding)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(jnp.abs(want).max()))


@pytest.mark.parametrize('kernel,strides,padding,size', CONV_SHAPES)
def test_eigen_form_gradients_equal_xlas_bit_for_bit(kernel, strides, padding, size):
  """The CPU backward's input and kernel gradients written as Eigen-form convolutions are exactly
  XLA's own transposes outside loops (so the host path's results are unchanged by them), and equal
  to them inside a lax.scan, where XLA:CPU runs its own form several times slower."""
  kx, kk, kg = jax.random.split(jax.random.key(2), 3)
  x = jax.random.normal(kx, (4, size, size, 6))
  w = jax.random.normal(kk, kernel + (6, 5))
  conv = lambda x_, w_: resnet._conv(x_, w_, strides, padding, jnp.float32)
  g = jax.random.normal(kg, jax.eval_shape(conv, x, w).shape)
  xla = jax.jit(lambda x, w, g: jax.vjp(conv, x, w)[1](g))
  eigen = lambda x, w, g: (resnet._input_grad_eigen(g, w, x.shape, strides, padding),
                           resnet._kernel_grad_eigen(x, g, w.shape, strides, padding))
  want = xla(x, w, g)
  got = jax.jit(eigen)(x, w, g)
  scanned = jax.jit(lambda x, w, g: jax.lax.scan(lambda c, _: (c, eigen(x, w, g)), 0, None, length=2)[1])(x, w, g)
  for a, b, c in zip(got, want, scanned):
    assert a.shape == b.shape and a.dtype == b.dtype
    if jax.default_backend() == 'cpu':
      np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(c[1], b, rtol=1e-5, atol=1e-5 * float(jnp.abs(b).max()))


@pytest.mark.skipif(jax.default_backend() != 'cpu', reason='a property of XLA:CPU programs')
@pytest.mark.parametrize('kernel,strides,padding,size', CONV_SHAPES)
def test_scanned_conv2d_gradients_compile_to_eigen_form_convolutions(kernel, strides, padding, size):
  """Inside a lax.scan (the device path's scanned steps) every convolution of conv2d's gradient is
  in the b01f_01io->b01f form XLA:CPU's Eigen kernels run; XLA's own transposes stay in other forms
  there (f01b_i01o->01bf for the kernel gradient) and run several times slower. Checked on the compiled
  program, so a change back to XLA's transposes fails here, not only in a benchmark."""
  x = jnp.ones((4, size, size, 6))
  w = jnp.ones(kernel + (6, 5))
  loss = lambda x_, w_: jnp.sum(resnet.conv2d(x_, w_, jnp.zeros_like(w_), strides, padding, jnp.float32, 'cpu') ** 2)
  grads = lambda x, w: jax.lax.scan(lambda c, _: (c, jax.grad(loss, (0, 1))(x, w)), 0, None, length=2)[1]
  hlo = jax.jit(grads).lower(x, w).compile().as_text()
  labels = re.findall(r'= f32\[[^\]]*\]\S* convolution\(.*?dim_labels=([^,\s]+)', hlo)
  assert len(labels) == 3 and set(labels) == {'b01f_01io->b01f'}, labels  # forward, input and kernel gradient


@pytest.mark.parametrize('backward', ['cpu', 'xla'])
def test_conv2d_gradients_on_every_backend_path(monkeypatch, backward):
  """conv2d's custom backward, both forms (model.conv_backward: 'cpu', the im2col kernel gradient for
  large output gradients and the Eigen-form convolutions for small ones; 'xla', XLA's transposes),
  at the clean kernel (the noise as eps) or exact (the noise in the kernel, eps zero), against plain
  autodiff of conv(x, w) and of conv(x, w + eps)."""
  by_shifts = resnet._kernel_grad_by_shifts
  kx, kw, ke = jax.random.split(jax.random.key(1), 3)
  x = jax.random.normal(kx, (2, 8, 8, 3))
  w = jax.random.normal(kw, (3, 3, 3, 4))
  eps = 0.3 * jax.random.normal(ke, w.shape)
  args = ((1, 1), ((1, 1), (1, 1)), jnp.float32)
  loss = lambda f: (lambda x_, w_: jnp.sum(jnp.sin(f(x_, w_))))
  shifts = []
  monkeypatch.setattr(resnet, '_kernel_grad_by_shifts', lambda *a: shifts.append(1) or by_shifts(*a))
  for clean, min_bytes in ((True, 0), (False, 0), (True, 1 << 40), (False, 1 << 40)):
    monkeypatch.setattr(resnet, 'KERNEL_GRAD_MIN_BYTES', min_bytes)
    shifts.clear()
    conv = (lambda x_, w_: resnet.conv2d(x_, w_, eps, *args, backward)) if clean else (
        lambda x_, w_: resnet.conv2d(x_, w_ + eps, jnp.zeros_like(w_), *args, backward))
    got = jax.grad(loss(conv), (0, 1))(x, w)
    exact = jax.grad(loss(lambda x_, w_: resnet._conv(x_, w_ + eps, *args)), (0, 1))(x, w)
    np.testing.assert_allclose(got[1], exact[1], rtol=1e-5, atol=1e-5)  # the kernel gradient either way
    if clean:  # the input gradient through the clean kernel, at the noisy forward's output gradient
      y = resnet._conv(x, w + eps, *args)
      _, vjp = jax.vjp(lambda x_: resnet._conv(x_, w, *args), x)
      want_x, = vjp(jnp.cos(y))
      np.testing.assert_allclose(got[0], want_x, rtol=1e-5, atol=1e-5)
      assert float(jnp.abs(got[0] - exact[0]).max()) > 1e-2
    else:
      np.testing.assert_allclose(got[0], exact[0], rtol=1e-5, atol=1e-5)
    assert bool(shifts) == (backward == 'cpu' and min_bytes == 0)  # the path taken


@pytest.mark.parametrize('min_bytes', [0, 1 << 40])
def test_conv2d_gradients_under_vmap_equal_each_members(monkeypatch, min_bytes):
  """The CPU backward (model.conv_backward='cpu', both of its forms) mapped over a member axis
  (members.map='vmap' on a CPU) gives each member the gradients of its own input, kernel and noise."""
  monkeypatch.setattr(resnet, 'KERNEL_GRAD_MIN_BYTES', min_bytes)
  by_shifts, shifts = resnet._kernel_grad_by_shifts, []
  monkeypatch.setattr(resnet, '_kernel_grad_by_shifts', lambda *a: shifts.append(1) or by_shifts(*a))
  kx, kw, ke = jax.random.split(jax.random.key(2), 3)
  x, w = jax.random.normal(kx, (3, 2, 8, 8, 3)), jax.random.normal(kw, (3, 3, 3, 3, 4))  # 3 members
  eps = 0.3 * jax.random.normal(ke, w.shape)
  args = ((1, 1), ((1, 1), (1, 1)), jnp.float32, 'cpu')
  grads = jax.grad(lambda x_, w_, e_: jnp.sum(jnp.sin(resnet.conv2d(x_, w_, e_, *args))), (0, 1))
  mapped = jax.jit(jax.vmap(grads))(x, w, eps)
  for i in range(3):
    one = jax.jit(grads)(x[i], w[i], eps[i])
    for got, want in zip(mapped, one):
      np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)
  assert bool(shifts) == (min_bytes == 0)  # the form taken


def test_fold_batch_stats_is_pytorch_running_update_in_turn():
  running = {'bn': {'mean': jnp.asarray([1.0, -2.0]), 'var': jnp.asarray([0.5, 3.0])}}
  batch = [{'bn': {'mean': jnp.asarray([0.1 * i, 1.0]), 'var': jnp.asarray([1.0 + i, 2.0])}} for i in range(3)]
  folded = fold_batch_stats(running, [jax.tree.map(lambda s: BN_MOMENTUM * s, b) for b in batch])
  want = {k: np.asarray(v) for k, v in running['bn'].items()}
  for b in batch:  # torch: running = (1 - momentum) * running + momentum * batch statistic
    want = {k: (1 - BN_MOMENTUM) * want[k] + BN_MOMENTUM * np.asarray(b['bn'][k]) for k in want}
  for k in want:
    np.testing.assert_allclose(folded['bn'][k], want[k], rtol=1e-6)


def test_task_epoch_batches_through_the_pipeline(smoke_config):
  """`base.sampler='task_epochs'` in the smoke pipeline: per epoch every base class once, `shots`
  distinct images each, class-contiguous, a pure function of (seed, step)."""
  config = pipeline.resolve(smoke_config)
  from f2m_jax.data import sources
  bench = sources.load_benchmark(config)
  exp = experiment_lib.Experiment.create(config, bench)
  b = config.base
  per_epoch = bench.num_base_classes * b.shots // b.batch_size
  batches = [exp.batch_indices(s) for s in range(2 * per_epoch)]
  again = experiment_lib.Experiment.create(config, bench)
  for s in reversed(range(2 * per_epoch)):  # another order of calls, same batches
    np.testing.assert_array_equal(again.batch_indices(s), batches[s])
  labels = bench.train.labels
  for e in range(2):
    epoch = np.concatenate(batches[e * per_epoch:(e + 1) * per_epoch])
    blocks = labels[epoch].reshape(-1, b.shots)
    assert (blocks == blocks[:, :1]).all()
    assert len(np.unique(blocks[:, 0])) == len(blocks)
    assert len(np.unique(epoch)) == len(epoch)
  assert not np.array_equal(batches[0], batches[per_epoch])


def test_the_prototype_norm_switch_reaches_the_sessions(smoke_config):
  """incremental.prototype_norm reaches the sessions' settings; the default is the authors' code's
  ('raw'; tests/test_incremental.py checks what each value computes)."""
  from f2m_jax import incremental
  from f2m_jax.data import sources
  from f2m_jax.methods import ncm
  assert smoke_config.incremental.prototype_norm == 'raw'
  bench = sources.load_benchmark(smoke_config)
  for norm in incremental.PROTOTYPE_NORMS:
    smoke_config.incremental.prototype_norm = norm
    exp = experiment_lib.Experiment.create(pipeline.resolve(smoke_config), bench)
    assert ncm.session_settings(exp, exp.noise_paths).prototype_norm == norm
