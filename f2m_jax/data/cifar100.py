"""CIFAR-100 in the TOPIC protocol (docs/data.md): the official set (`load_cifar100_tfds`) or the
trainsplit npz (`load_cifar100_trainsplit`), class ids the official fine labels; also the class splits."""
from __future__ import annotations

import json
import os
import pathlib
import re
import sys
import tarfile
from typing import Optional, Sequence

import numpy as np

from f2m_jax.data import download
from f2m_jax.data.index_lists import DATA_DIR_ENV, session_lists
from f2m_jax.data.types import Benchmark, DataError, Split, check_session_indices, sessions_from_counts

# Normalisation of the original code (0..1 scale).
MEAN = (0.5071, 0.4866, 0.4409)
STD = (0.2009, 0.1984, 0.2023)
IMAGE_SIZE = 32

NUM_BASE, WAY, SHOTS, NUM_SESSIONS = 60, 5, 5, 9
SESSION_CLASSES = sessions_from_counts(NUM_BASE, WAY, NUM_SESSIONS)
TEST_PER_CLASS = 100  # trainsplit: held-out images per class
NPZ_NAME = 'cifar100_train.npz'
# The official binary archive, pinned as TFDS pins it (tensorflow_datasets/url_checksums/cifar100.txt).
ARCHIVE_URL = 'https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz'
ARCHIVE_SIZE = 168513733
ARCHIVE_SHA256 = '58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec'
ARCHIVE_NAME = 'cifar-100-binary.tar.gz'
CONVERTED = 'cifar100_official.npz'
TRAINSPLIT_HOW_TO_GET = (
    f'How to obtain it: {NPZ_NAME} is the official training set as arrays (docs/data.md); build it with '
    '`python -m f2m_jax.data.make_trainsplit --out <data folder>` (downloads the official archive, or '
    f'--archive <a local cifar-100-binary.tar.gz>); the data folder is ${DATA_DIR_ENV} or --config.data.data_dir.')


# ---------------------------------------------------------------- TOPIC lists

def read_topic_lists(index_dir) -> tuple:
  """(base_train, topic_shots): session_1.txt and the session_2..9.txt lists as int64 arrays."""
  lists = session_lists(index_dir, NUM_SESSIONS)
  try:
    arrays = [np.asarray([int(x) for x in lines], np.int64) for lines in lists]
  except ValueError as e:
    raise DataError(f'{index_dir}: CIFAR-100 index lists must hold one integer per line ({e})') from e
  return arrays[0], tuple(arrays[1:])


def _check_in_range(index_arrays, n: int):
  for idx in index_arrays:
    if idx.size and (idx.min() < 0 or idx.max() >= n):
      raise DataError(f'index lists point outside the {n} training images')


def _benchmark(name: str, train: Split, test: Split, base_train: np.ndarray, shot_pool: np.ndarray,
               topic_shots: tuple) -> Benchmark:
  """Builds the Benchmark and checks the TOPIC indices against the labels (catches a wrong order)."""
  bench = Benchmark(
      name=name, train=train, test=test, base_train=base_train, session_classes=SESSION_CLASSES,
      shot_pool=shot_pool, topic_shots=topic_shots, image_size=IMAGE_SIZE, mean=MEAN, std=STD,
      augment='crop_flip')
  _check_in_range((base_train, shot_pool, *topic_shots), len(train))
  try:
    if np.any(train.labels[base_train] >= NUM_BASE):
      raise ValueError('session 1: base training images of novel classes')
    for t, shots in enumerate(topic_shots, start=2):
      check_session_indices(bench, shots, t, SHOTS)
  except ValueError as e:
    raise DataError(f'the TOPIC lists do not match the CIFAR-100 labels (wrong image order?): {e}') from e
  return bench


# ---------------------------------------------------------------- TFDS source

