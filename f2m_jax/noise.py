"""The noise set's bounded samplers (docs/method.md, 'Bounded noise'): a draw is a flat dict
{path: array} over the noise set's paths (f2m_jax/trees.py). 'discrete_beta' is the authors'
DiscreteBeta sampler as it runs: u ~ Beta(alpha, beta) per element (alpha, beta from BETA_SHAPES
once per layer and draw), its fifth of [0, 1] mapped to one of GRID_LEVELS * b. Their bins are the
equal fifths of [0, 1], labelled in place one after another, so the values of the second bin, first
labelled 1, are relabelled 4 when the last bin's turn comes: levels {-b, 0, b/2, b}, -b/2 never
drawn. 'grid': the same five levels all reachable (the authors' evident intent); 'uniform' on
[-b, b]."""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from f2m_jax import trees

DISTRIBUTIONS = ('discrete_beta', 'grid', 'uniform')
BETA_SHAPES = (0.3, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0)  # the original's Beta shape parameters
GRID_LEVELS = (-1.0, -0.5, 0.0, 0.5, 1.0)  # times the half-width b
RELABEL = {'discrete_beta': (0, 4, 2, 3, 4), 'grid': (0, 1, 2, 3, 4)}  # each fifth's level
FIFTHS = (0.2, 0.4, 0.6, 0.8)  # the upper ends of the first four fifths of [0, 1]


@functools.cache
def fifth_cdfs():
  """P(u <= 0.2), P(u <= 0.4), P(u <= 0.6), P(u <= 0.8) for u ~ Beta(alpha, beta), for every pair
  (alpha, beta) of BETA_SHAPES: float32 [7, 7, 4]."""
  from scipy import stats  # pylint: disable=g-import-not-at-top (0.7 s, for the Beta grids only)
  shapes = np.asarray(BETA_SHAPES, np.float64)
  return stats.beta.cdf(np.asarray(FIFTHS)[None, None], shapes[:, None, None],
                        shapes[None, :, None]).astype(np.float32)


def beta_grid(key, shape, b, distribution):
  """A Beta-grid draw (module docstring); the fifth drawn by inverting `fifth_cdfs`."""
  ka, kb, ku = jax.random.split(key, 3)
  cdf = jnp.asarray(fifth_cdfs())[jax.random.randint(ka, (), 0, len(BETA_SHAPES)),
                                  jax.random.randint(kb, (), 0, len(BETA_SHAPES))]
  fifth = jnp.sum(jax.random.uniform(ku, shape, jnp.float32)[..., None] > cdf, axis=-1)
  return jnp.asarray(GRID_LEVELS, jnp.float32)[jnp.asarray(RELABEL[distribution])][fifth] * b


def level_probabilities(distribution):
  """Exact probabilities of GRID_LEVELS under a Beta-grid sampler, averaged over the 49 equally
  likely (alpha, beta) pairs (for tests and documentation)."""
  cdfs = np.asarray(fifth_cdfs(), np.float64).reshape(-1, len(FIFTHS))
  fifths = np.diff(cdfs, prepend=0.0, append=1.0, axis=1).mean(axis=0)
  return np.bincount(RELABEL[distribution], fifths, minlength=len(GRID_LEVELS))


def sample_noise(key, params, paths, num_draws, bound, distribution='discrete_beta'):
  """M bounded noise draws for the noise set: {path: [M, *leaf.shape]}, every element in [-b, b].
  Each layer and each draw has its own key (and, for the Beta grids, its own alpha and beta)."""
  flat, eps = trees.flatten(params), {}
  for i, path in enumerate(paths):
    shape = flat[path].shape
    if distribution == 'uniform':
      draw = lambda k: jax.random.uniform(k, shape, minval=-bound, maxval=bound)
    else:
      draw = lambda k: beta_grid(k, shape, bound, distribution)
    keys = jax.random.split(jax.random.fold_in(key, i), num_draws)
    eps[path] = jax.vmap(draw)(keys).astype(jnp.float32)
  return eps
