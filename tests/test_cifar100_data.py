"""CIFAR-100 sources, the TOPIC protocol on the real lists, and finding/fetching the index lists.

Real data: `$F2M_DATA_DIR` (docs/development.md); tests needing it skip if it is unset.
"""
import hashlib
import io
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import DATA_DIR

from f2m_jax.data import cifar100, index_lists
from f2m_jax.data.types import DataError

CIFAR_LISTS = DATA_DIR / 'index_list' / 'cifar100'
NPZ = DATA_DIR / 'cifar100_train.npz'

needs_lists = pytest.mark.skipif(not CIFAR_LISTS.is_dir(), reason=f'no index lists in {DATA_DIR}')
needs_npz = pytest.mark.skipif(not (NPZ.is_file() and CIFAR_LISTS.is_dir()),
                               reason=f'no {NPZ.name} / index lists in {DATA_DIR}')


# ---------------------------------------------------------------- protocol on the real data

@pytest.fixture(scope='module')
def train_labels():
  with np.load(NPZ) as f:
    return np.asarray(f['y_train'], np.int32)


@pytest.fixture(scope='module')
def trainsplit():
  return cifar100.load_cifar100_trainsplit(NPZ, CIFAR_LISTS)


@needs_npz
def test_topic_lists_protocol(train_labels):
  base, shots = cifar100.read_topic_lists(CIFAR_LISTS, len(train_labels))
  assert base.shape == (30000,) and len(np.unique(base)) == 30000
  assert np.array_equal(np.bincount(train_labels[base], minlength=100)[:60], np.full(60, 500))
  assert train_labels[base].max() < 60
  assert len(shots) == 8
  for t, s in enumerate(shots, start=2):
    first = 60 + 5 * (t - 2)
    classes, counts = np.unique(train_labels[s], return_counts=True)
    assert classes.tolist() == list(range(first, first + 5)) and counts.tolist() == [5] * 5


@needs_npz
def test_trainsplit_protocol(trainsplit, train_labels):
  b = trainsplit
  assert len(b.train) == 50000 and b.num_sessions == 9 and b.num_base_classes == 60
  assert np.array_equal(np.bincount(b.train.labels[b.base_train], minlength=60), np.full(60, 400))
  assert np.array_equal(np.bincount(b.test.labels, minlength=100), np.full(100, 100))
  # Test images are training images; find their indices by the rule and check the content matches.
  shots = np.concatenate(b.topic_shots)
  test_idx = cifar100.trainsplit_test_indices(train_labels, shots)
  assert np.array_equal(b.train.images[test_idx], b.test.images)
  assert np.array_equal(test_idx[:100], np.flatnonzero(train_labels == 0)[-100:])
  used = np.concatenate([b.base_train, shots, b.shot_pool])
  assert not np.isin(test_idx, used).any()
  assert np.isin(shots, b.shot_pool).all()
  assert np.array_equal(np.bincount(b.train.labels[b.shot_pool], minlength=100)[60:],
                        np.full(40, 400))
  assert b.mean == cifar100.MEAN and b.std == cifar100.STD and b.augment == 'crop_flip'


def test_missing_npz_error(tmp_path):
  with pytest.raises(DataError, match='F2M_DATA_DIR') as e:
    cifar100.load_train_npz(tmp_path / 'cifar100_train.npz')
  assert str(tmp_path / 'cifar100_train.npz') in str(e.value)


def test_trainsplit_test_indices_skip_shots():
  labels = np.array([0, 1, 0, 1, 0, 1, 0, 1])
  got = cifar100.trainsplit_test_indices(labels, np.array([6]), per_class=2)
  assert got.tolist() == [2, 4, 5, 7]


# ---------------------------------------------------------------- index lists

@needs_lists
def test_sha256_table_matches_reference_copy():
  for dataset, table in index_lists.SHA256.items():
    folder = DATA_DIR / 'index_list' / dataset
    assert sorted(p.name for p in folder.iterdir()) == sorted(table)
    for name, digest in table.items():
      assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name


