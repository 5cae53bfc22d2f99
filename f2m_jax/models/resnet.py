"""ResNet-20 (CIFAR stem) and ResNet-18 (ImageNet stem) as used by F2M, with a trunk/suffix split.

The network is a flat sequence of units: the stem, then the BasicBlocks in forward order, then the
head (global average pooling -> embedding, linear classifier -> logits). `__call__` can run any
contiguous range of blocks, which is what lets the base session run the unperturbed trunk once and
only the noised suffix once per noise draw.

Parameter names follow torchvision (`conv1`, `bn1`, `layer3_1/conv2`, `layer2_0/downsample_conv`, `fc`)
so that pretrained weights convert by name.
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp

# PyTorch's kaiming_normal_(mode='fan_out', nonlinearity='relu'), the original code's conv init.
conv_init = nn.initializers.variance_scaling(2.0, 'fan_out', 'normal')


def _batch_norm(train: bool, dtype: Any, name: str) -> nn.BatchNorm:
  # PyTorch defaults: momentum 0.1 (flax keeps 0.9 of the old value), eps 1e-5.
  return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                      dtype=dtype, param_dtype=jnp.float32, name=name)


class BasicBlock(nn.Module):
  """Two 3x3 convs with BN and an identity or 1x1-conv shortcut."""
  features: int
  strides: int = 1
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool):
    conv = functools.partial(nn.Conv, use_bias=False, kernel_init=conv_init, dtype=self.dtype,
                             param_dtype=jnp.float32)
    y = conv(self.features, (3, 3), (self.strides, self.strides), padding=((1, 1), (1, 1)), name='conv1')(x)
    y = nn.relu(_batch_norm(train, self.dtype, 'bn1')(y))
    y = conv(self.features, (3, 3), padding=((1, 1), (1, 1)), name='conv2')(y)
    y = _batch_norm(train, self.dtype, 'bn2')(y)
    if self.strides != 1 or x.shape[-1] != self.features:
      x = conv(self.features, (1, 1), (self.strides, self.strides), padding='VALID', name='downsample_conv')(x)
      x = _batch_norm(train, self.dtype, 'downsample_bn')(x)
    return nn.relu(x + y)


class ResNet(nn.Module):
  """A ResNet returning (embedding, logits), or an intermediate activation for a partial range.

  Attributes:
    stage_sizes: BasicBlocks per stage.
    widths: channels per stage.
    stem: 'cifar' (3x3 conv, stride 1) or 'imagenet' (7x7/2 conv and 3x3/2 max-pool).
    num_classes: outputs of the linear classifier (the base classes).
  """
  stage_sizes: Sequence[int]
  widths: Sequence[int]
  stem: str
  num_classes: int
  stem_width: Optional[int] = None
  dtype: Any = jnp.float32

  @property
  def num_blocks(self) -> int:
    return sum(self.stage_sizes)

  def block_names(self) -> list:
    return [f'layer{i + 1}_{j}' for i, n in enumerate(self.stage_sizes) for j in range(n)]

  @nn.compact
  def __call__(self, x, train: bool, first: int = 0, last: Optional[int] = None):
    """Runs blocks [first, last). first=0 starts from images (stem included); last=None runs the
    remaining blocks and the head and returns (embedding, logits); otherwise the activation."""
    if first == 0:
      x = x.astype(self.dtype)
      stem_width = self.stem_width or self.widths[0]
      if self.stem == 'cifar':
        x = nn.Conv(stem_width, (3, 3), padding=((1, 1), (1, 1)), use_bias=False, kernel_init=conv_init,
                    dtype=self.dtype, param_dtype=jnp.float32, name='conv1')(x)
        x = nn.relu(_batch_norm(train, self.dtype, 'bn1')(x))
      elif self.stem == 'imagenet':
        x = nn.Conv(stem_width, (7, 7), (2, 2), padding=((3, 3), (3, 3)), use_bias=False,
                    kernel_init=conv_init, dtype=self.dtype, param_dtype=jnp.float32, name='conv1')(x)
        x = nn.relu(_batch_norm(train, self.dtype, 'bn1')(x))
        x = nn.max_pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))
      else:
        raise ValueError(f"stem must be 'cifar' or 'imagenet', got {self.stem!r}")
    names = self.block_names()
    stop = len(names) if last is None else last
    index = 0
    for i, (n, w) in enumerate(zip(self.stage_sizes, self.widths)):
      for j in range(n):
        if first <= index < stop:
          strides = 2 if (j == 0 and i > 0) else 1
          x = BasicBlock(w, strides, self.dtype, name=names[index])(x, train)
        index += 1
    if last is not None:
      return x
    embedding = jnp.mean(x, axis=(1, 2)).astype(jnp.float32)
    logits = nn.Dense(self.num_classes, kernel_init=nn.initializers.normal(1e-3),
                      bias_init=nn.initializers.zeros, name='fc')(embedding)
    return embedding, logits


def resnet20(num_classes: int, width: int = 16, dtype: Any = jnp.float32) -> ResNet:
  """ResNet-20 for 32x32 images (3 stages x 3 blocks, 16/32/64 channels, 64-d embedding)."""
  return ResNet((3, 3, 3), (width, 2 * width, 4 * width), 'cifar', num_classes, dtype=dtype)


def resnet18(num_classes: int, width: int = 64, dtype: Any = jnp.float32) -> ResNet:
  """torchvision ResNet-18 layout (ImageNet stem, 2-2-2-2 blocks, 512-d embedding)."""
  return ResNet((2, 2, 2, 2), (width, 2 * width, 4 * width, 8 * width), 'imagenet', num_classes, dtype=dtype)


ARCHS = {'resnet20': resnet20, 'resnet18': resnet18}


def build_model(arch: str, num_classes: int, width: Optional[int] = None, dtype: Any = jnp.float32) -> ResNet:
  if arch not in ARCHS:
    raise ValueError(f'model.arch={arch!r} is not one of {sorted(ARCHS)}')
  kwargs = {} if width is None else {'width': width}
  return ARCHS[arch](num_classes, dtype=dtype, **kwargs)


def conv3x3_paths(model: ResNet) -> list:
  """Paths (tuples of names) of every 3x3 conv kernel in forward order, stem included if 3x3.

  Shortcut 1x1 convs, BN and the classifier are never listed (DESIGN.md, 'Noise set')."""
  paths = [('conv1', 'kernel')] if model.stem == 'cifar' else []
  for name in model.block_names():
    paths += [(name, 'conv1', 'kernel'), (name, 'conv2', 'kernel')]
  return paths


def noise_set_paths(model: ResNet, num_layers: int) -> list:
  """The noise set: the last `num_layers` 3x3 conv kernels in forward order."""
  paths = conv3x3_paths(model)
  if not 1 <= num_layers <= len(paths):
    raise ValueError(f'noise.num_layers={num_layers} must be in [1, {len(paths)}] for this network')
  return paths[-num_layers:]


def split_block(model: ResNet, paths: Sequence[tuple]) -> int:
  """Index of the first block that holds a path of `paths`: blocks before it form the trunk."""
  names = model.block_names()
  owners = [names.index(p[0]) if p[0] in names else 0 for p in paths]
  return min(owners)
