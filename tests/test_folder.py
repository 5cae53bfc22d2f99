"""The folder source (f2m_jax/data/folder.py, configs/folder.py) on generated images: the layouts it
reads, the class order, TOPIC-style lists, validation without test images, each problem one message
(before any workdir), the mini fake folder through the generic fields, configs/folder.py:smoke."""
import argparse
import csv
import dataclasses
import json
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from conftest import far_above_chance, snapshot, without_provenance

from f2m_jax.data import augment, fake_folders, folder, protocol, sources
from f2m_jax.data.types import DataError

SPEC = fake_folders.SPECS['folder']  # 20 classes: 10 base + 5 sessions x 2-way, 12 train and 6 test images each


@pytest.fixture(scope='module')
def fake_root(tmp_path_factory):
  return fake_folders.fake_folder(tmp_path_factory.mktemp('cache'))


def spec_of(data: pathlib.Path, **fields) -> folder.Spec:
  base = dict(name='mine', train=str(data / 'folder' / 'train'), test=str(data / 'folder' / 'test'), num_base=10,
              way=2, num_sessions=6, image_size=32)
  return folder.Spec(**{**base, **fields})


def copy_of(fake_root, tmp_path) -> pathlib.Path:
  shutil.copytree(fake_root / 'folder', tmp_path / 'data' / 'folder')
  return tmp_path / 'data'


def write_nested(root: pathlib.Path, per_class: int = 26) -> pathlib.Path:
  """Omniglot as distributed, in small: `root`/alphabet_<g>/character<c>/<k>.png, 3 alphabets of 4
  characters, `per_class` grayscale gratings of each, of two sizes; no CSV, no train or test folders."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  for c in range(12):
    folder_path = root / f'alphabet_{c // 4}' / f'character{c % 4 + 1:02d}'
    folder_path.mkdir(parents=True)
    for k in range(per_class):
      h, w = (40, 40) if k % 2 else (48, 44)
      yy, xx = np.mgrid[:h, :w] / 40
      wave = np.sin(2 * np.pi * (1 + c % 4) * (np.cos(c) * xx + np.sin(c) * yy) + rng.uniform(0, 6.3))
      image = np.clip(128 + 90 * wave + rng.normal(0, 20, (h, w)), 0, 255).astype(np.uint8)
      Image.fromarray(image, 'L').save(folder_path / f'{k:02d}.png')
  return root


def nested_config(tmp_path, **fields):
  """configs/folder.py:smoke on `write_nested`'s folder, 6 drawings of each character its test images
  (seeded): 10 base characters + 1 session of 2, the smoke run's shapes (its programs serve)."""
  from configs import folder as folder_cfg  # pylint: disable=g-import-not-at-top
  config = folder_cfg.get_config('smoke')
  config.data.source, config.data.cache_dir, config.runs = 'folder', str(tmp_path / 'cache'), 1
  config.data.folder.update(train=str(write_nested(tmp_path / 'images_background')), test_per_class=6,
                            split_by='random', split_seed=1, num_base=10, way=2, num_sessions=2, **fields)
  return config


def write_csv(path: pathlib.Path, rows, header=('path', 'label', 'split')) -> str:
  with open(path, 'w', newline='') as f:
    csv.writer(f).writerows([header] + list(rows))
  return str(path)


def folder_rows(root: pathlib.Path) -> list:
  """(path relative to root, class, split) of the fake folder's images, in the order the scan reads them."""
  out = []
  for split in ('train', 'test'):
    t = folder.scan_folder(root / 'folder' / split, split)
    out += [(f'{split}/{f}', n, split) for f, n in zip(t.files, t.names)]
  return out


# ---------------------------------------------------------------- what the source reads

