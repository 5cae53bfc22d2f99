"""ResNet-20 (CIFAR stem) and ResNet-18 (ImageNet stem) whose `__call__` runs any contiguous
range of blocks (the trunk/suffix split). Parameter names follow torchvision (`conv1`,
`layer3_1/conv2`, `layer2_0/downsample_conv`, `fc`), so pretrained weights convert by name.

"""
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _scaled_normal(key, shape, dtype, scale):
  """N(0, 1) draws times `scale`, behind an optimization barrier so that eager and jitted inits give
  the same bits."""
  return lax.optimization_barrier(jax.random.normal(key, shape, dtype)) * np.asarray(scale, dtype)


def conv_init(key, shape, dtype=jnp.float32):
  """PyTorch's kaiming_normal_(mode='fan_out', nonlinearity='relu'), the original code's conv init:
  N(0, 2 / (H * W * O)) for an HWIO kernel, bit for bit (tests/test_init.py)."""
  fan_out = int(np.prod(shape[:-2])) * shape[-1]
  return _scaled_normal(key, shape, dtype, np.sqrt(np.asarray(2.0 / fan_out, dtype)))


def fc_init(key, shape, dtype=jnp.float32):
  """The linear classifier's init, N(0, 1e-3^2): flax's initializers.normal(1e-3), bit for bit."""
  return _scaled_normal(key, shape, dtype, 1e-3)


def fan_out_init(key, shape, dtype=jnp.float32):
  """The authors' iCaRL classifier init: kaiming_normal_(mode='fan_out') of their [embedding,
  classes] matrix (a 2-d tensor's fan_out is its first dimension), N(0, 2 / embedding)."""
  return _scaled_normal(key, shape, dtype, np.sqrt(np.asarray(2.0 / shape[0], dtype)))


BN_MOMENTUM = 0.1  # PyTorch's convention: running = (1 - m) * running + m * batch statistic
BN_EPSILON = 1e-5


def accumulation_dtype(dtype):
  """The dtype statistics, embeddings and gradient sums use: float32 for float32 and bfloat16
  compute, float64 for float64 (the equivalence tests run the whole network in float64)."""
  return jnp.promote_types(dtype, jnp.float32)


# images, kernels, outputs: the forward and the CPU backward's convs
LAYOUT = ('NHWC', 'HWIO', 'NHWC')


def _conv(x, kernel, strides, padding, dtype):
  return lax.conv_general_dilated(x.astype(dtype), kernel.astype(dtype), strides, padding,
                                  dimension_numbers=LAYOUT)


KERNEL_GRAD_BLOCK_BYTES = 2 << 20  # im2col block per scan step: small enough to stay in a CPU cache
# Output gradients smaller than this take the convolution form (`_kernel_grad_eigen`): as fast
# there, and it compiles faster. Every conv of the CIFAR-100, miniImageNet and CUB configs is above
# it.
# The measurements: experiments/results/README.md, "CPU speed: the convolution backward's forms".
KERNEL_GRAD_MIN_BYTES = 1 << 20


