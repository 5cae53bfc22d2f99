"""The config's shared fields, checked before anything is written (each method checks its own
section with `need`)."""
import os

from flax import traverse_util

from f2m_jax import base as base_lib
from f2m_jax import incremental as incremental_lib
from f2m_jax import noise as noise_lib
from f2m_jax import objectives
from f2m_jax.data import cifar100
from f2m_jax.data import folder as folder_lib
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.data import sources
from f2m_jax.models import ARCHS, HEADS

# Every field with a set of allowed values, and every number with its least value (one more rule
# each below). data.folder: 'num_base' 0 takes every class no later session takes, 'class_depth' 0
# makes each image's own folder its class (k: its first k folders).
CHOICES = {'noise.distribution': noise_lib.DISTRIBUTIONS,
           'noise.backward_weights': ('noisy', 'clean'), 'noise.bn_updates': base_lib.BN_UPDATES,
           'base.sampler': ('task_epochs', 'balanced', 'shuffle'),
           'incremental.trainable': ('noise_set', 'all'),
           'incremental.prototype_norm': incremental_lib.PROTOTYPE_NORMS,
           'incremental.distance': objectives.DISTANCES, 'data.protocol': protocol_lib.PROTOCOLS,
           'data.source': sources.SOURCES, 'model.arch': tuple(ARCHS),
           'model.dtype': ('float32', 'bfloat16'), 'model.head': HEADS,
           'members.map': base_lib.MEMBER_MAPS, 'data.folder.augment': folder_lib.AUGMENTS,
           'data.folder.split_by': folder_lib.SPLIT_BY}  # conv_backward, draw_map: run/backend.py
LEAST = {'runs': 1, 'seed': 0, 'eval.batch_size': 1, 'noise.M': 1, 'noise.bound': 0,
         'noise.pf_weight': 0, 'noise.std_weight': 0, 'base.steps': 1, 'base.batch_size': 1,
         'base.ways': 1, 'base.shots': 0, 'base.log_every': 1, 'base.select_every': 1,
         'base.steps_per_call': 1, 'base.checkpoint_every': 1, 'incremental.steps': 0,
         'data.shots': 1,
         **{f'data.synthetic.{k}': 1
            for k in ('num_base', 'way', 'num_sessions', 'train_per_class', 'test_per_class')},
         'data.synthetic.image_size': 8, 'data.synthetic.seed': 0, 'bench.warmup': 0,
         'bench.iters': 1, 'bench.batch': 0, 'flatness.num_draws': 1, 'flatness.chunk': 1,
         'flatness.max_images': 0, 'data.image_size': 8, 'data.folder.num_base': 0,
         'data.folder.way': 1, 'data.folder.num_sessions': 2, 'data.folder.class_depth': 0,
         'data.folder.split_seed': 0}
# Every number's bound (of its magnitude, in bits) from what the code can hold: step counts, sizes
# and indices are int32 on the devices (31); a seed is the PRNG key's 32 bits (jax.random.key keeps
# a larger seed's low 32: seed 2^32 would train as seed 0); each run keeps its sessions x sessions
# accuracies to the end (in memory, then results.json) and its sessions' checkpoints in a folder of
# its own. A sweep's values (members.field_values) are checked as each member's config.
MOST = {'seed': 32, 'runs': 20, 'data.synthetic.num_sessions': 10, 'data.folder.num_sessions': 10,
        'members.seeds': 32, 'members.field_values': 64}
# Every optimizer's settings, in any section (base, incremental, each method's).
OPTIMIZER = {'momentum': (lambda v: 0 <= v < 1, 'must be in [0, 1)'),
             'lr': (lambda v: v > 0, 'must be > 0'),
             'weight_decay': (lambda v: v >= 0, 'must be >= 0'),
             'lr_gamma': (lambda v: v > 0,
                          'must be > 0 (the rate is multiplied by it at each milestone)')}


def need(ok, field, value, allowed):
  """Raises ValueError('<field>=<value> is invalid: <allowed>') unless `ok`."""
  if not ok:
    raise ValueError(f'{field}={value!r} is invalid: {allowed}')


