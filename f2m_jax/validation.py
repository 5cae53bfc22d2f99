"""The config's shared fields, checked before anything is written (each method checks its own section
with `need`)."""
from __future__ import annotations

import os

import ml_collections

from f2m_jax import base as base_lib
from f2m_jax import noise as noise_lib
from f2m_jax import incremental as incremental_lib
from f2m_jax import objectives
from f2m_jax.data import cifar100
from f2m_jax.data import folder as folder_lib
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.data import sources
from f2m_jax.experiment import Experiment
from f2m_jax.models import ARCHS, HEADS

SAMPLERS = ('task_epochs', 'balanced', 'shuffle')
BACKWARD_WEIGHTS = ('noisy', 'clean')


def need(ok: bool, field: str, value, allowed: str) -> None:
  """Raises ValueError('<field>=<value> is invalid: <allowed>') unless `ok`."""
  if not ok:
    raise ValueError(f'{field}={value!r} is invalid: {allowed}')


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming the field, its value and what is allowed (the fields every method
  reads; a method's own section is its `Method.validate`'s)."""
  validate_noise(c)
  validate_base(c)
  validate_incremental(c)
  validate_data(c)
  need(c.runs >= 1, 'runs', c.runs, 'must be >= 1')
  need(c.eval.batch_size >= 1, 'eval.batch_size', c.eval.batch_size, 'must be >= 1')
  for name, section in c.items():  # every optimizer's settings: base, incremental, each method's section
    if isinstance(section, ml_collections.ConfigDict) and 'momentum' in section:
      need(0 <= section.momentum < 1, f'{name}.momentum', section.momentum, 'must be in [0, 1)')
    if isinstance(section, ml_collections.ConfigDict) and 'weight_decay' in section:
      need(section.weight_decay >= 0, f'{name}.weight_decay', section.weight_decay, 'must be >= 0')
  validate_model(c)
  need(c.members.map in base_lib.MEMBER_MAPS, 'members.map', c.members.map, f'allowed: {base_lib.MEMBER_MAPS}')


def validate_model(c: ml_collections.ConfigDict) -> None:
  """Every model.* field (model.pretrained's file: `check_data_folder`)."""
  m = c.model
  need(m.arch in ARCHS, 'model.arch', m.arch, f'allowed: {tuple(ARCHS)}')
  need(isinstance(m.width, int) and not isinstance(m.width, bool) and m.width >= 0, 'model.width', m.width,
       "an integer >= 1, or 0 for the architecture's standard width")
  need(m.dtype in ('float32', 'bfloat16'), 'model.dtype', m.dtype, "'float32' or 'bfloat16'")
  need(m.head in HEADS, 'model.head', m.head, f'allowed: {HEADS}')
  need(m.conv_backward in ('xla', 'cpu'), 'model.conv_backward', m.conv_backward, "'xla', 'cpu' or 'auto'")
  need(isinstance(m.pretrained, str), 'model.pretrained', m.pretrained, "a .pth file's path, or ''")


def validate_noise(c: ml_collections.ConfigDict) -> None:
  need(c.noise.M >= 1, 'noise.M', c.noise.M, 'must be >= 1')
  need(c.noise.bound >= 0, 'noise.bound', c.noise.bound, 'must be >= 0')
  need(c.noise.distribution in noise_lib.DISTRIBUTIONS, 'noise.distribution', c.noise.distribution,
       f'allowed: {noise_lib.DISTRIBUTIONS}')
  need(c.noise.backward_weights in BACKWARD_WEIGHTS, 'noise.backward_weights', c.noise.backward_weights,
       f'allowed: {BACKWARD_WEIGHTS}')
  need(c.noise.bn_updates in base_lib.BN_UPDATES, 'noise.bn_updates', c.noise.bn_updates,
       f'allowed: {base_lib.BN_UPDATES}')
  need(c.noise.pf_weight >= 0 and c.noise.std_weight >= 0, 'noise.pf_weight/std_weight',
       (c.noise.pf_weight, c.noise.std_weight), 'must be >= 0')
  need_term_weight(c, 'clean_ce_weight')


def need_term_weight(c: ml_collections.ConfigDict, name: str) -> None:
  """The weight noise.<name> of a term of the noisy passes' loss (`base.loss_terms`): >= 0, and 0 where
  noise is off, whose loss is the clean pass's CE alone (the term would be silently left out)."""
  value, field = c.noise[name], f'noise.{name}'
  need(value >= 0, field, value, 'must be >= 0')
  need(not value or c.noise.enabled, field, value, f'a term of the noisy passes, which method {c.method!r} '
       'runs without (noise.enabled=False): must be 0, or set --config.noise.enabled=True')


def validate_base(c: ml_collections.ConfigDict) -> None:
  need(c.base.steps >= 1, 'base.steps', c.base.steps, 'must be >= 1')
  need(c.base.batch_size >= 1, 'base.batch_size', c.base.batch_size, 'must be >= 1')
  need(c.base.log_every >= 1, 'base.log_every', c.base.log_every, 'must be >= 1')
  need(c.base.sampler in SAMPLERS, 'base.sampler', c.base.sampler, f'allowed: {SAMPLERS}')
  need(c.base.select_every >= 1, 'base.select_every', c.base.select_every, 'must be >= 1')
  need(c.base.ways >= 1, 'base.ways', c.base.ways, 'must be >= 1 (classes per batch)')
  need(c.base.shots >= 0, 'base.shots', c.base.shots, 'must be >= 0 (0: base.batch_size / base.ways)')
  need(c.base.lr > 0, 'base.lr', c.base.lr, 'must be > 0')
  need(all(isinstance(m, int) and not isinstance(m, bool) for m in c.base.milestones), 'base.milestones',
       tuple(c.base.milestones), 'a tuple of step numbers such as (15000,)')
  need(c.base.steps_per_call >= 1, 'base.steps_per_call', c.base.steps_per_call, 'must be >= 1')
  need(c.base.checkpoint_every >= 1, 'base.checkpoint_every', c.base.checkpoint_every, 'must be >= 1')


def validate_incremental(c: ml_collections.ConfigDict) -> None:
  need(c.incremental.trainable in ('noise_set', 'all'), 'incremental.trainable', c.incremental.trainable,
       "'noise_set' or 'all'")
  need(c.incremental.steps >= 0, 'incremental.steps', c.incremental.steps, 'must be >= 0')
  need(c.incremental.lr > 0, 'incremental.lr', c.incremental.lr, 'must be > 0')
  need(not c.incremental.round_steps or c.noise.bound > 0, 'incremental.round_steps', c.incremental.round_steps,
       f'rounds steps to multiples of noise.bound/2, so it needs noise.bound > 0 (is {c.noise.bound})')
  need(c.incremental.prototype_norm in incremental_lib.PROTOTYPE_NORMS, 'incremental.prototype_norm',
       c.incremental.prototype_norm, f'allowed: {incremental_lib.PROTOTYPE_NORMS}')
  need(c.incremental.distance in objectives.DISTANCES, 'incremental.distance', c.incremental.distance,
       f'allowed: {objectives.DISTANCES}')


def validate_data(c: ml_collections.ConfigDict) -> None:
  """The data section's fields (the folder source's data.folder fields: `validate_folder`)."""
  d = c.data
  need(d.protocol in protocol_lib.PROTOCOLS, 'data.protocol', d.protocol, f'allowed: {protocol_lib.PROTOCOLS}')
  need(d.source in sources.SOURCES, 'data.source', d.source, f'allowed: {sources.SOURCES}')
  need(d.shots >= 1, 'data.shots', d.shots, 'must be >= 1')
  if d.source == 'synthetic':
    need(min(d.synthetic.train_per_class, d.synthetic.test_per_class) >= 1, 'data.synthetic', dict(d.synthetic),
         'train_per_class and test_per_class must be >= 1')
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


def validate_folder(d: ml_collections.ConfigDict) -> None:
  """The folder source's fields (f2m_jax/data/folder.py; the files themselves are checked when read)."""
  f = d.folder
  need(bool(f.train) or d.source == 'fake_folder', 'data.folder.train', f.train,
       'a folder with one subfolder of images per class, or a CSV of path,label[,split]')
  need(f.num_base >= 0, 'data.folder.num_base', f.num_base, 'must be >= 0 (0: every class no later session takes)')
  need(f.way >= 1, 'data.folder.way', f.way, 'must be >= 1: the classes each later session brings')
  need(f.num_sessions >= 2, 'data.folder.num_sessions', f.num_sessions, 'must be >= 2: the base session and more')
  need(d.get('image_size', 0) >= 8, 'data.image_size', d.get('image_size'), 'must be >= 8 (pixels)')
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
  if sources.needs_data_dir(c) and not sources.data_dir(c):
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
