"""The noise set and its bounded samplers (DESIGN.md, 'Noise set' and 'Bounded noise').

Parameters are handled as flat dicts {path: array} (flax.traverse_util.flatten_dict), so a noise
draw is a small dict over the noise-set paths only: `perturb` adds it to a copy of the params.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import traverse_util

DISTRIBUTIONS = ('uniform', 'grid')
# The original's Beta shape parameters, drawn per layer and per draw (notes/original_code.md 1.2).
_BETA_SHAPES = (0.3, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0)
_GRID_LEVELS = (-1.0, -0.5, 0.0, 0.5, 1.0)


def flatten(params) -> dict:
  return traverse_util.flatten_dict(params)


def unflatten(flat: Mapping):
  return traverse_util.unflatten_dict(dict(flat))


def perturb(params, eps: Mapping[tuple, jax.Array]):
  """params + eps on the leaves named in eps (a flat dict); every other leaf is returned as is."""
  flat = flatten(params)
  for path, e in eps.items():
    flat[path] = flat[path] + e.astype(flat[path].dtype)
  return unflatten(flat)


def _uniform(key, shape, b):
  return jax.random.uniform(key, shape, minval=-b, maxval=b)


def _grid(key, shape, b):
  """Five levels {-b, -b/2, 0, b/2, b}: u ~ Beta(alpha, beta) per element, with alpha and beta drawn
  from the original's list once per call, mapped to equal-width bins on [0, 1]. The original's
  relabelling bug (which drops -b/2 and biases the mean) is not reproduced."""
  ka, kb, ku = jax.random.split(key, 3)
  shapes = jnp.asarray(_BETA_SHAPES)
  alpha = jax.random.choice(ka, shapes)
  beta = jax.random.choice(kb, shapes)
  u = jax.random.beta(ku, alpha, beta, shape)
  bins = jnp.clip(jnp.floor(u * 5.0), 0, 4).astype(jnp.int32)
  return jnp.asarray(_GRID_LEVELS, jnp.float32)[bins] * b


def sample_noise(key: jax.Array, params, paths: Sequence[tuple], num_draws: int, bound: float,
                 distribution: str = 'uniform') -> dict:
  """M bounded noise draws for the noise set: {path: [M, *leaf.shape]} with every element in [-b, b]."""
  if distribution not in DISTRIBUTIONS:
    raise ValueError(f'noise.distribution={distribution!r} is not one of {DISTRIBUTIONS}')
  flat = flatten(params)
  sampler = _uniform if distribution == 'uniform' else _grid
  eps = {}
  for i, path in enumerate(paths):
    leaf = flat[path]
    layer_keys = jax.random.split(jax.random.fold_in(key, i), num_draws)
    eps[path] = jax.vmap(lambda k: sampler(k, leaf.shape, bound))(layer_keys).astype(jnp.float32)
  return eps


def mask_tree(params, paths: Sequence[tuple]):
  """A boolean pytree like params, True on the given paths (for optax.masked and friends)."""
  wanted = set(paths)
  return unflatten({p: p in wanted for p in flatten(params)})