def official_order(ids: Sequence) -> np.ndarray:
  """The permutation that sorts records by the integer ending each id ('train_00012': 12, its position
  in the official file); a DataError unless those are exactly 0..N-1."""
  numbers = []
  for record_id in ids:
    record_id = record_id.decode() if isinstance(record_id, bytes) else str(record_id)
    match = re.search(r'(\d+)$', record_id)
    if match is None:
      raise DataError(f'CIFAR-100 record id {record_id!r} does not end in an integer')
    numbers.append(int(match.group(1)))
  numbers = np.asarray(numbers, np.int64)
  order = np.argsort(numbers, kind='stable')
  if not np.array_equal(numbers[order], np.arange(len(numbers))):
    raise DataError('CIFAR-100 record ids do not number the images 0..N-1 exactly once')
  return order


def tfds_folder(data_dir: Optional[str]) -> pathlib.Path:
  """TFDS's data folder: `data_dir`, else $TFDS_DATA_DIR, else ~/tensorflow_datasets."""
  return pathlib.Path(data_dir or os.environ.get('TFDS_DATA_DIR') or
                      os.path.join(os.path.expanduser('~'), 'tensorflow_datasets'))


def tfds_prepared(data_dir: Optional[str]) -> bool:
  """Whether a prepared TFDS cifar100 (cifar100/<version>/dataset_info.json) is in TFDS's data folder."""
  return any(tfds_folder(data_dir).glob('cifar100/*/dataset_info.json'))


def _tfds_help(split: str, data_dir: Optional[str], error: Exception) -> str:
  where = f' --data_dir={data_dir}' if data_dir else ''
  return (
      f'Could not open TFDS cifar100 (split {split!r}, data_dir {data_dir or "default"}): '
      f'{type(error).__name__}: {error}\n'
      'Prepare it once in array_record format; this needs TensorFlow and internet:\n'
      '  pip install tensorflow\n'
      f'  tfds build cifar100 --file_format=array_record{where}\n'
      f'Alternative without the official test set: the trainsplit protocol on {NPZ_NAME} '
      f'(config variant ":trainsplit", file in ${DATA_DIR_ENV}).')


def open_tfds_split(split: str, data_dir: Optional[str]):
  """`tfds.data_source('cifar100', split=...)` of a prepared copy (random access, no TensorFlow; never
  downloading)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top (optional, slow import)
  try:
    return tfds.data_source('cifar100', split=split, data_dir=data_dir, download=False)
  except Exception as e:  # tfds raises many types here (ImportError, NotImplementedError, ...)
    raise DataError(_tfds_help(split, data_dir, e)) from e


def read_records(source, desc: str = '', batch_size: int = 1000) -> tuple:
  """(images uint8 [N, 32, 32, 3], labels int32 [N], ids [N]) in the source's storage order."""
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  n = len(source)
  images, labels, ids = [], [], []
  with tqdm(total=n, desc=desc, unit='img', disable=None, leave=False) as bar:
    for start in range(0, n, batch_size):
      records = source.__getitems__(list(range(start, min(n, start + batch_size))))
      images.extend(r['image'] for r in records)
      labels.extend(int(r['label']) for r in records)
      ids.extend(r['id'] for r in records)
      bar.update(len(records))
  images = np.stack(images).astype(np.uint8) if images else np.zeros((0, 32, 32, 3), np.uint8)
  return images, np.asarray(labels, np.int32), ids


def tfds_split(split: str, data_dir: Optional[str]) -> Split:
  """One TFDS split, reordered into the official file order by record id."""
  images, labels, ids = read_records(open_tfds_split(split, data_dir), desc=f'cifar100 {split}')
  order = official_order(ids)
  return Split(images[order], labels[order])


def parse_binary(data: bytes) -> Split:
  """Records of the official binary format (coarse label, fine label, 3 x 32 x 32 planes) -> Split."""
  record = 2 + 3 * IMAGE_SIZE * IMAGE_SIZE
  if len(data) % record:
    raise DataError(f'a CIFAR-100 binary file of {len(data)} bytes is not a whole number of {record}-byte records')
  rows = np.frombuffer(data, np.uint8).reshape(-1, record)
  images = rows[:, 2:].reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE).transpose(0, 2, 3, 1)
  return Split(np.ascontiguousarray(images), rows[:, 1].astype(np.int32))


