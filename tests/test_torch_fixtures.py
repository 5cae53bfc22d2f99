"""The JAX code against what the authors' PyTorch code computes, step by step.

The fixtures (tests/fixtures/torch_f2m.npz) come from the PyTorch transcription in
tests/torch_reference/ (`python tests/torch_reference/make_fixtures.py` rewrites them where torch is
installed); these tests need no torch. Same weights, same batches, same explicit noise:
  - one base step: the loss and every gradient to 1e-5 (relative to each tensor's largest entry),
    also for the exact-gradient switch (noise.clean_backward=False);
  - three base steps: every parameter and BN running statistic to 1e-4;
  - three rounded and clamped fine-tuning steps: equal except entries that came within float error
    of a rounding boundary (counted);
  - the DiscreteBeta sampler's level frequencies (chi-square against the exact probabilities and
    against the transcription's counts) and the TaskSampler epoch structure.
"""
from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from f2m_jax import base as base_lib
from f2m_jax import incremental
from f2m_jax import noise as noise_lib
from f2m_jax import objectives
from f2m_jax.data import augment, protocol
from f2m_jax.models import build_model, split_block

FIXTURE = pathlib.Path(__file__).resolve().parent / 'fixtures' / 'torch_f2m.npz'
MEAN = (0.5071, 0.4866, 0.4409)
STD = (0.2009, 0.1984, 0.2023)


@pytest.fixture(scope='module')
def fx():
  with np.load(FIXTURE) as d:
    return {k: d[k] for k in d.files}


def tree(fx, prefix):
  """The fixture entries under `prefix` as a nested dict (paths split on '/')."""
  n = len(prefix) + 1
  return noise_lib.unflatten({tuple(k[n:].split('/')): jnp.asarray(v) for k, v in fx.items()
                              if k.startswith(prefix + '/')})


def noise_paths(fx):
  return tuple(tuple(p.split('/')) for p in fx['base/noise_names'])


def eps_of(fx, step):
  """The step's M draws {path: [M, ...]}: level index i stands for (i - 2) / 4 * bound_value."""
  b = np.float32(fx['meta/bound_value']) / np.float32(2)  # our half-width b
  levels = np.float32(noise_lib.GRID_LEVELS)
  return {p: jnp.stack([jnp.asarray(levels[fx[f'base/step{step}/noise{j}/' + '/'.join(p)]] * b)
                        for j in range(int(fx['meta/M']))]) for p in noise_paths(fx)}


def setup(fx, clean_backward=True):
  params = tree(fx, 'base/init/params')
  width = params['conv1']['kernel'].shape[-1]
  model = build_model('resnet20', params['fc']['kernel'].shape[-1], width, clean_backward=clean_backward)
  paths = noise_paths(fx)
  objective = base_lib.BaseObjective(
      model=model, noise_paths=paths, split=split_block(model, paths), num_draws=int(fx['meta/M']),
      bound=float(fx['meta/bound_value']) / 2, distribution='discrete_beta', pf_weight=1.0, std_weight=2.0,
      shared_trunk=True, draw_map='unroll', pf_gradient=False, bn_updates='all_passes')
  tx = base_lib.make_optimizer(float(fx['meta/lr']), 0.9, 5e-4, (), 0.1)
  state = base_lib.TrainState(jnp.zeros((), jnp.int32), params, tree(fx, 'base/init/batch_stats'), tx.init(params))
  return objective, tx, state


def inputs(images):
  return augment.normalize(jnp.asarray(images), MEAN, STD)


def assert_close(actual, expected, tol, what):
  """Every leaf to `tol` relative to the leaf's largest magnitude (float32 sums in another order
  differ by about 1e-7 of the largest terms); returns the worst relative error seen."""
  flat_a, flat_e = noise_lib.flatten(actual), noise_lib.flatten(expected)
  assert flat_a.keys() == flat_e.keys(), what
  worst = 0.0
  for path, e in flat_e.items():
    e, a = np.asarray(e), np.asarray(flat_a[path])
    err = float(np.abs(a - e).max() / max(np.abs(e).max(), 1e-30))
    worst = max(worst, err)
    assert err <= tol, f'{what} {"/".join(path)}: relative error {err:.2e} > {tol:.0e}'
  return worst


