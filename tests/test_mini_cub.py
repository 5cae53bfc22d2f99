"""miniImageNet and CUB-200, the layouts of the folder source: the TOPIC lists (real copies in
$F2M_DATA_DIR/index_list, skipped if absent), the loaders on the generated fake folders, the array
cache, the errors for missing data, and CUB's `:smoke` config end to end (files on disk -> results.json;
miniImageNet's: tests/test_folder.py)."""
import json
import shutil

import numpy as np
import pytest

from conftest import DATA_DIR

from f2m_jax.data import augment, fake_folders, folder, layouts, sources
from f2m_jax.data.types import DataError

MINI_LISTS = DATA_DIR / 'index_list' / 'mini_imagenet'
CUB_LISTS = DATA_DIR / 'index_list' / 'cub200'


@pytest.fixture(scope='module')
def fake_root(tmp_path_factory):
  return fake_folders.fake_folder(tmp_path_factory.mktemp('cache'))


def load(dataset, data_dir, index_dir, cache_dir, decode=None, **fields):
  """The benchmark of `dataset`'s layout in `data_dir`, as the folder source reads it."""
  return folder.load(layouts.spec(dataset, data_dir, index_dir, cache_dir, **fields), cache_dir, decode)


def _no_decode(*args):
  raise AssertionError(f'decoded {args[0]} although the cache should have been used')


# ---------------------------------------------------------------- the real TOPIC lists

@pytest.mark.skipif(not (MINI_LISTS / 'session_1.txt').is_file(), reason=f'no lists in {MINI_LISTS}')
def test_real_mini_imagenet_lists(tmp_path):
  spec = folder.Spec('mini_imagenet', train=str(MINI_LISTS / 'train.csv'), test=str(MINI_LISTS / 'test.csv'),
                     root=str(tmp_path), lists=str(MINI_LISTS), num_base=60, way=5, num_sessions=9,
                     protocol='topic')
  p = folder.read_protocol(spec)
  assert len(p.order) == 100 and list(p.order) == sorted(p.order)
  assert [len(c) for c in p.session_classes] == [60] + [5] * 8
  assert p.session_classes[0] == tuple(range(60))
  assert p.session_classes[8] == tuple(range(95, 100))
  base = p.train_labels[p.base_train]
  assert len(base) == 30000 and np.array_equal(np.bincount(base, minlength=60), np.full(60, 500))
  assert all(len(i) == 25 for i in p.topic_shots)
  for idx in p.topic_shots:
    assert np.array_equal(np.unique(p.train_labels[idx], return_counts=True)[1], [5] * 5)
  assert len(p.test.files) == 10000
  assert np.array_equal(np.bincount(p.test_labels), np.full(100, 100))
  assert len(set(p.test.files) & set(p.train.files)) == 0


@pytest.mark.skipif(not (CUB_LISTS / 'session_1.txt').is_file(), reason=f'no lists in {CUB_LISTS}')
def test_real_cub200_lists(tmp_path):
  # Metadata in the official format for the listed images (the real lists' paths, one made-up test
  # image per class): enough for read_protocol, which reads no image.
  lines = [l for t in range(1, 12) for l in (CUB_LISTS / f'session_{t}.txt').read_text().split()]
  rel = [l[len('CUB_200_2011/images/'):] for l in lines]
  dirs = sorted({r.split('/')[0] for r in rel})
  assert len(dirs) == 200 and dirs[0].startswith('001.') and dirs[-1].startswith('200.')
  rel += [f'{d}/test_{i}.jpg' for i, d in enumerate(dirs)]
  root = tmp_path / 'CUB_200_2011'
  (root / 'images').mkdir(parents=True)
  cls = {d: int(d.split('.')[0]) for d in dirs}
  (root / 'images.txt').write_text(''.join(f'{i + 1} {r}\n' for i, r in enumerate(rel)))
  (root / 'train_test_split.txt').write_text(''.join(f'{i + 1} {int(i < len(lines))}\n' for i in range(len(rel))))
  (root / 'image_class_labels.txt').write_text(''.join(f'{i + 1} {cls[r.split("/")[0]]}\n' for i, r in enumerate(rel)))
  (root / 'classes.txt').write_text(''.join(f'{cls[d]} {d}\n' for d in dirs))

  p = folder.read_protocol(layouts.spec('cub200', tmp_path, CUB_LISTS, protocol='topic'))
  assert [len(c) for c in p.session_classes] == [100] + [10] * 10
  assert p.session_classes[0] == tuple(range(100)) and p.session_classes[10] == tuple(range(190, 200))
  base = p.train_labels[p.base_train]
  assert len(base) == 3000 and np.array_equal(np.bincount(base, minlength=100), np.full(100, 30))
  for idx in p.topic_shots:
    assert np.array_equal(np.unique(p.train_labels[idx], return_counts=True)[1], [5] * 10)
  assert p.order[0] == '001.Black_footed_Albatross'