def images_at_hand(tfds_data_dir: Optional[str], cache_dir) -> bool:
  """Whether the 'tfds' source finds the images without a download: a prepared TFDS cifar100, the
  converted arrays or the official archive in the cache folder."""
  cache = pathlib.Path(cache_dir)
  return (tfds_prepared(tfds_data_dir) or (cache / 'cifar100' / CONVERTED).is_file()
          or (cache / 'downloads' / ARCHIVE_NAME).is_file())


def archive_help(cache_dir) -> str:
  """Where the 'tfds' source's images come from, and what to do offline."""
  return (f'The official archive {ARCHIVE_NAME} ({ARCHIVE_SIZE / 1e6:.0f} MB, {ARCHIVE_URL}, sha256 {ARCHIVE_SHA256}), '
          f'downloaded into {pathlib.Path(cache_dir) / "downloads"}/ when online; offline, put it there yourself, '
          'or prepare a TFDS cifar100 with TensorFlow (pip install tensorflow; tfds build cifar100 '
          f'--file_format=array_record), or use configs/cifar100.py:trainsplit on {NPZ_NAME} (python -m '
          'f2m_jax.data.make_trainsplit builds it from the archive).')


def fetch_archive(cache_dir, help_text: str = '') -> pathlib.Path:
  """The official archive, downloaded once into `<cache_dir>/downloads/` (resumable, checked against
  ARCHIVE_SIZE and ARCHIVE_SHA256)."""
  return download.fetch(ARCHIVE_URL, pathlib.Path(cache_dir) / 'downloads' / ARCHIVE_NAME, ARCHIVE_SHA256,
                        ARCHIVE_SIZE, f'CIFAR-100 ({ARCHIVE_SIZE / 1e6:.0f} MB)', help_text)


def official_arrays(cache_dir) -> tuple:
  """(train, test) Splits in the official order, from `<cache>/cifar100/cifar100_official.npz`, made once
  from the official archive (`fetch_archive`, deleted after a successful conversion)."""
  folder = pathlib.Path(cache_dir) / 'cifar100'
  converted = folder / CONVERTED
  if not converted.is_file():
    archive = fetch_archive(
        cache_dir, f'Alternatives: a TFDS cifar100 prepared with TensorFlow (pip install tensorflow; tfds build '
        f'cifar100 --file_format=array_record), or the trainsplit protocol on {NPZ_NAME} '
        f'(configs/cifar100.py:trainsplit; python -m f2m_jax.data.make_trainsplit builds it).')
    arrays = {}
    with tarfile.open(archive, 'r:*') as tar:
      for split in ('train', 'test'):
        member = tar.extractfile(f'cifar-100-binary/{split}.bin')
        if member is None:
          raise DataError(f'{archive} lacks cifar-100-binary/{split}.bin')
        parsed = parse_binary(member.read())
        arrays[f'x_{split}'], arrays[f'y_{split}'] = parsed.images, parsed.labels.astype(np.int16)
    folder.mkdir(parents=True, exist_ok=True)
    with download.written_atomically(converted, '.npz') as tmp:
      np.savez(tmp, **arrays)
    os.remove(archive)
    print(f'converted CIFAR-100 once into {converted}', file=sys.stderr, flush=True)
  with np.load(converted) as f:
    return (Split(f['x_train'], f['y_train'].astype(np.int32)), Split(f['x_test'], f['y_test'].astype(np.int32)))


