"""Choose and load the `Benchmark` a config asks for."""
from __future__ import annotations

import os

from f2m_jax.data import cifar100, cub200, fake_folders, holdout, index_lists, mini_imagenet
from f2m_jax.data.synthetic import make_synthetic
from f2m_jax.data.types import Benchmark

SOURCES = ('tfds', 'trainsplit', 'folder', 'fake_folder', 'synthetic')
FOLDER_DATASETS = ('mini_imagenet', 'cub200')


def data_dir(config) -> str:
  """The folder with local data: config.data.data_dir, else $F2M_DATA_DIR, else ''."""
  return config.data.data_dir or os.environ.get('F2M_DATA_DIR', '')


def cache_dir(config) -> str:
  """Where downloads and converted files go (never into the data folder)."""
  return (config.data.cache_dir or os.environ.get('F2M_CACHE_DIR', '')
          or os.path.join(os.path.expanduser('~'), '.cache', 'f2m_jax'))


def how_to_get(config) -> str:
  """What to put into the data folder for the config's dataset and source, and how to get it ('' for
  sources that read no data folder)."""
  dataset, source = config.data.dataset, config.data.source
  if source == 'folder' and dataset in FOLDER_DATASETS:
    return {'mini_imagenet': mini_imagenet.HOW_TO_GET, 'cub200': cub200.HOW_TO_GET}[dataset]
  if dataset == 'cifar100' and source == 'trainsplit':
    return cifar100.TRAINSPLIT_HOW_TO_GET
  return ''


def load_benchmark(config) -> Benchmark:
  """The config's benchmark; with data.protocol='validation' its validation protocol (holdout.py)."""
  bench = _load(config)
  return holdout.validation_benchmark(bench) if config.data.protocol == 'validation' else bench


def _load(config) -> Benchmark:
  source, dataset = config.data.source, config.data.dataset
  if source == 'synthetic':
    s = config.data.synthetic
    return make_synthetic(seed=s.get('seed', 0), num_base=s.num_base, way=s.way, num_sessions=s.num_sessions,
                          train_per_class=s.train_per_class, test_per_class=s.test_per_class,
                          image_size=s.image_size)
  if dataset == 'cifar100' and source in ('tfds', 'trainsplit'):
    if source == 'trainsplit':  # the images' file is named before the index lists are looked for
      folder = data_dir(config)
      if not folder:
        raise ValueError("data.source='trainsplit' reads cifar100_train.npz from a folder: set F2M_DATA_DIR "
                         f'or --config.data.data_dir.\n{cifar100.TRAINSPLIT_HOW_TO_GET}')
      npz = os.path.join(folder, cifar100.NPZ_NAME)
      if not os.path.isfile(npz):
        cifar100.load_train_npz(npz)  # raises the DataError saying what to put there
    index_dir = index_lists.index_list_dir('cifar100', data_dir(config) or None, cache_dir(config))
    if source == 'tfds':
      bench = cifar100.load_cifar100_tfds(config.data.tfds_data_dir or None, index_dir, cache_dir(config))
    else:
      bench = cifar100.load_cifar100_trainsplit(npz, index_dir)
    split = config.data.get('split', '')
    return cifar100.class_split(bench, split) if split else bench
  if dataset in FOLDER_DATASETS and source in ('folder', 'fake_folder'):
    return _load_folder_dataset(config, dataset, source)
  raise ValueError(f'data.source={source!r} is not available for data.dataset={dataset!r} '
                   f'(sources: {SOURCES})')


def _load_folder_dataset(config, dataset: str, source: str) -> Benchmark:
  """miniImageNet / CUB-200 from their folder layout: the user's data folder ('folder') or the tiny
  generated copy in the cache folder ('fake_folder', created on first use). The loaders check the
  image folder before looking for (or downloading) the index lists, so missing data is named first."""
  module = {'mini_imagenet': mini_imagenet, 'cub200': cub200}[dataset]
  load = mini_imagenet.load_mini_imagenet if dataset == 'mini_imagenet' else cub200.load_cub200
  image_size = int(config.data.get('image_size', 0) or 0) or module.IMAGE_SIZE
  cache = cache_dir(config)
  if source == 'fake_folder':
    root = fake_folders.fake_folder(cache)
    return load(str(root), root / 'index_list' / dataset, cache, image_size=image_size)
  return load(data_dir(config), None, cache, image_size=image_size)