def _kernel_grad_by_shifts(x, g, kernel_shape, strides, padding):
  """d conv(x, k) / dk contracted with g, as im2col matmuls over blocks of a few images
  (lax.scan)."""
  kh, kw, cin, cout = kernel_shape
  n, ho, wo, _ = g.shape
  sh, sw = strides
  acc_dtype = accumulation_dtype(x.dtype)
  per_image = ho * wo * kh * kw * cin * 4
  fits = [d for d in range(1, n + 1) if n % d == 0 and d * per_image <= KERNEL_GRAD_BLOCK_BYTES]
  chunk = max(fits or [1])
  xp = jnp.pad(x.astype(acc_dtype), ((0, 0), *padding, (0, 0)))
  xp = xp.reshape((n // chunk, chunk) + xp.shape[1:])
  gb = g.astype(acc_dtype).reshape(n // chunk, chunk * ho * wo, cout)

  def block(acc, inputs):
    xc, gc = inputs
    taps = [lax.slice(xc, (0, i, j, 0), (chunk, i + (ho - 1) * sh + 1, j + (wo - 1) * sw + 1, cin),
                      (1, sh, sw, 1)) for i in range(kh) for j in range(kw)]
    patches = jnp.concatenate(taps, axis=-1).reshape(chunk * ho * wo, kh * kw * cin)
    return acc + patches.T @ gc, None

  acc, _ = lax.scan(block, jnp.zeros((kh * kw * cin, cout), acc_dtype), (xp, gb))
  return acc.reshape(kernel_shape)


def _input_grad_eigen(g, kernel, x_shape, strides, padding):
  """d conv(x, kernel) / dx contracted with g (float32) as the convolution XLA:CPU's Eigen
  kernels run; bit-identical to XLA's transpose outside loops."""
  flipped = jnp.transpose(jnp.flip(kernel, (0, 1)), (0, 1, 3, 2))
  pads = []
  for size, k, s, (lo, _), out in zip(x_shape[1:3], kernel.shape, strides, padding, g.shape[1:3]):
    before = k - 1 - lo
    pads.append((before, size + k - 1 - ((out - 1) * s + 1) - before))
  return lax.conv_general_dilated(g, flipped, (1, 1), pads, lhs_dilation=strides,
                                  dimension_numbers=LAYOUT)


def _kernel_grad_eigen(x, g, kernel_shape, strides, padding):
  """d conv(x, k) / dk contracted with g (float32) as the convolution XLA:CPU's Eigen kernels run;
  bit-identical to XLA's transpose outside loops."""
  kh, kw = kernel_shape[:2]
  out = lax.conv_general_dilated(jnp.transpose(x, (3, 1, 2, 0)), jnp.transpose(g, (1, 2, 0, 3)),
                                 (1, 1), padding, rhs_dilation=strides, dimension_numbers=LAYOUT)
  return jnp.transpose(out[:, :kh, :kw, :], (1, 2, 0, 3))


def _conv_grads(x, kernel, g, strides, padding, dtype, backward):
  """(d x, d kernel) of conv(x, kernel) contracted with g: XLA's own transposes ('xla'), or
  ('cpu') the forms XLA:CPU runs fast (experiments/results/README.md, 'CPU speed: the
  convolution backward's forms')."""
  eigen = backward == 'cpu' and jnp.dtype(dtype) == jnp.float32
  if eigen:
    gx = _input_grad_eigen(g, kernel, x.shape, strides, padding)
  else:
    gx, = jax.linear_transpose(lambda x_: _conv(x_, kernel, strides, padding, dtype), x)(g)
  if backward == 'cpu' and g.size * 4 >= KERNEL_GRAD_MIN_BYTES:
    gk = _kernel_grad_by_shifts(x.astype(dtype), g, kernel.shape, strides, padding)
    gk = gk.astype(kernel.dtype)
  elif eigen:
    gk = _kernel_grad_eigen(x, g, kernel.shape, strides, padding)
  else:
    gk, = jax.linear_transpose(lambda k_: _conv(x, k_, strides, padding, dtype), kernel)(g)
  return gx, gk


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def conv2d(x, kernel, eps, strides, padding, dtype, backward):
  """conv(x, kernel + eps) whose backward sees `kernel` alone (eps gets no gradient): the
  clean-weights backward. backward: 'cpu' or 'xla', the form the gradients are written in
  (`_conv_grads`)."""
  return _conv(x, kernel + eps, strides, padding, dtype)


def _conv2d_fwd(x, kernel, eps, strides, padding, dtype, backward):
  return _conv(x, kernel + eps, strides, padding, dtype), (x, kernel, eps)


def _conv2d_bwd(strides, padding, dtype, backward, residuals, g):
  x, kernel, eps = residuals
  return *_conv_grads(x, kernel, g, strides, padding, dtype, backward), jnp.zeros_like(eps)


conv2d.defvjp(_conv2d_fwd, _conv2d_bwd)


class Conv(nn.Module):
  """A bias-free convolution (NHWC, HWIO 'kernel', as flax's nn.Conv); with a 'noise' collection,
  conv(x, kernel + eps) differentiated at the clean kernel (`conv2d`). kernel_size, strides and
  padding are tuples."""
  features: int
  kernel_size: tuple
  strides: tuple = (1, 1)
  padding: tuple = ((1, 1), (1, 1))
  dtype: Any = jnp.float32
  backward: str = 'xla'

  @nn.compact
  def __call__(self, x):
    shape = (*self.kernel_size, x.shape[-1], self.features)
    kernel = self.param('kernel', conv_init, shape, jnp.float32)
    args = self.strides, self.padding, self.dtype  # tuples: hashable, as conv2d's static arguments
    if self.has_variable('noise', 'kernel') or self.backward == 'cpu':
      eps = self.get_variable('noise', 'kernel', jnp.zeros_like(kernel))
      return conv2d(x, kernel, eps, *args, self.backward)
    return _conv(x, kernel, *args)


class BatchNorm(nn.Module):
  """PyTorch's BatchNorm2d: the biased batch variance to normalise, the unbiased one into the
  running variance (momentum BN_MOMENTUM). Variables named as flax's nn.BatchNorm."""
  use_running_average: bool
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    shape = x.shape[-1:]
    scale = self.param('scale', nn.initializers.ones, shape, jnp.float32)
    bias = self.param('bias', nn.initializers.zeros, shape, jnp.float32)
    ra_mean = self.variable('batch_stats', 'mean', jnp.zeros, shape, jnp.float32)
    ra_var = self.variable('batch_stats', 'var', jnp.ones, shape, jnp.float32)
    xf = x.astype(accumulation_dtype(self.dtype))
    if self.use_running_average:
      mean, var = ra_mean.value, ra_var.value
    else:
      axes = tuple(range(x.ndim - 1))
      mean = jnp.mean(xf, axes)
      var = jnp.mean(jnp.square(xf - mean), axes)
      if not self.is_initializing():
        n = x.size // x.shape[-1]
        m = BN_MOMENTUM
        ra_mean.value = (1 - m) * ra_mean.value + m * mean
        ra_var.value = (1 - m) * ra_var.value + m * var * (n / max(n - 1, 1))
    y = (xf - mean) * lax.rsqrt(var + BN_EPSILON) * scale + bias
    return y.astype(self.dtype)


def fold_batch_stats(running, updates):
  """PyTorch's running statistics after several train-mode passes in turn: each of `updates` is
  BN_MOMENTUM times a pass's batch statistics, applied as running <- (1 - m) * running + update."""
  for u in updates:
    running = jax.tree_util.tree_map(lambda r, d: (1 - BN_MOMENTUM) * r + d, running, u)
  return running


class BasicBlock(nn.Module):
  """Two 3x3 convs with BN and an identity or 1x1-conv shortcut."""
  features: int
  strides: int = 1
  dtype: Any = jnp.float32
  conv_backward: str = 'xla'

  @nn.compact
  def __call__(self, x, train):
    conv = functools.partial(Conv, self.features, dtype=self.dtype, backward=self.conv_backward)
    bn = functools.partial(BatchNorm, not train, self.dtype)
    y = nn.relu(bn(name='bn1')(conv((3, 3), (self.strides, self.strides), name='conv1')(x)))
    y = bn(name='bn2')(conv((3, 3), name='conv2')(y))
    if self.strides != 1 or x.shape[-1] != self.features:
      x = conv((1, 1), (self.strides, self.strides), ((0, 0), (0, 0)), name='downsample_conv')(x)
      x = bn(name='downsample_bn')(x)
    return nn.relu(x + y)


class ResNet(nn.Module):
  """A ResNet returning (embedding, logits), or an intermediate activation for a partial range.
  stem: 'cifar' or 'imagenet'; head: 'linear', 'linear_no_bias' (iCaRL's) or 'cosine' (LUCIR's);
  conv_backward: 'xla' or 'cpu' (`Conv`)."""
  stage_sizes: tuple
  widths: tuple
  stem: str
  num_classes: int
  dtype: Any = jnp.float32
  head: str = 'linear'
  conv_backward: str = 'xla'

  @property
  def num_blocks(self):
    return sum(self.stage_sizes)

  def blocks(self):
    """(name, width, stride) of every block: each stage after the first halves the size."""
    return [(f'layer{i + 1}_{j}', w, 2 if j == 0 and i > 0 else 1)
            for i, (n, w) in enumerate(zip(self.stage_sizes, self.widths)) for j in range(n)]

  def block_names(self):
    return [b[0] for b in self.blocks()]

  @nn.compact
  def __call__(self, x, train, first=0, last=None):
    """Runs blocks [first, last). first=0 starts from images (stem included); last=None runs the
    remaining blocks and the head and returns (embedding, logits); otherwise the activation."""
    if first == 0:
      x = x.astype(self.dtype)
      conv = functools.partial(Conv, self.widths[0], dtype=self.dtype,
                               backward=self.conv_backward, name='conv1')
      imagenet = self.stem == 'imagenet'  # else 'cifar'
      x = conv((7, 7), (2, 2), ((3, 3), (3, 3)))(x) if imagenet else conv((3, 3))(x)
      x = nn.relu(BatchNorm(not train, self.dtype, name='bn1')(x))
      if imagenet:
        x = nn.max_pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))
    for name, width, strides in self.blocks()[first:last]:
      x = BasicBlock(width, strides, self.dtype, self.conv_backward, name=name)(x, train)
    if last is not None:
      return x
    embedding = jnp.mean(x, axis=(1, 2)).astype(accumulation_dtype(self.dtype))
    if self.head == 'cosine':
      return embedding, CosineClassifier(self.num_classes, name='fc')(embedding)
    bias = self.head == 'linear'  # else 'linear_no_bias'
    fc = nn.Dense(self.num_classes, use_bias=bias, kernel_init=fc_init if bias else fan_out_init,
                  name='fc')
    return embedding, fc(embedding)


HEADS = ('linear', 'linear_no_bias', 'cosine')


def cosine_scores(embedding, kernel):
  """cos(embedding, each column of kernel [dim, classes]), norms clipped as F.normalize on the
  squared norm, so that an all-zero column has a zero gradient, not NaN."""
  def unit(x, axis):
    return x / jnp.sqrt(jnp.maximum(jnp.sum(x * x, axis=axis, keepdims=True), 1e-24))
  return unit(embedding, -1) @ unit(kernel, 0)


def uniform_columns(key, shape, dtype=jnp.float32):
  """The cosine classifier's init (LUCIR's, and the F2M authors' Rebalance): U(-1/sqrt(dim),
  1/sqrt(dim)) for a [dim, classes] kernel."""
  bound = 1.0 / np.sqrt(shape[0])
  return jax.random.uniform(key, shape, dtype, -bound, bound)


class CosineClassifier(nn.Module):
  """LUCIR's cosine-normalised classifier: logits = sigma * cos(embedding, w_c), with the scale
  sigma learned (initialised to 1). Params: `kernel` [dim, classes] and scalar `sigma`."""
  num_classes: int

  @nn.compact
  def __call__(self, embedding):
    kernel = self.param('kernel', uniform_columns, (embedding.shape[-1], self.num_classes))
    sigma = self.param('sigma', nn.initializers.ones, ())
    return sigma * cosine_scores(embedding, kernel)


def resnet20(num_classes, width=None, **kwargs):
  """ResNet-20 for 32x32 images (3 stages x 3 blocks, 16/32/64 channels, 64-d embedding)."""
  w = width or 16
  return ResNet((3, 3, 3), (w, 2 * w, 4 * w), 'cifar', num_classes, **kwargs)


def resnet18(num_classes, width=None, **kwargs):
  """torchvision ResNet-18 layout (ImageNet stem, 2-2-2-2 blocks, 512-d embedding)."""
  w = width or 64
  return ResNet((2, 2, 2, 2), (w, 2 * w, 4 * w, 8 * w), 'imagenet', num_classes, **kwargs)


ARCHS = {'resnet20': resnet20, 'resnet18': resnet18}


def build_model(arch, num_classes, width=None, dtype=jnp.float32, **kwargs):
  """The network `arch` (one of ARCHS) at its standard width or `width`; kwargs: ResNet's head and
  conv_backward."""
  return ARCHS[arch](num_classes, width, dtype=dtype, **kwargs)


def noise_set_paths(model, num_layers):
  """The noise set: the last `num_layers` 3x3 conv kernels in forward order, stem included if 3x3
  (docs/method.md, 'The model and the noise set')."""
  paths = [('conv1', 'kernel')] if model.stem == 'cifar' else []
  paths += [(name, conv, 'kernel') for name in model.block_names() for conv in ('conv1', 'conv2')]
  if not 1 <= num_layers <= len(paths):
    raise ValueError(f'noise.num_layers={num_layers} must be in [1, {len(paths)}] for this network')
  return paths[-num_layers:]


def split_block(model, paths):
  """Index of the first block that holds a path of `paths`: blocks before it form the trunk."""
  names = model.block_names()
  return min(names.index(p[0]) if p[0] in names else 0 for p in paths)
