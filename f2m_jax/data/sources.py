"""Choose and load the `Benchmark` a config asks for."""
import os

from f2m_jax.data import cifar100, fake_folders, folder, holdout, index_lists, layouts
from f2m_jax.data.synthetic import make_synthetic
from f2m_jax.data.types import DataError

SOURCES = ('tfds', 'trainsplit', 'folder', 'fake_folder', 'synthetic')
FOLDER_DATASETS = tuple(layouts.FOLDER)  # the datasets whose own files the folder source reads


def data_dir(config):
  """The folder with local data: config.data.data_dir, else $F2M_DATA_DIR, else ''."""
  return config.data.data_dir or os.environ.get('F2M_DATA_DIR', '')


def cache_dir(config):
  """Where downloads and converted files go: config.data.cache_dir, else
  index_lists.cache_folder's default."""
  return index_lists.cache_folder(config.data.cache_dir)


def uses_layout(config):
  """Whether a folder source reads miniImageNet's or CUB's own files (else the data.folder
  fields)."""
  return config.data.dataset in FOLDER_DATASETS and not config.data.get('folder', {}).get('train')


def how_to_get(config):
  """What the data folder must hold for the config's source and how to get it; '' where the
  source reads no data folder."""
  if config.data.source == 'folder' and uses_layout(config):
    return layouts.HOW_TO_GET[config.data.dataset]
  trainsplit = (config.data.dataset, config.data.source) == ('cifar100', 'trainsplit')
  return cifar100.TRAINSPLIT_HOW_TO_GET if trainsplit else ''


def load_benchmark(config):
  """The config's benchmark; with data.protocol='validation' its validation protocol (holdout.py).
  Every problem with the data stops here, before the pipeline writes anything."""
  bench = _load(config)
  return holdout.validation_benchmark(bench) if config.data.protocol == 'validation' else bench


def _load(config):
  source, dataset, cache = config.data.source, config.data.dataset, cache_dir(config)
  if source == 'synthetic':
    return make_synthetic(**config.data.synthetic.to_dict())
  if source in ('folder', 'fake_folder') and (uses_layout(config) or 'folder' in config.data):
    return folder.load(folder_spec(config), cache)
  if dataset != 'cifar100' or source not in ('trainsplit', 'tfds'):
    raise ValueError(f'data.source={source!r} is not available for data.dataset={dataset!r} '
                     f'(sources: {SOURCES}; the folder source reads any dataset through '
                     'configs/folder.py)')
  if source == 'trainsplit':  # cifar100_train.npz in the data folder validation demands
    # read first: where it is missing, the DataError says what to put there, not the lists'
    train = cifar100.load_train_npz(os.path.join(data_dir(config), cifar100.NPZ_NAME))
    index_dir = index_lists.index_list_dir('cifar100', data_dir(config), cache)
    bench = cifar100.load_cifar100_trainsplit(train, index_dir)
  else:  # from TFDS or the official archive
    try:
      index_dir = index_lists.index_list_dir('cifar100', data_dir(config), cache)
    except DataError as e:  # the images' files are named with the lists where both are missing
      if cifar100.images_at_hand(cache, config.data.tfds_data_dir):
        raise
      raise DataError('CIFAR-100 needs two things this machine has not got:\n1. '
                      f'{cifar100.archive_help(cache)}\n2. {e}') from e
    bench = cifar100.load_official(index_dir, cache, config.data.tfds_data_dir)
  split = config.data.get('split', '')
  return cifar100.class_split(bench, split) if split else bench


def folder_spec(config, writes=True):
  """The folder.Spec of a folder source: a layout's own files (layouts.py), the data.folder
  fields, or the generated 'fake_folder'. With `writes=False` (a dry run) None where it would
  be created."""
  cache, dataset = cache_dir(config), config.data.dataset
  fields = dict(shots=config.data.shots, protocol=config.data.protocol)
  fake = config.data.source == 'fake_folder'
  root = fake_folders.fake_folder(cache, create=writes) if fake else None
  if fake and root is None:
    return None
  if uses_layout(config):
    files = root or data_dir(config)
    index_dir = None  # layouts.spec finds the lists, downloading them where absent
    if not writes:
      index_dir = index_lists.index_list_dir(dataset, files, cache, download=False)
      if index_dir is None:
        return None
    return layouts.spec(dataset, files, index_dir, cache, config.data.get('image_size', 0),
                        **fields)
  f = config.data.folder.to_dict()
  for k in ('train', 'test', 'root', 'lists', 'classes'):
    f[k] = os.path.expanduser(os.path.expandvars(f[k]))
  # the generated folder of 20 classes and its lists instead of the user's files
  if root is not None:
    f.update({name: str(root / 'folder' / name) for name in ('train', 'test', 'lists')})
  return folder.Spec(name=dataset or 'folder', image_size=config.data.image_size, **f, **fields)
