"""Incremental fine-tuning stays inside the box around phi* and touches only the trainable leaves."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from f2m_jax import incremental
from f2m_jax import noise as noise_lib
from f2m_jax.models import noise_set_paths, resnet20


@pytest.fixture(scope='module')
def setup():
  model = resnet20(6, width=4)
  variables = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False)
  rng = np.random.default_rng(0)
  images = rng.integers(0, 255, (10, 16, 16, 3), dtype=np.uint8)
  labels = np.repeat(np.array([6, 7], np.int32), 5)
  stored = np.concatenate([rng.normal(size=(6, 16)), np.zeros((2, 16))]).astype(np.float32)
  return model, variables, images, labels, stored


def _settings(model, paths, steps, clamp=True, lr=1.0):
  return incremental.SessionSettings(
      model=model, trainable_paths=tuple(paths), steps=steps, lr=lr, momentum=0.9, weight_decay=5e-4,
      bound=0.003, clamp=clamp, distance='squared_euclidean', augment='crop_flip', image_size=16,
      mean=(0.5,) * 3, std=(0.25,) * 3)


def test_every_step_inside_box_and_frozen_leaves_unchanged(setup):
  model, variables, images, labels, stored = setup
  paths = noise_set_paths(model, 4)
  flat0 = noise_lib.flatten(variables['params'])
  anchor = {p: flat0[p] for p in paths}
  for steps in range(1, 5):  # the state after step 1, 2, 3, 4 (same key, so a prefix of one trajectory)
    params, losses = incremental.make_finetune(_settings(model, paths, steps))(
        variables['params'], variables['batch_stats'], anchor, images, labels, stored, jax.random.key(1))
    flat = noise_lib.flatten(params)
    for p, v in flat.items():
      if p in anchor:
        diff = np.abs(np.asarray(v) - np.asarray(anchor[p]))
        assert diff.max() <= 0.003 + 1e-7, (steps, p, diff.max())
        assert diff.max() > 0.0029  # lr=1 pushes to the walls: the clip really acted
      else:
        np.testing.assert_array_equal(v, flat0[p])
    assert np.all(np.isfinite(losses))


def test_without_clamp_leaves_the_box(setup):
  model, variables, images, labels, stored = setup
  paths = noise_set_paths(model, 4)
  flat0 = noise_lib.flatten(variables['params'])
  anchor = {p: flat0[p] for p in paths}
  params, _ = incremental.make_finetune(_settings(model, paths, 3, clamp=False, lr=0.05))(
      variables['params'], variables['batch_stats'], anchor, images, labels, stored, jax.random.key(1))
  flat = noise_lib.flatten(params)
  assert max(float(np.abs(flat[p] - anchor[p]).max()) for p in paths) > 0.003


def test_clip_to_box_arithmetic():
  out = incremental.clip_to_box({'w': jnp.array([0.0, 1.2, 0.95])}, {'w': jnp.array([1.0, 1.0, 1.0])}, 0.1)
  np.testing.assert_allclose(out['w'], [0.9, 1.1, 0.95])
