"""A generated benchmark for tests and smoke runs: each class a coloured sinusoidal grating,
learnable in seconds on a CPU, a deterministic function of the seed; never a fallback. Also
the images of the generated folders (fake_folders.py)."""
import numpy as np

from f2m_jax.data.types import Benchmark, Split, sessions_from_counts


def class_looks(rng, num_classes):
  """Each class's grating: (orientation [C], frequency in periods per image side [C], colour [C,
  3])."""
  return (rng.uniform(0, np.pi, num_classes), rng.uniform(1.0, 4.0, num_classes),
          rng.uniform(-1.0, 1.0, (num_classes, 3)))


def render(rng, looks, labels, shape, amplitude, noise):
  """uint8 images [*labels.shape, H, W, 3]: each its class's grating (`class_looks`) at a random
  phase (so position carries no label), plus Gaussian pixel noise of std `noise` (on the 0..1
  scale)."""
  angle, freq, colour = (x[labels, None, None] for x in looks)
  phase = rng.uniform(0, 2 * np.pi, np.shape(labels))
  yy, xx = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing='ij')
  proj = (np.cos(angle) * xx + np.sin(angle) * yy) / max(shape)
  wave = np.sin(2 * np.pi * freq * proj + phase[..., None, None])
  images = 0.5 + amplitude * wave[..., None] * colour
  return np.clip((images + rng.normal(0.0, noise, images.shape)) * 255.0, 0, 255).astype(np.uint8)


def make_synthetic(seed=0, num_base=60, way=5, num_sessions=9, train_per_class=40,
                   test_per_class=20, image_size=32, noise=0.15):
  """A `Benchmark` with `num_base + way * (num_sessions - 1)` classes of generated images."""
  if num_base < 1 or way < 1 or num_sessions < 1:
    raise ValueError(f'synthetic sizes must be positive, got base={num_base} way={way} '
                     f'sessions={num_sessions}')
  num_classes = num_base + way * (num_sessions - 1)
  rng = np.random.default_rng([seed, 1])
  looks = class_looks(np.random.default_rng(seed), num_classes)
  labels = [np.repeat(np.arange(num_classes, dtype=np.int32), n)
            for n in (train_per_class, test_per_class)]
  # train, then test: one stream of draws
  train, test = (Split(render(rng, looks, y, (image_size,) * 2, 0.25, noise), y) for y in labels)
  return Benchmark(
      name='synthetic', train=train, test=test, base_train=np.flatnonzero(train.labels < num_base),
      session_classes=sessions_from_counts(num_base, way, num_sessions),
      shot_pool=np.arange(len(train)), topic_shots=None, image_size=image_size,
      mean=(0.5,) * 3, std=(0.25,) * 3, augment='crop_flip')
