"""CIFAR-100 in the TOPIC protocol (docs/data.md): the official train and test sets
(`load_official`, data.source 'tfds': a TFDS cifar100 prepared in TFDS's data folder, else the
official archive TFDS itself downloads) or the official training set alone from the trainsplit
npz (`load_cifar100_trainsplit`), class ids the official fine labels; also the class splits."""
import dataclasses
import json
import os
import pathlib
import re
import sys
import tarfile

import numpy as np

from f2m_jax.data import download
from f2m_jax.data.index_lists import DATA_DIR_ENV, session_lists
from f2m_jax.data.types import (Benchmark, DataError, Split, check_session_indices,
                                sessions_from_counts)

# Normalisation of the original code (0..1 scale).
MEAN = (0.5071, 0.4866, 0.4409)
STD = (0.2009, 0.1984, 0.2023)
IMAGE_SIZE = 32

NUM_BASE, WAY, SHOTS, NUM_SESSIONS = 60, 5, 5, 9
SESSION_CLASSES = sessions_from_counts(NUM_BASE, WAY, NUM_SESSIONS)
TEST_PER_CLASS = 100  # trainsplit: held-out images per class
NPZ_NAME = 'cifar100_train.npz'
# The official binary archive, pinned as TFDS pins it
# (tensorflow_datasets/url_checksums/cifar100.txt).
ARCHIVE_URL = 'https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz'
ARCHIVE_SIZE = 168513733
ARCHIVE_SHA256 = '58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec'
ARCHIVE_NAME = 'cifar-100-binary.tar.gz'
TRAINSPLIT_ALTERNATIVE = (f'configs/cifar100.py:trainsplit on {NPZ_NAME} (python -m '
                          'f2m_jax.data.make_trainsplit builds it from the archive)')
TRAINSPLIT_HOW_TO_GET = (f'How to obtain it: {NPZ_NAME} is the official training set as arrays '
                         '(docs/data.md); build it with `python -m f2m_jax.data.make_trainsplit '
                         '--out <data folder>` (downloads the official archive, or --archive <a '
                         f'local {ARCHIVE_NAME}>); the data folder is ${DATA_DIR_ENV} or '
                         '--config.data.data_dir.')


# ---------------------------------------------------------------- TOPIC lists

def read_topic_lists(index_dir, num_images):
  """(base_train, topic_shots): session_1.txt and the session_2..9.txt lists as int64 arrays,
  every index one of the `num_images` training images."""
  lists = session_lists(index_dir, NUM_SESSIONS)  # a DataError (a ValueError) of its own
  try:
    arrays = [np.asarray(lines, np.int64) for lines in lists]
  except ValueError as e:
    raise DataError(f'{index_dir}: CIFAR-100 index lists must hold one integer per line '
                    f'({e})') from e
  if any(a.size and (a.min() < 0 or a.max() >= num_images) for a in arrays):
    raise DataError(f'{index_dir}: the index lists point outside the {num_images} training images')
  return arrays[0], tuple(arrays[1:])


def _benchmark(name, train, test, base_train, shot_pool, topic_shots):
  """Builds the Benchmark and checks the TOPIC indices against the labels (catches a wrong
  order)."""
  bench = Benchmark(
      name=name, train=train, test=test, base_train=base_train, session_classes=SESSION_CLASSES,
      shot_pool=shot_pool, topic_shots=topic_shots, image_size=IMAGE_SIZE, mean=MEAN, std=STD,
      augment='crop_flip')
  try:
    if np.any(train.labels[base_train] >= NUM_BASE):
      raise ValueError('session 1: base training images of novel classes')
    for t, shots in enumerate(topic_shots, start=2):
      check_session_indices(bench, shots, t, SHOTS)
  except ValueError as e:
    raise DataError('the TOPIC lists do not match the CIFAR-100 labels (wrong image '
                    f'order?): {e}') from e
  return bench


# ---------------------------------------------------------------- the official archive

ARCHIVE_FILES = ('train.bin', 'test.bin', 'fine_label_names.txt')
# a record of train.bin and test.bin: coarse label, fine label, 3 x 32 x 32 planes
RECORD = 2 + 3 * IMAGE_SIZE ** 2


