"""Training augmentation and normalisation in JAX, driven by explicit PRNG keys (jit-friendly)."""
import jax
import jax.numpy as jnp

# Each kind `augment` takes, in the dry run's words.
AUGMENTS = {'crop_flip': 'random crops of the image padded by 4 pixels and horizontal flips',
            'rrc_flip': 'random-resized crops and horizontal flips', 'none': 'none'}


def float_dtype():
  """float32, or float64 where 64-bit computation is enabled (the float64 equivalence tests)."""
  return jax.dtypes.canonicalize_dtype(jnp.float64)


def normalize(images, mean, std):
  """uint8 [N, H, W, C] -> float32, (x / 255 - mean) / std (the original's torchvision
  Normalize)."""
  dtype = float_dtype()
  x = images.astype(dtype) / 255.0
  return (x - jnp.asarray(mean, dtype)) / jnp.asarray(std, dtype)


def eval_view(images, size):
  """The centre `size` x `size` crop of stored training images (uint8 [N, R, R, 3], R >= size): the
  original's test transform of miniImageNet and CUB images; images already `size` pass unchanged."""
  h, w = images.shape[1:3]
  if h < size or w < size:
    raise ValueError(f'images {h}x{w} are smaller than the view {size}')
  top, left = round((h - size) / 2), round((w - size) / 2)
  return images[:, top:top + size, left:left + size]


def _flip(key, image):
  return jnp.where(jax.random.bernoulli(key), image[:, ::-1], image)


def _crop_flip_one(key, image, pad=4):
  """RandomCrop(size, padding=pad) with zero padding, then a horizontal flip with p = 0.5."""
  k1, k2, k3 = jax.random.split(key, 3)
  padded = jnp.pad(image, ((pad, pad), (pad, pad), (0, 0)))
  dy = jax.random.randint(k1, (), 0, 2 * pad + 1)
  dx = jax.random.randint(k2, (), 0, 2 * pad + 1)
  crop = jax.lax.dynamic_slice(padded, (dy, dx, 0), image.shape)
  return _flip(k3, crop)


def _rrc_flip_one(key, image, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
  """RandomResizedCrop(size) then a flip. The crop's area fraction and log aspect ratio are drawn
  uniformly (as torchvision) and clipped to fit the image instead of torchvision's 10 retries."""
  h, w, _ = image.shape
  k1, k2, k3, k4, k5 = jax.random.split(key, 5)
  area = jax.random.uniform(k1, (), minval=scale[0], maxval=scale[1]) * h * w
  aspect = jnp.exp(jax.random.uniform(k2, (), minval=jnp.log(ratio[0]), maxval=jnp.log(ratio[1])))
  cw = jnp.clip(jnp.sqrt(area * aspect), 1.0, w)
  ch = jnp.clip(jnp.sqrt(area / aspect), 1.0, h)
  y0 = jax.random.uniform(k3, ()) * (h - ch)
  x0 = jax.random.uniform(k4, ()) * (w - cw)
  scale_yx = jnp.stack([size / ch, size / cw])
  translate = -jnp.stack([y0, x0]) * scale_yx
  out = jax.image.scale_and_translate(image, (size, size, image.shape[2]), (0, 1), scale_yx,
                                      translate, method='linear')
  return _flip(k5, out)


def augment(key, images, kind, size):
  """Augments a float batch [N, H, W, C] with per-image keys derived from `key`; `kind` one of
  AUGMENTS."""
  keys = jax.random.split(key, images.shape[0])
  one = {'crop_flip': _crop_flip_one,
         'rrc_flip': lambda k, x: _rrc_flip_one(k, x, size), 'none': None}[kind]
  return images if one is None else jax.vmap(one)(keys, images)


GREY = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma: torchvision's and PIL's grayscale


def jitter_image(image, factors, order):
  """torchvision's ColorJitter on one float image [H, W, 3] in [0, 255] with its draws given:
  factors (brightness, contrast, saturation) applied in `order` (a permutation of 0, 1, 2),
  each result clipped to [0, 255]. Brightness blends with black, contrast with the image's
  mean grey, saturation with each pixel's grey. In float: the original's PIL images also round
  to 8 bits after each operation."""
  grey = lambda x: x @ jnp.asarray(GREY, x.dtype)
  ops = (lambda x, f: f * x, lambda x, f: f * x + (1 - f) * jnp.mean(grey(x)),
         lambda x, f: f * x + (1 - f) * grey(x)[..., None])
  for i in range(3):
    image = jnp.clip(jax.lax.switch(order[i], ops, image, factors[order[i]]), 0.0, 255.0)
  return image


def color_jitter(key, images, strength):
  """ColorJitter(strength, strength, strength) on a float batch [N, H, W, 3]: per image three
  factors uniform in [max(0, 1 - strength), 1 + strength] and a random order of the three
  operations, as torchvision draws them per image (`jitter_image`)."""
  kf, ko = jax.random.split(key)
  n = images.shape[0]
  factors = jax.random.uniform(kf, (n, 3), images.dtype, max(0.0, 1.0 - strength), 1.0 + strength)
  order = jax.vmap(lambda k: jax.random.permutation(k, 3))(jax.random.split(ko, n))
  return jax.vmap(jitter_image)(images, factors, order)


def train_inputs(key, images_u8, kind, size, mean, std, jitter=0.0):
  """uint8 training images -> augmented, normalised float32 network inputs. Crops pad with black
  before normalisation, as torchvision's RandomCrop does on the original's PIL images; `jitter` > 0
  adds `color_jitter` after the crop and flip (the original's order: crop, jitter, flip; the flip
  commutes with it)."""
  x = augment(key, images_u8.astype(float_dtype()), kind, size)
  return normalize(color_jitter(jax.random.fold_in(key, 1), x, jitter) if jitter else x, mean, std)
