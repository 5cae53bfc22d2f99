"""miniImageNet in the TOPIC protocol (60 base classes, 8 sessions of 5-way 5-shot), from the layout of
the FSCIL codebases (CEC, FACT, ...), plus the decode-once array cache shared with `cub200`.

Expected layout under the data folder (`$F2M_DATA_DIR` or `config.data.data_dir`):

    miniimagenet/images/<file>.jpg           60,000 JPEGs (100 classes x 600), e.g. n0153282900000005.jpg
    miniimagenet/split/train.csv             filename,label (label = wnid); 50,000 rows (500 per class)
    miniimagenet/split/test.csv              filename,label; 10,000 rows (100 per class)
    index_list/mini_imagenet/session_1.txt   30,000 lines MINI-ImageNet/train/<wnid>/<file>.jpg
    index_list/mini_imagenet/session_{2..9}.txt   25 lines each (5 classes x 5 shots)

The split CSVs are read from `index_list/mini_imagenet/{train,test}.csv` (pinned by checksum in
`index_lists`) when present, else from `miniimagenet/split/`. List lines are mapped to `images/` by file
name. Class ids are the sorted wnids, which is the TOPIC order (session 1 = the first 60 wnids).

Decoding: every image is decoded once with PIL and stored as a uint8 `.npy` file in the cache folder
(never the data folder), keyed by a hash of the file list, the file sizes and the transform:
  - test images: Resize(92) + CenterCrop(84), the original's test transform;
  - train images: Resize(92) + CenterCrop(92), i.e. 92x92 (the usual 84x84 images upsampled). The
    original's RandomResizedCrop(84) + flip runs on the device (augment 'rrc_flip') on these, and
    their centre 84x84 crop (`augment.eval_view`) is exactly the original's test transform of a training
    image, which is what prototypes (Eq. 1) must be computed from.
ImageNet normalisation. `image_size` scales 84 and 92 together (smoke runs use small images).
"""
from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import hashlib
import json
import os
import pathlib
import tempfile
from typing import Callable, Optional, Sequence

import numpy as np

from f2m_jax.data import index_lists
from f2m_jax.data.index_lists import DATA_DIR_ENV, session_lists
from f2m_jax.data.types import Benchmark, DataError, Split, check_session_indices

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUGMENT = 'rrc_flip'

IMAGE_SIZE = 84
TEST_RESIZE = 92  # Resize(92) + CenterCrop(84) at 84; scaled proportionally for other sizes
NUM_SESSIONS = 9
SHOTS = 5
FOLDER = 'miniimagenet'
CACHE_VERSION = 1

HOW_TO_GET = (
    'How to obtain it: miniImageNet as distributed for the FSCIL codebases (CEC, '
    'https://github.com/icoz69/CEC-CVPR2021, "Datasets": the miniimagenet folder with images/ and split/), '
    'or build images/ from ImageNet with the miniImageNet split (Ravi & Larochelle) at 84x84. '
    f'Put it so that <data folder>/{FOLDER}/images/ holds the JPEGs and <data folder>/{FOLDER}/split/ '
    f'the CSVs; the data folder is ${DATA_DIR_ENV} or --config.data.data_dir.')


# ================================================================ decoding and the array cache
# (shared with cub200)

def resize_short(img, size: int):
  """torchvision `Resize(size)` on a PIL image: the shorter side becomes `size`, the longer one
  int(size * long / short); bilinear (PIL's antialiased filter, as torchvision on PIL images)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  w, h = img.size
  if min(w, h) == size:
    return img
  if w <= h:
    new_w, new_h = size, int(size * h / w)
  else:
    new_w, new_h = int(size * w / h), size
  return img.resize((new_w, new_h), Image.BILINEAR)


def center_crop(img, size: int):
  """torchvision `CenterCrop(size)` on a PIL image at least `size` on each side."""
  w, h = img.size
  if w < size or h < size:
    raise ValueError(f'image {w}x{h} is smaller than the crop {size}')
  top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
  return img.crop((left, top, left + size, top + size))


def transform_image(img, resize: int, crop: int) -> np.ndarray:
  """RGB uint8 [crop, crop, 3]: Resize(resize) then CenterCrop(crop), as torchvision on PIL images."""
  return np.asarray(center_crop(resize_short(img.convert('RGB'), resize), crop), np.uint8)


def decode_file(path, resize: int, crop: int) -> np.ndarray:
  """Decodes one image file with PIL and applies `transform_image`."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  with Image.open(path) as img:
    return transform_image(img, resize, crop)


