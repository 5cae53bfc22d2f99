"""F2M on your own images: any folder of images as an incremental few-shot benchmark (docs/data.md,
'Your own images', takes you from the folder to results.json).

  python run.py --config configs/folder.py --workdir W --config.data.folder.train=PATH/train \\
      --config.data.folder.test=PATH/test --config.data.folder.way=5 --config.data.folder.num_sessions=9
  python run.py --config configs/folder.py:cpu --workdir W ...  # the same at a budget a 2-core CPU trains in minutes
  python run.py --config configs/folder.py:smoke --workdir W   # a generated folder of 20 classes, < 1 min

Data (`f2m_jax/data/folder.py`, fields in `configs/common.py: folder_section`): `data.folder.train` is a
folder of class folders (an image's class: its folder's path under it, at any depth, or its first
`data.folder.class_depth` folders), or a CSV of `path,label` (optionally a `split` column of
train/test); `data.folder.test` the test images the same way, or `data.folder.test_per_class` images of
each class of `train` split off as its test images (`split_by` 'first' or 'random', `split_seed`).
The classes in sorted order (or `data.folder.classes`, a file listing them); session 1 takes
`data.folder.num_base` classes (0: all but the later sessions'), each later session `data.folder.way`,
with `data.shots` images each; `data.image_size` the network's input. Every image is decoded once
into the cache folder.

Training: the miniImageNet settings (configs/mini.py: ResNet-18 with the ImageNet stem from a random
init, 28,503 base iterations of TaskSampler epochs of 16 images per class, M = 2, b = 0.008, no
fine-tuning in the sessions, PN, 10 runs of shot draws). `cpu` sets the fields of a budget together
(common.make_cpu): 1,000 iterations of batch 64 (16 classes x 4 images), lr 0.05, a width-16
ResNet-18 at 32 px, 5 runs (measured times, CIFAR-100's at this budget among them: experiments/results/
README.md, section 25). F2M-V:
`configs/f2m_v.py:folder` (or `:folder:cpu`).

`smoke`: the same code path on `data.source='fake_folder'`: 20 generated classes (JPEG and PNG files of
varied shapes, written once into the cache folder), 10 base classes + 5 sessions x 2-way, 32x32
images, a width-8 ResNet-18, 100 base steps, 2 runs.
"""
from configs import common
from configs import mini


def get_config(arg: str = ''):
  config = mini.get_config('')
  config.data.dataset = 'folder'  # the name results.json gives the dataset
  config.data.folder = common.folder_section()

  variant = common.parse_arg(arg, ('', 'smoke', 'cpu'))
  if variant == 'cpu':
    common.make_cpu(config)
  elif variant == 'smoke':
    mini.make_folder_smoke(config)
    config.data.folder.update(num_base=10, way=2, num_sessions=6)
    config.base.update(ways=6, batch_size=48)  # 6 classes x 8 images: the validation protocol keeps 6 pseudo-base classes
    for section in ('icarl', 'rebalance'):  # session 2 holds 10 x 2 exemplars + 2 x 5 shots
      config[section].batch_size = 24
  return config
