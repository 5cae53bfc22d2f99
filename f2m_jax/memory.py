"""A run's memory, estimated from its config before anything is read or written: sizes that cannot
fit are refused, naming the field, the estimate and the memory available; sizes the estimate is
unsure about get a warning.

The estimate, in bytes (uint8 images: 1 a pixel channel; float32: 4 a value):
  on the host
    images       the decoded training and test images, uint8 (generated data and CIFAR-100 only:
                 other datasets' image counts are known only once their lists are read)
    generation   generated data are rendered in float64: about 3 values a pixel channel of a split
    eval batch   every eval batch is padded on the host to eval.batch_size images, uint8
  on each device (on a CPU the host's memory again)
    train images the training images, placed on every device for base training
    parameters   params and momentum, x members; gradients, the update and a saved copy: 3 more
    base step    what the backward keeps: about 3 values (convolution, BatchNorm, ReLU) a value of
                 every convolution's output, per image of the batch on the device, for the clean pass
                 and each of the M noisy ones, x members
    eval batch   a forward pass of eval.batch_size images: every convolution's output once
The images, the generation, the eval batch's uint8 copy, the train images and params with momentum
are allocated as counted; the rest depends on what XLA fuses, keeps and frees, so it may be a few
times lower. A size is refused when the counted part plus the rest divided by UNCERTAINTY exceeds
the memory available, and warned about when the whole estimate does.
"""
from __future__ import annotations

import functools
import math
import sys
from typing import Optional

import jax
import ml_collections

from f2m_jax import backend
from f2m_jax.models import ResNet, build_model

UNCERTAINTY = 4  # how much lower than estimated what XLA allocates may be
IMAGE_SIZES = {'cifar100': 32, 'mini_imagenet': 84, 'cub200': 224}  # a dataset's network input
CIFAR100_IMAGES = (50_000, 10_000)  # training and test images, every protocol and split at most
GIB = 2 ** 30


def network_size(model: ResNet, image_size: int) -> tuple:
  """(parameters, output values per image summed over every convolution) of `model` on
  `image_size` px inputs, from its stages alone."""
  stem = model.stem_width or model.widths[0]
  size = image_size if model.stem == 'cifar' else math.ceil(image_size / 2)
  params, values, channels = (9 if model.stem == 'cifar' else 49) * 3 * stem + 2 * stem, size * size * stem, stem
  size = size if model.stem == 'cifar' else math.ceil(size / 2)  # the max-pool
  for i, (blocks, width) in enumerate(zip(model.stage_sizes, model.widths)):
    for j in range(blocks):
      stride = 2 if (j == 0 and i > 0) else 1
      size = math.ceil(size / stride)
      shortcut = stride != 1 or channels != width
      params += 9 * channels * width + 9 * width * width + 4 * width + shortcut * (channels * width + 2 * width)
      values += (2 + shortcut) * size * size * width
      channels = width
  return params + (channels + 1) * model.num_classes, values


def _images(config: ml_collections.ConfigDict) -> Optional[tuple]:
  """(training images, test images, image size, field that sets their number), or None where the
  number is not known before the data are read."""
  d = config.data
  if d.source == 'synthetic':
    s = d.synthetic
    classes = s.num_base + s.way * (s.num_sessions - 1)
    field = 'data.synthetic.' + ('train_per_class' if s.train_per_class >= s.test_per_class else 'test_per_class')
    return classes * s.train_per_class, classes * s.test_per_class, s.image_size, field
  if d.dataset == 'cifar100' and d.source in ('tfds', 'trainsplit'):
    return (*CIFAR100_IMAGES, 32, 'data.dataset')
  return None