def test_class_folders(fake_root, tmp_path):
  b = folder.load(spec_of(fake_root), tmp_path)
  n = 20
  assert (b.name, b.num_sessions, b.num_base_classes, b.image_size, b.augment) == ('mine', 6, 10, 32, 'rrc_flip')
  assert b.session_classes[1:] == ((10, 11), (12, 13), (14, 15), (16, 17), (18, 19))
  assert b.train.images.shape == (n * SPEC.train_per_class, 37, 37, 3)  # round(32 x 8/7)
  assert b.test.images.shape == (n * SPEC.test_per_class, 32, 32, 3)
  assert np.array_equal(b.train.labels, np.repeat(np.arange(n), SPEC.train_per_class))
  assert np.array_equal(b.base_train, np.arange(10 * SPEC.train_per_class))
  assert np.array_equal(b.shot_pool, np.arange(10 * SPEC.train_per_class, n * SPEC.train_per_class))
  assert b.topic_shots is None and (b.mean, b.std) == (folder.IMAGENET_MEAN, folder.IMAGENET_STD)
  # Class order = sorted names; images in sorted order; a PNG and a JPEG of non-square shapes decoded as
  # torchvision's Resize + CenterCrop, and a stored training image's centre crop is the test transform.
  files = sorted((fake_root / 'folder' / 'train' / 'class_03').iterdir())
  suffixes = [f.suffix for f in files]
  for k in (suffixes.index('.jpg'), suffixes.index('.png')):
    want = folder.decode_file(files[k], 37, 32)
    assert np.array_equal(augment.eval_view(b.train.images[3 * 12 + k:3 * 12 + k + 1], 32)[0], want)
  test0 = sorted((fake_root / 'folder' / 'test' / 'class_00').iterdir())[0]
  assert np.array_equal(b.test.images[0], folder.decode_file(test0, 37, 32))


def test_a_csv_with_a_split_column_reads_as_the_folders(fake_root, tmp_path):
  """The same images listed in a CSV (paths relative to `root`; or to the CSV's folder), or as a train
  CSV and a test CSV, give the very same benchmark."""
  want = folder.load(spec_of(fake_root), tmp_path / 'c1')
  listing = write_csv(tmp_path / 'all.csv', folder_rows(fake_root))
  got = folder.load(spec_of(fake_root, train=listing, test='', root=str(fake_root / 'folder')), tmp_path / 'c2')
  rows = folder_rows(fake_root)
  train_csv = write_csv(tmp_path / 'train.csv', [r[:2] for r in rows if r[2] == 'train'], ('filename', 'label'))
  test_csv = write_csv(tmp_path / 'test.csv', [(str(fake_root / 'folder' / r[0]), r[1]) for r in rows
                                               if r[2] == 'test'], ('path', 'label'))  # absolute paths
  shutil.copytree(fake_root / 'folder' / 'train', tmp_path / 'train')  # the train CSV's paths start at its folder
  split = folder.load(spec_of(fake_root, train=train_csv, test=test_csv), tmp_path / 'c3')
  for b in (got, split):
    for a, z in ((want.train, b.train), (want.test, b.test)):
      assert np.array_equal(a.images, z.images) and np.array_equal(a.labels, z.labels)
    assert np.array_equal(want.base_train, b.base_train) and want.session_classes == b.session_classes


def test_topic_lists(fake_root, tmp_path):
  """TOPIC-style lists name training images by a trailing part of their path: session 1 becomes the
  base training images, the later lists the fixed shots of protocol 'topic'."""
  lists = fake_root / 'folder' / 'lists'
  b = folder.load(spec_of(fake_root, lists=str(lists), protocol='topic'), tmp_path)
  assert len(b.base_train) == 10 * 12 and len(b.topic_shots) == 5
  p = folder.read_protocol(spec_of(fake_root, lists=str(lists)))
  for t in range(2, 7):
    shots = protocol.session_shots(b, 'topic', run=0, session=t, shots=5, seed=0)
    named = [f'train/{p.train.files[i]}' for i in shots]
    assert named == (lists / f'session_{t}.txt').read_text().split()
    assert sorted(set(b.train.labels[shots].tolist())) == list(b.session_classes[t - 1])


