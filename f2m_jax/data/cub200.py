"""CUB-200-2011 in the TOPIC protocol (100 base classes, 10 sessions of 10-way 5-shot), from the
official folder layout.

Expected layout under the data folder (`$F2M_DATA_DIR` or `config.data.data_dir`):

    CUB_200_2011/images/<class dir>/<file>.jpg    11,788 JPEGs, class dirs 001.Black_footed_Albatross ...
    CUB_200_2011/images.txt                       <image id> <class dir>/<file>.jpg
    CUB_200_2011/train_test_split.txt             <image id> <1 = train, 0 = test>
    CUB_200_2011/image_class_labels.txt           <image id> <class id 1..200>
    CUB_200_2011/classes.txt                      <class id> <class dir>
    index_list/cub200/session_1.txt               3,000 lines CUB_200_2011/images/<class dir>/<file>.jpg
    index_list/cub200/session_{2..11}.txt         50 lines each (10 classes x 5 shots)

(the official archive CUB_200_2011.tgz unpacked in the data folder gives exactly this). Class id =
official id - 1, which is the TOPIC order (session 1 = classes 0..99). train = the official training
images, test = the official test images (both in images.txt order).

Decoding (once, cached as uint8 `.npy` in the cache folder, see `mini_imagenet.decode_cached`):
  - train images: Resize(256) + CenterCrop(256); the device's RandomResizedCrop(224) + flip (augment
    'rrc_flip') crops from that square. (The original crops from the whole image, so crops near the
    ends of the longer side are not drawn here: a small, documented difference.) Their centre 224
    crop (`augment.eval_view`) is exactly the test transform, the view for prototypes.
  - test images: Resize(256) + CenterCrop(224), the original's test transform.
ImageNet normalisation. `image_size` scales 224 and 256 together (smoke runs use small images).
"""
from __future__ import annotations

import pathlib
from typing import Callable, Optional

import numpy as np

from f2m_jax.data import index_lists
from f2m_jax.data.index_lists import DATA_DIR_ENV, session_lists
from f2m_jax.data.mini_imagenet import (Protocol, decode_cached, protocol_benchmark, scaled,
                                        sessions_from_lists)
from f2m_jax.data.types import Benchmark, DataError

IMAGE_SIZE = 224
RESIZE = 256  # train: Resize(256) + CenterCrop(256); test: Resize(256) + CenterCrop(224)
NUM_SESSIONS = 11
FOLDER = 'CUB_200_2011'
META_FILES = ('images.txt', 'train_test_split.txt', 'image_class_labels.txt', 'classes.txt')

HOW_TO_GET = (
    'How to obtain it: download CUB_200_2011.tgz (Caltech-UCSD Birds-200-2011, '
    'https://www.vision.caltech.edu/datasets/cub_200_2011/ or https://data.caltech.edu/records/65de6-vzc59) '
    f'and unpack it in the data folder (${DATA_DIR_ENV} or --config.data.data_dir), so that '
    f'<data folder>/{FOLDER}/images/ and <data folder>/{FOLDER}/images.txt exist.')


def check_layout(data_dir) -> pathlib.Path:
  """`<data_dir>/CUB_200_2011` holding images/ and the four metadata files, else DataError."""
  if not data_dir:
    raise DataError(f'CUB-200-2011 needs a data folder: set ${DATA_DIR_ENV} or --config.data.data_dir.\n'
                    f'{HOW_TO_GET}')
  root = pathlib.Path(data_dir) / FOLDER
  missing = [str(root / n) for n in ('images',) + META_FILES if not (root / n).exists()]
  if missing:
    raise DataError(
        'CUB-200-2011 not found or incomplete: missing ' + ', '.join(missing) + '.\n'
        f'Expected {root}/images/<class dir>/<file>.jpg and {root}/{{{",".join(META_FILES)}}}, plus the '
        f'TOPIC lists in {pathlib.Path(data_dir) / "index_list" / "cub200"}/session_{{1..11}}.txt '
        '(downloaded into the cache when absent).\n' + HOW_TO_GET)
  return root


def _read_pairs(path: pathlib.Path) -> dict:
  """{int id: value} from '<id> <value>' lines."""
  out = {}
  for n, line in enumerate(path.read_text().splitlines(), start=1):
    line = line.strip()
    if not line:
      continue
    parts = line.split(maxsplit=1)
    if len(parts) != 2 or not parts[0].isdigit():
      raise DataError(f'{path}:{n}: expected "<id> <value>", got {line!r}')
    out[int(parts[0])] = parts[1].strip()
  return out


