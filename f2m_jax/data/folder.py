"""Any image dataset as an incremental few-shot benchmark (`data.source='folder'`; docs/data.md,
'Your own images'): `read_protocol` checks the lists, classes and sessions without reading an image;
`load` decodes each image once."""
import concurrent.futures
import contextlib
import csv
import dataclasses
import hashlib
import json
import os
import pathlib
import sys
from typing import Optional, Union

import numpy as np

from f2m_jax import progress
from f2m_jax.data.index_lists import read_index_file, session_lists
from f2m_jax.data.types import Benchmark, DataError, Split, sessions_from_counts
from f2m_jax.files import remove_stale, written_atomically

IMAGE_SUFFIXES = ('.bmp', '.gif', '.jpeg', '.jpg', '.png', '.tif', '.tiff', '.webp')
AUGMENTS = ('rrc_flip', 'crop_flip')
SPLIT_BY = ('first', 'random')
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CACHE_VERSION = 2


@dataclasses.dataclass(frozen=True)
class Spec:
  """What the source reads (the data.folder fields, configs/common.py: folder_section); '' for
  none."""
  name: str
  train: str = ''
  test: str = ''
  root: str = ''
  classes: Union[str, tuple] = ''  # '', a file, or the names themselves (a layout's official order)
  lists: str = ''
  num_base: int = 0
  way: int = 0
  num_sessions: int = 0
  shots: int = 5
  protocol: str = 'draws'
  image_size: int = 84
  resize: float = 8 / 7
  augment: str = 'rrc_flip'
  class_depth: int = 0
  test_per_class: int = 0
  split_by: str = 'first'
  split_seed: int = 0
  how_to_get: str = ''  # appended to the message about missing image files
  tables: Optional[tuple] = None  # a layout's own (train, test) Tables, read instead of those


@dataclasses.dataclass(frozen=True)
class Table:
  """Images listed by one folder or CSV (`where`): paths relative to `root`, class names, splits
  ('train', 'test')."""
  root: pathlib.Path
  files: tuple
  names: tuple
  splits: tuple
  where: str

  def select(self, keep):
    pick = lambda values: tuple(v for v, k in zip(values, keep) if k)
    return dataclasses.replace(self, files=pick(self.files), names=pick(self.names),
                               splits=pick(self.splits))

  def paths(self):
    return [self.root / f for f in self.files]


@dataclasses.dataclass(frozen=True)
class Protocol:
  """Everything but the pixels: the images of the classes in `order` and their labels (positions in
  `order`), the session classes, the base training images, the fixed shots (lists); `found`: the
  training images' classes."""
  order: tuple
  train: Table
  test: Table
  train_labels: np.ndarray
  test_labels: np.ndarray
  session_classes: tuple
  base_train: np.ndarray
  topic_shots: Optional[tuple]
  found: int