@pytest.mark.parametrize('draw_map', ['unroll', 'vmap'])
def test_one_base_step_loss_and_every_gradient(fx, draw_map):
  objective, _, state = setup(fx)
  objective = base_lib.dataclasses.replace(objective, draw_map=draw_map)
  x, y = inputs(fx['base/step0/images']), jnp.asarray(fx['base/step0/labels'])
  grad_fn = jax.jit(jax.value_and_grad(base_lib.base_loss, has_aux=True), static_argnums=5)
  (loss, (new_stats, _)), grads = grad_fn(state.params, state.batch_stats, x, y, eps_of(fx, 0), objective)
  np.testing.assert_allclose(float(loss), float(fx['base/step0/loss']), rtol=1e-5)
  assert_close(grads, tree(fx, 'base/step0/grads'), 1e-5, 'gradient')
  assert_close(new_stats, tree(fx, 'base/step0/batch_stats'), 1e-5, 'BN statistics after step 1')


def test_exact_gradient_switch_matches_torch_without_the_early_restore(fx):
  """noise.clean_backward=False is PyTorch with the noise removed only after backward; and the two
  gradients really differ (so the default is not the exact gradient by accident)."""
  objective, _, state = setup(fx, clean_backward=False)
  x, y = inputs(fx['base/step0/images']), jnp.asarray(fx['base/step0/labels'])
  (loss, _), grads = jax.value_and_grad(base_lib.base_loss, has_aux=True)(
      state.params, state.batch_stats, x, y, eps_of(fx, 0), objective)
  np.testing.assert_allclose(float(loss), float(fx['base/exact/loss']), rtol=1e-5)
  flat = noise_lib.flatten(grads)
  exact = {tuple(k.split('/')[3:]): v for k, v in fx.items() if k.startswith('base/exact/grads/')}
  assert_close({p: flat[p] for p in exact}, exact, 1e-5, 'exact gradient')
  clean = {tuple(k.split('/')[3:]): v for k, v in fx.items() if k.startswith('base/step0/grads/')}
  stem = ('conv1', 'kernel')
  assert np.abs(clean[stem] - exact[stem]).max() > 1e-3 * np.abs(exact[stem]).max()


def test_three_base_steps_params_and_bn_statistics(fx):
  objective, tx, state = setup(fx)
  step = jax.jit(lambda s, x, y, e: base_lib.apply_step(s, x, y, e, objective, tx))
  for t in range(3):
    state, metrics = step(state, inputs(fx[f'base/step{t}/images']), jnp.asarray(fx[f'base/step{t}/labels']),
                          eps_of(fx, t))
    assert bool(metrics['finite'])
  assert_close(state.params, tree(fx, 'base/step2/params'), 1e-4, 'params after 3 steps')
  assert_close(state.batch_stats, tree(fx, 'base/step2/batch_stats'), 1e-4, 'BN statistics after 3 steps')


def test_three_rounded_clamped_finetuning_steps(fx):
  params, stats_ = tree(fx, 'base/step2/params'), tree(fx, 'base/step2/batch_stats')
  model = build_model('resnet20', params['fc']['kernel'].shape[-1], params['conv1']['kernel'].shape[-1])
  paths = noise_paths(fx)
  lr, bound = float(fx['inc/lr']), float(fx['inc/bound_value']) / 2
  settings = incremental.SessionSettings(
      model=model, trainable_paths=paths, steps=3, lr=lr, momentum=0.9, weight_decay=5e-4, bound=bound,
      clamp=True, distance='squared_euclidean', augment='none', image_size=16, mean=MEAN, std=STD,
      round_steps=True)
  tx = incremental.session_optimizer(settings)
  flat = noise_lib.flatten(params)
  trainable = {p: flat[p] for p in paths}
  frozen = {p: v for p, v in flat.items() if p not in trainable}
  anchor = dict(trainable)
  base_protos = jnp.asarray(fx['inc/base_prototypes'])
  num_base = base_protos.shape[0]
  labels = jnp.asarray(np.repeat(np.arange(num_base, num_base + 2), 5))
  stored = jnp.concatenate([base_protos, jnp.zeros((2, base_protos.shape[1]))])
  step = jax.jit(lambda tr, o, x: incremental.session_step(tr, o, frozen, stats_, anchor, x, labels, stored,
                                                           jnp.int32(num_base + 2), settings, tx))
  opt_state, losses = tx.init(trainable), []
  for t in range(3):
    trainable, opt_state, loss = step(trainable, opt_state, inputs(fx[f'inc/step{t}/images']))
    losses.append(float(loss))
  np.testing.assert_allclose(losses, fx['inc/losses'], rtol=1e-5)
  mismatched = near = total = 0
  for p in paths:
    key = '/'.join(p)
    want, got = fx[f'inc/final/{key}'], np.asarray(trainable[p])
    assert np.all(np.abs(got - np.asarray(anchor[p])) <= bound + 1e-7), f'{key} left the box'  # + ulps of the weights
    differ = ~np.isclose(got, want, rtol=0, atol=1e-7)
    mismatched += int(differ.sum())
    near += int(fx[f'inc/near_boundary/{key}'].sum())
    total += got.size
    assert not np.any(differ & ~fx[f'inc/near_boundary/{key}']), (
        f'{key}: {int((differ & ~fx[f"inc/near_boundary/{key}"]).sum())} entries differ away from a rounding boundary')
  print(f'fine-tuning: {mismatched} of {total} entries differ, all among the {near} near a rounding boundary')
  # The fixture exercises the rounding: some entries moved by whole quanta, most not at all.
  moved = np.concatenate([np.abs(np.asarray(trainable[p] - anchor[p])).ravel() for p in paths])
  assert 0.02 < np.mean(moved > bound / 4) < 0.9


