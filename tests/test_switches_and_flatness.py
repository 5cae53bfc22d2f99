"""Method and ablation switches, the flatness indicator."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import init_variables, noise_view
from f2m_jax import base as base_lib
from f2m_jax import experiment as experiment_lib
from f2m_jax import flatness
from f2m_jax import noise as noise_lib
from f2m_jax import objectives
from f2m_jax import optim
from f2m_jax import sharding
from f2m_jax.data import sources
from f2m_jax.models import noise_set_paths, resnet20, split_block
from f2m_jax.run import pipeline


@pytest.fixture(scope='module')
def tiny():
  model = resnet20(4, width=4)
  variables = init_variables(model, 8)
  rng = np.random.default_rng(0)
  images = rng.integers(0, 255, (30, 8, 8, 3), dtype=np.uint8)
  labels = rng.integers(0, 4, 30).astype(np.int32)
  paths = noise_set_paths(model, 4)
  return model, variables, images, labels, paths, split_block(model, paths)


def test_flatness_stats_zero_bound_and_chunking(tiny):
  s = flatness.flatness_stats(1.0, [1.0, 2.0, 3.0, 2.0])
  assert s['I'] == pytest.approx((0 + 1 + 4 + 1) / 4)
  assert s['sigma2'] == pytest.approx(0.5)  # values 1,2,3,2: mean 2, squared deviations 1,0,1,0
  assert s['num_draws'] == 4
  model, variables, images, labels, paths, split = tiny
  args = (model, variables, images, labels, paths, split)
  clean, losses = flatness.noisy_losses(*args, 0.0, 'uniform', 5, 2, jax.random.key(1), (0.5,) * 3, (0.25,) * 3,
                                        batch_size=8)
  np.testing.assert_allclose(losses, clean, rtol=1e-5)
  _, a = flatness.noisy_losses(*args, 0.05, 'uniform', 7, 3, jax.random.key(1), (0.5,) * 3, (0.25,) * 3, 8)
  _, b = flatness.noisy_losses(*args, 0.05, 'uniform', 7, 7, jax.random.key(1), (0.5,) * 3, (0.25,) * 3, 16)
  np.testing.assert_allclose(a, b, rtol=1e-4)
  assert np.std(a) > 0
  # the clean loss equals the plain mean CE of the full network
  _, logits = jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, (images / 255.0 - 0.5) / 0.25)
  ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1).mean()
  np.testing.assert_allclose(clean, ce, rtol=1e-5)


def test_fm_off_draws_no_noise(tiny, monkeypatch):
  model, variables, images, labels, paths, split = tiny

  def forbidden(*a, **k):
    raise AssertionError('noise drawn with FM off')

  monkeypatch.setattr(noise_lib, 'sample_noise', forbidden)
  noise = noise_view(enabled=False)
  tx = optim.sgd(0.1, 0.9, 5e-4, (), 0.1)
  # Tracing the train program is where noise would be drawn: shapes suffice, nothing need compile.
  state = jax.eval_shape(lambda k: base_lib.init_state(model, k, 8, tx), jax.random.key(0))
  data = types.SimpleNamespace(augment='crop_flip', image_size=8, mean=(0.5,) * 3, std=(0.25,) * 3)
  program = base_lib.make_train_program(model, noise, tx, data, 'unroll', sharding.data_mesh())
  states = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct((1,) + s.shape, s.dtype), state)
  jax.eval_shape(program, states, images, labels, np.zeros((1, 1, 8), np.int32), np.int32(1),
                 jnp.stack([jax.random.key(2)]), np.float32([0.01]))
  x = (images[:8] / 255.0 - 0.5) / 0.25
  loss, (_, metrics) = jax.jit(base_lib.base_loss, static_argnums=(5, 6))(
      variables['params'], variables['batch_stats'], x, labels[:8], {}, model, noise)
  (_, logits), _ = jax.jit(lambda v: model.apply(v, x, train=True, mutable=['batch_stats']))(variables)
  assert float(loss) == float(metrics['loss'])  # the loss is the clean pass's CE (another program: rounded otherwise)
  np.testing.assert_allclose(float(loss), float(objectives.cross_entropy(logits, labels[:8])), rtol=1e-6)
  assert set(metrics) == {'loss', 'acc'}  # what a plain step logs


def test_baseline_and_ablation_switches(smoke_config):
  c = pipeline.resolve(smoke_config)
  exp = experiment_lib.Experiment.create(c, sources.load_benchmark(c))
  assert exp.loss.enabled and exp.loss.prototype_fixing and exp.loss.pf_weight == 1.0
  smoke_config.noise.prototype_fixing = False
  smoke_config.noise.enabled = False
  c2 = pipeline.resolve(smoke_config)
  exp2 = experiment_lib.Experiment.create(c2, exp.bench)
  assert not exp2.loss.enabled and not exp2.loss.prototype_fixing
  smoke_config.method = 'f2m+'
  with pytest.raises(ValueError, match="method='f2m\\+'"):
    pipeline.resolve(smoke_config)


def test_round_steps_needs_a_positive_bound(smoke_config):
  smoke_config.incremental.round_steps = True
  smoke_config.noise.bound = 0.0
  with pytest.raises(ValueError, match='incremental.round_steps=True.*noise.bound > 0'):
    pipeline.resolve(smoke_config)
  smoke_config.noise.bound = 0.005
  assert pipeline.resolve(smoke_config).incremental.round_steps