def test_classes_at_any_depth(tmp_path):
  """The class of an image is its folder's path under the root (default), or its first k folders."""
  root = write_nested(tmp_path / 'omniglot', per_class=2)
  t = folder.scan_folder(root, 'train')
  assert t.files[:3] == ('alphabet_0/character01/00.png', 'alphabet_0/character01/01.png',
                         'alphabet_0/character02/00.png') and len(t.files) == 24
  assert sorted(set(t.names)) == [f'alphabet_{c // 4}/character{c % 4 + 1:02d}' for c in range(12)]
  assert t.names[:3] == ('alphabet_0/character01',) * 2 + ('alphabet_0/character02',)
  assert sorted(set(folder.scan_folder(root, 'train', depth=1).names)) == ['alphabet_0', 'alphabet_1', 'alphabet_2']
  assert folder.scan_folder(root, 'train', depth=2).names == t.names
  (root / 'stray.png').write_bytes(b'')  # an image in no folder has no class
  (root / 'alphabet_0' / '.hidden').mkdir()
  (root / 'alphabet_0' / '.hidden' / 'x.png').write_bytes(b'')
  assert folder.scan_folder(root, 'train') == t


def test_tiny_imagenet_as_distributed_through_docs_recipe(tmp_path):
  """docs/data.md's Tiny-ImageNet recipe on a folder of its shape (train/<wnid>/images/*, val/images/*
  named by val/val_annotations.txt; a class list of 6 wnids in its own order, the validation CSV by the
  recipe's awk line): with the default class_depth (classes '<wnid>/images') the list is refused naming
  class_depth=1, with which it reads: the list's classes in its order, the others left out."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  data, wnids = tmp_path / 'tiny-imagenet-200', [f'n0{c:07d}' for c in range(8)]
  for c, w in enumerate(wnids * 8):
    for split, name in (('train', f'{w}/images/{w}_{c}.png'), ('val', f'images/val_{c}.png')):
      (data / split / name).parent.mkdir(parents=True, exist_ok=True)
      Image.new('RGB', (64, 64)).save(data / split / name)
  annotations = listing(data / 'val' / 'val_annotations.txt',
                        [f'val_{c}.png\t{w}\t0\t0\t63\t63' for c, w in enumerate(wnids * 8)])
  with open(tmp_path / 'val.csv', 'w') as f:
    subprocess.run(['awk', '-F\t', 'BEGIN {print "path,label"} {print $1","$2}', annotations], stdout=f,
                   check=True)
  spec = folder.Spec('tiny', train=str(data / 'train'), test=str(tmp_path / 'val.csv'),
                     root=str(data / 'val' / 'images'), num_base=4, way=1, num_sessions=3,
                     classes=listing(tmp_path / 'classes.txt', wnids[5::-1]))  # 6 of 8, in its order
  with pytest.raises(DataError, match=r"lists \['n00000005', .* ends in /images: "
                                      '--config.data.folder.class_depth=1 makes'):
    folder.read_protocol(spec)
  p = folder.read_protocol(dataclasses.replace(spec, class_depth=1))
  assert p.order == tuple(wnids[5::-1]) and p.found == 8 and p.session_classes == ((0, 1, 2, 3), (4,), (5,))
  assert np.bincount(p.train_labels).tolist() == np.bincount(p.test_labels).tolist() == [8] * 6
  assert {p.train.names[i] for i in p.base_train[p.train_labels[p.base_train] == 1]} == {wnids[4]}
  unseen = folder.read_protocol(dataclasses.replace(spec, class_depth=1, test='', protocol='validation'))
  assert unseen.order == p.order and not unseen.test.files  # validation needs no test image


@pytest.mark.parametrize('split_by', folder.SPLIT_BY)
def test_a_seeded_split_of_one_folder(tmp_path, split_by):
  """test_per_class images of each class split off as its test images: its first in path order, or a
  random choice that its seed alone decides; every other image a training image."""
  root = write_nested(tmp_path / 'omniglot', per_class=7)
  spec = folder.Spec('mine', train=str(root), test_per_class=3, split_by=split_by, split_seed=5)
  train, test = folder.read_tables(spec)
  everything = folder.scan_folder(root, 'train')
  assert sorted(train.files + test.files) == sorted(everything.files) and not set(train.files) & set(test.files)
  for name in set(everything.names):
    chosen = [f for f, n in zip(test.files, test.names) if n == name]
    assert len(chosen) == 3 and sum(n == name for n in train.names) == 4
    if split_by == 'first':
      assert chosen == [f'{name}/{k:02d}.png' for k in range(3)]
  assert test.where.endswith(f'omniglot (data.folder.test_per_class=3 of each class, split_by {split_by}'
                             + (', split_seed 5)' if split_by == 'random' else ')'))
  again = folder.read_tables(spec)
  other = folder.read_tables(dataclasses.replace(spec, split_seed=6))
  assert again == (train, test) and (other == (train, test)) == (split_by == 'first')
  with pytest.raises(DataError, match=r"class 'alphabet_0/character01' has 7 images; data.folder.test_per_class=7 "
                                      'must leave every class training images'):
    folder.read_tables(dataclasses.replace(spec, test_per_class=7))
  with pytest.raises(DataError, match='the test images are given more than one way'):
    folder.read_tables(dataclasses.replace(spec, test=str(root)))


def test_a_dry_run_shows_classes_images_and_their_files(tmp_path, capsys, monkeypatch):
  """The nested folder split by the config, only headers read: classes, images per class, where the test
  images come from, the files' sizes and colour mode, the augmentation, the cache, the base training's
  time (its compile + base.steps x a step; the timing: tests/test_cli.py); nothing written. 0739cee
  printed the config alone, and passed a misspelt train folder (exit 0)."""
  from f2m_jax.run import bench  # pylint: disable=g-import-not-at-top
  from f2m_jax.run import cli  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(bench, 'bench_experiment', lambda *args: argparse.Namespace(loss=None))
  monkeypatch.setattr(bench, 'program_case', lambda *args: None)
  monkeypatch.setattr(bench, 'time_cases', lambda *args: [dict(step_ms_median=250.0, compile_s=12.4)])
  config = nested_config(tmp_path)
  before = snapshot(tmp_path)
  assert cli.main(config, None, 'train', dry_run=True) == 0
  out = capsys.readouterr().out.split('set when the run starts', 1)[1].splitlines()
  data = next(i for i, line in enumerate(out) if line.startswith('data: '))
  root, cache = tmp_path / 'images_background', tmp_path / 'cache'
  assert out[data:] == [
      f'data: folder, 12 classes found in {root}, 12 classes used (protocol draws): session 1 of 10 '
      'classes, then 1 sessions of 2 classes x 5 shots, 1 runs',
      '  classes in label order: alphabet_0/character01, alphabet_0/character02, alphabet_0/character03, '
      'alphabet_0/character04, ..., alphabet_2/character04',
      '  training images per class (min / median / max): base classes 20 / 20 / 20; later classes 20 / 20 '
      '/ 20 (their shots are drawn from these)',
      f'  test images per class (min / median / max): 6 / 6 / 6, 72 in all, from {root} '
      "(data.folder.test_per_class=6 of each class, split_by random, split_seed 1)",
      '  image files: widths 40 to 44, heights 40 to 48 pixels, colour mode L in the 24 files sampled (one '
      'in 13 of 312; every file is decoded as RGB, a grey one into all three channels); the network sees '
      '32x32 (data.image_size)',
      '  training augmentation: random-resized crops and horizontal flips (rrc_flip)',
      f'cache: {cache} holds 0.00B (decoded images 0.00B, compiled programs 0.00B)',
      f'  train: 240 images of 37x37 (986kB), decoded once on the first run: {out[data + 7].split(": ")[-1]}',
      f'  test: 72 images of 32x32 (221kB), decoded once on the first run: {out[data + 8].split(": ")[-1]}',
      f'  to clear: rm -r {cache}/arrays/folder (every image size of this dataset: decoded again when '
      f'needed), or rm -r {cache} (all: downloads, decoded images, compiled programs)',
      'base training: about 37 s on this machine at its present load: a compile of 12 s, then '
      'base.steps=100 of 0.25 s (a step timed here, the median of 2 after 1)',
      'dry run: nothing was written']
  assert out[data + 7].split(': ')[-1].startswith(f'{cache}/arrays/folder/train-')
  assert snapshot(tmp_path) == before
  config.data.folder.train = str(tmp_path / 'trian')
  assert cli.main(config, None, 'train', dry_run=True) == 2
  assert "error: data.folder.train='" in capsys.readouterr().err


# ---------------------------------------------------------------- problems, each one message

PROBLEMS = [
    # (what to change, the message's parts)
    (lambda root, tmp: dict(shots=13), ['folder/train: class \'class_00\' has 12 training images', '19 more classes',
                                        'data.shots=13 needs at least 13 per class']),
    (lambda root, tmp: dict(num_base=10, way=3), ['the session layout does not add up', 'num_base=10',
                                                  'way=3', '= 25 classes', 'folder/train has 20',
                                                  'num_base + way x (num_sessions - 1) = 20']),
    (lambda root, tmp: dict(test=''), ["no test images of class 'class_00'", "folder/train (its split=test rows; data.folder.test is empty)",
                                       'protocol=validation']),
    (lambda root, tmp: dict(train=str(root / 'nope')), ["data.folder.train='", "nope' does not exist",
                                                        'allowed: a folder with one subfolder of images per class']),
    # a CSV's root that does not exist: one line (d41b789: each of its images named as missing)
    (lambda root, tmp: dict(train=write_csv(tmp / 'r.csv', folder_rows(root)), test='', root=str(tmp / 'nowhere')),
     ["data.folder.root='", "nowhere' is not a folder; allowed: the folder that the relative paths of ",
      "r.csv start from, or '' (the CSV's own folder)"]),
    (lambda root, tmp: dict(train=write_csv(tmp / 'a.csv', [('x.jpg', 'c')], ('file', 'label'))),
     ['a.csv: expected a header naming the columns path (or filename), label']),
    (lambda root, tmp: dict(train=write_csv(tmp / 'b.csv', [('x.jpg', 'c', 'val')])),
     ["b.csv: the split column holds ['val']; allowed: train, test"]),
    (lambda root, tmp: dict(test=str(root / 'folder' / 'train')), ['is both a training and a test image']),
    (lambda root, tmp: dict(protocol='topic'), ["protocol 'topic' takes each session's shots from TOPIC-style lists",
                                                'data.folder.lists']),
    (lambda root, tmp: dict(classes=str(tmp / 'none.txt')), ["data.folder.classes='", 'none.txt\' does not exist']),
    (lambda root, tmp: dict(lists=str(root / 'folder' / 'lists'), protocol='topic', shots=4),
     ['session_2.txt lists 5 images per class; protocol topic takes them as the shots, so data.shots must be 5']),
    # the classes used are counted apart from those found (0739cee: 'folder/train has 10')
    (lambda root, tmp: dict(classes=listing(tmp / 'ten.txt', [f'class_{c:02d}' for c in range(10)])),
     ['= 20 classes, but ', "folder/train has 20 classes and data.folder.classes='", "ten.txt' lists 10 of them, "
      'the classes used; allowed: num_base + way x (num_sessions - 1) = 10']),
    # test images in one folder, their labels in a file beside (Tiny-ImageNet's val/): the CSV route
    (lambda root, tmp: dict(test=one_folder_of_test_images(root, tmp)),
     ["val has images of classes without training images: ['images']", 'go in through a CSV of path,label: '
      'data.folder.test=FILE.csv']),
]


def listing(path: pathlib.Path, names) -> str:
  path.write_text(''.join(f'{n}\n' for n in names))
  return str(path)


def one_folder_of_test_images(root: pathlib.Path, tmp: pathlib.Path) -> str:
  """`tmp`/val/images/ holding the test images, and val_annotations.txt their classes."""
  (tmp / 'val' / 'images').mkdir(parents=True)
  lines = []
  for path in sorted((root / 'folder' / 'test').rglob('*.jpg')):
    shutil.copy(path, tmp / 'val' / 'images' / f'{path.parent.name}_{path.name}')
    lines.append(f'{path.parent.name}_{path.name}\t{path.parent.name}')
  listing(tmp / 'val' / 'val_annotations.txt', lines)
  return str(tmp / 'val')


@pytest.mark.parametrize('case', range(len(PROBLEMS)))
def test_each_problem_is_one_message_naming_the_file(fake_root, tmp_path, case):
  root = copy_of(fake_root, tmp_path)
  change, parts = PROBLEMS[case]
  with pytest.raises(DataError) as e:
    folder.read_protocol(spec_of(root, **change(root, tmp_path)))
  for part in parts:
    assert part in str(e.value), (part, str(e.value))
  assert not (tmp_path / 'cache').exists()


def test_a_list_naming_an_unknown_image(fake_root, tmp_path):
  root = copy_of(fake_root, tmp_path)
  s2 = root / 'folder' / 'lists' / 'session_2.txt'
  original = s2.read_text()
  s2.write_text(original.replace('.jpg', '.jpeg', 1))
  with pytest.raises(DataError, match=r'session_2.txt names train/class_10/\d+.jpeg, which is not a training image'):
    folder.read_protocol(spec_of(root, lists=str(root / 'folder' / 'lists')))
  s2.write_text(original.replace('train/class_10/', '', 1))  # a bare file name: one in every class folder
  with pytest.raises(DataError, match=r'session_2.txt: \d+.jpe?g names several training images of .*train; name it by '
                                      'more of its path'):
    folder.read_protocol(spec_of(root, lists=str(root / 'folder' / 'lists')))


def test_an_unreadable_image_is_named_and_nothing_is_cached(fake_root, tmp_path):
  root = copy_of(fake_root, tmp_path)
  bad = root / 'folder' / 'train' / 'class_04' / '001.jpg'
  bad.write_bytes(b'not an image at all')
  with pytest.raises(DataError, match=f'could not read {bad} as an image .*every listed file must be an image'):
    folder.load(spec_of(root), tmp_path / 'cache')
  assert not list((tmp_path / 'cache').rglob('*.npy*'))


def test_problems_stop_run_py_before_the_workdir(fake_root, tmp_path):
  """Through run.py's entry (cli.main): one 'error:' line, exit code 2, no workdir; the data folder
  and its files are only read."""
  from configs import folder as folder_cfg
  from f2m_jax.run import cli
  root = copy_of(fake_root, tmp_path)
  before = sorted((p.relative_to(root), p.stat().st_mtime_ns) for p in root.rglob('*'))
  config = folder_cfg.get_config('')
  config.data.folder.update(train=str(root / 'folder' / 'train'), test=str(root / 'folder' / 'test'),
                            num_base=12, way=2, num_sessions=6)
  config.data.cache_dir = str(tmp_path / 'cache')
  assert cli.main(config, str(tmp_path / 'w'), 'train') == 2
  assert not (tmp_path / 'w').exists()
  assert sorted((p.relative_to(root), p.stat().st_mtime_ns) for p in root.rglob('*')) == before


@pytest.mark.parametrize('field,value,allowed', [
    ('way', 0, 'data.folder.way=0 is invalid: must be >= 1'),
    ('num_sessions', 1, 'data.folder.num_sessions=1 is invalid: must be >= 2'),
    ('augment', 'crop_flip', "data.folder.resize=1.1428571428571428 is invalid: the stored images' side over "
                             "data.image_size: >= 1, and 1 with augment 'crop_flip'"),
    ('train', '', "data.folder.train='' is invalid: a folder with one subfolder of images per class"),
    ('class_depth', -1, "data.folder.class_depth=-1 is invalid: must be >= 0"),
    ('test_per_class', 3, "data.folder.test_per_class=3 is invalid: >= 0, and 0 where data.folder.test is set"),
    ('split_by', 'last', "data.folder.split_by='last' is invalid: allowed: ('first', 'random')"),
])
def test_bad_folder_fields_are_refused_before_reading(field, value, allowed):
  from configs import folder as folder_cfg
  from f2m_jax import validation
  config = folder_cfg.get_config('')
  config.data.folder.update(train='/somewhere', test='/elsewhere')
  config.data.folder[field] = value
  with pytest.raises(ValueError, match=allowed.replace('(', r'\(').replace(')', r'\)').replace('.', r'\.')):
    validation.validate(config)


# ---------------------------------------------------------------- the configs

def _mini_through_the_folder_fields(config, fake_root):
  """configs/mini.py:smoke on the miniImageNet fake folder read through the generic data.folder fields."""
  from configs import common
  mini = fake_root / 'miniimagenet'
  lists = fake_root / 'index_list' / 'mini_imagenet'
  config.data.source = 'folder'
  config.data.folder = common.folder_section()
  config.data.folder.update(train=str(mini / 'split' / 'train.csv'), test=str(mini / 'split' / 'test.csv'),
                            root=str(mini / 'images'), lists=str(lists), num_base=8, way=2, num_sessions=9,
                            resize=92 / 84)
  return config


@pytest.mark.parametrize('protocol_name', ['draws', 'topic', 'validation'])
def test_the_mini_fake_folder_through_the_folder_fields_is_its_layout(tmp_path, protocol_name):
  """The real-looking miniImageNet folder read through the generic fields gives the benchmark of its
  own layout, array for array (so every result computed from it is the same)."""
  from configs import mini
  layout = mini.get_config('smoke')
  layout.data.update(cache_dir=str(tmp_path / 'cache'), protocol=protocol_name)
  want = sources.load_benchmark(layout)
  fake_root = fake_folders.fake_folder(tmp_path / 'cache')
  got = sources.load_benchmark(_mini_through_the_folder_fields(layout, fake_root))
  for name in ('train', 'test'):
    a, b = getattr(want, name), getattr(got, name)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels) and a.labels.dtype == b.labels.dtype
  for name in ('base_train', 'shot_pool'):
    assert np.array_equal(getattr(want, name), getattr(got, name))
  assert (want.topic_shots is None) == (got.topic_shots is None)
  assert all(np.array_equal(a, b) for a, b in zip(want.topic_shots or (), got.topic_shots or ()))
  for name in ('name', 'session_classes', 'image_size', 'mean', 'std', 'augment'):
    assert getattr(want, name) == getattr(got, name), name


def test_the_smoke_config_under_every_protocol(tmp_path):
  """configs/folder.py:smoke's generated folder under draws, topic (its lists) and validation."""
  from configs import folder as folder_cfg
  got = {}
  for name in protocol.PROTOCOLS:
    config = folder_cfg.get_config('smoke')
    config.data.update(cache_dir=str(tmp_path), protocol=name)
    got[name] = sources.load_benchmark(config)
  assert [len(c) for c in got['draws'].session_classes] == [10, 2, 2, 2, 2, 2] and got['draws'].topic_shots
  assert np.array_equal(got['draws'].base_train, got['topic'].base_train)  # session_1.txt: every base image
  assert [len(c) for c in got['validation'].session_classes] == [6, 2, 2]
  assert len(got['validation'].base_train) == 6 * 9  # 12 images less the held-out 3; a batch is 6 x 8


