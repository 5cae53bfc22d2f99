"""A run's peak memory, estimated from its config before anything is read or written: a run whose
estimate exceeds this machine's total memory is refused, naming the field to lower; one whose estimate
exceeds what is free now is warned about; config.memory_check=False skips both.

The estimate counts arrays and multiplies them by factors in bytes, the largest that whole runs on a CPU
needed (experiments/results/README.md, "Peak memory against the estimate"). Held throughout: the runtime
(JAX, XLA, compiling: RUNTIME), PARAMS a parameter per member, and the decoded images, 1 a pixel channel,
with the training images again on the devices (CIFAR-100 and generated data; other datasets' sizes are
known once read). Then the largest of three phases: generating synthetic images in float64 (GENERATION a
pixel channel of the larger split), the base step (STEP a value of every convolution's output per image of
the batch, per pass: the clean one and noise.M noisy ones, per member) and the evaluation (EVAL a value of
every convolution's output per image of eval.batch_size). On a GPU the parameters, the devices' images and
the last two phases count against each device's memory, with the CPU's factors (not measured there).
"""
from __future__ import annotations

import functools
import math
import sys

import jax
import jax.numpy as jnp
import ml_collections

from f2m_jax.models import ResNet, build_model
from f2m_jax.models.resnet import Conv
from f2m_jax.run import backend

RUNTIME, PARAMS, GENERATION, STEP, EVAL = 2 ** 30, 60, 30, 8, 2.3
PHASES = ('generation', 'base step', 'evaluation')
CIFAR100_IMAGES = (50_000, 10_000)  # training and test images, every protocol and split at most


def network_size(model: ResNet, image_size: int) -> tuple:
  """(parameters, values of every convolution's output for one image) of `model` at `image_size` px."""
  x = jax.ShapeDtypeStruct((1, image_size, image_size, 3), jnp.float32)
  _, v = jax.eval_shape(lambda x: model.init_with_output(
      jax.random.key(0), x, train=True, capture_intermediates=lambda m, _: isinstance(m, Conv)), x)
  return tuple(sum(math.prod(a.shape) for a in jax.tree_util.tree_leaves(v[k])) for k in ('params', 'intermediates'))


def estimate(c: ml_collections.ConfigDict, num_devices: int = 1) -> list:
  """[(what, field to lower, bytes, on the devices)]: the module docstring's parts for the effective
  config `c` on `num_devices` devices."""
  d, s, b, synthetic = c.data, c.data.synthetic, c.base, c.data.source == 'synthetic'
  size = s.image_size if synthetic else d.get('image_size', 32)  # CIFAR-100's 32 px, or data.image_size
  params, values = network_size(build_model(c.model.arch, s.num_base if synthetic else 100, c.model.width or None),
                                size)
  members = max(1, len(c.members.seeds or c.members.field_values))
  batch = math.ceil((b.ways * b.shots if b.sampler == 'balanced' else b.batch_size) / num_devices)
  passes = 1 + (c.noise.M if c.noise.enabled else 0)
  step_field = max([('noise.M', passes), ('base.ways' if b.sampler == 'balanced' else 'base.batch_size', batch),
                    ('members.seeds' if c.members.seeds else 'members.field_values', members)], key=lambda f: f[1])[0]
  parts = [('runtime', '', RUNTIME, False), ('parameters', 'model.width', PARAMS * params * members, True),
           ('base step', step_field, STEP * values * batch * passes * members, True),
           ('evaluation', 'eval.batch_size', EVAL * values * c.eval.batch_size, True)]
  pixels = 3 * size * size
  if synthetic:
    classes = s.num_base + s.way * (s.num_sessions - 1)
    split = 'train_per_class' if s.train_per_class >= s.test_per_class else 'test_per_class'
    train, test, field = classes * s.train_per_class, classes * s.test_per_class, f'data.synthetic.{split}'
    parts.append(('generation', field, GENERATION * max(train, test) * pixels, False))
  elif d.dataset == 'cifar100' and d.source in ('tfds', 'trainsplit'):
    (train, test), field = CIFAR100_IMAGES, 'data.dataset'
  else:
    return parts
  return parts + [('images', field, (train + test) * pixels, False), ('training images', field, train * pixels, True)]


def needed(parts: list) -> int:
  """Bytes `parts` need at once: every part outside the PHASES, and the largest phase (each is freed when
  it ends)."""
  return sum(p[2] for p in parts if p[0] not in PHASES) + max([p[2] for p in parts if p[0] in PHASES] or [0])


def verdict(parts: list, total: int, free: int, device=None) -> tuple:
  """('refuse' | 'warn' | 'fits', the largest part, bytes needed, bytes there are) of the `estimate` parts on
  a host of `total` bytes, `free` free now, whose devices have `device` bytes each (None on a CPU)."""
  pools = [([p for p in parts if device is None or not p[3]], total, free)]
  pools += [([p for p in parts if p[3]], device, device)] if device is not None else []
  for kind, limit in (('refuse', 1), ('warn', 2)):
    for pool in pools:
      if needed(pool[0]) > pool[limit]:
        return kind, max((p for p in pool[0] if p[1]), key=lambda p: p[2]), needed(pool[0]), pool[limit]
  return 'fits', None, 0, 0


def check(config: ml_collections.ConfigDict) -> None:
  """A ValueError naming the field to lower where the run cannot fit in this machine's memory, a warning
  where it may not fit in what is free now; nothing where config.memory_check is False."""
  if not config.memory_check:
    return
  total, free, device = backend.available_memory()
  kind, part, need, limit = verdict(estimate(config, jax.local_device_count()), total, free, device)
  if kind == 'fits':
    return
  field, what = _named(config, part)
  if kind == 'refuse':
    on = 'this machine' if device is None else 'each device'
    raise ValueError(f'{field} is invalid: the run needs about {_gib(need)} ({what}), more than the {_gib(limit)} {on} '
                     'has (--config.memory_check=False skips this check)')
  _warn(f'warning: {field} may not fit in memory: the run needs about {_gib(need)} ({what}), {_gib(limit)} free now')


def advice(config: ml_collections.ConfigDict) -> str:
  """What an allocation failure says (cli.py): the field of the estimate's largest part, to lower."""
  parts = estimate(config, jax.local_device_count())
  field, what = _named(config, max((p for p in parts if p[1]), key=lambda p: p[2]))
  return f'lower {field}, the largest part of the memory estimate ({what})'


def _named(config: ml_collections.ConfigDict, part) -> tuple:
  """('<field>=<value>', '<what>: <size>; f2m_jax/run/memory.py') of an `estimate` part."""
  value = functools.reduce(lambda node, key: node[key], part[1].split('.'), config)
  return f'{part[1]}={value!r}', f'{part[0]}: {_gib(part[2])}; f2m_jax/run/memory.py'


def _gib(size: float) -> str:
  return f'{size / 2 ** 30:.2f} GiB'


@functools.lru_cache(maxsize=None)
def _warn(line: str) -> None:
  """Each warning once per process (a sweep checks each member and the sweep)."""
  print(line, file=sys.stderr, flush=True)
