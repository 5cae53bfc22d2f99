"""The config's shared fields, checked before anything is written (each method checks its own section
with `need`)."""
from __future__ import annotations

import math
import os

import ml_collections
from flax import traverse_util

from f2m_jax import base as base_lib
from f2m_jax import incremental as incremental_lib
from f2m_jax import noise as noise_lib
from f2m_jax import objectives
from f2m_jax.data import cifar100
from f2m_jax.data import folder as folder_lib
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.data import sources
from f2m_jax.experiment import Experiment
from f2m_jax.models import ARCHS, HEADS

# Every field with a set of allowed values, and every number with its least value (one more rule each below).
CHOICES = {'noise.distribution': noise_lib.DISTRIBUTIONS, 'noise.backward_weights': ('noisy', 'clean'),
           'noise.bn_updates': base_lib.BN_UPDATES, 'base.sampler': ('task_epochs', 'balanced', 'shuffle'),
           'incremental.trainable': ('noise_set', 'all'), 'incremental.prototype_norm': incremental_lib.PROTOTYPE_NORMS,
           'incremental.distance': objectives.DISTANCES, 'data.protocol': protocol_lib.PROTOCOLS,
           'data.source': sources.SOURCES, 'model.arch': tuple(ARCHS), 'model.dtype': ('float32', 'bfloat16'),
           'model.head': HEADS, 'members.map': base_lib.MEMBER_MAPS}  # model.conv_backward, noise.draw_map: backend.py
LEAST = {'runs': 1, 'seed': 0, 'eval.batch_size': 1, 'noise.M': 1, 'noise.bound': 0, 'noise.pf_weight': 0,
         'noise.std_weight': 0, 'base.steps': 1, 'base.batch_size': 1, 'base.ways': 1,
         'base.shots': 0, 'base.log_every': 1, 'base.select_every': 1, 'base.steps_per_call': 1,
         'base.checkpoint_every': 1, 'incremental.steps': 0, 'data.shots': 1,
         **{f'data.synthetic.{k}': 1 for k in ('num_base', 'way', 'num_sessions', 'train_per_class', 'test_per_class')},
         'data.synthetic.image_size': 8, 'data.synthetic.seed': 0, 'bench.warmup': 0, 'bench.iters': 1,
         'bench.batch': 0, 'flatness.num_draws': 1, 'flatness.chunk': 1, 'flatness.max_images': 0}
# Every optimizer's settings, in any section (base, incremental, each method's).
OPTIMIZER = {'momentum': (lambda v: 0 <= v < 1, 'must be in [0, 1)'), 'lr': (lambda v: v > 0, 'must be > 0'),
             'weight_decay': (lambda v: v >= 0, 'must be >= 0'),
             'lr_gamma': (lambda v: v > 0, 'must be > 0 (the rate is multiplied by it at each milestone)')}


