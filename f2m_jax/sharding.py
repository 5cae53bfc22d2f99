"""Data parallelism with `jax.sharding` (docs/performance.md, 'Devices and hosts'): a 1-D 'data' mesh
over all devices, the batch sharded and the state replicated; each host builds its own rows."""
from __future__ import annotations

import os
from typing import Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXIS = 'data'


def maybe_initialize_distributed(requested: bool = False) -> bool:
  """Calls `jax.distributed.initialize()` when JAX_COORDINATOR_ADDRESS is set or `requested` (config
  `distributed=True`); returns whether it did. Must run before any computation."""
  address = os.environ.get('JAX_COORDINATOR_ADDRESS')
  if not (address or requested):
    return False
  kwargs = {}
  if address:
    kwargs['coordinator_address'] = address
  for env, arg in (('JAX_NUM_PROCESSES', 'num_processes'), ('JAX_PROCESS_ID', 'process_id')):
    if os.environ.get(env):
      kwargs[arg] = int(os.environ[env])
  jax.distributed.initialize(**kwargs)
  return True


def data_mesh(devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A 1-D mesh named 'data' over `devices` (default: every device of every process)."""
  devices = jax.devices() if devices is None else list(devices)
  return Mesh(np.asarray(devices), (AXIS,))


def per_device_batch(global_batch: int, mesh: Mesh) -> int:
  """The per-device batch; a ValueError when the global batch does not split evenly."""
  n = mesh.size
  if global_batch % n:
    raise ValueError(f'the global batch {global_batch} is not divisible by the {n} devices of the mesh; '
                     'choose a batch size (base.batch_size, or base.ways x base.shots) that is')
  return global_batch // n


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def member_rows_sharded(mesh: Mesh) -> NamedSharding:
  """[N, S, B] per-step batch indices of S members: B split over 'data'."""
  return NamedSharding(mesh, P(None, None, AXIS))


def _put(x, sharding: NamedSharding) -> jax.Array:
  """A global array from a host value that every process holds in full."""
  if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    data = _put(jax.random.key_data(x), sharding)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
  host = np.asarray(jax.device_get(x))
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def replicate(tree, mesh: Mesh):
  """Every leaf of `tree` (a train state, a PRNG key) replicated on all devices of the mesh."""
  return jax.tree_util.tree_map(lambda x: _put(x, replicated(mesh)), tree)


def shard_member_rows(mesh: Mesh, indices: np.ndarray) -> jax.Array:
  """[N, S, B] batch indices of S members split along B over the mesh."""
  per_device_batch(indices.shape[2], mesh)
  return _put(indices, member_rows_sharded(mesh))
