"""The in-memory `Benchmark` every data source produces. Class ids are in session order, so a
label is also the row of its prototype."""
import dataclasses
from typing import Optional

import numpy as np


class DataError(ValueError):
  """Data that a source needs is missing or wrong; the message says what to do about it."""


@dataclasses.dataclass(frozen=True)
class Split:
  """Images and labels of one split. Test images are stored already resized/cropped to the final
  size, so the evaluation path only normalises them."""
  images: np.ndarray  # uint8 [N, H, W, 3]
  labels: np.ndarray  # int32 [N]

  def __post_init__(self):
    if self.images.ndim != 4 or self.images.dtype != np.uint8:
      raise ValueError(f'images must be uint8 [N, H, W, C], got {self.images.dtype} '
                       f'{self.images.shape}')
    if self.labels.shape != (self.images.shape[0],):
      raise ValueError(f'labels shape {self.labels.shape} does not match {self.images.shape[0]} '
                       'images')

  def __len__(self):
    return len(self.labels)


@dataclasses.dataclass(frozen=True)
class Benchmark:
  """A dataset laid out for incremental few-shot learning: `train` and `test` images;
  `base_train`, `shot_pool` and `topic_shots` (per session 2..T, or None) index `train`;
  session_classes[0] are the base classes; image_size, mean, std and augment ('crop_flip' or
  'rrc_flip') are the network input's."""
  name: str
  train: Split
  test: Split
  base_train: np.ndarray
  session_classes: tuple
  shot_pool: np.ndarray
  topic_shots: Optional[tuple]
  image_size: int
  mean: tuple
  std: tuple
  augment: str

  @property
  def num_sessions(self):
    return len(self.session_classes)

  @property
  def num_base_classes(self):
    return len(self.session_classes[0])

  def num_seen_classes(self, session):
    """Number of classes seen after `session` (1-based)."""
    return sum(len(c) for c in self.session_classes[:session])


def sessions_from_counts(num_base, way, num_sessions):
  """Class ids per session for a contiguous class order: (0..B-1), (B..B+way-1), ..."""
  ends = [num_base + way * t for t in range(num_sessions)]
  return tuple(tuple(range(start, end)) for start, end in zip([0] + ends, ends))


def check_session_indices(benchmark, indices, session, shots):
  """Raises if `indices` are not exactly `shots` training images of each class of `session`."""
  labels = benchmark.train.labels[indices].tolist()
  want = benchmark.session_classes[session - 1]
  for c in want:
    if labels.count(c) != shots:
      raise ValueError(f'session {session}: class {c} has {labels.count(c)} shots, expected '
                       f'{shots}')
  extra = set(labels) - set(want)
  if extra:
    raise ValueError(f'session {session}: shots of unexpected classes {sorted(extra)}')
