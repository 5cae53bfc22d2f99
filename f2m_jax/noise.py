"""The noise set and its bounded samplers (DESIGN.md, 'Noise set' and 'Bounded noise').

Parameters are handled as flat dicts {path: array} (flax.traverse_util.flatten_dict), so a noise
draw is a small dict over the noise-set paths only; the model receives it as its 'noise' collection
(`collection`), and the parameters themselves are never changed.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

DISTRIBUTIONS = ('discrete_beta', 'grid', 'uniform')
# The original's Beta shape parameters, drawn per layer and per draw (notes/original_code.md 1.2).
BETA_SHAPES = (0.3, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0)
GRID_LEVELS = (-1.0, -0.5, 0.0, 0.5, 1.0)  # times the half-width b
# The original's bins are the equal fifths of [0, 1], labelled in place one after another, so the
# values of the second bin, first labelled 1, are relabelled 4 when the last bin's turn comes.
DISCRETE_BETA_RELABEL = (0, 4, 2, 3, 4)
SYMMETRIC_RELABEL = (0, 1, 2, 3, 4)


def flatten(params) -> dict:
  return traverse_util.flatten_dict(params)


def unflatten(flat: Mapping):
  return traverse_util.unflatten_dict(dict(flat))


def collection(eps: Mapping[tuple, jax.Array]) -> dict:
  """One noise draw {path: array} as the model's 'noise' collection: pass it as
  `model.apply({'params': ..., 'batch_stats': ..., 'noise': collection(eps)}, ...)`; each conv adds
  its entry to its kernel (models.resnet.Conv)."""
  return unflatten(eps)


def _uniform(key, shape, b):
  return jax.random.uniform(key, shape, minval=-b, maxval=b)


def _beta_grid(key, shape, b, relabel):
  """u ~ Beta(alpha, beta) per element, alpha and beta drawn uniformly from BETA_SHAPES once per call
  (per layer and draw); u's fifth of [0, 1] (upper ends inclusive, as the original's <=) is mapped
  through `relabel` to one of GRID_LEVELS * b."""
  ka, kb, ku = jax.random.split(key, 3)
  shapes = jnp.asarray(BETA_SHAPES, jnp.float32)
  alpha = shapes[jax.random.randint(ka, (), 0, len(BETA_SHAPES))]
  beta = shapes[jax.random.randint(kb, (), 0, len(BETA_SHAPES))]
  u = jax.random.beta(ku, alpha, beta, shape, jnp.float32)
  anchors = jnp.asarray([0.2, 0.4, 0.6, 0.8], jnp.float32)
  fifth = jnp.sum(u[..., None] > anchors, axis=-1)
  levels = jnp.asarray(GRID_LEVELS, jnp.float32)[jnp.asarray(relabel)]
  return levels[fifth] * b


def _discrete_beta(key, shape, b):
  """The authors' DiscreteBeta sampler as it runs (notes/original_code.md 1.2), in our units: their
  support {-1, -1/2, 0, 1/2, 1} x b_cfg/2 is GRID_LEVELS x b with b = b_cfg/2 the true half-width;
  their bin relabelling means -b/2 is never drawn and the mean is positive (about +0.24 b)."""
  return _beta_grid(key, shape, b, DISCRETE_BETA_RELABEL)


def _grid(key, shape, b):
  """The same five-level Beta grid with every level reachable (the authors' evident intent)."""
  return _beta_grid(key, shape, b, SYMMETRIC_RELABEL)


_SAMPLERS = {'discrete_beta': _discrete_beta, 'grid': _grid, 'uniform': _uniform}


def level_probabilities(distribution: str) -> np.ndarray:
  """Exact probabilities of GRID_LEVELS under a Beta-grid sampler, averaged over the 49 equally
  likely (alpha, beta) pairs (for tests and documentation)."""
  from scipy import stats
  relabel = {'discrete_beta': DISCRETE_BETA_RELABEL, 'grid': SYMMETRIC_RELABEL}[distribution]
  edges = np.linspace(0.0, 1.0, 6)
  probs = np.zeros(len(GRID_LEVELS))
  for a in BETA_SHAPES:
    for c in BETA_SHAPES:
      fifths = np.diff(stats.beta.cdf(edges, a, c))
      np.add.at(probs, list(relabel), fifths)
  return probs / len(BETA_SHAPES) ** 2


def sample_noise(key: jax.Array, params, paths: Sequence[tuple], num_draws: int, bound: float,
                 distribution: str = 'discrete_beta') -> dict:
  """M bounded noise draws for the noise set: {path: [M, *leaf.shape]}, every element in [-b, b].
  Each layer and each draw has its own key (and, for the Beta grids, its own alpha and beta)."""
  if distribution not in DISTRIBUTIONS:
    raise ValueError(f'noise.distribution={distribution!r} is not one of {DISTRIBUTIONS}')
  flat = flatten(params)
  sampler = _SAMPLERS[distribution]
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