def need(ok: bool, field: str, value, allowed: str) -> None:
  """Raises ValueError('<field>=<value> is invalid: <allowed>') unless `ok`."""
  if not ok:
    raise ValueError(f'{field}={value!r} is invalid: {allowed}')


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming the field, its value and what is allowed: every field of configs/common.py
  (a method's own section: also its `Method.validate`)."""
  fields = traverse_util.flatten_dict(c.to_dict(), sep='.')
  for field, allowed in CHOICES.items():
    need(fields[field] in allowed, field, fields[field], f'allowed: {allowed}')
  for field, least in LEAST.items():
    need(fields[field] >= least, field, fields[field], f'must be >= {least}')
  for field, value in fields.items():
    ok, allowed = OPTIMIZER.get(field.rpartition('.')[2], (None, ''))
    need(ok is None or ok(value), field, value, allowed)
    need(not isinstance(value, float) or math.isfinite(value), field, value, 'must be a finite number')
  need(all(isinstance(m, int) and not isinstance(m, bool) for m in c.base.milestones), 'base.milestones',
       tuple(c.base.milestones), 'a tuple of step numbers such as (15000,)')
  need(not c.incremental.round_steps or c.noise.bound > 0, 'incremental.round_steps', c.incremental.round_steps,
       f'rounds steps to multiples of noise.bound/2, so it needs noise.bound > 0 (is {c.noise.bound})')
  need(isinstance(c.model.width, int) and not isinstance(c.model.width, bool) and c.model.width >= 0, 'model.width',
       c.model.width, "an integer >= 1, or 0 for the architecture's standard width")
  need(isinstance(c.model.pretrained, str), 'model.pretrained', c.model.pretrained, "a .pth file's path, or ''")
  need(min(c.bench.M_list, default=1) >= 1 and set(c.bench.dtypes) <= {'float32', 'bfloat16'},
       'bench', c.bench.to_dict(), "M_list needs integers >= 1, dtypes 'float32' or 'bfloat16'")
  need_term_weight(c, 'clean_ce_weight')
  d = c.data
  need(d.get('image_size', 8) >= 8, 'data.image_size', d.get('image_size'), 'must be >= 8 (pixels)')  # folder data
  if d.split:
    need(d.split in cifar100.SPLITS, 'data.split', d.split, f'allowed: {sorted(cifar100.SPLITS)}, or empty')
    need(d.dataset == 'cifar100' and d.source in ('tfds', 'trainsplit'), 'data.split', d.split,
         "the class splits regroup CIFAR-100's 100 real classes, so they need data.dataset='cifar100' from "
         f"data.source 'tfds' or 'trainsplit' (this config: {d.dataset!r} from {d.source!r}), e.g. --config "
         f'configs/cifar100.py:trainsplit --config.data.split={d.split}')
    need(d.protocol in ('draws', 'validation'), 'data.protocol', d.protocol,
         "the class splits have no TOPIC lists: use 'draws' (or 'validation')")
  if d.source in ('folder', 'fake_folder') and not sources.uses_layout(c):
    need('folder' in d, 'data.dataset', d.dataset, f'the folder source reads the files of {sources.FOLDER_DATASETS}, '
         'any other dataset through the data.folder fields: use --config configs/folder.py')
    validate_folder(d)


def need_term_weight(c: ml_collections.ConfigDict, name: str) -> None:
  """The weight noise.<name> of a term of the noisy passes' loss (`base.loss_terms`): >= 0, and 0 where
  noise is off, whose loss is the clean pass's CE alone (the term would be silently left out)."""
  value, field = c.noise[name], f'noise.{name}'
  need(value >= 0, field, value, 'must be >= 0')
  need(not value or c.noise.enabled, field, value, f'a term of the noisy passes, which method {c.method!r} '
       'runs without (noise.enabled=False): must be 0, or set --config.noise.enabled=True')


def validate_folder(d: ml_collections.ConfigDict) -> None:
  """The folder source's fields (f2m_jax/data/folder.py; the files themselves are checked when read)."""
  f = d.folder
  need(bool(f.train) or d.source == 'fake_folder', 'data.folder.train', f.train,
       'a folder with one subfolder of images per class, or a CSV of path,label[,split]')
  need(f.num_base >= 0, 'data.folder.num_base', f.num_base, 'must be >= 0 (0: every class no later session takes)')
  need(f.way >= 1, 'data.folder.way', f.way, 'must be >= 1: the classes each later session brings')
  need(f.num_sessions >= 2, 'data.folder.num_sessions', f.num_sessions, 'must be >= 2: the base session and more')
  need(f.augment in folder_lib.AUGMENTS, 'data.folder.augment', f.augment, f'allowed: {folder_lib.AUGMENTS}')
  need(f.resize >= 1 and (f.augment == 'rrc_flip' or f.resize == 1), 'data.folder.resize', f.resize,
       "the stored images' side over data.image_size: >= 1, and 1 with augment 'crop_flip'")
  need(f.class_depth >= 0, 'data.folder.class_depth', f.class_depth,
       "must be >= 0: 0 each image's own folder is its class, k its first k folders")
  need(f.test_per_class >= 0 and not (f.test_per_class and f.test), 'data.folder.test_per_class', f.test_per_class,
       f'>= 0, and 0 where data.folder.test is set (is {f.test!r}): the test images come one way')
  need(f.split_by in folder_lib.SPLIT_BY, 'data.folder.split_by', f.split_by, f'allowed: {folder_lib.SPLIT_BY}')


def check_data_folder(c: ml_collections.ConfigDict) -> None:
  """Raises ValueError where the config's source reads a data folder that is unset or missing."""
  help_text = sources.how_to_get(c)
  if help_text and not sources.data_dir(c):
    raise ValueError(f'data.source={c.data.source!r} needs a data folder: set F2M_DATA_DIR or '
                     '--config.data.data_dir' + (f'.\n{help_text}' if help_text else ''))
  if sources.data_dir(c) and not os.path.isdir(sources.data_dir(c)):
    raise ValueError(f'data folder {sources.data_dir(c)!r} (data.data_dir or F2M_DATA_DIR) does not exist'
                     + (f'.\n{help_text}' if help_text else ''))
  pretrained = os.path.expanduser(os.path.expandvars(c.model.pretrained))
  need(not pretrained or os.path.isfile(pretrained), 'model.pretrained', c.model.pretrained,
       f"no such file{f' ({pretrained})' if pretrained != c.model.pretrained else ''}: the path of a torchvision "
       "ResNet-18 .pth file (docs/data.md), or '' for a random init")


def check_benchmark(exp: Experiment) -> None:
  """The limits the data sets, checked before anything is written: the base session's first batch and the
  first run's shots of every session, drawn as the run draws them. Raises ValueError naming the value."""
  c = exp.config
  exp.batch_indices(0)
  for session in range(2, exp.bench.num_sessions + 1):
    protocol_lib.session_shots(exp.bench, c.data.protocol, 0, session, c.data.shots, c.seed)