@pytest.mark.slow
def test_folder_smoke_end_to_end(tmp_path, capsys):
  """configs/folder.py:smoke through run.py's entry: a generated folder of 20 classes (written once into
  the cache folder) to results.json."""
  from configs import folder as folder_cfg
  from f2m_jax.run import cli
  config = folder_cfg.get_config('smoke')
  config.data.cache_dir = str(tmp_path / 'cache')
  config.runs = 1  # the code path of two runs: tests/test_end_to_end.py
  origin = {'config': 'configs/folder.py:smoke', 'changes': {'runs': 1}}  # as run.py passes it
  assert cli.main(config, str(tmp_path / 'work'), 'train', origin=origin) == 0
  results = json.loads((tmp_path / 'work' / 'results.json').read_text())
  assert results['dataset'] == 'folder' and results['protocol'] == 'draws' and results['runs'] == 1
  assert [s['num_classes'] for s in results['sessions']] == [10, 12, 14, 16, 18, 20]
  assert results['sessions'][0]['acc']['mean'] > 50  # 10 generated classes are easy
  assert 'f2m on folder (draws, 1 run' in capsys.readouterr().out
  root = tmp_path / 'cache' / 'fake_folder' / f'v{fake_folders.VERSION}'
  assert (root / fake_folders.COMPLETE).is_file() and len(list((root / 'folder').rglob('*.png'))) == 20 * 4
  assert len(list((tmp_path / 'cache' / 'arrays' / 'folder').glob('*.npy'))) == 2


