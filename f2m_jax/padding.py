"""Padding to a fixed shape, so that one compiled program serves inputs of every size (every session,
the last batch of a dataset, the last chunk of noise draws). The added entries are cut from the
results, or the computation is told to ignore them (a label of -1, a count of real rows, a weight 0)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def round_up(n: int, multiple: int) -> int:
  """The smallest multiple of `multiple` that is at least n."""
  return n + (-n) % multiple


def pad_rows(x, size: int, value=0, axis: int = 0):
  """`x` with `axis` extended to `size` entries of `value` (unchanged if already as long); a host
  array stays on the host, a jax.Array on its device."""
  xp = jnp if isinstance(x, jax.Array) else np
  x = xp.asarray(x)
  missing = size - x.shape[axis]
  if missing <= 0:
    return x
  shape = x.shape[:axis] + (missing,) + x.shape[axis + 1:]
  return xp.concatenate([x, xp.full(shape, value, x.dtype)], axis=axis)


def repeat_last(x, size: int):
  """`x` (rows on the leading axis) extended to `size` rows by copies of its last row."""
  missing = size - len(x)
  if missing <= 0:
    return x
  xp = jnp if isinstance(x, jax.Array) else np
  return xp.concatenate([x, xp.repeat(x[-1:], missing, axis=0)])
