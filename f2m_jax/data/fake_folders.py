"""Tiny generated datasets in the on-disk layouts of miniImageNet, CUB-200-2011 and the folder source
(each class a coloured grating, as synthetic.py), for smoke runs and tests; never a fallback for real data."""
from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import tempfile
from typing import Optional

import numpy as np

from f2m_jax.data import download

VERSION = 2  # 2: the folder of 20 classes added
COMPLETE = 'COMPLETE'


@dataclasses.dataclass(frozen=True)
class FakeSpec:
  num_base: int
  way: int
  num_sessions: int
  train_per_class: int
  test_per_class: int
  shots: int = 5
  sizes: tuple = ((40, 40),)  # (height, width) of the JPEGs, cycled over images
  seed: int = 0


# miniImageNet: square 84x84 in reality; 8 base classes + 8 sessions x 2-way (9 sessions).
MINI_SPEC = FakeSpec(num_base=8, way=2, num_sessions=9, train_per_class=12, test_per_class=6,
                     sizes=((40, 40),), seed=1)
# CUB: images of varied aspect ratio; 8 base classes + 10 sessions x 2-way (11 sessions).
CUB_SPEC = FakeSpec(num_base=8, way=2, num_sessions=11, train_per_class=10, test_per_class=6,
                    sizes=((40, 48), (52, 40), (44, 44)), seed=2)
# The folder source: 20 classes, 10 base + 5 sessions x 2-way; JPEG and PNG files of varied shapes.
FOLDER_SPEC = FakeSpec(num_base=10, way=2, num_sessions=6, train_per_class=12, test_per_class=6,
                       sizes=((40, 48), (52, 40), (44, 44)), seed=3)


def num_classes(spec: FakeSpec) -> int:
  return spec.num_base + spec.way * (spec.num_sessions - 1)


def render(rng: np.random.Generator, label: int, height: int, width: int, seed: int,
           num_cls: int, noise: float = 0.12) -> np.ndarray:
  """uint8 [height, width, 3]: the grating of class `label` at a random phase, plus noise."""
  crng = np.random.default_rng([seed, 99])
  angle = crng.uniform(0, np.pi, num_cls)[label]
  freq = crng.uniform(1.0, 4.0, num_cls)[label]
  colour = crng.uniform(-1.0, 1.0, (num_cls, 3))[label]
  yy, xx = np.meshgrid(np.arange(height), np.arange(width), indexing='ij')
  size = max(height, width)
  proj = (np.cos(angle) * xx + np.sin(angle) * yy) / size
  wave = np.sin(2 * np.pi * freq * proj + rng.uniform(0, 2 * np.pi))
  img = 0.5 + 0.3 * wave[..., None] * colour[None, None, :]
  img = img + rng.normal(0.0, noise, img.shape)
  return np.clip(img * 255.0, 0, 255).astype(np.uint8)


