"""The validation protocol (`data.protocol='validation'`; docs/data.md): a benchmark made of the base
classes' training images only."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from f2m_jax.data.augment import eval_view
from f2m_jax.data.types import Benchmark, Split

HOLDOUT = 0.2  # the share of each base class's training images held out as its test images


def novel_sessions(benchmark: Benchmark) -> int:
  """S: pseudo-novel sessions of the real protocol's way that keep its share of novel classes."""
  way = len(benchmark.session_classes[1])
  total = benchmark.num_seen_classes(benchmark.num_sessions)
  share = (total - benchmark.num_base_classes) / total
  return max(1, round(benchmark.num_base_classes * share / way))


def roles(benchmark: Benchmark) -> dict:
  """Indices into benchmark.train of 'base_train', 'shot_pool' and 'test' (held-out images of every base
  class), and the class layout 'session_classes'."""
  labels = benchmark.train.labels
  train, test = [], []
  for c in benchmark.session_classes[0]:
    members = np.sort(benchmark.base_train[labels[benchmark.base_train] == c])
    held = math.ceil(HOLDOUT * len(members))
    train.append(members[:len(members) - held])
    test.append(members[len(members) - held:])
  way = len(benchmark.session_classes[1])
  base_classes = list(benchmark.session_classes[0])
  num_novel = way * novel_sessions(benchmark)
  if num_novel >= len(base_classes):
    raise ValueError(f'{len(base_classes)} base classes are too few for a validation protocol of '
                     f'{num_novel} pseudo-novel classes')
  pseudo_base = base_classes[:len(base_classes) - num_novel]
  novel = base_classes[len(pseudo_base):]
  sessions = (tuple(pseudo_base),) + tuple(tuple(novel[i:i + way]) for i in range(0, num_novel, way))
  train_all = np.concatenate(train)
  is_base = np.isin(labels[train_all], pseudo_base)
  return {'base_train': train_all[is_base], 'shot_pool': train_all[~is_base], 'test': np.concatenate(test),
          'session_classes': sessions}


def validation_benchmark(benchmark: Benchmark) -> Benchmark:
  """The validation protocol's benchmark; its test images are held-out training images, stored as the
  test transform sees them."""
  r = roles(benchmark)
  train = benchmark.train
  images = eval_view(train.images[r['test']], benchmark.image_size)
  return dataclasses.replace(
      benchmark, name=f'{benchmark.name}_validation', test=Split(np.ascontiguousarray(images), train.labels[r['test']]),
      base_train=r['base_train'], session_classes=r['session_classes'], shot_pool=r['shot_pool'], topic_shots=None)
