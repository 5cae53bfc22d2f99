"""A generated benchmark for tests and smoke runs: each class a coloured sinusoidal grating, learnable in
seconds on a CPU, a deterministic function of the seed; never a fallback."""
from __future__ import annotations

import numpy as np

from f2m_jax.data.types import Benchmark, Split, sessions_from_counts


def _render(rng: np.random.Generator, num_classes: int, labels: np.ndarray, size: int, noise: float,
            class_rng_seed: int) -> np.ndarray:
  """Class c is a sinusoidal grating with its own orientation, frequency and colour, at a random
  phase per image (so position carries no label), plus Gaussian pixel noise."""
  crng = np.random.default_rng(class_rng_seed)
  angle = crng.uniform(0, np.pi, num_classes)
  freq = crng.uniform(1.0, 4.0, num_classes)
  colour = crng.uniform(-1.0, 1.0, (num_classes, 3))
  yy, xx = np.meshgrid(np.arange(size), np.arange(size), indexing='ij')
  phase = rng.uniform(0, 2 * np.pi, len(labels))
  proj = (np.cos(angle)[labels, None, None] * xx + np.sin(angle)[labels, None, None] * yy) / size
  wave = np.sin(2 * np.pi * freq[labels, None, None] * proj + phase[:, None, None])
  images = 0.5 + 0.25 * wave[..., None] * colour[labels, None, None, :]
  images += rng.normal(0.0, noise, images.shape)
  return np.clip(images * 255.0, 0, 255).astype(np.uint8)


def make_synthetic(seed: int = 0, num_base: int = 60, way: int = 5, num_sessions: int = 9,
                   train_per_class: int = 40, test_per_class: int = 20, image_size: int = 32,
                   noise: float = 0.15) -> Benchmark:
  """A `Benchmark` with `num_base + way * (num_sessions - 1)` classes of generated images."""
  if num_base < 1 or way < 1 or num_sessions < 1:
    raise ValueError(f'synthetic sizes must be positive, got base={num_base} way={way} sessions={num_sessions}')
  num_classes = num_base + way * (num_sessions - 1)
  rng = np.random.default_rng([seed, 1])
  train_labels = np.repeat(np.arange(num_classes, dtype=np.int32), train_per_class)
  test_labels = np.repeat(np.arange(num_classes, dtype=np.int32), test_per_class)
  train = Split(_render(rng, num_classes, train_labels, image_size, noise, seed), train_labels)
  test = Split(_render(rng, num_classes, test_labels, image_size, noise, seed), test_labels)
  return Benchmark(
      name='synthetic', train=train, test=test, base_train=np.flatnonzero(train_labels < num_base),
      session_classes=sessions_from_counts(num_base, way, num_sessions),
      shot_pool=np.arange(len(train_labels)), topic_shots=None, image_size=image_size,
      mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), augment='crop_flip')