def _save_image(path: pathlib.Path, image: np.ndarray):
  """A JPEG (quality 95), or a PNG where `path` ends in .png."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  path.parent.mkdir(parents=True, exist_ok=True)
  if path.suffix == '.png':
    Image.fromarray(image).save(path, format='PNG')
  else:
    Image.fromarray(image).save(path, format='JPEG', quality=95)


def _write_lines(path: pathlib.Path, lines):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(''.join(f'{line}\n' for line in lines))


def _split_and_shots(spec: FakeSpec):
  """Per class: which of its train_per_class + test_per_class images are test images, and which
  training images are the TOPIC shots (novel classes)."""
  rng = np.random.default_rng([spec.seed, 1])
  n = spec.train_per_class + spec.test_per_class
  out = []
  for c in range(num_classes(spec)):
    is_test = np.zeros(n, bool)
    is_test[rng.choice(n, spec.test_per_class, replace=False)] = True
    train_pos = np.flatnonzero(~is_test)
    shots = np.sort(rng.choice(len(train_pos), spec.shots, replace=False)) if c >= spec.num_base else None
    out.append((is_test, train_pos, shots))
  return out


def _images(spec: FakeSpec):
  """Yields (class, k, image) for every image k of every class, deterministically."""
  rng = np.random.default_rng([spec.seed, 2])
  n = spec.train_per_class + spec.test_per_class
  for c in range(num_classes(spec)):
    for k in range(n):
      h, w = spec.sizes[(c * n + k) % len(spec.sizes)]
      yield c, k, render(rng, c, h, w, spec.seed, num_classes(spec))


def _write_lists(folder: pathlib.Path, spec: FakeSpec, splits, line):
  """session_1.txt (every training image of the base classes) .. session_<T>.txt (the shots of each
  later session's classes), each image written as `line(class, k)`."""
  sessions = [[] for _ in range(spec.num_sessions)]
  for c, (_, train_pos, shots) in enumerate(splits):
    session = 0 if c < spec.num_base else 1 + (c - spec.num_base) // spec.way
    sessions[session] += [line(c, k) for k in (train_pos if shots is None else train_pos[shots])]
  for t, lines in enumerate(sessions, start=1):
    _write_lines(folder / f'session_{t}.txt', lines)


def write_fake_mini_imagenet(root, spec: FakeSpec = MINI_SPEC):
  """miniImageNet layout under `root`: images/, split CSVs, index_list/mini_imagenet."""
  root = pathlib.Path(root)
  splits = _split_and_shots(spec)
  wnid = lambda c: f'n{c + 1:08d}'
  fname = lambda c, k: f'{wnid(c)}{k + 1:08d}.jpg'
  for c, k, img in _images(spec):
    _save_image(root / 'miniimagenet' / 'images' / fname(c, k), img)
  train_rows, test_rows = [], []
  for c, (is_test, train_pos, _) in enumerate(splits):
    test_rows += [f'{fname(c, k)},{wnid(c)}' for k in range(len(is_test)) if is_test[k]]
    train_rows += [f'{fname(c, k)},{wnid(c)}' for k in train_pos]
  lists = root / 'index_list' / 'mini_imagenet'
  for folder in (root / 'miniimagenet' / 'split', lists):
    _write_lines(folder / 'train.csv', ['filename,label'] + train_rows)
    _write_lines(folder / 'test.csv', ['filename,label'] + test_rows)
  _write_lists(lists, spec, splits, lambda c, k: f'MINI-ImageNet/train/{wnid(c)}/{fname(c, k)}')


def write_fake_cub200(root, spec: FakeSpec = CUB_SPEC):
  """CUB_200_2011 layout under `root`: images/<class dir>/, the four metadata files, index_list/cub200."""
  root = pathlib.Path(root)
  cub = root / 'CUB_200_2011'
  splits = _split_and_shots(spec)
  cdir = lambda c: f'{c + 1:03d}.Fake_Bird_{c + 1:03d}'
  fname = lambda c, k: f'Fake_Bird_{c + 1:03d}_{k + 1:04d}_{1000 * (c + 1) + k}.jpg'
  for c, k, img in _images(spec):
    _save_image(cub / 'images' / cdir(c) / fname(c, k), img)
  rows = [(c, k, is_test[k]) for c, (is_test, _, _) in enumerate(splits) for k in range(len(is_test))]
  _write_lines(cub / 'images.txt', [f'{i} {cdir(c)}/{fname(c, k)}' for i, (c, k, _) in enumerate(rows, start=1)])
  _write_lines(cub / 'train_test_split.txt', [f'{i} {0 if t else 1}' for i, (_, _, t) in enumerate(rows, start=1)])
  _write_lines(cub / 'image_class_labels.txt', [f'{i} {c + 1}' for i, (c, _, _) in enumerate(rows, start=1)])
  _write_lines(cub / 'classes.txt', [f'{c + 1} {cdir(c)}' for c in range(num_classes(spec))])
  _write_lists(root / 'index_list' / 'cub200', spec, splits,
               lambda c, k: f'CUB_200_2011/images/{cdir(c)}/{fname(c, k)}')


def write_fake_class_folders(root, spec: FakeSpec = FOLDER_SPEC):
  """The folder source's layout under `root`/folder: train/ and test/ with one subfolder per class
  (every fourth image a PNG), and TOPIC-style lists naming training images by train/<class>/<file>."""
  base = pathlib.Path(root) / 'folder'
  splits = _split_and_shots(spec)
  fname = lambda k: f'{k:03d}.{"png" if k % 4 == 3 else "jpg"}'
  for c, k, img in _images(spec):
    _save_image(base / ('test' if splits[c][0][k] else 'train') / f'class_{c:02d}' / fname(k), img)
  _write_lists(base / 'lists', spec, splits, lambda c, k: f'train/class_{c:02d}/{fname(k)}')


def generated(cache_dir) -> Optional[pathlib.Path]:
  """`fake_folder`'s folder where it was generated already, else None."""
  target = pathlib.Path(cache_dir) / 'fake_folder' / f'v{VERSION}'
  return target if (target / COMPLETE).is_file() else None


def fake_folder(cache_dir) -> pathlib.Path:
  """`<cache_dir>/fake_folder/v<VERSION>` with the three fake datasets, generated on first use into a
  temporary folder renamed into place, so a folder that exists is complete."""
  target = pathlib.Path(cache_dir) / 'fake_folder' / f'v{VERSION}'
  if (target / COMPLETE).is_file():
    return target
  target.parent.mkdir(parents=True, exist_ok=True)
  download.remove_stale(target.parent, '.v*-*')  # killed generations' (of any version)
  tmp = pathlib.Path(tempfile.mkdtemp(dir=target.parent, prefix=f'.v{VERSION}-'))
  try:
    with download.held(tmp):  # so that no other process removes it as stale
      write_fake_mini_imagenet(tmp)
      write_fake_cub200(tmp)
      write_fake_class_folders(tmp)
      (tmp / COMPLETE).write_text('generated by f2m_jax.data.fake_folders\n')
      if target.exists() and not (target / COMPLETE).is_file():
        shutil.rmtree(target, ignore_errors=True)  # a leftover without the marker
      try:
        os.rename(tmp, target)
      except OSError:
        if not (target / COMPLETE).is_file():  # not another process that finished first
          raise
  finally:
    if tmp.exists():
      shutil.rmtree(tmp, ignore_errors=True)
  return target