def read_metadata(root: pathlib.Path) -> tuple:
  """(relative paths, is_train bool, labels 0-based) per image, in image-id order, checked for
  consistency between the four metadata files."""
  images = _read_pairs(root / 'images.txt')
  split = _read_pairs(root / 'train_test_split.txt')
  labels = _read_pairs(root / 'image_class_labels.txt')
  classes = _read_pairs(root / 'classes.txt')
  ids = sorted(images)
  if set(split) != set(ids) or set(labels) != set(ids):
    raise DataError(f'{root}: images.txt, train_test_split.txt and image_class_labels.txt list different '
                    'image ids (incomplete download?)')
  paths, is_train, y = [], [], []
  for i in ids:
    rel, c = images[i], int(labels[i])
    if c not in classes:
      raise DataError(f'{root}/image_class_labels.txt: image {i} has class {c}, absent from classes.txt')
    if rel.split('/')[0] != classes[c]:
      raise DataError(f'{root}: image {i} ({rel}) is not in the folder of its class {classes[c]}')
    paths.append(rel)
    is_train.append(split[i].strip() == '1')
    y.append(c - 1)
  if sorted(classes) != list(range(1, len(classes) + 1)):
    raise DataError(f'{root}/classes.txt: class ids must be 1..{len(classes)}')
  return paths, np.asarray(is_train, bool), np.asarray(y, np.int32)


def read_protocol(data_dir, index_dir) -> Protocol:
  """The official split and labels (`read_metadata`) mapped to session_1..11.txt: every list line must
  be an official training image; session 1 must hold classes 0..B-1 and each later session the next
  block of classes."""
  root = check_layout(data_dir)
  index_dir = pathlib.Path(index_dir)
  paths, is_train, labels = read_metadata(root)
  train_idx, test_idx = np.flatnonzero(is_train), np.flatnonzero(~is_train)
  train_paths = [paths[i] for i in train_idx]
  position = {p: k for k, p in enumerate(train_paths)}
  train_labels = labels[train_idx]
  prefix = f'{FOLDER}/images/'
  indices = []
  for t, lines in enumerate(session_lists(index_dir, NUM_SESSIONS), start=1):
    idx = []
    for line in lines:
      rel = line.replace('\\', '/')
      rel = rel[len(prefix):] if rel.startswith(prefix) else rel
      if rel not in position:
        where = 'an official test image' if rel in set(paths) else 'not in images.txt'
        raise DataError(f'{index_dir}/session_{t}.txt names {line}, which is {where}')
      idx.append(position[rel])
    indices.append(np.asarray(idx, np.int64))
  num_classes = int(labels.max()) + 1
  session_classes = sessions_from_lists([train_labels[i] for i in indices], num_classes, 'cub200')
  names = {}
  for rel, y in zip(paths, labels):
    names.setdefault(int(y), rel.split('/')[0])
  return Protocol(class_names=[names.get(c, '') for c in range(num_classes)], train_files=train_paths,
                  train_labels=train_labels, test_files=[paths[i] for i in test_idx],
                  test_labels=labels[test_idx], session_indices=indices, session_classes=session_classes)


def load_cub200(data_dir, index_dir=None, cache_dir=None, image_size: int = IMAGE_SIZE,
                decode: Optional[Callable] = None) -> Benchmark:
  """The CUB-200-2011 `Benchmark` (TOPIC protocol) from the official folder layout.

  train = official training images, test = official test images (images.txt order), labels =
  official class id - 1; base_train = session_1.txt; topic_shots = session_2..11.txt; shot_pool =
  training images of the novel classes. `index_dir` None: `index_lists.index_list_dir('cub200', ...)`.
  `decode` replaces `mini_imagenet.decode_file` (tests)."""
  root = check_layout(data_dir)
  cache_dir = pathlib.Path(cache_dir) if cache_dir else index_lists.default_cache_dir()
  if index_dir is None:
    index_dir = index_lists.index_list_dir('cub200', str(data_dir), str(cache_dir))
  p = read_protocol(data_dir, index_dir)

  resize = scaled(image_size, IMAGE_SIZE, RESIZE)
  folder = cache_dir / 'arrays' / 'cub200'
  images_dir = root / 'images'
  train_images = decode_cached([images_dir / f for f in p.train_files], root, folder, 'train', resize, resize,
                               desc='CUB-200 train', how_to_get=HOW_TO_GET, decode=decode)
  test_images = decode_cached([images_dir / f for f in p.test_files], root, folder, 'test', resize,
                              image_size, desc='CUB-200 test', how_to_get=HOW_TO_GET, decode=decode)
  return protocol_benchmark('cub200', p, train_images, test_images, image_size)