def load_cifar100_tfds(tfds_data_dir: Optional[str], index_dir, cache_dir=None) -> Benchmark:
  """The official protocol (official train order and test set, session_*.txt's base images and shots),
  from a prepared TFDS cifar100, else (with a cache folder) from the official archive."""
  tfds_error = None
  if cache_dir is None or tfds_prepared(tfds_data_dir):
    try:
      train = tfds_split('train', tfds_data_dir)
      test = tfds_split('test', tfds_data_dir)
    except DataError as e:
      if cache_dir is None:
        raise
      tfds_error = e
  if cache_dir is not None and (tfds_error is not None or not tfds_prepared(tfds_data_dir)):
    converted = pathlib.Path(cache_dir) / 'cifar100' / CONVERTED
    if not converted.is_file():
      print(f'CIFAR-100: not in the cache folder ({converted}) and no TFDS cifar100 prepared in '
            f'{tfds_folder(tfds_data_dir)}; downloading the official archive once ({ARCHIVE_SIZE / 1e6:.0f} MB, '
            f'{ARCHIVE_URL}) into {pathlib.Path(cache_dir) / "downloads"}', file=sys.stderr, flush=True)
    try:
      train, test = official_arrays(cache_dir)
    except DataError as e:
      raise DataError(f'{e}' + (f'\n\nA prepared TFDS cifar100 was found but could not be read: {tfds_error}'
                                if tfds_error is not None else '')) from e
  base_train, topic_shots = read_topic_lists(index_dir)
  shot_pool = np.flatnonzero(train.labels >= NUM_BASE)
  return _benchmark('cifar100', train, test, base_train, shot_pool, topic_shots)


# ---------------------------------------------------------------- trainsplit source

def load_train_npz(npz_path) -> Split:
  """The official training set from `cifar100_train.npz` (x_train uint8, y_train fine labels)."""
  path = pathlib.Path(npz_path)
  if not path.is_file():
    raise DataError(f'{path} not found. Point ${DATA_DIR_ENV} (or --config.data.data_dir) at the folder '
                    f'holding {NPZ_NAME}.\n{TRAINSPLIT_HOW_TO_GET}')
  with np.load(path) as f:
    if 'x_train' not in f or 'y_train' not in f:
      raise DataError(f'{path} must hold arrays x_train and y_train, has {sorted(f.keys())}')
    return Split(np.asarray(f['x_train'], np.uint8), np.asarray(f['y_train'], np.int32))


def trainsplit_test_indices(labels: np.ndarray, shots: np.ndarray,
                            per_class: int = TEST_PER_CLASS) -> np.ndarray:
  """For every class c (ascending): the last `per_class` of the sorted indices of c that are not in
  `shots`. Concatenated class by class."""
  is_shot = np.zeros(labels.shape[0], bool)
  is_shot[shots] = True
  picked = []
  for c in np.unique(labels):
    candidates = np.flatnonzero((labels == c) & ~is_shot)
    if candidates.size < per_class:
      raise DataError(f'class {c}: only {candidates.size} non-shot images, need {per_class}')
    picked.append(candidates[-per_class:])
  return np.concatenate(picked)


def load_cifar100_trainsplit(npz_path, index_dir) -> Benchmark:
  """The `trainsplit` protocol: test = the last 100 non-shot training images of each class, base_train =
  session_1.txt minus those, shot_pool = the other novel-class training images (docs/data.md)."""
  train = load_train_npz(npz_path)
  base_list, topic_shots = read_topic_lists(index_dir)
  _check_in_range((base_list, *topic_shots), len(train))
  test_idx = trainsplit_test_indices(train.labels, np.concatenate(topic_shots))
  is_test = np.zeros(len(train), bool)
  is_test[test_idx] = True
  base_train = base_list[~is_test[base_list]]
  shot_pool = np.flatnonzero(~is_test & (train.labels >= NUM_BASE))
  test = Split(train.images[test_idx], train.labels[test_idx])
  return _benchmark('cifar100_trainsplit', train, test, base_train, shot_pool, topic_shots)


# ---------------------------------------------------------------- superclass splits