@needs_lists
def test_index_list_found_in_data_dir(monkeypatch, tmp_path):
  monkeypatch.setenv('F2M_DATA_DIR', str(DATA_DIR))
  assert index_lists.index_list_dir('cifar100', None, tmp_path / 'cache') == CIFAR_LISTS
  monkeypatch.delenv('F2M_DATA_DIR')
  assert index_lists.index_list_dir('cifar100', str(DATA_DIR), tmp_path / 'cache') == CIFAR_LISTS
  assert not (tmp_path / 'cache').exists()
  lists = index_lists.session_lists(CIFAR_LISTS, 9)
  assert [len(x) for x in lists] == [30000] + [25] * 8


def _no_network(*args, **kwargs):
  raise urllib.error.URLError('no network')


def test_download_failure_is_clear(monkeypatch, tmp_path):
  monkeypatch.delenv('F2M_DATA_DIR', raising=False)
  monkeypatch.setattr(urllib.request, 'urlopen', _no_network)
  with pytest.raises(DataError) as e:
    index_lists.index_list_dir('cifar100', str(tmp_path / 'data'), tmp_path / 'cache')
  msg = str(e.value)
  for part in (f'{index_lists.BASE_URL}/cifar100/session_1.txt', 'session_9.txt',
               'F2M_DATA_DIR/index_list/cifar100/', str(tmp_path / 'cache'), 'no network'):
    assert part in msg
  assert list((tmp_path / 'cache' / 'index_list' / 'cifar100').iterdir()) == []


def test_checksum_mismatch_detected(monkeypatch, tmp_path):
  monkeypatch.setattr(urllib.request, 'urlopen', lambda url, timeout: io.BytesIO(b'1\n2\n'))
  with pytest.raises(DataError, match='checksum mismatch'):
    index_lists.download_index_lists('cifar100', tmp_path)
  assert list(tmp_path.iterdir()) == []


@needs_lists
def test_download_into_cache(monkeypatch, tmp_path):
  monkeypatch.delenv('F2M_DATA_DIR', raising=False)
  prefix = index_lists.BASE_URL + '/'
  serve = lambda url, timeout: io.BytesIO((DATA_DIR / 'index_list' / url[len(prefix):]).read_bytes())
  monkeypatch.setattr(urllib.request, 'urlopen', serve)
  got = index_lists.index_list_dir('cub200', None, tmp_path)
  assert got == tmp_path / 'index_list' / 'cub200'
  assert sorted(p.name for p in got.iterdir()) == sorted(index_lists.SHA256['cub200'])
  monkeypatch.setattr(urllib.request, 'urlopen', _no_network)  # now served from the cache
  assert index_lists.index_list_dir('cub200', None, tmp_path) == got


@needs_npz
def test_validation_protocol_on_trainsplit_reads_no_test_image(trainsplit):
  """On the real data: the validation protocol's images (pseudo-base training, pseudo-novel shot
  pool, held-out test) come from the 24,000 base training images alone, never from trainsplit's test
  images or the novel classes, in disjoint roles: 35 + 5 x 5 classes, 320 training and 80 held-out
  images per class."""
  from f2m_jax.data import holdout
  from test_protocol import check_validation_roles
  val, roles = holdout.validation_benchmark(trainsplit), holdout.roles(trainsplit)
  check_validation_roles(trainsplit, val, roles)
  real_test = cifar100.trainsplit_test_indices(trainsplit.train.labels, np.concatenate(trainsplit.topic_shots))
  for role in ('base_train', 'shot_pool', 'test'):
    assert not np.intersect1d(roles[role], real_test).size
  assert len(roles['base_train']) == 35 * 320 and len(roles['shot_pool']) == 25 * 320 and len(roles['test']) == 60 * 80
  assert val.test.images.shape == (4800, 32, 32, 3)
  np.testing.assert_array_equal(val.test.images, trainsplit.train.images[roles['test']])  # 32x32: stored as seen
