"""What XLA:CPU's convolutions on 2x2 maps cost F2M's step on configs/folder.py:cpu (issue 83): the plain
and F2M base programs (bench.program_case, 10 steps a call, one run) timed in the same rounds as they are,
and with every 3x3 stride-1 convolution on maps of at most 2x2 pixels (ResNet-18's layer3 and layer4 at
32 px) written as an im2col matmul, its gradients the matmul's transposes. The patch changes float
rounding, so it is an experiment, not the model's code.

  python experiments/results/cpu_folder_times/small_convs.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..', '..'))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402

from f2m_jax import sharding  # noqa: E402
from f2m_jax.models import resnet  # noqa: E402
from f2m_jax.run import bench, cli, pipeline  # noqa: E402

conv, grads = resnet._conv, resnet._conv_grads  # pylint: disable=protected-access


def small(x, kernel, strides):
  return x.shape[1] <= 2 and kernel.shape[:2] == (3, 3) and tuple(strides) == (1, 1)


def im2col(x, kernel, strides, padding, dtype):
  if not small(x, kernel, strides):
    return conv(x, kernel, strides, padding, dtype)
  n, h, w, c = x.shape
  xp = jnp.pad(x.astype(dtype), ((0, 0), tuple(padding[0]), tuple(padding[1]), (0, 0)))
  cols = jnp.concatenate([xp[:, i:i + h, j:j + w, :] for i in range(3) for j in range(3)], -1)
  return (cols.reshape(n * h * w, 9 * c) @ kernel.astype(dtype).reshape(9 * c, -1)).reshape(n, h, w, -1)


def im2col_grads(x, kernel, g, strides, padding, dtype, backward):
  if not small(x, kernel, strides):
    return grads(x, kernel, g, strides, padding, dtype, backward)
  gx, = jax.linear_transpose(lambda x_: im2col(x_, kernel, strides, padding, dtype), x)(g)
  gk, = jax.linear_transpose(lambda k_: im2col(x, k_, strides, padding, dtype), kernel)(g)
  return gx, gk


def cases(config, tag):
  exp = bench.bench_experiment(config, 'float32')
  variant = lambda **changes: ml_collections.FrozenConfigDict({**exp.loss, **changes})
  mesh = sharding.data_mesh()
  return [bench.program_case(exp, variant(enabled=False), f'plain{tag}', 0, 1, mesh),
          bench.program_case(exp, variant(), f'f2m_shared{tag}', 2, 1, mesh)]


config = cli.load_config('configs/folder.py:cpu')
config.data.folder.update(train='/unused', num_base=60, way=5, num_sessions=9)
config = pipeline.resolve(config, reads_data=False)
timed = cases(config, '')
resnet._conv, resnet._conv_grads = im2col, im2col_grads  # pylint: disable=protected-access
timed += cases(config, '_im2col')
records = bench.time_cases(timed, 'float32', 1, 10)
print(bench.format_table(records))