SUPERCLASS_FILE = pathlib.Path(__file__).with_name('cifar100_superclasses.json')
# The paper's appendix tables "first" and "second class split": base = 6 superclasses (30 classes),
# then one superclass (5 classes, 5-way 5-shot) per session, in the paper's order.
SUPERCLASS_SPLITS = {
    'superclass1': (('aquatic_mammals', 'fish', 'insects', 'reptiles', 'small_mammals', 'large_carnivores'),
                    ('vehicles_2', 'flowers', 'food_containers', 'household_furniture')),
    'superclass2': (('aquatic_mammals', 'fish', 'insects', 'reptiles', 'household_furniture', 'small_mammals'),
                    ('people', 'vehicles_2', 'flowers', 'food_containers')),
}


def superclasses() -> tuple:
  """(coarse names [20], fine_to_coarse [100]) from the shipped CIFAR-100 superclass table."""
  with open(SUPERCLASS_FILE) as f:
    table = json.load(f)
  return tuple(table['coarse_names']), np.asarray(table['fine_to_coarse'], np.int64)


# ---------------------------------------------------------------- class-incremental split

# Plain class-incremental learning as the LUCIR paper runs it on CIFAR-100 (the check the F2M
# appendix uses for its iCaRL and Rebalance): LUCIR's class order (NumPy's legacy RNG seeded with
# 1993 shuffling 0..99), the first 50 classes as the base session, then 5 sessions of 10 classes
# that bring every training image of their classes (`data.shots` = the images per class: 400 on
# trainsplit, 500 on tfds).
CLASS_INCREMENTAL_SPLITS = {'incremental50': (50, 10, 1993)}
SPLITS = tuple(SUPERCLASS_SPLITS) + tuple(CLASS_INCREMENTAL_SPLITS)


def split_order(split: str) -> tuple:
  """(fine labels in the split's class order, classes per session) of any split in SPLITS: a superclass
  split's superclasses base first, each one's 5 fine classes ascending; LUCIR's seeded permutation."""
  if split in CLASS_INCREMENTAL_SPLITS:
    base, way, seed = CLASS_INCREMENTAL_SPLITS[split]
    return np.random.RandomState(seed).permutation(100), (base,) + (way,) * ((100 - base) // way)
  if split not in SUPERCLASS_SPLITS:
    raise ValueError(f'data.split={split!r} is not one of {sorted(SPLITS)} (or empty)')
  names, fine_to_coarse = superclasses()
  base, sessions = SUPERCLASS_SPLITS[split]
  groups = [np.flatnonzero(fine_to_coarse == names.index(n)) for n in base + sessions]
  return np.concatenate(groups), (sum(len(g) for g in groups[:len(base)]),) + tuple(len(g) for g in groups[len(base):])


def class_split(bench: Benchmark, split: str) -> Benchmark:
  """The CIFAR-100 benchmark `bench` relabelled into `split` (class ids in the split's order); no TOPIC
  shots (the shots are F2M-style draws)."""
  order, sizes = split_order(split)
  new_id = np.full(100, -1, np.int64)
  new_id[order] = np.arange(len(order))
  train_labels = new_id[bench.train.labels].astype(np.int32)
  usable = np.zeros(len(bench.train), bool)
  usable[np.concatenate([bench.base_train, bench.shot_pool])] = True
  num_base = sizes[0]
  keep_test = new_id[bench.test.labels] >= 0
  test = Split(bench.test.images[keep_test], new_id[bench.test.labels[keep_test]].astype(np.int32))
  bounds = np.cumsum((0,) + sizes).tolist()
  classes = [tuple(range(start, end)) for start, end in zip(bounds[:-1], bounds[1:])]
  return Benchmark(
      name=f'{bench.name}_{split}', train=Split(bench.train.images, train_labels), test=test,
      base_train=np.flatnonzero(usable & (train_labels >= 0) & (train_labels < num_base)),
      session_classes=tuple(classes), shot_pool=np.flatnonzero(usable & (train_labels >= num_base)),
      topic_shots=None, image_size=bench.image_size, mean=bench.mean, std=bench.std, augment=bench.augment)