def validate(c):
  """Raises ValueError naming the field, its value and what is allowed: every field of
  configs/common.py (a method's own section: also its `Method.validate`)."""
  fields = traverse_util.flatten_dict(c.to_dict(), sep='.')
  for field, allowed in CHOICES.items():
    need(fields.get(field, allowed[0]) in allowed, field, fields.get(field), f'allowed: {allowed}')
  for field, least in LEAST.items():
    need(fields.get(field, least) >= least, field, fields.get(field), f'must be >= {least}')
  for field, value in fields.items():
    ok, allowed = OPTIMIZER.get(field.rpartition('.')[2], (lambda v: True, ''))
    need(ok(value), field, value, allowed)
    bits = MOST.get(field, 31)
    for v in value if isinstance(value, tuple) else [value]:
      need(not isinstance(v, (int, float)) or abs(v) < 2 ** bits, field, value,
           f'must be finite, of magnitude < 2^{bits} = {2 ** bits:,}')
  need(all(type(m) is int for m in c.base.milestones), 'base.milestones',
       c.base.milestones, 'a tuple of step numbers such as (15000,)')
  need(not c.incremental.round_steps or c.noise.bound > 0, 'incremental.round_steps',
       c.incremental.round_steps,
       f'rounds steps to multiples of noise.bound/2, so it needs noise.bound > 0 '
       f'(is {c.noise.bound})')
  need(type(c.model.width) is int and c.model.width >= 0, 'model.width', c.model.width,
       "an integer >= 1, or 0 for the architecture's standard width")
  need(isinstance(c.model.pretrained, str), 'model.pretrained', c.model.pretrained,
       "a .pth file's path, or ''")
  need(min(c.bench.M_list, default=1) >= 1 and set(c.bench.dtypes) <= {'float32', 'bfloat16'},
       'bench', c.bench.to_dict(), "M_list needs integers >= 1, dtypes 'float32' or 'bfloat16'")
  need_term_weight(c, 'clean_ce_weight')
  d = c.data
  if d.split:
    need(d.split in cifar100.SPLITS, 'data.split', d.split,
         f'allowed: {sorted(cifar100.SPLITS)}, or empty')
    need(d.dataset == 'cifar100' and d.source in ('tfds', 'trainsplit'), 'data.split', d.split,
         "the class splits regroup CIFAR-100's 100 real classes, so they need "
         "data.dataset='cifar100' from data.source 'tfds' or 'trainsplit' (this config: "
         f'{d.dataset!r} from {d.source!r}), e.g. --config configs/cifar100.py:trainsplit '
         f'--config.data.split={d.split}')
    need(d.protocol in ('draws', 'validation'), 'data.protocol', d.protocol,
         "the class splits have no TOPIC lists: use 'draws' (or 'validation')")
  if d.source in ('folder', 'fake_folder') and not sources.uses_layout(c):
    need('folder' in d, 'data.dataset', d.dataset,
         f'the folder source reads the files of {sources.FOLDER_DATASETS}, any other dataset '
         'through the data.folder fields: use --config configs/folder.py')
    validate_folder(d)


def need_term_weight(c, name):
  """The weight noise.<name> of a term of the noisy passes' loss (`base.loss_terms`): >= 0, and 0
  where noise is off, whose loss is the clean pass's CE alone (the term would be silently left
  out)."""
  value, field = c.noise[name], f'noise.{name}'
  need(value >= 0, field, value, 'must be >= 0')
  need(not value or c.noise.enabled, field, value,
       f'a term of the noisy passes, which method {c.method!r} runs without (noise.enabled=False): '
       'must be 0, or set --config.noise.enabled=True')


def validate_folder(d):
  """The folder source's fields (f2m_jax/data/folder.py; the files themselves are checked when
  read)."""
  f = d.folder
  need(bool(f.train) or d.source == 'fake_folder', 'data.folder.train', f.train,
       'a folder with one subfolder of images per class, or a CSV of path,label[,split]')
  need(f.resize >= 1 and (f.augment == 'rrc_flip' or f.resize == 1), 'data.folder.resize', f.resize,
       "the stored images' side over data.image_size: >= 1, and 1 with augment 'crop_flip'")
  need(f.test_per_class >= 0 and not (f.test_per_class and f.test), 'data.folder.test_per_class',
       f.test_per_class,
       f'>= 0, and 0 where data.folder.test is set (is {f.test!r}): the test images come one way')


def check_data_folder(c):
  """Raises ValueError where the config's source reads a data folder that is unset or missing."""
  folder, help_text = sources.data_dir(c), sources.how_to_get(c)
  tail = f'.\n{help_text}' if help_text else ''
  if help_text and not folder:
    raise ValueError(f'data.source={c.data.source!r} needs a data folder: set F2M_DATA_DIR or '
                     f'--config.data.data_dir{tail}')
  if folder and not os.path.isdir(folder):
    raise ValueError(f'data folder {folder!r} (data.data_dir or F2M_DATA_DIR) does not exist{tail}')
  pretrained = os.path.expanduser(os.path.expandvars(c.model.pretrained))
  need(not pretrained or os.path.isfile(pretrained), 'model.pretrained', c.model.pretrained,
       f"no such file{f' ({pretrained})' if pretrained != c.model.pretrained else ''}: the path "
       "of a torchvision ResNet-18 .pth file (docs/data.md), or '' for a random init")


def check_benchmark(exp):
  """The limits the data sets, checked before anything is written: the base session's first batch
  and the first run's shots of every session, drawn as the run draws them. Raises ValueError naming
  the value."""
  c = exp.config
  exp.batch_indices(0)
  for session in range(2, exp.bench.num_sessions + 1):
    protocol_lib.session_shots(exp.bench, c.data.protocol, 0, session, c.data.shots, c.seed)
