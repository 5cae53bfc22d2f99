"""The validation protocol (`data.protocol='validation'`): an incremental few-shot benchmark made of
the base classes' training images only, to choose settings without reading a test image.

From any benchmark (CIFAR-100 through TFDS or `trainsplit`, miniImageNet, CUB-200):
  - of each base class's training images (`base_train`, in index order) the last HOLDOUT (20%,
    rounded up) are held out as that class's test images; the rest are its training images;
  - the base classes split into pseudo-base and pseudo-novel classes in the class order: the last
    `way` x S classes are pseudo-novel, S the number of sessions that keeps the real protocol's share
    of novel classes (rounded to whole sessions, at least one): CIFAR-100 and miniImageNet 35 + 5 x 5
    (60 base classes), CUB-200 50 + 5 x 10 (100);
  - session 1 trains on the pseudo-base classes' training images; each later session brings `way`
    pseudo-novel classes whose shots are drawn, run by run, from their training images (as the
    `draws` protocol); after every session the test set is the held-out images of all classes seen.

No image of the real novel classes and no real test image is used; the roles (pseudo-base training,
pseudo-novel shot pool, held-out test images) are disjoint (tests/test_protocol.py). Class ids are
unchanged (the pseudo-base classes are the first ids), so a label is still its prototype's row.
"""
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
  """Indices into benchmark.train of each role: 'base_train' (pseudo-base training images),
  'shot_pool' (pseudo-novel training images), 'test' (held-out images of every base class), and the
  class layout 'session_classes'."""
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
  """The validation protocol's benchmark (module docstring). Its test images are held-out training
  images, stored as the test transform sees them (the centre crop where training images are stored
  larger)."""
  r = roles(benchmark)
  train = benchmark.train
  images = eval_view(train.images[r['test']], benchmark.image_size)
  return dataclasses.replace(
      benchmark, name=f'{benchmark.name}_validation', test=Split(np.ascontiguousarray(images), train.labels[r['test']]),
      base_train=r['base_train'], session_classes=r['session_classes'], shot_pool=r['shot_pool'], topic_shots=None)