# ---------------------------------------------------------------- loaders on the fake folders

def test_fake_mini_imagenet_benchmark(fake_root, tmp_path):
  b = load('mini_imagenet', fake_root, fake_root / 'index_list' / 'mini_imagenet', tmp_path, image_size=32)
  spec = fake_folders.SPECS['mini_imagenet']
  assert b.name == 'mini_imagenet' and b.num_sessions == 9 and b.num_base_classes == 8
  assert b.session_classes[1:] == tuple((8 + 2 * i, 9 + 2 * i) for i in range(8))
  n_cls = fake_folders.num_classes(spec)
  assert b.train.images.shape == (n_cls * spec.train_per_class, 35, 35, 3)  # Resize(92/84*32=35)
  assert b.test.images.shape == (n_cls * spec.test_per_class, 32, 32, 3)
  assert np.array_equal(np.bincount(b.train.labels[b.base_train]), np.full(8, spec.train_per_class))
  assert len(b.topic_shots) == 8 and all(len(s) == 10 for s in b.topic_shots)
  assert np.all(b.train.labels[b.shot_pool] >= 8) and len(b.shot_pool) == 16 * spec.train_per_class
  assert (b.image_size, b.augment, b.mean, b.std) == (32, 'rrc_flip', folder.IMAGENET_MEAN, folder.IMAGENET_STD)
  # Test image 0 is its file through Resize(35) + CenterCrop(32); the centre crop of a stored
  # training image is that same test transform (the view prototypes need).
  name = (fake_root / 'index_list' / 'mini_imagenet' / 'test.csv').read_text().splitlines()[1].split(',')[0]
  want = folder.decode_file(fake_root / 'miniimagenet' / 'images' / name, 35, 32)
  assert np.array_equal(b.test.images[0], want)
  first_train = (fake_root / 'index_list' / 'mini_imagenet' / 'train.csv').read_text().splitlines()[1].split(',')[0]
  view = augment.eval_view(b.train.images[:1], 32)[0]
  assert np.array_equal(view, folder.decode_file(fake_root / 'miniimagenet' / 'images' / first_train, 35, 32))


def test_fake_cub200_benchmark(fake_root, tmp_path):
  b = load('cub200', fake_root, fake_root / 'index_list' / 'cub200', tmp_path, image_size=56)
  spec = fake_folders.SPECS['cub200']
  n_cls = fake_folders.num_classes(spec)
  assert b.name == 'cub200' and b.num_sessions == 11 and b.num_base_classes == 8
  assert [len(c) for c in b.session_classes] == [8] + [2] * 10
  assert b.train.images.shape == (n_cls * spec.train_per_class, 64, 64, 3)  # 256/224 * 56
  assert b.test.images.shape == (n_cls * spec.test_per_class, 56, 56, 3)
  assert np.array_equal(np.bincount(b.test.labels), np.full(n_cls, spec.test_per_class))
  assert all(len(s) == 10 for s in b.topic_shots)
  # The centre 56 crop of a stored (non-square source) training image = Resize(64) + CenterCrop(56).
  rel = [l.split()[1] for l in (fake_root / 'CUB_200_2011' / 'images.txt').read_text().splitlines()]
  split = [l.split()[1] for l in (fake_root / 'CUB_200_2011' / 'train_test_split.txt').read_text().splitlines()]
  train_rel = [r for r, s in zip(rel, split) if s == '1']
  for k in (0, 1, 2):  # the fake JPEGs cycle through three shapes
    want = folder.decode_file(fake_root / 'CUB_200_2011' / 'images' / train_rel[k], 64, 56)
    assert np.array_equal(augment.eval_view(b.train.images[k:k + 1], 56)[0], want)