@pytest.mark.slow
def test_the_mini_fake_folder_gives_the_results_of_its_layout(tmp_path):
  """The mini fake folder through the generic fields and its own layout (configs/mini.py:smoke,
  shortened, end to end): the same results.json but for provenance. The Baseline's programs compile
  fastest (F2M on the ResNet-18 end to end: tests/test_mini_cub.py)."""
  from configs import mini
  from f2m_jax.run import pipeline

  def config():
    c = mini.get_config('smoke')
    c.data.cache_dir = str(tmp_path / 'cache')
    c.method = 'baseline'
    c.runs = 1
    c.base.update(steps=30, milestones=(20,), checkpoint_every=10)
    return c

  want = pipeline.run(config(), str(tmp_path / 'layout'))
  assert want['dataset'] == 'mini_imagenet' and len(want['sessions']) == 9
  assert want['sessions'][0]['num_classes'] == 8 and want['sessions'][-1]['num_classes'] == 8 + 2 * 8
  assert want['sessions'][0]['acc']['mean'] > 50  # 8 fake classes are easy
  assert (tmp_path / 'cache' / 'fake_folder' / f'v{fake_folders.VERSION}' / fake_folders.COMPLETE).is_file()
  got = pipeline.run(_mini_through_the_folder_fields(config(), fake_folders.fake_folder(tmp_path / 'cache')),
                     str(tmp_path / 'generic'))
  assert without_provenance(got) == without_provenance(want)


