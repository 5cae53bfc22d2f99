"""The plain class-incremental split of CIFAR-100 (configs/cifar100_incremental.py): LUCIR's class
order, 50 base classes + 5 sessions of 10 that bring every training image of their classes."""
import numpy as np
import pytest

from conftest import DATA_DIR
from f2m_jax.data import cifar100, protocol
from test_superclass import _official_like


def test_order_is_lucirs_seed_1993_permutation():
  order, sizes = cifar100.split_order('incremental50')
  assert sizes == (50, 10, 10, 10, 10, 10)
  assert sorted(order.tolist()) == list(range(100))
  # NumPy's legacy RNG seeded with 1993 shuffling 0..99, as LUCIR's CIFAR-100 runs order the classes
  legacy = np.arange(100)
  np.random.RandomState(1993).shuffle(legacy)
  assert np.array_equal(order, legacy)
  assert order[:6].tolist() == [68, 56, 78, 8, 23, 84]
  with pytest.raises(ValueError, match='data.split'):
    cifar100.split_order('incremental40')


def _check(bench, per_class: int, test_per_class: int):
  assert [len(c) for c in bench.session_classes] == [50, 10, 10, 10, 10, 10]
  assert np.array_equal(np.bincount(bench.train.labels[bench.base_train], minlength=50), np.full(50, per_class))
  assert np.array_equal(np.bincount(bench.train.labels[bench.shot_pool], minlength=100)[50:], np.full(50, per_class))
  assert np.array_equal(np.bincount(bench.test.labels, minlength=100), np.full(100, test_per_class))
  for session in (2, 6):  # "shots" = every training image of the session's classes, the same in every run
    shots = protocol.session_shots(bench, 'draws', run=0, session=session, shots=per_class, seed=0)
    again = protocol.session_shots(bench, 'draws', run=3, session=session, shots=per_class, seed=5)
    assert np.array_equal(shots, again)
    members = bench.shot_pool[np.isin(bench.train.labels[bench.shot_pool], bench.session_classes[session - 1])]
    assert np.array_equal(np.sort(shots), np.sort(members))


def test_split_of_the_tfds_shaped_benchmark():
  bench = _official_like()
  new = cifar100.class_split(bench, 'incremental50')
  _check(new, per_class=8, test_per_class=3)
  order, _ = cifar100.split_order('incremental50')
  k = np.flatnonzero(bench.train.labels == order[57])[0]  # relabelled in LUCIR's order, pixels kept
  assert new.train.labels[k] == 57 and np.array_equal(new.train.images[k], bench.train.images[k])


@pytest.mark.skipif(not (DATA_DIR / 'cifar100_train.npz').is_file(), reason=f'no {DATA_DIR}/cifar100_train.npz')
def test_split_of_the_trainsplit_benchmark():
  bench = cifar100.load_cifar100_trainsplit(cifar100.load_train_npz(DATA_DIR / 'cifar100_train.npz'), DATA_DIR / 'index_list' / 'cifar100')
  _check(cifar100.class_split(bench, 'incremental50'), per_class=400, test_per_class=100)


def test_config_resolves_with_twenty_exemplars_per_class():
  from configs import cifar100_incremental
  from f2m_jax.run import pipeline
  config = pipeline.resolve(cifar100_incremental.get_config())  # the TFDS source: resolve reads no data
  assert (config.data.split, config.data.shots, config.method, config.runs) == ('incremental50', 500, 'icarl', 1)
  assert config.icarl.memory == config.rebalance.memory == 20
  assert cifar100_incremental.get_config('trainsplit').data.shots == 400