def test_fake_folder_is_deterministic(tmp_path):
  a, b = tmp_path / 'a', tmp_path / 'b'
  fake_folders.write_images(a, 'mini_imagenet')
  fake_folders.write_images(b, 'mini_imagenet')
  files = sorted(p.relative_to(a) for p in a.rglob('*') if p.is_file())
  assert files and files == sorted(p.relative_to(b) for p in b.rglob('*') if p.is_file())
  assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


# ---------------------------------------------------------------- the array cache

def test_cache_is_reused_and_keyed_by_files(fake_root, tmp_path):
  root = tmp_path / 'data'
  shutil.copytree(fake_root / 'CUB_200_2011', root / 'CUB_200_2011')
  lists = fake_root / 'index_list' / 'cub200'
  first = load('cub200', root, lists, tmp_path / 'cache', image_size=32)
  cached = sorted((tmp_path / 'cache' / 'arrays' / 'cub200').iterdir())
  assert [p.suffix for p in cached] == ['.npy', '.npy']
  again = load('cub200', root, lists, tmp_path / 'cache', image_size=32, decode=_no_decode)
  assert np.array_equal(first.train.images, again.train.images)
  assert np.array_equal(first.test.images, again.test.images)
  # A changed file (another size) changes the key: that split is decoded again.
  img = next((root / 'CUB_200_2011' / 'images').rglob('*.jpg'))
  img.write_bytes(img.read_bytes() + b'\0')
  with pytest.raises(DataError, match='although the cache should have been used'):
    load('cub200', root, lists, tmp_path / 'cache', image_size=32, decode=_no_decode)


def test_data_folder_is_only_read(fake_root, tmp_path):
  before = sorted(str(p) for p in fake_root.rglob('*'))
  load('mini_imagenet', fake_root, fake_root / 'index_list' / 'mini_imagenet', tmp_path, image_size=32)
  assert sorted(str(p) for p in fake_root.rglob('*')) == before
  assert list((tmp_path / 'arrays' / 'mini_imagenet').glob('*.npy'))


# ---------------------------------------------------------------- missing or incomplete data

def test_missing_data_errors(tmp_path):
  with pytest.raises(DataError, match=r'(?s)miniimagenet/images.*How to obtain'):
    load('mini_imagenet', tmp_path, None, tmp_path / 'cache')
  with pytest.raises(DataError, match=r'(?s)CUB_200_2011/images.*images.txt.*How to obtain'):
    load('cub200', tmp_path, None, tmp_path / 'cache')
  with pytest.raises(DataError, match='needs a data folder'):
    load('mini_imagenet', '', None, tmp_path / 'cache')


def test_cub_metadata_lines(tmp_path):
  """CUB's '<id> <value>' files: blank lines skipped, a line of another form named by its number."""
  path = tmp_path / 'images.txt'
  path.write_text('1 001.Albatross/a b.jpg\n\n2  002.Crow/c.jpg \n')
  assert layouts._read_pairs(path) == {1: '001.Albatross/a b.jpg', 2: '002.Crow/c.jpg'}  # pylint: disable=protected-access
  path.write_text('1 001.Albatross/a.jpg\nx 002.Crow/c.jpg\n')
  with pytest.raises(DataError, match=f'{path}:2: expected "<id> <value>", got \'x 002.Crow/c.jpg\''):
    layouts._read_pairs(path)  # pylint: disable=protected-access


