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
  return cifar100.load_cifar100_trainsplit(cifar100.load_train_npz(NPZ), CIFAR_LISTS)


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


# ---------------------------------------------------------------- a prepared TFDS cifar100

class _ListSource(list):
  """A random-access data source over a list of records, as tfds.data_source returns."""

  def __getitems__(self, keys):
    return [self[k] for k in keys]


def _fake_records(split, n, seed):
  """Records stored shuffled; official image k has label k % 100 and pixel values encoding k."""
  records = []
  for k in np.random.default_rng(seed).permutation(n):
    image = np.zeros((32, 32, 3), np.uint8)
    image[..., 0], image[..., 1] = k % 256, k // 256
    records.append({'id': f'{split}_{k:05d}'.encode(), 'image': image, 'label': np.int64(k % 100)})
  return records


def _write_tiny_lists(folder, per_class):
  """TOPIC-shaped lists for fake data where official image k has label k % 100."""
  folder.mkdir(parents=True)
  base = [c + 100 * j for c in range(60) for j in range(per_class)]
  (folder / 'session_1.txt').write_text('\n'.join(map(str, base)) + '\n')
  for t in range(2, 10):
    shots = [c + 100 * j for c in range(60 + 5 * (t - 2), 65 + 5 * (t - 2)) for j in range(5)]
    (folder / f'session_{t}.txt').write_text('\n'.join(map(str, shots)) + '\n')


@pytest.fixture
def prepared(tmp_path):
  """A TFDS data folder that holds a prepared cifar100 (its dataset_info.json), and TOPIC lists."""
  (tmp_path / 'tfds' / 'cifar100' / '3.0.2').mkdir(parents=True)
  (tmp_path / 'tfds' / 'cifar100' / '3.0.2' / 'dataset_info.json').write_text('{}')
  _write_tiny_lists(tmp_path / 'lists', per_class=6)
  return tmp_path


def test_a_prepared_tfds_cifar100_is_read_in_the_official_order_without_a_download(prepared):
  tfds = pytest.importorskip('tensorflow_datasets')
  sizes = {'train': 600, 'test': 200}
  fake = lambda self, split, **kwargs: _ListSource(_fake_records(split, sizes[split], len(split)))
  assert cifar100.images_at_hand(prepared / 'no_cache', str(prepared / 'tfds'))
  with tfds.testing.mock_data(as_data_source_fn=fake):  # the cache folder holds no archive: no download
    b = cifar100.load_official(prepared / 'lists', prepared / 'no_cache', str(prepared / 'tfds'))
  k = np.arange(600)
  assert np.array_equal(b.train.labels, k % 100)
  assert np.array_equal(b.train.images[:, 0, 0, 0], k % 256) and np.array_equal(b.train.images[:, 0, 0, 1], k // 256)
  assert np.array_equal(b.test.labels, np.arange(200) % 100)
  assert len(b.base_train) == 360 and len(b.topic_shots) == 8
  assert not (prepared / 'no_cache').exists()


def test_a_tfds_copy_whose_ids_do_not_number_the_images_is_refused(prepared):
  tfds = pytest.importorskip('tensorflow_datasets')
  records = _fake_records('train', 600, 0)
  records[0] = {**records[0], 'id': records[1]['id']}  # one id twice, another missing
  fake = lambda self, split, **kwargs: _ListSource(records)
  with tfds.testing.mock_data(as_data_source_fn=fake):
    with pytest.raises(DataError, match='do not number its images 0..N-1 exactly once'):
      cifar100.load_official(prepared / 'lists', prepared / 'no_cache', str(prepared / 'tfds'))


def test_an_unreadable_tfds_copy_says_what_to_do(prepared, monkeypatch):
  tfds = pytest.importorskip('tensorflow_datasets')
  def fail(*args, **kwargs):
    raise NotImplementedError('not prepared')
  monkeypatch.setattr(tfds, 'data_source', fail)
  with pytest.raises(DataError) as e:
    cifar100.load_official(prepared / 'lists', prepared / 'no_cache', str(prepared / 'tfds'))
  for part in (str(prepared / 'tfds'), 'tfds build cifar100 --file_format=array_record', 'move it away'):
    assert part in str(e.value)


# ---------------------------------------------------------------- index lists

@needs_lists
def test_sha256_table_matches_reference_copy():
  for dataset, table in index_lists.SHA256.items():
    folder = DATA_DIR / 'index_list' / dataset
    assert sorted(p.name for p in folder.iterdir()) == sorted(table)
    for name, digest in table.items():
      assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name


@needs_lists
def test_index_list_found_in_data_dir(tmp_path):
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