def read_archive(archive):
  """{'x_train', 'y_train', 'x_test', 'y_test', 'label_names'} of the official binary archive
  (images in file order, fine labels as int16), read in one pass: the one reader of both
  sources' arrays."""
  try:
    with tarfile.open(archive) as tar:
      files = {os.path.basename(m.name): tar.extractfile(m).read() for m in tar
               if os.path.basename(m.name) in ARCHIVE_FILES and m.isfile()}
  except (tarfile.TarError, OSError) as e:
    raise DataError(f'could not read {archive} as a .tar.gz archive: {e}') from e
  missing = [n for n in ARCHIVE_FILES if n not in files]
  if missing:
    raise DataError(f'{archive} is not the CIFAR-100 binary archive: it lacks {", ".join(missing)} '
                    '(expected cifar-100-binary/train.bin, test.bin and fine_label_names.txt)')
  arrays = {'label_names': np.asarray(files['fine_label_names.txt'].decode().split())}
  for split in ('train', 'test'):
    data = files[f'{split}.bin']
    if len(data) % RECORD:
      raise DataError(f'{archive}: {split}.bin is not a whole number of {RECORD}-byte records')
    rows = np.frombuffer(data, np.uint8).reshape(-1, RECORD)
    images = rows[:, 2:].reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE).transpose(0, 2, 3, 1)
    arrays[f'x_{split}'] = np.ascontiguousarray(images)
    arrays[f'y_{split}'] = rows[:, 1].astype(np.int16)
  if len(arrays['label_names']) != 100 or arrays['y_train'].max(initial=0) >= 100:
    raise DataError(f'{archive}: expected 100 fine label names and labels 0..99, found '
                    f'{len(arrays["label_names"])} names')
  return arrays


def archive_path(cache_dir):
  """Where the official archive is downloaded to and read from: `<cache_dir>/downloads/`."""
  return pathlib.Path(cache_dir) / 'downloads' / ARCHIVE_NAME


def images_at_hand(cache_dir, tfds_data_dir):
  """Whether the 'tfds' source needs no download: a prepared TFDS cifar100, or the official
  archive in the cache."""
  return tfds_prepared(tfds_data_dir) or archive_path(cache_dir).is_file()


def tfds_folder(data_dir):
  """TFDS's data folder: `data_dir` (data.tfds_data_dir), else $TFDS_DATA_DIR, else
  ~/tensorflow_datasets."""
  folder = data_dir or os.environ.get('TFDS_DATA_DIR') or '~/tensorflow_datasets'
  return pathlib.Path(folder).expanduser()


def tfds_prepared(data_dir):
  """Whether a TFDS cifar100 is prepared there (cifar100/<version>/dataset_info.json)."""
  return any(tfds_folder(data_dir).glob('cifar100/*/dataset_info.json'))


def tfds_split(split, data_dir):
  """One split of the prepared TFDS cifar100, read with `tfds.data_source` (random access: no
  TensorFlow, never a download) and put back into the official file order by its record ids
  ('train_00012': 12)."""
  # A slow import, so only here.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  folder = tfds_folder(data_dir)
  try:
    source = tfds.data_source('cifar100', split=split, data_dir=str(folder), download=False)
    records = source.__getitems__(list(range(len(source))))
    # b'train_00012': 12
    numbers = np.asarray([int(re.sub(r'\D', '', str(r['id']))) for r in records])
  except Exception as e:  # tfds raises many types for a copy it cannot read
    raise DataError(f'the TFDS cifar100 prepared in {folder} cannot be read ({type(e).__name__}: '
                    f'{e}); prepare it again (pip install tensorflow; tfds build cifar100 '
                    '--file_format=array_record) or move it away to use the official '
                    'archive') from e
  order = np.argsort(numbers)
  if not np.array_equal(numbers[order], np.arange(len(numbers))):
    raise DataError(f'the record ids of TFDS cifar100 {split} do not number its images 0..N-1 '
                    'exactly once')
  images = np.stack([r['image'] for r in records]).astype(np.uint8)
  return Split(images[order], np.asarray([r['label'] for r in records], np.int32)[order])


