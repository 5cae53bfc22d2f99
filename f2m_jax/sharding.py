"""Data parallelism with `jax.sharding` (docs/performance.md, 'Devices and hosts'): a 1-D 'data'
mesh over all devices, the batch sharded and the state replicated; each host builds its own rows."""
import inspect
import os
import sys
from concurrent import futures

import jax
import numpy as np
from absl import flags
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXIS = 'data'


def maybe_initialize_distributed(requested=False):
  """Calls `jax.distributed.initialize()` when JAX_COORDINATOR_ADDRESS is set or `requested`
  (config `distributed=True`), then connects the collectives; returns whether it did. Before any
  computation. The join runs in a helper thread while this one waits F2M_DISTRIBUTED_TIMEOUT_S
  seconds (300), as big_vision's checkpointing_timeout: a process that does not come ends this one
  in one line (exit code 3), before JAX's own timeout, which ends it with a page of its log; a
  misconfiguration (no coordinator) is a ValueError (exit code 2) at once."""
  address = os.environ.get('JAX_COORDINATOR_ADDRESS')
  if not (address or requested):
    return False
  kwargs = {'coordinator_address': address}  # None: JAX looks for a cluster manager
  for env, arg in (('JAX_NUM_PROCESSES', 'num_processes'), ('JAX_PROCESS_ID', 'process_id')):
    if os.environ.get(env):
      kwargs[arg] = int(os.environ[env])

  def end(line):  # without JAX's exit barrier: the others' waits on this process end at once
    print(f'error: process {kwargs.get("process_id", "?")}: {line}', file=sys.stderr, flush=True)
    os._exit(3)  # pylint: disable=protected-access
  wait = int(os.environ.get('F2M_DISTRIBUTED_TIMEOUT_S') or 300)
  # (jax 0.4.30 has no shutdown_timeout_seconds.) A failed process waits at exit till orbax's
  # barriers time out.
  if 'shutdown_timeout_seconds' in inspect.signature(jax.distributed.initialize).parameters:
    kwargs['shutdown_timeout_seconds'] = wait + 300
  if 'jax_enable_preemption_service' in jax.config.values:  # its notifier would take our SIGTERM
    jax.config.update('jax_enable_preemption_service', False)
  me, count = kwargs.get('process_id'), kwargs.get('num_processes', 0)
  others = [str(i) for i in range(count) if i != me] if me is not None else []  # 2: the one missing
  missing = (f": missing {'process ' if len(others) == 1 else 'one or more of processes '}"
             f"{', '.join(others)}")
  with futures.ThreadPoolExecutor(1) as pool:
    try:
      pool.submit(jax.distributed.initialize, **kwargs,
                  initialization_timeout=wait + 60).result(timeout=wait)
    except futures.TimeoutError:
      end(f'not every process joined {address} within {wait} s' + missing * bool(others))
    except ValueError as e:
      raise ValueError(f'joining the processes: {e} Set JAX_COORDINATOR_ADDRESS (with '
                       'JAX_NUM_PROCESSES, JAX_PROCESS_ID), or run where JAX finds its peers '
                       '(SLURM, a TPU pod)') from e
  if 'experimental_orbax_use_distributed_barrier' in flags.FLAGS:  # (orbax 0.11.0 has not it)
    flags.FLAGS.experimental_orbax_use_distributed_barrier = True  # bounded, the late named
  # The collectives connect at their first use, waiting 30 s for the others: here, as they meet.
  try:
    multihost_utils.sync_global_devices('f2m_jax: the collectives connect')
  except Exception as e:  # pylint: disable=broad-except  (jax raises several types)
    end(f"the processes' collectives did not connect: {' '.join(str(e).split())}")
  return True


def data_mesh(devices=None):
  """A 1-D mesh named 'data' over `devices` (default: every device of every process)."""
  return Mesh(np.asarray(devices or jax.devices()), (AXIS,))


def per_device_batch(global_batch, mesh):
  """The per-device batch; a ValueError when the global batch does not split evenly."""
  if global_batch % mesh.size:
    raise ValueError(f'the global batch {global_batch} is not divisible by the {mesh.size} devices '
                     'of the mesh; choose a batch size (base.batch_size, or base.ways x '
                     'base.shots) that is')
  return global_batch // mesh.size


def replicated(mesh):
  return NamedSharding(mesh, P())


def member_rows_sharded(mesh):
  """[N, S, B] per-step batch indices of S members: B split over 'data'."""
  return NamedSharding(mesh, P(None, None, AXIS))


def _put(x, sharding):
  """A global array from a host value that every process holds in full."""
  if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    data = _put(jax.random.key_data(x), sharding)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
  host = np.asarray(jax.device_get(x))
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def replicate(tree, mesh):
  """Every leaf of `tree` (a train state, a PRNG key) replicated on all devices of the mesh."""
  return jax.tree_util.tree_map(lambda x: _put(x, replicated(mesh)), tree)


def shard_member_rows(mesh, indices):
  """[N, S, B] batch indices of S members split along B over the mesh."""
  per_device_batch(indices.shape[2], mesh)
  return _put(indices, member_rows_sharded(mesh))
