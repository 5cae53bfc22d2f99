"""Session protocols: F2M draws, the class-balanced sampler, the synthetic source."""
import numpy as np
import pytest

from f2m_jax.data import protocol
from f2m_jax.data.synthetic import make_synthetic


@pytest.fixture(scope='module')
def bench():
  return make_synthetic(seed=0, num_base=10, way=3, num_sessions=4, train_per_class=12, test_per_class=4,
                        image_size=8)


def test_synthetic_is_deterministic_and_shaped(bench):
  again = make_synthetic(seed=0, num_base=10, way=3, num_sessions=4, train_per_class=12, test_per_class=4,
                         image_size=8)
  np.testing.assert_array_equal(bench.train.images, again.train.images)
  assert bench.train.images.shape == (19 * 12, 8, 8, 3) and bench.test.images.shape == (19 * 4, 8, 8, 3)
  assert bench.session_classes[0] == tuple(range(10)) and bench.session_classes[3] == (16, 17, 18)
  assert not np.array_equal(make_synthetic(seed=1, num_base=10, way=3, num_sessions=4, train_per_class=12,
                                           test_per_class=4, image_size=8).train.images, bench.train.images)


def test_draws_are_seeded_per_run_and_session(bench):
  a = protocol.session_shots(bench, 'draws', run=0, session=2, shots=5, seed=3)
  assert np.array_equal(a, protocol.session_shots(bench, 'draws', run=0, session=2, shots=5, seed=3))
  b = protocol.session_shots(bench, 'draws', run=1, session=2, shots=5, seed=3)
  assert not np.array_equal(a, b)
  labels = bench.train.labels[a]
  assert sorted(np.unique(labels).tolist()) == [10, 11, 12] and all(np.sum(labels == c) == 5 for c in (10, 11, 12))
  with pytest.raises(ValueError, match='TOPIC'):
    protocol.session_shots(bench, 'topic', 0, 2, 5, 0)
  with pytest.raises(ValueError, match='session'):
    protocol.session_shots(bench, 'draws', 0, 5, 5, 0)


def test_test_indices_cover_seen_classes(bench):
  idx = protocol.test_indices(bench, 2)
  assert set(bench.test.labels[idx].tolist()) == set(range(13))


def test_balanced_batch_is_a_function_of_seed_and_step(bench):
  a = protocol.balanced_batch(bench.train.labels, bench.base_train, ways=4, shots=3, seed=0, step=7)
  assert np.array_equal(a, protocol.balanced_batch(bench.train.labels, bench.base_train, 4, 3, 0, 7))
  labels = bench.train.labels[a].reshape(4, 3)
  assert len(set(labels[:, 0].tolist())) == 4 and np.all(labels == labels[:, :1])  # class-contiguous blocks
  assert np.all(labels < 10)
  with pytest.raises(ValueError, match='ways'):
    protocol.balanced_batch(bench.train.labels, bench.base_train, 11, 3, 0, 0)


def test_shuffled_batches_cover_an_epoch(bench):
  pool = bench.base_train
  per_epoch = len(pool) // 10
  seen = np.concatenate([protocol.shuffled_batch(pool, 10, 0, s) for s in range(per_epoch)])
  assert len(np.unique(seen)) == len(seen) == per_epoch * 10


def check_validation_roles(real, val, roles):
  """The validation benchmark `val` of `real`: only real base classes' training images, in disjoint
  roles, the real protocol's way, test images = the held-out ones."""
  used = [roles['base_train'], roles['shot_pool'], roles['test']]
  for i in range(3):
    for j in range(i + 1, 3):
      assert not np.intersect1d(used[i], used[j]).size
  everything = np.concatenate(used)
  assert np.isin(everything, real.base_train).all()  # never a real novel class's image, never a real test image
  assert len(everything) == len(real.base_train)
  assert val.session_classes[0] == tuple(sorted(set(real.train.labels[roles['base_train']])))
  assert all(len(c) == len(real.session_classes[1]) for c in val.session_classes[1:])
  assert set(val.train.labels[val.shot_pool]) == {c for s in val.session_classes[1:] for c in s}
  np.testing.assert_array_equal(val.test.labels, real.train.labels[roles['test']])
  per_class = np.bincount(real.train.labels[real.base_train])
  held = np.bincount(val.test.labels)
  np.testing.assert_array_equal(held[per_class > 0], np.ceil(0.2 * per_class[per_class > 0]))


