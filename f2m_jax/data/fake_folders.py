"""Tiny generated datasets in the on-disk layouts of miniImageNet, CUB-200-2011 and the folder
source (each class a coloured grating at random phases, plus noise), written once into the
cache for the `:smoke` configs and the tests; never a fallback for real data."""
import collections
import os
import pathlib
import shutil
import tempfile

import numpy as np

from f2m_jax import files
from f2m_jax.data import synthetic

VERSION = 2  # 2: the folder of 20 classes added
COMPLETE = 'COMPLETE'
SHOTS = 5
Spec = collections.namedtuple('Spec', 'num_base way num_sessions train_per_class test_per_class '
                                      'sizes seed')
# (height, width), cycled over the images: varied aspect ratios
SHAPES = ((40, 48), (52, 40), (44, 44))
# mini_imagenet: 8 base classes + 8 sessions x 2-way
SPECS = {'mini_imagenet': Spec(8, 2, 9, 12, 6, ((40, 40),), 1),
         'cub200': Spec(8, 2, 11, 10, 6, SHAPES, 2),  # 8 + 10 x 2
         'folder': Spec(10, 2, 6, 12, 6, SHAPES, 3)}  # 10 + 5 x 2, every fourth image a PNG
# the file of class c's image k: its wnid, a number
MINI = lambda c, k: f'n{c + 1:08d}{k + 1:08d}.jpg'
CUB = lambda c, k: (f'{c + 1:03d}.Fake_Bird_{c + 1:03d}/'
                    f'Fake_Bird_{c + 1:03d}_{k + 1:04d}_{1000 * (c + 1) + k}.jpg')
FOLDER = lambda c, k: f'class_{c:02d}/{k:03d}.{"png" if k % 4 == 3 else "jpg"}'
# Per dataset: the path of class c's image k (t: a test image), the TOPIC lists' line for it, and
# the lists' folder.
LAYOUTS = {
    'mini_imagenet': (lambda c, k, t: f'miniimagenet/images/{MINI(c, k)}',
                      lambda c, k: f'MINI-ImageNet/train/n{c + 1:08d}/{MINI(c, k)}',
                      'index_list/mini_imagenet'),
    'cub200': (lambda c, k, t: f'CUB_200_2011/images/{CUB(c, k)}',
               lambda c, k: f'CUB_200_2011/images/{CUB(c, k)}', 'index_list/cub200'),
    'folder': (lambda c, k, t: f'folder/{"test" if t else "train"}/{FOLDER(c, k)}',
               lambda c, k: f'train/{FOLDER(c, k)}', 'folder/lists'),
}


def num_classes(s):
  return s.num_base + s.way * (s.num_sessions - 1)


def write_lines(path, lines):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(''.join(f'{line}\n' for line in lines))


def write_images(root, name):
  """Dataset `name`'s images under `root` (JPEG quality 95, or PNG) and its TOPIC lists
  (session_1.txt: every training image of the base classes; session_<t>.txt: 5 shots of each
  of session t's classes); its (class, path, is_test) rows, in order."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  s, (path, line, lists) = SPECS[name], LAYOUTS[name]
  n_cls, n = num_classes(s), s.train_per_class + s.test_per_class
  split_rng, rng, class_rng = (np.random.default_rng([s.seed, i]) for i in (1, 2, 99))
  looks = synthetic.class_looks(class_rng, n_cls)
  rows, sessions = [], [[] for _ in range(s.num_sessions)]
  for c in range(n_cls):
    is_test = np.isin(np.arange(n), split_rng.choice(n, s.test_per_class, replace=False))
    train = np.flatnonzero(~is_test)
    if c >= s.num_base:
      train = train[np.sort(split_rng.choice(len(train), SHOTS, replace=False))]
    sessions[max(0, (c - s.num_base) // s.way + 1)] += [line(c, k) for k in train]
    for k in range(n):
      img = synthetic.render(rng, looks, c, s.sizes[(c * n + k) % len(s.sizes)], 0.3, 0.12)
      rows.append((c, path(c, k, is_test[k]), is_test[k]))
      file = root / rows[-1][1]
      file.parent.mkdir(parents=True, exist_ok=True)
      Image.fromarray(img).save(file, quality=95)  # a JPEG's (a PNG has none)
  for t, lines in enumerate(sessions, start=1):
    write_lines(root / lists / f'session_{t}.txt', lines)
  return rows


def write_all(root):
  """The three datasets under `root`, with miniImageNet's split CSVs and CUB's four metadata
  files."""
  mini = write_images(root, 'mini_imagenet')
  for folder in ('miniimagenet/split', 'index_list/mini_imagenet'):
    for split, test in (('train', False), ('test', True)):
      write_lines(root / folder / f'{split}.csv', ['filename,label'] + [
          f'{os.path.basename(p)},{os.path.basename(p)[:9]}' for c, p, t in mini if t == test])
  rows = [(i, c, p[len('CUB_200_2011/images/'):], t)
          for i, (c, p, t) in enumerate(write_images(root, 'cub200'), 1)]
  cub = root / 'CUB_200_2011'
  write_lines(cub / 'images.txt', [f'{i} {p}' for i, c, p, t in rows])
  write_lines(cub / 'train_test_split.txt', [f'{i} {int(not t)}' for i, c, p, t in rows])
  write_lines(cub / 'image_class_labels.txt', [f'{i} {c + 1}' for i, c, p, t in rows])
  write_lines(cub / 'classes.txt',
              [f'{c + 1} {CUB(c, 0).split("/")[0]}' for c in range(num_classes(SPECS['cub200']))])
  write_images(root, 'folder')


def fake_folder(cache_dir, create=True):
  """`<cache_dir>/fake_folder/v<VERSION>` with the three datasets, generated on first use
  (`create`; else None) into a temporary folder renamed into place, so a folder that exists is
  complete."""
  target = pathlib.Path(cache_dir) / 'fake_folder' / f'v{VERSION}'
  done = target / COMPLETE
  if create and not done.is_file():
    target.parent.mkdir(parents=True, exist_ok=True)
    files.remove_stale(target.parent, '.v*-*')  # killed generations' (of any version)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=f'.v{VERSION}-'))
    try:
      with files.held(tmp):  # so that no other process removes it as stale
        write_all(tmp)
        (tmp / COMPLETE).write_text('generated by f2m_jax.data.fake_folders\n')
        os.rename(tmp, target)  # fails where another process finished first
    except OSError:
      if not done.is_file():
        raise
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
  return target if done.is_file() else None