@pytest.mark.slow
def test_a_nested_folder_split_by_the_config_end_to_end(tmp_path, capsys):
  """Omniglot's layout in small, one folder split by the config, to results.json (in process, after
  configs/folder.py:smoke above, whose programs it reuses: 20 base steps of them); the split is in
  config.json. A dry run with --checkpoint of that workdir then estimates no base training."""
  from f2m_jax.run import cli  # pylint: disable=g-import-not-at-top
  from f2m_jax.run import pipeline  # pylint: disable=g-import-not-at-top
  config = nested_config(tmp_path)
  config.base.steps = 20  # the schedule (its milestone at 80) as the smoke's: the same program
  results = pipeline.run(config, str(tmp_path / 'work'))
  assert [s['num_classes'] for s in results['sessions']] == [10, 12]
  assert far_above_chance(results['sessions'][0]['acc']['mean'], images=60, classes=10)
  with open(tmp_path / 'work' / 'config.json') as f:
    recorded = json.load(f)['data']['folder']
  assert (recorded['test_per_class'], recorded['split_by'], recorded['split_seed'], recorded['class_depth']) == (
      6, 'random', 1, 0)
  capsys.readouterr()
  assert cli.main(config, None, 'train', checkpoint=str(tmp_path / 'work'), dry_run=True) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[-2] == f'base training: none, the base model is read from --checkpoint {tmp_path / "work"}'
  assert not any(line.startswith('base step') for line in out)


def test_the_image_decode_shows_its_progress_off_a_terminal(tmp_path, capsys):
  """At 0739cee the decode bar showed on a terminal only (tqdm's disable=None)."""
  paths = [tmp_path / f'{i}.png' for i in range(3)]
  for path in paths:
    path.write_bytes(b'')
  images = folder.decode_cached(paths, tmp_path / 'cache', 'train', 8, 8, desc='mine train',
                                decode=lambda path, resize, crop: np.zeros((crop, crop, 3), np.uint8))
  assert images.shape == (3, 8, 8, 3)
  err = capsys.readouterr().err  # a line a redraw (progress.bar)
  assert '\r' not in err and '):   0%' in err.splitlines()[0]
  assert err.splitlines()[-1].startswith(f'decoding mine train (once, cached in {tmp_path / "cache"}): 100%')