def check_files(paths: Sequence[pathlib.Path], what: str, how_to_get: str) -> list:
  """Sizes in bytes of every file; DataError listing the missing ones (the first 10 and a count)."""
  sizes, missing = [], []
  for p in paths:
    try:
      sizes.append(os.stat(p).st_size)
    except OSError:
      missing.append(str(p))
  if missing:
    shown = '\n  '.join(missing[:10])
    more = f'\n  ... and {len(missing) - 10} more' if len(missing) > 10 else ''
    raise DataError(f'{what}: {len(missing)} of {len(paths)} image files are missing:\n  {shown}{more}\n'
                    f'{how_to_get}')
  return sizes


def cache_key(root, paths: Sequence[pathlib.Path], sizes: Sequence[int], transform: dict) -> str:
  """sha256 over the cache version, the transform and every (path relative to root, size)."""
  h = hashlib.sha256()
  h.update(json.dumps({'version': CACHE_VERSION, 'transform': transform}, sort_keys=True).encode())
  root = pathlib.Path(root)
  for p, s in zip(paths, sizes):
    h.update(f'\n{pathlib.Path(p).relative_to(root).as_posix()}\t{int(s)}'.encode())
  return h.hexdigest()


def _default_workers() -> int:
  return max(1, min(16, os.cpu_count() or 1))


def decode_cached(paths: Sequence[pathlib.Path], root, cache_folder, name: str, resize: int, crop: int,
                  desc: str = '', how_to_get: str = '',
                  decode: Optional[Callable] = None, workers: Optional[int] = None) -> np.ndarray:
  """uint8 [N, crop, crop, 3]: the images at `paths`, transformed, from the cache file
  `<cache_folder>/<name>-<key>.npy` (memory-mapped, read-only) when it exists; otherwise decoded once
  (threads, progress bar) into a temporary file that is renamed into place when complete."""
  paths = [pathlib.Path(p) for p in paths]
  sizes = check_files(paths, desc or name, how_to_get)
  transform = {'resize': int(resize), 'crop': int(crop)}
  key = cache_key(root, paths, sizes, transform)
  folder = pathlib.Path(cache_folder)
  target = folder / f'{name}-{key[:20]}.npy'
  shape = (len(paths), crop, crop, 3)
  if target.is_file():
    try:
      arr = np.load(target, mmap_mode='r')
      if arr.shape == shape and arr.dtype == np.uint8:
        return arr
    except (OSError, ValueError):
      pass  # unreadable or truncated: decode again below
  decode = decode or decode_file
  folder.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=f'.{name}-', suffix='.npy.tmp')
  os.close(fd)
  try:
    out = np.lib.format.open_memmap(tmp, mode='w+', dtype=np.uint8, shape=shape)

    def work(i):
      try:
        out[i] = decode(paths[i], resize, crop)
      except Exception as e:  # PIL raises many types for a broken file
        raise DataError(f'could not decode {paths[i]}: {type(e).__name__}: {e}') from e

    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
    with concurrent.futures.ThreadPoolExecutor(workers or _default_workers()) as pool, \
        tqdm(total=len(paths), desc=f'decoding {desc or name} (once, cached in {folder})', unit='img',
             disable=None) as bar:
      for _ in pool.map(work, range(len(paths))):
        bar.update(1)
    out.flush()
    del out
    os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache may be shared
    os.replace(tmp, target)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return np.load(target, mmap_mode='r')


def sessions_from_lists(list_labels: Sequence[np.ndarray], num_classes: int, dataset: str) -> tuple:
  """Session classes from the labels of each session list: session 1 must be 0..B-1 and each later
  session the next block of the same size (the TOPIC order of sorted class names)."""
  classes, start, way = [], 0, None
  for t, labels in enumerate(list_labels, start=1):
    got = sorted(set(np.asarray(labels).tolist()))
    n = len(got)
    if t >= 2:
      way = n if way is None else way
      if n != way:
        raise DataError(f'{dataset}: session {t} has {n} classes, session 2 has {way}')
    if got != list(range(start, start + n)):
      raise DataError(f'{dataset}: the classes of session_{t}.txt are not the next {n} classes in sorted '
                      f'order (got ids {got[:5]}...); are the lists and the images from the same release?')
    classes.append(tuple(got))
    start += n
  if start > num_classes:
    raise DataError(f'{dataset}: the lists name {start} classes, the split only {num_classes}')
  return tuple(classes)


