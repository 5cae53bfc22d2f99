"""Incremental fine-tuning stays inside the box around phi* and touches only the trainable leaves."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import cifar100
from conftest import init_variables
from f2m_jax import incremental
from f2m_jax import objectives
from f2m_jax import trees
from f2m_jax import validation
from f2m_jax.data import augment
from f2m_jax.models import noise_set_paths, resnet20


@pytest.fixture(scope='module')
def setup():
  model = resnet20(6, width=4)
  variables = init_variables(model, 16)
  rng = np.random.default_rng(0)
  images = rng.integers(0, 255, (10, 16, 16, 3), dtype=np.uint8)
  labels = np.repeat(np.array([6, 7], np.int32), 5)
  stored = np.concatenate([rng.normal(size=(6, 16)), np.zeros((2, 16))]).astype(np.float32)
  paths = noise_set_paths(model, 4)
  flat0 = trees.flatten(variables['params'])
  return model, variables, images, labels, stored, paths, {p: flat0[p] for p in paths}


def _settings(model, paths, steps, clamp=True, lr=1.0):
  return incremental.SessionSettings(
      model=model, trainable_paths=tuple(paths), steps=steps, lr=lr, momentum=0.9, weight_decay=5e-4,
      bound=0.003, clamp=clamp, distance='squared_euclidean', augment='crop_flip', image_size=16,
      mean=(0.5,) * 3, std=(0.25,) * 3)


def test_every_step_inside_box_and_frozen_leaves_unchanged(setup):
  """make_finetune's 4 steps, and the same 4 steps one at a time (`session_step` on the same inputs)
  to see the state after each: inside the box every time, and the frozen leaves unchanged; without
  the clamp the box is left."""
  model, variables, images, labels, stored, paths, anchor = setup
  settings = _settings(model, paths, 4)
  key = jax.random.key(1)
  params, losses = incremental.make_finetune(settings)(
      variables['params'], variables['batch_stats'], anchor, images, labels, stored, np.int32(len(stored)), key)
  assert np.all(np.isfinite(losses))
  chex.assert_trees_all_equal(trees.split(params, paths)[1], trees.split(variables['params'], paths)[1])
  unclamped, _ = incremental.make_finetune(_settings(model, paths, 3, clamp=False, lr=0.05))(
      variables['params'], variables['batch_stats'], anchor, images, labels, stored, np.int32(len(stored)), key)
  assert max(float(np.abs(trees.flatten(unclamped)[p] - anchor[p]).max()) for p in paths) > 0.003  # no clamp

  tx = incremental.session_optimizer(settings)
  frozen = trees.split(variables['params'], paths)[1]

  @jax.jit
  def step(trainable, opt_state, i):
    x = augment.train_inputs(jax.random.fold_in(key, i), images, 'crop_flip', 16, settings.mean, settings.std)
    return incremental.session_step(trainable, opt_state, frozen, variables['batch_stats'], anchor, x, labels,
                                    stored, len(stored), settings, tx)

  trainable = dict(anchor)
  opt_state = tx.init(trainable)
  for i in range(4):
    trainable, opt_state, loss = step(trainable, opt_state, i)
    # The same trajectory as make_finetune's, to rounding: another program, and distances of ~1e3
    # entering a softmax (measured 2e-4 at most; the next step's augmentation key instead: 10x).
    np.testing.assert_allclose(loss, losses[i], rtol=1e-3)
    for p, v in trainable.items():
      diff = np.abs(np.asarray(v) - np.asarray(anchor[p]))
      assert diff.max() <= 0.003 + 1e-7, (i, p, diff.max())
      assert diff.max() > 0.0029  # lr=1 pushes to the walls: the clip really acted


def test_clip_to_box_and_round_gradient_arithmetic():
  out = incremental.clip_to_box({'w': jnp.array([0.0, 1.2, 0.95])}, {'w': jnp.array([1.0, 1.0, 1.0])}, 0.1)
  np.testing.assert_allclose(out['w'], [0.9, 1.1, 0.95])
  # round_gradient puts SGD's steps on the grid
  lr, quantum = 0.01, 0.0025
  g = jnp.array([0.05, 0.2, -0.4, 0.124, -0.126])  # lr*g / quantum = 0.2, 0.8, -1.6, 0.496, -0.504
  step = lr * incremental.round_gradient(g, lr, quantum)
  np.testing.assert_allclose(step, [0.0, 0.0025, -0.005, 0.0, -0.0025], atol=1e-9)
  # every entry rounds to 0 at lr: the original retries once with 2*lr*g (0.4 -> 0, 1.2 -> 1)
  small = jnp.array([0.05, 0.15])
  np.testing.assert_allclose(lr * incremental.round_gradient(small, lr, quantum), [0.0, 0.0025], atol=1e-9)


def test_round_steps_moves_only_by_multiples_of_half_the_bound(setup):
  model, variables, images, labels, stored, paths, anchor = setup
  settings = _settings(model, paths, 1, clamp=False, lr=0.05)
  settings = incremental.SessionSettings(**{**settings.__dict__, 'momentum': 0.0, 'weight_decay': 0.0,
                                            'round_steps': True})
  params, _ = incremental.make_finetune(settings)(
      variables['params'], variables['batch_stats'], anchor, images, labels, stored, np.int32(len(stored)),
      jax.random.key(1))
  flat = trees.flatten(params)
  steps = np.concatenate([np.ravel(np.asarray(flat[p]) - np.asarray(anchor[p])) for p in paths]) / 0.0015
  np.testing.assert_allclose(steps, np.round(steps), atol=1e-3)  # multiples of b/2 = 0.0015
  assert 0 < np.count_nonzero(np.round(steps)) < steps.size  # some entries moved, small ones did not


def test_padding_to_the_last_sessions_shape_changes_nothing(setup):
  model, variables, images, labels, stored, paths, anchor = setup
  # one step: later steps amplify float32 rounding (distances ~1e3 enter a softmax), not padding
  settings = incremental.SessionSettings(**{**_settings(model, paths, 1, lr=0.05).__dict__, 'augment': 'none'})
  finetune = incremental.make_finetune(settings)
  exact, exact_losses = finetune(variables['params'], variables['batch_stats'], anchor, images, labels, stored,
                                 np.int32(len(stored)), jax.random.key(1))
  padded, padded_losses = finetune(variables['params'], variables['batch_stats'], anchor,
                                   *incremental.pad_session(images, labels, stored, 25, 12), jax.random.key(1))
  np.testing.assert_allclose(padded_losses, exact_losses, atol=5e-5)
  moved = max(float(np.abs(trees.flatten(exact)[p] - anchor[p]).max()) for p in paths)
  chex.assert_trees_all_close(padded, exact, atol=1e-5, rtol=1e-7)
  assert moved > 1e-3  # the step itself is two orders larger than the tolerance
  # a smaller session padded to the same sizes reuses the compiled program
  size = finetune._cache_size()
  smaller = incremental.pad_session(images[:5], labels[:5], stored[:7], 25, 12)
  finetune(variables['params'], variables['batch_stats'], anchor, *smaller, jax.random.key(2))
  assert finetune._cache_size() == size


def _unit(rows):
  norms = np.linalg.norm(rows, axis=-1, keepdims=True)
  return np.where(norms > 0, rows / np.maximum(norms, 1e-300), 0.0)


def naive_metric_loss(emb, labels, stored, norm='raw'):
  """Eq. 5 in float64 numpy: softmax over minus the squared distances to every stored row, the rows of
  the batch's classes replaced by their batch means; the mean CE over the batch. `norm`: 'unit_base'
  scales the stored rows to unit norm before the batch means replace theirs, 'unit_all' every row
  after (zero rows stay zero)."""
  prototypes = np.array(stored, np.float64)
  if norm == 'unit_base':
    prototypes = _unit(prototypes)
  for c in np.unique(labels):
    prototypes[c] = emb[labels == c].mean(0)
  if norm == 'unit_all':
    prototypes = _unit(prototypes)
  logits = -((emb[:, None, :] - prototypes[None]) ** 2).sum(-1)
  top = logits.max(1, keepdims=True)
  log_softmax = logits - top - np.log(np.exp(logits - top).sum(1, keepdims=True))
  return -log_softmax[np.arange(len(labels)), labels].mean(), np.abs(logits).max()


def test_prototype_norm_sets_the_norm_of_eq5s_prototypes(setup):
  """incremental.prototype_norm: 'raw' (the default, the authors' code) uses the stored rows and the
  batch's means as they are, 'unit_base' the stored (base) rows at unit L2 norm, as Algorithm 1 saves
  them, 'unit_all' every prototype at unit norm, batch means included. Each against Eq. 5 in float64
  on the same embeddings, with base prototypes near the batch's embeddings (norm ~4), so that the
  norm changes the loss; zero rows stay zero."""
  model, variables, images, labels, _, paths, anchor = setup
  frozen = trees.split(variables['params'], paths)[1]
  x = (jnp.asarray(images, jnp.float32) / 255.0 - 0.5) * 0.25  # embeddings of norm ~4: distances ~10
  emb = np.asarray(jax.jit(lambda v: model.apply(v, x, train=False)[0])(variables), np.float64)
  rng = np.random.default_rng(1)
  base = emb.mean(0) + rng.normal(scale=0.3, size=(6, emb.shape[1]))
  stored = np.concatenate([base, np.zeros((2, emb.shape[1]))]).astype(np.float32)  # rows 6, 7: the novel classes
  norms = np.linalg.norm(stored.astype(np.float64), axis=1, keepdims=True)
  assert np.all(np.abs(norms[:6] - 1) > 1)  # raw base rows far from unit norm
  assert np.all(np.abs(np.linalg.norm([emb[labels == c].mean(0) for c in (6, 7)], axis=1) - 1) > 1)  # novel too
  raw = _settings(model, paths, 1)
  assert raw.prototype_norm == 'raw'  # the default: the authors' raw prototypes
  session_loss = jax.jit(incremental.session_loss, static_argnums=(6, 7))  # one program, not op by op
  loss = lambda settings: float(session_loss(anchor, frozen, variables['batch_stats'], x, labels,
                                             jnp.asarray(stored), len(stored), settings))
  losses, tolerance = {}, {}
  for norm in incremental.PROTOTYPE_NORMS:
    settings = incremental.SessionSettings(**{**raw.__dict__, 'prototype_norm': norm})
    want, scale = naive_metric_loss(emb, labels, stored.astype(np.float64), norm)
    # float32 distances of magnitude `scale`: a few roundings each in the logits
    tolerance[norm] = 32 * np.finfo(np.float32).eps * scale
    losses[norm] = loss(settings)
    np.testing.assert_allclose(losses[norm], want, rtol=0, atol=tolerance[norm])
  for a, b in (('raw', 'unit_base'), ('raw', 'unit_all'), ('unit_base', 'unit_all')):
    assert abs(losses[a] - losses[b]) > 1e3 * max(tolerance.values())
  config = cifar100.get_config('smoke')
  config.incremental.prototype_norm = 'unit'
  with pytest.raises(ValueError, match=r"incremental.prototype_norm='unit'.*'raw', 'unit_base', 'unit_all'"):
    validation.validate(config)  # the field's one rule


def test_metric_loss_with_unit_prototypes_float64():
  """objectives.metric_loss(unit_prototypes=True) in float64: the loss equals Eq. 5 over unit-norm
  prototypes (numpy), and its gradient in the embeddings, which reaches the batch means through the
  normalisation, equals numpy's central differences; with a stored zero row and a padding row."""
  rng = np.random.default_rng(3)
  emb = rng.normal(loc=1.0, size=(9, 5)) * 2.0
  labels = np.array([3, 3, 3, 4, 4, 4, 4, 4, -1])  # row 8: padding
  stored = np.concatenate([rng.normal(size=(3, 5)) * 3.0, np.zeros((3, 5))])  # row 5: a zero row, unused
  valid = labels >= 0

  def naive(e):
    return naive_metric_loss(e[valid], labels[valid], stored, 'unit_all')[0]

  with jax.enable_x64(True):
    f = jax.jit(lambda e: objectives.metric_loss(e, jnp.asarray(labels), jnp.asarray(stored), 'squared_euclidean',
                                                 unit_prototypes=True))
    got = f(jnp.asarray(emb))
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(float(got), naive(emb), rtol=1e-12)
    grad = np.asarray(jax.grad(f)(jnp.asarray(emb)))
  h = 1e-6
  numeric = np.zeros_like(emb)
  for i, j in np.ndindex(*emb.shape):
    step = np.zeros_like(emb)
    step[i, j] = h
    numeric[i, j] = (naive(emb + step) - naive(emb - step)) / (2 * h)
  # central differences: truncation O(h^2) and rounding ~ eps * |loss| / h, both below 1e-8 here
  np.testing.assert_allclose(grad, numeric, rtol=0, atol=1e-7)
  assert np.all(grad[8] == 0)  # the padding row
  assert np.abs(grad[:8]).min() > 0  # every real row moves the loss
