"""miniImageNet and CUB-200-2011 as layouts the folder source reads, in the TOPIC protocol
(docs/data.md, 'Datasets and sources')."""
import pathlib

import numpy as np

from f2m_jax.data import folder, index_lists
from f2m_jax.data.index_lists import DATA_DIR_ENV
from f2m_jax.data.types import DataError

IMAGE_SIZE = {'mini_imagenet': 84, 'cub200': 224}
RESIZE = {'mini_imagenet': 92 / 84, 'cub200': 256 / 224}  # the stored side over the image size
FOLDER = {'mini_imagenet': 'miniimagenet', 'cub200': 'CUB_200_2011'}
CUB_FILES = ('images.txt', 'train_test_split.txt', 'image_class_labels.txt', 'classes.txt')
NEEDED = {'mini_imagenet': ('images', 'split'), 'cub200': ('images',) + CUB_FILES}
HOW_TO_GET = {
    'mini_imagenet': (
        'How to obtain it: the miniimagenet folder (images/ and split/) as the FSCIL codebases '
        'distribute it (CEC, https://github.com/icoz69/CEC-CVPR2021, "Datasets"), or images/ built '
        'from ImageNet with the miniImageNet split (Ravi & Larochelle) at 84x84: <data '
        'folder>/miniimagenet/images/ holds the JPEGs (such as n0153282900000005.jpg), <data '
        'folder>/miniimagenet/split/ train.csv and test.csv (filename,label); the data folder is '
        f'${DATA_DIR_ENV} or --config.data.data_dir.'),
    'cub200': (
        'How to obtain it: download CUB_200_2011.tgz (Caltech-UCSD Birds-200-2011, '
        'https://www.vision.caltech.edu/datasets/cub_200_2011/ or '
        'https://data.caltech.edu/records/65de6-vzc59) and unpack it in the data folder '
        f'(${DATA_DIR_ENV} or --config.data.data_dir), so that <data '
        'folder>/CUB_200_2011/images/<class dir>/<file>.jpg and <data '
        'folder>/CUB_200_2011/images.txt exist.'),
}


def mini_csv(root, index_dir, name):
  """`<index_dir>/<name>.csv` if present, else `<root>/split/<name>.csv`."""
  found = [f for f in (pathlib.Path(index_dir, f'{name}.csv'), root / 'split' / f'{name}.csv')
           if f.is_file()]
  if not found:
    raise DataError(f'miniImageNet split file {name}.csv not found in {index_dir} or '
                    f'{root / "split"}.\n{HOW_TO_GET["mini_imagenet"]}')
  return str(found[0])


def _read_pairs(path):
  """{int id: value} from '<id> <value>' lines."""
  pairs = {}
  for n, line in enumerate(path.read_text().splitlines(), start=1):
    parts = line.split(maxsplit=1)
    if parts and (len(parts) != 2 or not parts[0].isdigit()):
      raise DataError(f'{path}:{n}: expected "<id> <value>", got {line!r}')
    if parts:
      pairs[int(parts[0])] = parts[1].strip()
  return pairs


def cub_tables(root):
  """((train Table, test Table), class order) of CUB's official files (module docstring)."""
  images, split, labels, classes = (_read_pairs(root / n) for n in CUB_FILES)
  ids = sorted(images)
  if split.keys() != images.keys() or labels.keys() != images.keys():
    raise DataError(f'{root}: images.txt, train_test_split.txt and image_class_labels.txt list '
                    'different image ids (incomplete download?)')
  names = tuple(images[i].split('/')[0] for i in ids)
  for i, name in zip(ids, names):
    if name != classes.get(int(labels[i])):
      raise DataError(f'{root}: image {i} ({images[i]}) is not in the folder of its class '
                      f'{labels[i]} ({classes.get(int(labels[i]), "absent from classes.txt")})')
  is_train = np.asarray([split[i] == '1' for i in ids])
  table = folder.Table(root / 'images', tuple(images[i] for i in ids), names,
                       tuple('train' if t else 'test' for t in is_train), str(root / 'images.txt'))
  order = tuple(classes[c] for c in sorted(classes))
  return (table.select(is_train), table.select(~is_train)), order


def spec(dataset, data_dir, index_dir=None, cache_dir=None, image_size=0, **fields):
  """The folder source's Spec of `dataset` in `data_dir`, its TOPIC lists in `index_dir` (else
  found or downloaded into `cache_dir`); `fields`: shots, protocol. A DataError names what is
  missing and how to get it."""
  if not data_dir:
    raise DataError(f'{dataset} needs a data folder: set ${DATA_DIR_ENV} or '
                    f'--config.data.data_dir.\n{HOW_TO_GET[dataset]}')
  root = pathlib.Path(data_dir) / FOLDER[dataset]
  missing = [str(root / n) for n in NEEDED[dataset] if not (root / n).exists()]
  if missing:
    raise DataError(f'{dataset} not found or incomplete: missing {", ".join(missing)} (its TOPIC '
                    f'lists: {pathlib.Path(data_dir) / "index_list" / dataset}, else '
                    f'downloaded).\n{HOW_TO_GET[dataset]}')
  if index_dir is None:
    index_dir = index_lists.index_list_dir(dataset, str(data_dir), cache_dir)
  common = dict(name=dataset, lists=str(index_dir), image_size=image_size or IMAGE_SIZE[dataset],
                resize=RESIZE[dataset], how_to_get=HOW_TO_GET[dataset], **fields)
  if dataset == 'mini_imagenet':
    return folder.Spec(train=mini_csv(root, index_dir, 'train'),
                       test=mini_csv(root, index_dir, 'test'), root=str(root / 'images'), **common)
  tables, order = cub_tables(root)
  return folder.Spec(classes=order, tables=tables, **common)