def archive_help(cache_dir):
  """Where the 'tfds' source's images come from, and what to do offline."""
  return (f'The official archive {ARCHIVE_NAME} ({ARCHIVE_SIZE / 1e6:.0f} MB, {ARCHIVE_URL}, '
          f'sha256 {ARCHIVE_SHA256}), downloaded into {archive_path(cache_dir).parent}/ when '
          f'online; offline, put it there yourself, or use {TRAINSPLIT_ALTERNATIVE}.')


def fetch_archive(cache_dir, help_text=''):
  """The official archive in `<cache_dir>/downloads/`, downloaded there once (`download.fetch`)."""
  return download.fetch(ARCHIVE_URL, archive_path(cache_dir), ARCHIVE_SHA256, ARCHIVE_SIZE,
                        f'CIFAR-100 ({ARCHIVE_SIZE / 1e6:.0f} MB)', help_text)


def load_official(index_dir, cache_dir, tfds_data_dir=''):
  """The official protocol (official train order and test set, session_*.txt's base images and
  shots), from a prepared TFDS cifar100, else from the official archive in
  `<cache>/downloads/` (downloaded there once)."""
  if tfds_prepared(tfds_data_dir):
    train, test = (tfds_split(s, tfds_data_dir) for s in ('train', 'test'))
  else:
    archive = archive_path(cache_dir)
    if not archive.is_file():
      print(f'CIFAR-100: no TFDS cifar100 prepared in {tfds_folder(tfds_data_dir)}, nor the '
            f'official archive in the cache ({archive}); downloading the archive once '
            f'({ARCHIVE_SIZE / 1e6:.0f} MB, {ARCHIVE_URL})',
            file=sys.stderr)
    arrays = read_archive(fetch_archive(cache_dir, f'Alternative: {TRAINSPLIT_ALTERNATIVE}.'))
    train, test = (Split(arrays[f'x_{s}'], arrays[f'y_{s}'].astype(np.int32))
                   for s in ('train', 'test'))
  base_train, topic_shots = read_topic_lists(index_dir, len(train))
  shot_pool = np.flatnonzero(train.labels >= NUM_BASE)
  return _benchmark('cifar100', train, test, base_train, shot_pool, topic_shots)


# ---------------------------------------------------------------- trainsplit source

def load_train_npz(path):
  """The official training set from `cifar100_train.npz` (x_train uint8, y_train fine labels)."""
  if not os.path.isfile(path):
    raise DataError(f'{path} not found.\n{TRAINSPLIT_HOW_TO_GET}')
  with np.load(path) as f:
    if 'x_train' not in f or 'y_train' not in f:
      raise DataError(f'{path} must hold arrays x_train and y_train, has {sorted(f.keys())}')
    return Split(np.asarray(f['x_train'], np.uint8), np.asarray(f['y_train'], np.int32))


def trainsplit_test_indices(labels, shots, per_class=TEST_PER_CLASS):
  """For every class c (ascending): the last `per_class` of the sorted indices of c that are not in
  `shots`. Concatenated class by class."""
  free = np.setdiff1d(np.arange(len(labels)), shots)
  picked = {c: free[labels[free] == c][-per_class:] for c in np.unique(labels)}
  for c, p in picked.items():
    if len(p) < per_class:
      raise DataError(f'class {c}: only {len(p)} non-shot images, need {per_class}')
  return np.concatenate(list(picked.values()))


def load_cifar100_trainsplit(train, index_dir):
  """The `trainsplit` protocol on the official training set `train` (`load_train_npz`): test = the
  last 100 non-shot training images of each class, base_train = session_1.txt minus those,
  shot_pool = the other novel-class training images (docs/data.md)."""
  base_list, topic_shots = read_topic_lists(index_dir, len(train))
  test_idx = trainsplit_test_indices(train.labels, np.concatenate(topic_shots))
  is_test = np.isin(np.arange(len(train)), test_idx)
  base_train = base_list[~is_test[base_list]]
  shot_pool = np.flatnonzero(~is_test & (train.labels >= NUM_BASE))
  test = Split(train.images[test_idx], train.labels[test_idx])
  return _benchmark('cifar100_trainsplit', train, test, base_train, shot_pool, topic_shots)