def protocol_benchmark(name: str, p: 'Protocol', train_images: np.ndarray, test_images: np.ndarray,
                       image_size: int) -> Benchmark:
  """The Benchmark of a folder dataset (miniImageNet, CUB) from its protocol and decoded images; the
  TOPIC shot lists are checked against the labels."""
  num_base = len(p.session_classes[0])
  bench = Benchmark(
      name=name, train=Split(train_images, p.train_labels), test=Split(test_images, p.test_labels),
      base_train=p.session_indices[0], session_classes=p.session_classes,
      shot_pool=np.flatnonzero(p.train_labels >= num_base), topic_shots=tuple(p.session_indices[1:]),
      image_size=image_size, mean=IMAGENET_MEAN, std=IMAGENET_STD, augment=AUGMENT)
  check_shots(bench, p.session_indices[1:], SHOTS)
  return bench


def check_shots(bench: Benchmark, topic_shots: Sequence[np.ndarray], shots: int):
  try:
    for t, idx in enumerate(topic_shots, start=2):
      check_session_indices(bench, idx, t, shots)
  except ValueError as e:
    raise DataError(f'{bench.name}: TOPIC session lists do not match the labels: {e}') from e


def scaled(size: int, ref_size: int, ref_value: int) -> int:
  """`ref_value` scaled by size / ref_size (e.g. the test resize 92 at 84 -> 35 at 32)."""
  return ref_value if size == ref_size else int(round(size * ref_value / ref_size))


# ================================================================ miniImageNet

def _read_csv(path: pathlib.Path) -> list:
  """[(filename, wnid)] rows of a split CSV with header filename,label."""
  with open(path, newline='') as f:
    rows = list(csv.reader(f))
  if not rows or [c.strip() for c in rows[0][:2]] != ['filename', 'label']:
    raise DataError(f'{path}: expected a header "filename,label"')
  out = [(r[0].strip(), r[1].strip()) for r in rows[1:] if r and r[0].strip()]
  if not out:
    raise DataError(f'{path} has no rows')
  return out


def split_csv(root: pathlib.Path, index_dir: Optional[pathlib.Path], name: str) -> pathlib.Path:
  """`<index_dir>/<name>.csv` if present, else `<root>/miniimagenet/split/<name>.csv`."""
  candidates = ([pathlib.Path(index_dir) / f'{name}.csv'] if index_dir else []) + \
      [root / FOLDER / 'split' / f'{name}.csv']
  for c in candidates:
    if c.is_file():
      return c
  raise DataError(f'miniImageNet split file {name}.csv not found; looked in '
                  f'{", ".join(str(c) for c in candidates)}.\n{HOW_TO_GET}')


def check_layout(data_dir) -> pathlib.Path:
  """`<data_dir>/miniimagenet/images` or a DataError describing the expected layout."""
  if not data_dir:
    raise DataError(f'miniImageNet needs a data folder: set ${DATA_DIR_ENV} or --config.data.data_dir.\n'
                    f'{HOW_TO_GET}')
  images = pathlib.Path(data_dir) / FOLDER / 'images'
  if not images.is_dir():
    raise DataError(
        f'miniImageNet not found: expected the folder {images} (JPEGs such as n0153282900000005.jpg) and '
        f'{pathlib.Path(data_dir) / FOLDER / "split"}/{{train,test}}.csv (filename,label), plus the TOPIC '
        f'lists in {pathlib.Path(data_dir) / "index_list" / "mini_imagenet"}/session_{{1..9}}.txt '
        '(downloaded into the cache when absent).\n' + HOW_TO_GET)
  return images


