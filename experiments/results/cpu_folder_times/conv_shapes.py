"""One 3x3 convolution of each stage's shape, forward and backward (the model's own conv2d, its CPU
backward forms) against the same convolution as an im2col matmul, jitted, medians of 30 on this machine:
configs/folder.py:cpu's ResNet-18 (width 16, 32 px, batch 64: layers 1-4 at 8, 4, 2 and 1 pixels) and
the stage ResNet-20's noise set lives in on CIFAR-100 (64 channels at 8 pixels, batch 256). Every shape
here is about the same number of FLOPs a batch but the last two of ResNet-18 (its noise set).

  python experiments/results/cpu_folder_times/conv_shapes.py
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..', '..'))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from f2m_jax.models import resnet  # noqa: E402

PAD = ((1, 1), (1, 1))


def median_ms(fn, *args, n=30):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)


def model_conv(x, w):
  return resnet.conv2d(x, w, jnp.zeros_like(w), (1, 1), PAD, jnp.float32, 'cpu')


def im2col(x, w):
  n, h, wd, c = x.shape
  xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  cols = jnp.concatenate([xp[:, i:i + h, j:j + wd, :] for i in range(3) for j in range(3)], -1)
  return (cols.reshape(n * h * wd, 9 * c) @ w.reshape(9 * c, -1)).reshape(n, h, wd, -1)


rng = np.random.default_rng(0)
print(f'{"shape (batch x side x side x channels)":<40} {"MFLOP":>6} {"conv fwd":>9} {"conv bwd":>9} '
      f'{"im2col fwd":>10} {"im2col bwd":>10}  (ms)')
for name, (n, side, c) in [('ResNet-18 layer1', (64, 8, 16)), ('ResNet-18 layer2', (64, 4, 32)),
                           ('ResNet-18 layer3 (noised)', (64, 2, 64)), ('ResNet-18 layer4 (noised)', (64, 1, 128)),
                           ('ResNet-20 stage 3 (noised)', (256, 8, 64))]:
  x = jnp.asarray(rng.normal(size=(n, side, side, c)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(3, 3, c, c)) * 0.05, jnp.float32)
  row = []
  for f in (model_conv, im2col):
    row.append(median_ms(jax.jit(f), x, w))
    row.append(median_ms(jax.jit(jax.grad(lambda x, w, f=f: jnp.sum(f(x, w) ** 2), argnums=(0, 1))), x, w))
  print(f'{name + f" {n}x{side}x{side}x{c}":<40} {2 * n * side * side * 9 * c * c / 1e6:>6.0f} {row[0]:>9.2f} '
        f'{row[1]:>9.2f} {row[2]:>10.2f} {row[3]:>10.2f}')