def test_incomplete_data_errors(fake_root, tmp_path):
  root = tmp_path / 'data'
  shutil.copytree(fake_root, root)
  victim = sorted((root / 'miniimagenet' / 'images').iterdir())[3]
  victim.unlink()
  with pytest.raises(DataError, match=f'(?s)1 of .* image files are missing:.*{victim.name}'):
    load('mini_imagenet', root, root / 'index_list' / 'mini_imagenet', tmp_path / 'cache', image_size=32)
  (root / 'CUB_200_2011' / 'train_test_split.txt').unlink()
  with pytest.raises(DataError, match='train_test_split.txt'):
    load('cub200', root, root / 'index_list' / 'cub200', tmp_path / 'cache', image_size=32)
  # A list naming an image the split does not have.
  s2 = root / 'index_list' / 'mini_imagenet' / 'session_2.txt'
  s2.write_text(s2.read_text().replace('.jpg', 'x.jpg', 1))
  with pytest.raises(DataError, match='x.jpg, which is not a training image of .*train.csv'):
    folder.read_protocol(layouts.spec('mini_imagenet', root, root / 'index_list' / 'mini_imagenet'))


# ---------------------------------------------------------------- configs

def test_full_configs_load_the_folder_layout(fake_root, tmp_path):
  """The full configs read the user's layout (here the fake folder as the data folder) at the real
  image sizes; without data they stop with the DataError."""
  from configs import cub200 as cub_cfg
  from configs import mini as mini_cfg
  for get, size, stored in ((mini_cfg.get_config, 84, 92), (cub_cfg.get_config, 224, 256)):
    c = get('')
    c.data.data_dir, c.data.cache_dir = str(fake_root), str(tmp_path)
    b = sources.load_benchmark(c)
    assert b.image_size == size and b.train.images.shape[1:] == (stored, stored, 3)
    assert b.test.images.shape[1:] == (size, size, 3)
    c.data.data_dir = str(tmp_path / 'empty')
    with pytest.raises(DataError, match='(?s)How to obtain'):
      sources.load_benchmark(c)


def test_cub_config_needs_pretrained_weights(monkeypatch):
  from configs import cub200 as cub_cfg
  from f2m_jax.models import resnet18, torch_import
  monkeypatch.delenv('F2M_CUB_PRETRAINED', raising=False)
  monkeypatch.setenv('F2M_DATA_DIR', '/nonexistent-data')
  c = cub_cfg.get_config('')
  assert c.model.pretrained == '${F2M_DATA_DIR}/resnet18-f37072fd.pth'
  assert (c.base.lr, c.base.classifier_lr, c.runs, c.eval.normalize_prototypes) == (1e-3, 1e-2, 5, False)
  with pytest.raises(torch_import.WeightsError, match='/nonexistent-data/resnet18-f37072fd.pth'):
    torch_import.load_torchvision_resnet18(c.model.pretrained, resnet18(100, width=8), 32)
  monkeypatch.setenv('F2M_CUB_PRETRAINED', '/w/r18.pth')
  assert cub_cfg.get_config('').model.pretrained == '/w/r18.pth'


@pytest.mark.slow
def test_cub200_smoke_config_end_to_end(tmp_path):
  """configs/cub200.py:smoke shortened, from its generated folder to results.json. miniImageNet's:
  tests/test_folder.py::test_the_mini_fake_folder_gives_the_results_of_its_layout."""
  from configs import cub200
  from f2m_jax.run import pipeline
  config = cub200.get_config('smoke')
  assert config.data.source == 'fake_folder'
  config.data.cache_dir = str(tmp_path / 'cache')
  config.runs = 1  # the smoke run shortened: the code path is the same, the compiles dominate
  config.base.update(steps=40, milestones=(30,), checkpoint_every=20)
  pipeline.run(config, str(tmp_path / 'work'))
  with open(tmp_path / 'work' / 'results.json') as f:
    results = json.load(f)
  assert results['dataset'] == 'cub200' and len(results['sessions']) == 11
  assert results['sessions'][0]['num_classes'] == 8 and results['sessions'][-1]['num_classes'] == 8 + 2 * 10
  assert results['sessions'][0]['acc']['mean'] > 50  # 8 fake classes are easy
  assert (tmp_path / 'cache' / 'fake_folder' / f'v{fake_folders.VERSION}' / fake_folders.COMPLETE).is_file()