# ---------------------------------------------------------------- superclass splits

# The paper's appendix tables "first" and "second class split": base = 6 superclasses (30 classes),
# then one superclass (5 classes, 5-way 5-shot) per session, in the paper's order.
SUPERCLASS_SPLITS = {
    'superclass1': (('aquatic_mammals', 'fish', 'insects', 'reptiles', 'small_mammals',
                     'large_carnivores'),
                    ('vehicles_2', 'flowers', 'food_containers', 'household_furniture')),
    'superclass2': (('aquatic_mammals', 'fish', 'insects', 'reptiles', 'household_furniture',
                     'small_mammals'),
                    ('people', 'vehicles_2', 'flowers', 'food_containers')),
}


def superclasses():
  """(coarse names [20], fine_to_coarse [100]) from the shipped CIFAR-100 superclass table."""
  table = json.loads(pathlib.Path(__file__).with_name('cifar100_superclasses.json').read_text())
  return tuple(table['coarse_names']), np.asarray(table['fine_to_coarse'], np.int64)


# ---------------------------------------------------------------- class-incremental split

# Plain class-incremental learning as the LUCIR paper runs it on CIFAR-100 (the check the F2M
# appendix uses for its iCaRL and Rebalance): LUCIR's class order (NumPy's legacy RNG seeded with
# 1993 shuffling 0..99), the first 50 classes as the base session, then 5 sessions of 10 classes
# that bring every training image of their classes (`data.shots` = the images per class: 400 on
# trainsplit, 500 on tfds).
CLASS_INCREMENTAL_SPLITS = {'incremental50': (50, 10, 1993)}
SPLITS = tuple(SUPERCLASS_SPLITS) + tuple(CLASS_INCREMENTAL_SPLITS)


def split_order(split):
  """(fine labels in the split's class order, classes per session) of any split in SPLITS: a
  superclass split's superclasses base first, each one's 5 fine classes ascending; LUCIR's
  seeded permutation."""
  if split in CLASS_INCREMENTAL_SPLITS:
    base, way, seed = CLASS_INCREMENTAL_SPLITS[split]
    return np.random.RandomState(seed).permutation(100), (base,) + (way,) * ((100 - base) // way)
  if split not in SUPERCLASS_SPLITS:
    raise ValueError(f'data.split={split!r} is not one of {sorted(SPLITS)} (or empty)')
  names, fine_to_coarse = superclasses()
  base, sessions = SUPERCLASS_SPLITS[split]
  order = np.concatenate([np.flatnonzero(fine_to_coarse == names.index(n))
                          for n in base + sessions])
  return order, (5 * len(base),) + (5,) * len(sessions)  # every superclass holds 5 classes


def class_split(bench, split):
  """The CIFAR-100 benchmark `bench` relabelled into `split` (class ids in the split's order); no
  TOPIC shots (the shots are F2M-style draws)."""
  order, sizes = split_order(split)
  new_id = np.full(100, -1, np.int32)
  new_id[order] = np.arange(len(order))
  train_labels, test_labels = new_id[bench.train.labels], new_id[bench.test.labels]
  usable = np.isin(np.arange(len(bench.train)), np.concatenate([bench.base_train, bench.shot_pool]))
  keep_test = test_labels >= 0
  return dataclasses.replace(
      bench, name=f'{bench.name}_{split}', train=Split(bench.train.images, train_labels),
      test=Split(bench.test.images[keep_test], test_labels[keep_test]),
      base_train=np.flatnonzero(usable & (train_labels >= 0) & (train_labels < sizes[0])),
      session_classes=sessions_from_counts(sizes[0], sizes[1], len(sizes)),
      shot_pool=np.flatnonzero(usable & (train_labels >= sizes[0])), topic_shots=None)