@pytest.mark.parametrize('num_base, way, sessions, expected', [
    (60, 5, 9, (35, 5)),  # CIFAR-100, miniImageNet: 35 pseudo-base classes + 5 sessions of 5
    (100, 10, 11, (50, 5)),  # CUB-200: 50 + 5 sessions of 10
])
def test_validation_protocol_roles(num_base, way, sessions, expected):
  from f2m_jax.data import holdout
  real = make_synthetic(seed=0, num_base=num_base, way=way, num_sessions=sessions, train_per_class=30,
                        test_per_class=2, image_size=8)
  val = holdout.validation_benchmark(real)
  roles = holdout.roles(real)
  assert (len(val.session_classes[0]), len(val.session_classes) - 1) == expected
  check_validation_roles(real, val, roles)
  # deterministic, and its shots are drawn run by run from the pseudo-novel pool
  np.testing.assert_array_equal(holdout.roles(real)['test'], roles['test'])
  shots = protocol.session_shots(val, 'validation', 1, 2, 5, 0)
  assert np.isin(shots, val.shot_pool).all()
  np.testing.assert_array_equal(shots, protocol.session_shots(val, 'draws', 1, 2, 5, 0))


@pytest.mark.parametrize('config_name, changes, expected', [
    ('folder', dict(batch_size=64), 4),  # the authors' 16 classes per batch at a quarter of their batch
    ('folder', dict(batch_size=256), 16),
    ('mini', dict(batch_size=32), 2),
    ('mini', dict(batch_size=64, shots=4), 4),
    ('cub200', dict(), 8),  # 32 classes x 8 images at 256, as their CUB config
    ('cub200', dict(batch_size=128), 4),
    ('mini', dict(batch_size=64, shots=16), 'base.shots=16 is invalid: the task_epochs sampler keeps base.ways=16'),
    ('mini', dict(batch_size=100), 'base.batch_size=100 is invalid: the task_epochs sampler takes base.ways=16 '
                                   'classes per batch, base.batch_size / base.ways images each (base.shots=0), so it '
                                   'needs a multiple of 16 (e.g. 96 or 112); or set base.ways, or base.shots'),
    ('mini', dict(batch_size=100, sampler='shuffle'), 0),  # not read by shuffled batches: no refusal
    ('mini', dict(sampler='balanced', shots=3), 3),  # ways x shots is the batch
    ('mini', dict(sampler='balanced', batch_size=8), 'base.batch_size=8 is invalid: the balanced sampler'),
])
def test_the_class_aware_samplers_keep_their_classes_per_batch_at_any_batch_size(config_name, changes, expected):
  """base.shots=0 (every dataset config) is base.batch_size / base.ways when the run starts, so a
  smaller batch keeps the classes per batch (at 0739cee, 64 took 4 classes of 16 and F2M stayed at
  chance); a combination that cannot keep them is refused, naming base.shots."""
  import importlib
  from f2m_jax.run import pipeline
  config = importlib.import_module(f'configs.{config_name}').get_config()
  config.base.update(changes)
  if 'folder' in config.data:
    config.data.folder.train = 'any'
  if isinstance(expected, int):
    assert pipeline.resolve(config, reads_data=False).base.shots == expected
  else:
    with pytest.raises(ValueError) as e:
      pipeline.resolve(config, reads_data=False)
    assert str(e.value).startswith(expected), str(e.value)
