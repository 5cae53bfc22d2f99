"""Padding to a fixed shape, so that one compiled program serves inputs of every size (every
session, the last batch of a dataset, the last chunk of noise draws). The added entries are cut from
the results, or the computation is told to ignore them (a label of -1, a count of real rows, a
weight 0). A host array stays on the host, a jax.Array on its device."""
import jax
import jax.numpy as jnp
import numpy as np


def round_up(n, multiple):
  """The smallest multiple of `multiple` that is at least n."""
  return n + (-n) % multiple


def pad_rows(x, size, value=0, axis=0):
  """`x` with `axis` extended to `size` entries of `value` (unchanged if already as long)."""
  xp = jnp if isinstance(x, jax.Array) else np
  x = xp.asarray(x)
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return xp.pad(x, widths, constant_values=value) if size > x.shape[axis] else x


def repeat_last(x, size):
  """`x` (rows on the leading axis) extended to `size` rows by copies of its last row."""
  xp = jnp if isinstance(x, jax.Array) else np
  return xp.concatenate([x, xp.repeat(x[-1:], max(size - len(x), 0), axis=0)])
