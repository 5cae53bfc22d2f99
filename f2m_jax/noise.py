"""The noise set's bounded samplers (docs/method.md, 'Bounded noise'): a draw is a flat dict
{path: array} over the noise set's paths (f2m_jax/trees.py)."""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from f2m_jax.trees import flatten

DISTRIBUTIONS = ('discrete_beta', 'grid', 'uniform')
# The original's Beta shape parameters, drawn per layer and per draw (docs/method.md, 'Bounded noise').
BETA_SHAPES = (0.3, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0)
GRID_LEVELS = (-1.0, -0.5, 0.0, 0.5, 1.0)  # times the half-width b
# The original's bins are the equal fifths of [0, 1], labelled in place one after another, so the
# values of the second bin, first labelled 1, are relabelled 4 when the last bin's turn comes.
DISCRETE_BETA_RELABEL = (0, 4, 2, 3, 4)
SYMMETRIC_RELABEL = (0, 1, 2, 3, 4)


def _uniform(key, shape, b):
  return jax.random.uniform(key, shape, minval=-b, maxval=b)


FIFTHS = (0.2, 0.4, 0.6, 0.8)  # the upper ends of the first four fifths of [0, 1]


@functools.lru_cache(maxsize=None)
def fifth_cdfs() -> np.ndarray:
  """P(u <= 0.2), P(u <= 0.4), P(u <= 0.6), P(u <= 0.8) for u ~ Beta(alpha, beta), for every pair
  (alpha, beta) of BETA_SHAPES: float32 [7, 7, 4]."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  shapes = np.asarray(BETA_SHAPES, np.float64)
  edges = np.asarray(FIFTHS, np.float64)
  return stats.beta.cdf(edges[None, None, :], shapes[:, None, None], shapes[None, :, None]).astype(np.float32)


def _beta_grid(key, shape, b, relabel):
  """u ~ Beta(alpha, beta) per element (alpha, beta from BETA_SHAPES once per call), its fifth of [0, 1]
  mapped through `relabel` to one of GRID_LEVELS * b; the fifth drawn by inverting `fifth_cdfs`."""
  ka, kb, ku = jax.random.split(key, 3)
  cdf = jnp.asarray(fifth_cdfs())[jax.random.randint(ka, (), 0, len(BETA_SHAPES)),
                                  jax.random.randint(kb, (), 0, len(BETA_SHAPES))]
  u = jax.random.uniform(ku, shape, jnp.float32)
  fifth = jnp.sum(u[..., None] > cdf, axis=-1)
  levels = jnp.asarray(GRID_LEVELS, jnp.float32)[jnp.asarray(relabel)]
  return levels[fifth] * b


def _discrete_beta(key, shape, b):
  """The authors' DiscreteBeta sampler as it runs (docs/method.md, 'Bounded noise'): levels
  {-b, 0, b/2, b}, -b/2 never drawn."""
  return _beta_grid(key, shape, b, DISCRETE_BETA_RELABEL)


def _grid(key, shape, b):
  """The same five-level Beta grid with every level reachable (the authors' evident intent)."""
  return _beta_grid(key, shape, b, SYMMETRIC_RELABEL)


_SAMPLERS = {'discrete_beta': _discrete_beta, 'grid': _grid, 'uniform': _uniform}


def level_probabilities(distribution: str) -> np.ndarray:
  """Exact probabilities of GRID_LEVELS under a Beta-grid sampler, averaged over the 49 equally
  likely (alpha, beta) pairs (for tests and documentation)."""
  relabel = {'discrete_beta': DISCRETE_BETA_RELABEL, 'grid': SYMMETRIC_RELABEL}[distribution]
  cdfs = np.asarray(fifth_cdfs(), np.float64).reshape(-1, len(FIFTHS))
  fifths = np.diff(np.concatenate([np.zeros((len(cdfs), 1)), cdfs, np.ones((len(cdfs), 1))], axis=1), axis=1)
  probs = np.zeros(len(GRID_LEVELS))
  np.add.at(probs, list(relabel), fifths.mean(axis=0))
  return probs


def sample_noise(key: jax.Array, params, paths: Sequence[tuple], num_draws: int, bound: float,
                 distribution: str = 'discrete_beta') -> dict:
  """M bounded noise draws for the noise set: {path: [M, *leaf.shape]}, every element in [-b, b].
  Each layer and each draw has its own key (and, for the Beta grids, its own alpha and beta)."""
  flat = flatten(params)
  sampler = _SAMPLERS[distribution]
  eps = {}
  for i, path in enumerate(paths):
    leaf = flat[path]
    layer_keys = jax.random.split(jax.random.fold_in(key, i), num_draws)
    eps[path] = jax.vmap(lambda k: sampler(k, leaf.shape, bound))(layer_keys).astype(jnp.float32)
  return eps