def scan_folder(folder, split, depth=0):
  """Every image in a subfolder of `folder` (at any depth, hidden files and folders skipped), in
  sorted path order; its class the path of its folder relative to `folder` (depth k > 0: of the
  first k folders)."""
  files = sorted(p.relative_to(folder) for p in folder.rglob('*')
                 if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
  files = [f for f in files if len(f.parts) > 1 and not any(p.startswith('.') for p in f.parts)]
  if not files:
    raise DataError(f'{folder} holds no images in class subfolders: expected {folder}/<class '
                    f'name>/<image> (suffixes {", ".join(IMAGE_SUFFIXES)})')
  names = tuple('/'.join(f.parts[:-1][:depth or None]) for f in files)
  return Table(folder, tuple(f.as_posix() for f in files), names, (split,) * len(files),
               str(folder))


def read_csv(path, root, split):
  """The rows of a CSV with a header naming path (or filename), label and optionally split (else
  `split`)."""
  with open(path, newline='', encoding='utf-8') as f:
    rows = [[c.strip() for c in r] for r in csv.reader(f) if any(c.strip() for c in r)]
  columns = csv_columns(path, rows)
  for n, r in enumerate(rows[1:], start=2):
    if len(r) <= max(columns) or not all(r[i] for i in columns):
      raise DataError(f'{path}:{n}: every row needs a value in each of the columns '
                      f'{", ".join(rows[0])}; got {r}')
  files, names, *given = zip(*([r[i] for i in columns] for r in rows[1:]))
  splits = tuple(s.lower() for s in given[0]) if given else (split,) * len(files)
  bad = sorted(set(splits) - {'train', 'test'})
  if bad:
    raise DataError(f'{path}: the split column holds {bad[:3]}; allowed: train, test')
  return Table(root, files, names, splits, str(path))


def csv_columns(path, rows):
  """The column numbers of path (or filename), label and split (where there is one) in a CSV's
  header row."""
  header = [c.lower() for c in rows[0]] if rows else []
  wanted = ('path' if 'path' in header else 'filename', 'label', 'split')
  columns = [header.index(c) for c in wanted if c in header]
  if len(columns) < 2 or header[columns[1]] != 'label' or len(rows) < 2:
    raise DataError(f'{path}: expected a header naming the columns path (or filename), label and '
                    'optionally split, then one row per image; got '
                    f'{rows[0] if rows else "an empty file"}')
  return columns


def read_images(spec, name):
  """The Table of `spec.<name>` ('train' or 'test'): a folder of class subfolders, or a CSV (paths
  relative to `spec.root`, else to the CSV's folder)."""
  given = getattr(spec, name)
  path = pathlib.Path(given)
  if given and path.is_dir():
    return scan_folder(path, name, spec.class_depth)
  if spec.root and not os.path.isdir(spec.root):
    raise DataError(f'data.folder.root={spec.root!r} is not a folder; allowed: the folder that the '
                    f"relative paths of {given} start from, or '' (the CSV's own folder)")
  if path.is_file() and path.suffix.lower() == '.csv':
    return read_csv(path, pathlib.Path(spec.root or path.parent), name)
  unset = ' (an environment variable in it is unset?)' if '$' in given else ''
  what = ' is not a folder or a .csv' if path.exists() else ' does not exist'
  raise DataError(f'data.folder.{name}={given!r}{what}{unset}; allowed: a folder with one '
                  'subfolder of images per class, or a CSV of path,label[,split]')


def read_tables(spec):
  """(train Table, test Table): `spec.train`'s images; the test images its split=test rows,
  `spec.test`'s or `spec.test_per_class` of each class: its first or a random choice (one
  permutation of all rows, seeded)."""
  given = read_images(spec, 'train')
  is_test = np.asarray([s == 'test' for s in given.splits], bool)
  if bool(spec.test) + bool(spec.test_per_class) + is_test.any() > 1:
    raise DataError(f'the test images are given more than one way: data.folder.test={spec.test!r}, '
                    f'data.folder.test_per_class={spec.test_per_class} and {is_test.sum()} '
                    f'split=test rows of {given.where}')
  where = f'{given.where} (its split=test rows; data.folder.test is empty)'
  if spec.test_per_class:
    classes, label, counts = np.unique(np.asarray(given.names), return_inverse=True,
                                       return_counts=True)
    if counts.min() <= spec.test_per_class:
      raise DataError(f'{given.where}: class {str(classes[counts.argmin()])!r} has {counts.min()} '
                      f'images; data.folder.test_per_class={spec.test_per_class} must leave every '
                      'class training images: lower it')
    rank = np.arange(len(label))
    how = f'split_by {spec.split_by}'
    if spec.split_by == 'random':
      rank = np.random.default_rng(spec.split_seed).permutation(len(label))
      how += f', split_seed {spec.split_seed}'
    is_test = np.zeros(len(label), bool)
    for c in range(len(classes)):  # the class's test_per_class rows of the lowest rank
      rows = np.flatnonzero(label == c)
      is_test[rows[np.argsort(rank[rows])[:spec.test_per_class]]] = True
    where = f'{given.where} (data.folder.test_per_class={spec.test_per_class} of each class, {how})'
  train, test = given.select(~is_test), dataclasses.replace(given.select(is_test), where=where)
  return train, read_images(spec, 'test') if spec.test else test


def class_order(spec, train):
  """The class names in label order: `spec.classes` (names, or a file listing them), else sorted."""
  if isinstance(spec.classes, tuple):
    return spec.classes
  present = sorted(set(train.names))
  if not spec.classes:
    return tuple(present)
  if not os.path.isfile(spec.classes):
    raise DataError(f'data.folder.classes={spec.classes!r} does not exist; allowed: empty (the '
                    'sorted class names) or a file listing the class names in order, one per line')
  names = read_index_file(spec.classes)
  absent = [n for n in names if n not in set(present)]
  if absent or len(set(names)) != len(names):
    raise DataError(f'{spec.classes} must list distinct classes of {train.where} '
                    f'({", ".join(present[:8])}{", ..." if len(present) > 8 else ""}); it lists '
                    f'{absent[:5] or "a class twice"}'
                    + depth_hint(present))
  return tuple(names)


def depth_hint(names):
  """Where every class name ends in the same folder (Tiny-ImageNet's train/<class>/images/), the
  message's ending naming the class_depth that takes the folders above it as the classes; else
  ''."""
  parts = {tuple(n.split('/')) for n in names}
  depths, last = {len(p) for p in parts}, {p[-1] for p in parts}
  if len(depths) > 1 or len(last) > 1 or min(depths) < 2:
    return ''
  return (f'; every class name found ends in /{last.pop()}: '
          f'--config.data.folder.class_depth={depths.pop() - 1} makes the folders above it the '
          'classes')


def labelled(table, order, strict):
  """(the table's rows of classes in `order`, their labels); `strict`: a class not in it is an
  error."""
  index = {n: i for i, n in enumerate(order)}
  unknown = sorted(set(table.names) - set(index))
  if strict and unknown:
    raise DataError(f'{table.where} has images of classes without training images: {unknown[:5]}; '
                    'name a test class folder as its training folder; test images in one folder '
                    'with a file of their labels (such as val/images, val_annotations.txt) go in '
                    'through a CSV of path,label: data.folder.test=FILE.csv'
                    + depth_hint(order))
  kept = table.select([n in index for n in table.names])
  return kept, np.asarray([index[n] for n in kept.names], np.int32)


def session_layout(spec, order, found, where):
  """The class ids of each session, checked against the classes used (`order`, of the `found` in
  `where`)."""
  later = spec.way * (spec.num_sessions - 1)
  base = spec.num_base or len(order) - later
  if base < 1 or spec.way < 1 or spec.num_sessions < 2 or base + later != len(order):
    used = (f' and data.folder.classes={spec.classes!r} lists {len(order)} of them, the classes '
            'used'
            if isinstance(spec.classes, str) and spec.classes else '')
    raise DataError(
        f'the session layout does not add up: data.folder.num_base={spec.num_base} + '
        f'data.folder.way={spec.way} x (data.folder.num_sessions={spec.num_sessions} - 1) = '
        f'{base + later} classes, but {where} has {found} classes{used}; allowed: num_base + way x '
        f'(num_sessions - 1) = {len(order)}, way >= 1, num_sessions >= 2 (num_base=0: every class '
        'no later session takes)')
  return sessions_from_counts(base, spec.way, spec.num_sessions)


def find_listed(line, index, train, names, where):
  """The training image a list line names (its longest trailing part that names one)."""
  parts = line.replace('\\', '/').split('/')
  for k in range(len(parts)):
    i = index.get('/'.join(parts[k:]))
    if i == -1:
      raise DataError(f'{where}: {line} names several training images of {train.where}; name it by '
                      'more of its path')
    if i is not None:
      if len(parts) > 1 and parts[-2] in names and parts[-2] != train.names[i]:
        raise DataError(f'{where}: {line} is of class {train.names[i]} in {train.where}')
      return i
  raise DataError(f'{where} names {line}, which is not a training image of {train.where}')


def map_lists(spec, train, order):
  """Indices into `train` of the images each session_<t>.txt names (num_sessions 0: as many as there
  are)."""
  index = {}  # every trailing part of a training image's path: its index, -1 where several end so
  for i, f in enumerate(train.files):
    for k in range(f.count('/') + 1):
      part = '/'.join(f.split('/')[k:])
      index[part] = -1 if part in index else i
  count = spec.num_sessions or len(list(pathlib.Path(spec.lists).glob('session_*.txt')))
  where = lambda t: os.path.join(spec.lists, f'session_{t}.txt')
  return [np.asarray([find_listed(line, index, train, set(order), where(t))
                      for line in lines], np.int64)
          for t, lines in enumerate(session_lists(spec.lists, max(1, count)), start=1)]


def check_lists(spec, indices, labels, order, classes):
  """(base_train, topic_shots): the lists, each checked against its session of the layout."""
  for t, idx in enumerate(indices, start=1):
    where = os.path.join(spec.lists, f'session_{t}.txt')
    counts = np.bincount(labels[idx], minlength=len(order))[list(classes[t - 1])]
    uneven = t > 1 and len(set(counts.tolist())) != 1
    if set(labels[idx].tolist()) != set(classes[t - 1]) or uneven:
      raise DataError(f'{where}: its images are of the classes '
                      f'{sorted({order[c] for c in labels[idx]})[:6]}; allowed: those of session '
                      f'{t} of the layout, {[order[c] for c in classes[t - 1]][:6]}, '
                      + ('each with as many images' if t > 1 else
                         'each with its base training images'))
    if t > 1 and spec.protocol == 'topic' and counts[0] != spec.shots:
      raise DataError(f'{where} lists {counts[0]} images per class; protocol topic takes them as '
                      f'the shots, so data.shots must be {counts[0]} (is {spec.shots})')
  return indices[0], tuple(indices[1:])


def read_protocol(spec):
  """The `Protocol` of `spec` from its tables (`read_tables` where None), every check made; no image
  is read."""
  train, test = spec.tables or read_tables(spec)
  order, found = class_order(spec, train), len(set(train.names))
  train, train_labels = labelled(train, order, strict=False)
  test, test_labels = labelled(test, order, strict=not spec.classes)
  overlap = set(map(str, train.paths())) & set(map(str, test.paths()))
  if overlap:
    raise DataError(f'{min(overlap)} is both a training and a test image ({len(overlap)} such '
                    f'files): the test images of {test.where} must not be training images of '
                    f'{train.where}')
  n_train = np.bincount(train_labels, minlength=len(order))
  few = np.flatnonzero(n_train < spec.shots)
  if few.size:
    raise DataError(f'{train.where}: class {order[few[0]]!r} has {n_train[few[0]]} training images'
                    f'{f" (and {few.size - 1} more classes too few)" if few.size > 1 else ""}; '
                    f'data.shots={spec.shots} needs at least {spec.shots} per class: add images, '
                    'lower --config.data.shots or leave the class out (data.folder.classes)')
  empty = np.flatnonzero(np.bincount(test_labels, minlength=len(order)) == 0)
  if empty.size and spec.protocol != 'validation':  # validation holds out training images
    raise DataError(f'no test images of class {order[empty[0]]!r} ({empty.size} of {len(order)} '
                    f'classes have none) in {test.where}: give them in a test folder or CSV '
                    '(data.folder.test) or split=test rows; or use '
                    '--config.data.protocol=validation, which holds out training images instead')
  if spec.protocol == 'topic' and not spec.lists:
    raise DataError("protocol 'topic' takes each session's shots from TOPIC-style lists: set "
                    "data.folder.lists to a folder holding session_1.txt .. session_<T>.txt, or "
                    "use protocol 'draws'")
  indices = map_lists(spec, train, order) if spec.lists else None
  if indices and not spec.way and len(indices) > 1:  # way 0: the lists' layout (a layout's files)
    spec = dataclasses.replace(spec, num_base=len(set(train_labels[indices[0]].tolist())),
                               way=len(set(train_labels[indices[1]].tolist())),
                               num_sessions=len(indices))
  classes = session_layout(spec, order, found, train.where)
  base_train, topic_shots = (check_lists(spec, indices, train_labels, order, classes) if indices
                             else (np.flatnonzero(train_labels < len(classes[0])), None))
  return Protocol(order, train, test, train_labels, test_labels, classes, base_train, topic_shots,
                  found)


def decode_file(path, resize, crop):
  """RGB uint8 [crop, crop, 3]: the image file through torchvision's Resize(resize) (the shorter
  side to `resize`, the longer int(resize x long / short), PIL's bilinear filter) and
  CenterCrop(crop)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  with Image.open(path) as img:
    img = img.convert('RGB')
    w, h = img.size
    if min(w, h) != resize:
      size = (resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize)
      img = img.resize(size, Image.BILINEAR)
    w, h = img.size
    if w < crop or h < crop:
      raise ValueError(f'image {w}x{h} is smaller than the crop {crop}')
    top, left = round((h - crop) / 2), round((w - crop) / 2)
    return np.asarray(img.crop((left, top, left + crop, top + crop)), np.uint8)


def cached_file(paths, cache_folder, name, resize, crop, desc='', how_to_get=''):
  """`<cache_folder>/<name>-<key>.npy` (a pathlib.Path; resize and crop ints), its key a sha256
  over the cache version, the transform and every (absolute path, size, modification time); a
  DataError naming the missing files (the first 10)."""
  key = {'version': CACHE_VERSION, 'transform': {'resize': resize, 'crop': crop}}
  h = hashlib.sha256(json.dumps(key, sort_keys=True).encode())
  missing = []
  for p in paths:  # one stat a file
    try:
      s = os.stat(p)
    except OSError:
      missing.append(str(p))
      continue
    h.update(f'\n{os.path.abspath(p)}\t{s.st_size}\t{s.st_mtime_ns}'.encode())
  if missing:
    head = f'{desc or name}: {len(missing)} of {len(paths)} image files are missing:'
    raise DataError('\n  '.join([head, *missing[:10]]) + (f'\n{how_to_get}' if how_to_get else ''))
  return cache_folder / f'{name}-{h.hexdigest()[:20]}.npy'


def decode_cached(paths, cache_folder, name, resize, crop, desc='', how_to_get='', decode=None):
  """uint8 [N, crop, crop, 3]: the images at `paths` through `decode` (`decode_file`), memory-mapped
  from `cached_file`, decoded once into it where it is absent or incomplete."""
  shape = (len(paths), crop, crop, 3)
  if not paths:
    return np.zeros(shape, np.uint8)
  target = cached_file(paths, cache_folder, name, resize, crop, desc, how_to_get)
  with contextlib.suppress(OSError, ValueError):  # absent, unreadable or truncated: decode again
    done = np.load(target, mmap_mode='r')
    if done.shape == shape and done.dtype == np.uint8:
      return done
  target.parent.mkdir(parents=True, exist_ok=True)
  remove_stale(target.parent, '.*.npy.*.tmp')  # every killed decode's, not only this file's
  with written_atomically(target) as tmp:
    out = np.lib.format.open_memmap(tmp, mode='w+', dtype=np.uint8, shape=shape)

    def work(i):
      try:
        return (decode or decode_file)(paths[i], resize, crop)
      except Exception as e:  # PIL raises many types for a broken file
        raise DataError(f'could not read {paths[i]} as an image ({type(e).__name__}: {e}); every '
                        'listed file must be an image PIL reads (JPEG, PNG, ...): replace or '
                        'remove it') from e

    with concurrent.futures.ThreadPoolExecutor(min(16, os.cpu_count() or 1)) as pool, \
        progress.bar(len(paths), f'decoding {desc or name} (once, cached in {target.parent})',
                     file=sys.stderr, unit='img') as bar:
      for i, image in enumerate(pool.map(work, range(len(paths)))):
        out[i] = image
        bar.update(1)
    del out  # flushes it
  return np.load(target, mmap_mode='r')


def cache_plan(spec, p, cache_dir):
  """{split: (its image paths, `decode_cached`'s arguments: cache folder, name, resize, crop)}."""
  folder = pathlib.Path(cache_dir) / 'arrays' / spec.name
  size = round(spec.image_size * spec.resize)
  crop = {'train': size, 'test': spec.image_size}
  return {split: (table.paths(), (folder, split, size, crop[split]))
          for split, table in (('train', p.train), ('test', p.test))}


def load(spec, cache_dir, decode=None):
  """The `Benchmark` of `spec`, images cached in `<cache_dir>/arrays/<name>/`; `decode` replaces
  `decode_file`."""
  p = read_protocol(spec)
  images = {split: decode_cached(paths, *args, desc=f'{spec.name} {split}',
                                 how_to_get=spec.how_to_get, decode=decode)
            for split, (paths, args) in cache_plan(spec, p, cache_dir).items()}
  return benchmark(spec, p, images)


def benchmark(spec, p, images):
  """The `Benchmark` of `p` with `images` ({'train', 'test'}: uint8 arrays)."""
  return Benchmark(
      name=spec.name, train=Split(images['train'], p.train_labels),
      test=Split(images['test'], p.test_labels),
      base_train=p.base_train, session_classes=p.session_classes,
      shot_pool=np.flatnonzero(p.train_labels >= len(p.session_classes[0])),
      topic_shots=p.topic_shots,
      image_size=spec.image_size, mean=IMAGENET_MEAN, std=IMAGENET_STD, augment=spec.augment)