def test_discrete_beta_level_frequencies(fx):
  """20,000 one-element draws (each with its own alpha and beta): chi-square against the exact level
  probabilities of the relabelled bins (notes/original_code.md 1.2: 0.26, 0, 0.165, 0.156, 0.42)
  and against the PyTorch transcription's counts. -b/2 never occurs."""
  n = 20000
  eps = noise_lib.sample_noise(jax.random.key(7), {'w': jnp.zeros((1,))}, [('w',)], n, 0.005, 'discrete_beta')
  idx = np.rint(np.asarray(eps[('w',)]).ravel() / 0.0025).astype(int) + 2
  ours, theirs = np.bincount(idx, minlength=5), fx['sampler/level_counts']
  probs = noise_lib.level_probabilities('discrete_beta')
  np.testing.assert_allclose(probs, [0.26, 0.0, 0.166, 0.157, 0.417], atol=2e-3)
  assert ours[1] == 0 and theirs[1] == 0
  keep = [0, 2, 3, 4]
  for counts in (ours, theirs):
    assert stats.chisquare(counts[keep], probs[keep] * counts.sum()).pvalue > 1e-3
  assert stats.chi2_contingency(np.stack([ours[keep], theirs[keep]]))[1] > 1e-3
  assert np.asarray(eps[('w',)]).mean() == pytest.approx(0.005 * float(probs @ np.asarray(noise_lib.GRID_LEVELS)),
                                                         abs=2e-4)


def test_task_sampler_epoch_structure(fx):
  """Our task_epochs batches have the transcription's epoch structure: 60 classes x 16 images ->
  3 batches of 256 = 16 classes x 16 contiguous images, no class twice in an epoch, no image twice
  within a class, the remaining 12 classes dropped."""
  labels = np.repeat(np.arange(60), 20)
  pool = np.arange(len(labels))
  per_epoch = protocol.task_epoch_batches(60, 16, 256)
  epoch = protocol.task_epoch(labels, pool, 16, seed=0, epoch=0)
  ours = [epoch[b * 256:(b + 1) * 256] for b in range(per_epoch)]

  def signature(batches):
    blocks = [labels[b].reshape(-1, 16) for b in batches]
    return {'batches': len(batches), 'sizes': [len(b) for b in batches],
            'contiguous': all((blk == blk[:, :1]).all() for blk in blocks),
            'classes_per_batch': [len(np.unique(blk[:, 0])) for blk in blocks],
            'distinct_classes': len(np.unique(np.concatenate([blk[:, 0] for blk in blocks]))),
            'distinct_images': len(np.unique(np.concatenate(batches)))}

  theirs = list(fx['sampler/epoch_indices'].astype(np.int64))
  assert signature(ours) == signature(theirs) == {
      'batches': 3, 'sizes': [256] * 3, 'contiguous': True, 'classes_per_batch': [16] * 3,
      'distinct_classes': 48, 'distinct_images': 768}
  np.testing.assert_array_equal(fx['sampler/epoch_labels'], labels[np.asarray(theirs)])
  # a function of (seed, epoch): reproducible, and the next epoch is another draw
  np.testing.assert_array_equal(epoch, protocol.task_epoch(labels, pool, 16, seed=0, epoch=0))
  assert not np.array_equal(epoch, protocol.task_epoch(labels, pool, 16, seed=0, epoch=1))


def test_std_term_is_differentiated_as_torch_std(fx):
  """On two nearly equal losses PyTorch's std gradient keeps the rounding of x - mean (its entries
  do not sum to zero); ours is the same to the bit, where plain autodiff of jnp.std is not."""
  x = jnp.asarray(fx['std/x'])
  ours = np.asarray(jax.grad(objectives.unbiased_std)(x))
  np.testing.assert_array_equal(ours, fx['std/grad'])
  assert ours.sum() != 0.0
  assert not np.array_equal(np.asarray(jax.grad(lambda v: jnp.std(v, ddof=1))(x)), fx['std/grad'])