def estimate(config: ml_collections.ConfigDict, num_devices: int = 1) -> list:
  """[(what, where, field, bytes, counted)]: the parts of the module docstring's estimate for
  `config` (effective: presets applied) on `num_devices` devices; `counted`: allocated as counted."""
  c = config
  images = _images(c)
  size = images[2] if images else (c.data.synthetic.image_size if c.data.source == 'synthetic' else
                                   int(c.data.get('image_size', 0) or IMAGE_SIZES.get(c.data.dataset, 32)))
  classes = c.data.synthetic.num_base if c.data.source == 'synthetic' else 100
  model = build_model(c.model.arch, classes, c.model.width or None)
  params, values = network_size(model, size)
  members = max(1, len(c.members.seeds or c.members.field_values))
  batch = c.base.ways * c.base.shots if c.base.sampler == 'balanced' else c.base.batch_size
  passes = 1 + (c.noise.M if c.noise.enabled else 0)
  batch_field = 'base.ways' if c.base.sampler == 'balanced' else 'base.batch_size'
  member_field = 'members.seeds' if c.members.seeds else 'members.field_values'
  step_field = max([('noise.M', passes), (batch_field, batch), (member_field, members)], key=lambda f: f[1])[0]
  pixels = 3 * size * size
  parts = [('eval batch', 'host', 'eval.batch_size', c.eval.batch_size * pixels, True),
           ('parameters', 'device', 'model.width', 2 * 4 * params * members, True),
           ('gradients and copies', 'device', 'model.width', 3 * 4 * params * members, False),
           ('base step', 'device', step_field, 3 * 4 * values * passes * math.ceil(batch / num_devices) * members, False),
           ('eval batch', 'device', 'eval.batch_size', 4 * (values + pixels) * c.eval.batch_size, False)]
  if images:
    train, test, _, field = images
    parts += [('images', 'host', field, (train + test) * pixels, True),
              ('train images', 'device', field, train * pixels, True)]
    if c.data.source == 'synthetic':
      parts.append(('generation', 'host', field, 3 * 8 * max(train, test) * pixels, True))
  return parts


def verdict(parts: list, host: int, device: Optional[int]) -> tuple:
  """('refuse' | 'warn' | 'fits', the field to name, what the estimate says) for the `estimate` parts
  against `host` bytes available and `device` bytes per device (None on a CPU, whose devices are the
  host's memory)."""
  found = []
  for pool, available in [('host', host)] + ([] if device is None else [('device', device)]):
    mine = [p for p in parts if device is None or p[1] == pool]
    counted, total = sum(p[3] for p in mine if p[4]), sum(p[3] for p in mine)
    kind = ('refuse' if counted + (total - counted) / UNCERTAINTY > available else
            'warn' if total > available else None)
    if kind:
      found.append((kind == 'warn', kind, max(mine, key=lambda p: p[3]), pool, total, available))
  if not found:
    return 'fits', '', ''
  _, kind, (what, _, field, size, _), pool, total, available = min(found, key=lambda f: f[0])  # a refusal first
  on = 'this machine' if device is None else ('each device' if pool == 'device' else 'the host')
  return kind, field, (f'the run needs about {_human(total)} on {on} ({what}: {_human(size)}), and '
                       f'{_human(available)} is available (the estimate: f2m_jax/memory.py)')


def available() -> tuple:
  """(bytes the host has available, bytes each device has or None: backend.available_memory)."""
  return backend.available_memory()


def check(config: ml_collections.ConfigDict) -> None:
  """A ValueError naming the field where the run cannot fit in this machine's memory; a warning on
  stderr where it may not."""
  host, device = available()
  kind, field, text = verdict(estimate(config, jax.local_device_count()), host, device)
  if kind == 'fits':
    return
  value = functools.reduce(lambda node, key: node[key], field.split('.'), config)
  if kind == 'refuse':
    raise ValueError(f'{field}={value!r} is invalid: {text}')
  _warn(f'warning: {field}={value!r} may not fit in memory: {text}')


@functools.lru_cache(maxsize=None)
def _warn(line: str) -> None:
  """Each warning once per process (a sweep checks each member and the sweep)."""
  print(line, file=sys.stderr, flush=True)


def _human(size: float) -> str:
  for unit in ('B', 'KiB', 'MiB', 'GiB', 'TiB'):
    if size < 1024 or unit == 'TiB':
      return f'{size:.1f} {unit}'
    size /= 1024
