"""The paper's appendix class splits of CIFAR-100 by superclass: the shipped fine-to-coarse table,
the splits' class sets and order, and both splits on the TFDS-shaped and the trainsplit benchmarks."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import DATA_DIR
from f2m_jax.data import cifar100, protocol
from f2m_jax.data.types import Benchmark, Split


def test_every_superclass_has_exactly_five_classes():
  names, fine_to_coarse = cifar100.superclasses()
  assert len(names) == 20 and fine_to_coarse.shape == (100,)
  assert np.array_equal(np.bincount(fine_to_coarse, minlength=20), np.full(20, 5))
  # spot checks against the official table (fine labels in the official order)
  assert names[fine_to_coarse[0]] == 'fruit_and_vegetables'  # apple
  assert names[fine_to_coarse[4]] == 'aquatic_mammals'  # beaver
  assert names[fine_to_coarse[98]] == 'people'  # woman
  assert names[fine_to_coarse[99]] == 'non-insect_invertebrates'  # worm


@pytest.mark.parametrize('split', ['superclass1', 'superclass2'])
def test_split_class_sets_in_the_papers_order(split):
  names, fine_to_coarse = cifar100.superclasses()
  order, sizes = cifar100.split_order(split)
  assert sizes == (30, 5, 5, 5, 5) and len(set(order.tolist())) == 50
  base, sessions = cifar100.SUPERCLASS_SPLITS[split]
  groups = [names[fine_to_coarse[f]] for f in order[::5]]
  assert tuple(groups) == base + sessions
  for g in range(10):  # each superclass's five classes, ascending
    block = order[5 * g:5 * g + 5]
    assert (np.diff(block) > 0).all() and len(set(fine_to_coarse[block].tolist())) == 1
  if split == 'superclass1':
    assert sessions == ('vehicles_2', 'flowers', 'food_containers', 'household_furniture')
  else:
    assert base[4] == 'household_furniture' and sessions[0] == 'people'
  with pytest.raises(ValueError, match='data.split'):
    cifar100.split_order('superclass3')


def _official_like(per_class=8, test_per_class=3) -> Benchmark:
  """A benchmark shaped as the TFDS source gives it: official fine labels, base_train = every image
  of classes < 60, shot_pool = every image of classes >= 60."""
  labels = np.tile(np.arange(100), per_class).astype(np.int32)
  images = np.zeros((len(labels), 4, 4, 3), np.uint8)
  images[..., 0] = (np.arange(len(labels)) % 256)[:, None, None]
  test_labels = np.tile(np.arange(100), test_per_class).astype(np.int32)
  return Benchmark(name='cifar100', train=Split(images, labels),
                   test=Split(np.zeros((len(test_labels), 4, 4, 3), np.uint8), test_labels),
                   base_train=np.flatnonzero(labels < 60), session_classes=cifar100.SESSION_CLASSES,
                   shot_pool=np.flatnonzero(labels >= 60), topic_shots=None, image_size=4,
                   mean=cifar100.MEAN, std=cifar100.STD, augment='crop_flip')


def _check(bench: Benchmark, split: str, per_class: int, test_per_class: int):
  order, _ = cifar100.split_order(split)
  assert bench.num_base_classes == 30 and bench.num_sessions == 5
  assert [len(c) for c in bench.session_classes] == [30, 5, 5, 5, 5]
  assert np.array_equal(np.bincount(bench.train.labels[bench.base_train], minlength=30), np.full(30, per_class))
  assert set(bench.train.labels[bench.shot_pool].tolist()) == set(range(30, 50))
  assert np.array_equal(np.bincount(bench.test.labels, minlength=50), np.full(50, test_per_class))
  for session in range(2, 6):  # the F2M-style draws work; TOPIC shots do not exist
    shots = protocol.session_shots(bench, 'draws', run=0, session=session, shots=5, seed=0)
    assert sorted(set(bench.train.labels[shots].tolist())) == list(bench.session_classes[session - 1])
  with pytest.raises(ValueError, match="data.protocol='topic' is invalid: it needs the TOPIC lists"):
    protocol.session_shots(bench, 'topic', 0, 2, 5, 0)
  return order


@pytest.mark.parametrize('split', ['superclass1', 'superclass2'])
def test_split_of_the_tfds_shaped_benchmark(split):
  bench = _official_like()
  new = cifar100.class_split(bench, split)
  order = _check(new, split, per_class=8, test_per_class=3)
  # relabelled, not reordered: image k keeps its pixels, its label is its class's place in the order
  k = np.flatnonzero(bench.train.labels == order[31])[0]
  assert new.train.labels[k] == 31 and np.array_equal(new.train.images[k], bench.train.images[k])


@pytest.mark.skipif(not (DATA_DIR / 'cifar100_train.npz').is_file(), reason=f'no {DATA_DIR}/cifar100_train.npz')
@pytest.mark.parametrize('split', ['superclass1', 'superclass2'])
def test_split_of_the_trainsplit_benchmark(split):
  bench = cifar100.load_cifar100_trainsplit(cifar100.load_train_npz(DATA_DIR / 'cifar100_train.npz'), DATA_DIR / 'index_list' / 'cifar100')
  new = cifar100.class_split(bench, split)
  _check(new, split, per_class=400, test_per_class=100)
  # no held-out test image is ever a training image, for base or novel classes
  test_pixels = {new.test.images[i].tobytes() for i in range(0, len(new.test), 7)}
  used = np.concatenate([new.base_train, new.shot_pool])
  assert not any(new.train.images[i].tobytes() in test_pixels for i in used[::13])


def test_config_field_is_validated():
  from configs import cifar100 as config_file
  from f2m_jax.run import pipeline
  config = config_file.get_config()  # the TFDS source: resolve reads no data
  config.data.split = 'superclass3'
  with pytest.raises(ValueError, match="data.split='superclass3' is invalid"):
    pipeline.resolve(config)
  config.data.split, config.data.protocol = 'superclass1', 'topic'
  with pytest.raises(ValueError, match='no TOPIC lists'):
    pipeline.resolve(config)
  config.data.protocol = 'draws'
  assert pipeline.resolve(config).data.split == 'superclass1'


def test_a_split_on_generated_data_says_why_it_is_refused(smoke_config):
  """`data.split=superclass1` on the smoke config (generated data) is refused for the real reason: the
  splits need CIFAR-100's real classes, from the tfds or trainsplit source; not with a list of allowed
  values that holds superclass1."""
  from f2m_jax import validation
  smoke_config.data.split = 'superclass1'
  with pytest.raises(ValueError) as e:
    validation.validate(smoke_config)
  msg = str(e.value)
  assert msg.startswith("data.split='superclass1' is invalid: the class splits regroup CIFAR-100's 100 real classes")
  assert "data.source 'tfds' or 'trainsplit' (this config: 'cifar100' from 'synthetic')" in msg
  assert 'configs/cifar100.py:trainsplit --config.data.split=superclass1' in msg and "['incremental50'" not in msg
