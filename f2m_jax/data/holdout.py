"""The validation protocol (`data.protocol='validation'`; docs/data.md): a benchmark made of the
base classes' training images only."""
import dataclasses
import math

import numpy as np

from f2m_jax.data.augment import eval_view
from f2m_jax.data.types import Split, sessions_from_counts

HOLDOUT = 0.2  # the share of each base class's training images held out as its test images


def roles(benchmark):
  """Indices into benchmark.train of 'base_train', 'shot_pool' and 'test' (held-out images of
  every base class), and the class layout 'session_classes' (the last base classes as the
  pseudo-novel ones): S pseudo-novel sessions of the real protocol's way that keep its share
  of novel classes."""
  labels = benchmark.train.labels
  train, test = [], []
  for c in benchmark.session_classes[0]:
    members = np.sort(benchmark.base_train[labels[benchmark.base_train] == c])
    cut = len(members) - math.ceil(HOLDOUT * len(members))
    train.append(members[:cut])
    test.append(members[cut:])
  way, base = len(benchmark.session_classes[1]), benchmark.num_base_classes
  total = benchmark.num_seen_classes(benchmark.num_sessions)
  share = (total - base) / total  # of novel classes
  sessions = max(1, round(base * share / way))
  num_base = base - way * sessions
  if num_base < 1:
    raise ValueError(f'{base} base classes are too few for a validation protocol of '
                     f'{way * sessions} pseudo-novel classes')
  train_all = np.concatenate(train)
  is_base = labels[train_all] < num_base
  return {'base_train': train_all[is_base], 'shot_pool': train_all[~is_base],
          'test': np.concatenate(test),
          'session_classes': sessions_from_counts(num_base, way, sessions + 1)}


def validation_benchmark(benchmark):
  """The validation protocol's benchmark; its test images are held-out training images, stored as
  the test transform sees them."""
  r = roles(benchmark)
  test = r.pop('test')
  images = np.ascontiguousarray(eval_view(benchmark.train.images[test], benchmark.image_size))
  return dataclasses.replace(benchmark, name=f'{benchmark.name}_validation', topic_shots=None,
                             test=Split(images, benchmark.train.labels[test]), **r)
