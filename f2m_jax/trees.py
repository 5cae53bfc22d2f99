"""Parameter trees as flat dicts {path: array} (flax.traverse_util's tuple paths): the form in which
the sessions and methods pick the leaves they train, keep the rest frozen, and put them back; and
trees stacked on a leading axis (members, draws)."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

flatten = traverse_util.flatten_dict


def unflatten(flat):
  return traverse_util.unflatten_dict(dict(flat))


def split(tree, paths):
  """(selected, rest): flat dicts of the leaves of `tree` on `paths` and of all the others, in the
  tree's order; every path must be a leaf of `tree`."""
  flat, wanted = flatten(tree), set(paths)
  missing = wanted - flat.keys()
  if missing:
    raise KeyError(f'not leaves of the tree: {sorted(missing)}')
  selected = {p: v for p, v in flat.items() if p in wanted}
  return selected, {p: v for p, v in flat.items() if p not in wanted}


def overlay(tree, part):
  """`tree` with the leaves of `part` (a nested subtree or a flat dict) in place of its own."""
  flat = flatten(tree)
  flat.update(part if all(isinstance(k, tuple) for k in part) else flatten(part))
  return unflatten(flat)


def stack(items):
  """Trees of one structure (e.g. S members' train states) as one tree with a leading axis."""
  return jax.tree_util.tree_map(lambda *v: jnp.stack(v), *items)


def index(tree, i):
  """Entry `i` of a tree's leading axis (the inverse of `stack`)."""
  return jax.tree_util.tree_map(lambda x: x[i], tree)


def non_finite(tree):
  """The paths (jax.tree_util.keystr) of the floating leaves of `tree` that hold a NaN or an
  infinity: the one test of what a training step, a session or a restored checkpoint produced."""
  return [jax.tree_util.keystr(path) for path, x in jax.tree_util.tree_leaves_with_path(tree)
          if jnp.issubdtype(np.asarray(x).dtype, jnp.inexact) and not np.isfinite(x).all()]