@dataclasses.dataclass(frozen=True)
class Protocol:
  """What the split CSVs and the TOPIC lists define, before any image is read."""
  class_names: list  # class id = position (miniImageNet: sorted wnids; CUB: official order)
  train_files: list  # paths relative to the image folder (miniImageNet: train.csv order)
  train_labels: np.ndarray
  test_files: list
  test_labels: np.ndarray
  session_indices: list  # per session: indices into train_files (session 1 = base training images)
  session_classes: tuple


def read_protocol(index_dir, data_dir=None) -> Protocol:
  """Reads the split CSVs (`split_csv`) and session_1..9.txt and checks them against each other:
  every list line must be a train.csv image of the same wnid, session 1 must hold the first classes
  in sorted wnid order and each later session the next block."""
  index_dir = pathlib.Path(index_dir)
  root = pathlib.Path(data_dir) if data_dir else index_dir
  train_rows = _read_csv(split_csv(root, index_dir, 'train'))
  test_rows = _read_csv(split_csv(root, index_dir, 'test'))
  wnids = sorted({w for _, w in train_rows})
  class_of = {w: i for i, w in enumerate(wnids)}
  unknown = sorted({w for _, w in test_rows} - set(class_of))
  if unknown:
    raise DataError(f'miniImageNet test.csv has classes absent from train.csv: {unknown[:5]}')
  train_files = [f for f, _ in train_rows]
  position = {f: i for i, f in enumerate(train_files)}
  if len(position) != len(train_files):
    raise DataError('miniImageNet train.csv lists a file twice')
  train_labels = np.asarray([class_of[w] for _, w in train_rows], np.int32)

  indices = []
  for t, lines in enumerate(session_lists(index_dir, NUM_SESSIONS), start=1):
    idx = []
    for line in lines:
      parts = line.replace('\\', '/').split('/')
      if parts[-1] not in position:
        raise DataError(f'{index_dir}/session_{t}.txt names {line}, which train.csv lacks')
      k = position[parts[-1]]
      if len(parts) > 1 and parts[-2] != train_rows[k][1]:
        raise DataError(f'{index_dir}/session_{t}.txt: {line} has class {train_rows[k][1]} in train.csv')
      idx.append(k)
    indices.append(np.asarray(idx, np.int64))
  session_classes = sessions_from_lists([train_labels[i] for i in indices], len(wnids), 'mini_imagenet')
  return Protocol(class_names=wnids, train_files=train_files, train_labels=train_labels,
                  test_files=[f for f, _ in test_rows],
                  test_labels=np.asarray([class_of[w] for _, w in test_rows], np.int32),
                  session_indices=indices, session_classes=session_classes)


def load_mini_imagenet(data_dir, index_dir=None, cache_dir=None, image_size: int = IMAGE_SIZE,
                       decode: Optional[Callable] = None) -> Benchmark:
  """The miniImageNet `Benchmark` (TOPIC protocol) from the folder layout of the module docstring.

  train = every row of train.csv (all 500 training images of each of the 100 classes, in CSV order),
  labels = index of the wnid among the sorted wnids; base_train = session_1.txt; topic_shots =
  session_2..9.txt; shot_pool = training images of the novel classes; test = test.csv.
  `index_dir` None: found (or downloaded into the cache) by `index_lists.index_list_dir`.
  `cache_dir` None: `index_lists.default_cache_dir()`. `decode` replaces `decode_file` (tests)."""
  images_dir = check_layout(data_dir)
  root = pathlib.Path(data_dir)
  cache_dir = pathlib.Path(cache_dir) if cache_dir else index_lists.default_cache_dir()
  if index_dir is None:
    index_dir = index_lists.index_list_dir('mini_imagenet', str(root), str(cache_dir))
  p = read_protocol(index_dir, root)

  test_resize = scaled(image_size, IMAGE_SIZE, TEST_RESIZE)
  folder = cache_dir / 'arrays' / 'mini_imagenet'
  train_images = decode_cached([images_dir / f for f in p.train_files], root, folder, 'train', test_resize,
                               test_resize, desc='miniImageNet train', how_to_get=HOW_TO_GET, decode=decode)
  test_images = decode_cached([images_dir / f for f in p.test_files], root, folder, 'test', test_resize,
                              image_size, desc='miniImageNet test', how_to_get=HOW_TO_GET, decode=decode)
  return protocol_benchmark('mini_imagenet', p, train_images, test_images, image_size)
