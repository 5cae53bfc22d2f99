"""Data parallelism: one train step on 4 (fake CPU) devices equals the step on 1 device, since the
batch-norm statistics and the gradient are over the global batch. (Steps scanned in one call equal
calls of one step: tests/test_base_program.py, on one device; the program is the same on 4.)

The bench is not run on the 4 fake devices here: on a loaded CI machine that child stalled in the
bench past the subprocess's limit (experiments/results/README.md, 'Figures behind the code's
choices'); the bench's mesh is the same `sharding.data_mesh` as the step's.

The 4 devices exist only if XLA_FLAGS is set before jax is imported, so the checks run in a child
process (this test process has already imported jax with one device).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from conftest import xla_flags
from f2m_jax import sharding

REPO = pathlib.Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent('''
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from f2m_jax import base as base_lib, optim, sharding, trees
    from f2m_jax.data import synthetic
    import ml_collections
    from configs import common
    from f2m_jax.models import build_model

    out = {'device_count': jax.device_count()}
    data = synthetic.make_synthetic(num_base=4, way=1, num_sessions=1, train_per_class=2,
                                    test_per_class=1, image_size=16)  # 8 images, 4 classes
    model = build_model('resnet20', 4, 4, conv_backward='cpu')
    noise = common.base_config().noise
    noise.update(distribution='uniform', pf_weight=1.0, std_weight=0.0, draw_map='unroll')
    noise = ml_collections.FrozenConfigDict(noise)
    tx = optim.sgd(0.1, 0.9, 5e-4, (), 0.1)
    init = jax.jit(lambda key: base_lib.init_state(model, key, 16, tx))  # one program, not op by op
    indices = np.arange(8, dtype=np.int32)[None, None]  # 1 step x 1 member

    def train(mesh, calls):
      program = base_lib.make_train_program(model, noise, tx, data, 'unroll', mesh)
      state = sharding.replicate(trees.stack([init(jax.random.key(0))]), mesh)
      data_ = sharding.replicate((data.train.images, data.train.labels), mesh)
      keys, bounds = sharding.replicate((jnp.stack([jax.random.key(1)]), np.float32([0.05])), mesh)
      for rows in calls:
        rows = sharding.shard_member_rows(mesh, rows)
        state, metrics = program(state, *data_, rows, np.int32(len(rows)), keys, bounds)
      return rows, trees.index(state, 0), metrics

    results = {}
    for n in (1, 4):
      mesh = sharding.data_mesh(jax.devices()[:n])
      rows, state, metrics = train(mesh, [indices])
      out[f'rows_devices_{n}'] = len(rows.sharding.device_set)
      out[f'params_devices_{n}'] = len(jax.tree.leaves(state.params)[0].sharding.device_set)
      results[n] = jax.device_get((metrics['loss'][0, 0], state.params, state.batch_stats))
    out['loss'] = [float(results[1][0]), float(results[4][0])]
    rel = lambda a, b: max(jax.tree.leaves(jax.tree.map(  # host values
        lambda x, y: float(np.max(np.abs(x - y)) / (np.max(np.abs(y)) + 1e-12)), a, b)))
    out['max_rel_diff'] = rel(results[1][1:], results[4][1:])
    try:
      sharding.per_device_batch(6, sharding.data_mesh())
      out['indivisible_error'] = None
    except ValueError as e:
      out['indivisible_error'] = str(e)

    print('RESULT ' + json.dumps(out))
''')


# XLA:CPU ends the process when a device reaches a collective 40 s (its default) after another: 4
# fake devices on a loaded 2-core machine can lag that much, so the waits are raised to what the
# subprocess timeout allows.
SLOW_COLLECTIVES = [f'--xla_cpu_{flag}=900' for flag in (
    'collective_call_terminate_timeout_seconds', 'collective_timeout_seconds',
    'collective_call_warn_stuck_timeout_seconds')]


@pytest.fixture(scope='module')
def out():
  """Runs CHILD with 4 fake CPU devices; returns its result dict."""
  flags = xla_flags('--xla_force_host_platform_device_count=4', *SLOW_COLLECTIVES)
  env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS='cpu', PYTHONPATH=str(REPO))
  proc = subprocess.run([sys.executable, '-c', CHILD], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')][-1]
  return json.loads(line[len('RESULT '):])


@pytest.mark.slow
def test_one_step_on_four_devices_equals_one_device(out):
  assert out['rows_devices_4'] == 4 and out['params_devices_4'] == 4  # rows split, params copied
  loss_1, loss_4 = out['loss']
  assert abs(loss_1 - loss_4) <= 1e-5 * abs(loss_1)
  # Updated params and BN statistics, relative to each leaf's scale: float32 sums in another order
  # (per-device partial sums, then an all-reduce).
  assert out['max_rel_diff'] < 1e-4


@pytest.mark.slow
def test_indivisible_global_batch_is_refused(out):
  assert 'not divisible by the 4 devices' in out['indivisible_error']


def test_distributed_is_initialized_only_when_asked(monkeypatch):
  """Initialized with bounded waits, then the collectives connect (f2m_jax/sharding.py)."""
  calls = []
  monkeypatch.setattr(sharding.jax.distributed, 'initialize', lambda shutdown_timeout_seconds=300,
                      **kw: calls.append({**kw, 'exit': shutdown_timeout_seconds}))
  monkeypatch.setattr(sharding.multihost_utils, 'sync_global_devices', calls.append)
  monkeypatch.delenv('JAX_COORDINATOR_ADDRESS', raising=False)
  assert not sharding.maybe_initialize_distributed(False) and calls == []
  for name, value in (('JAX_COORDINATOR_ADDRESS', '10.0.0.1:1234'), ('JAX_NUM_PROCESSES', '2'),
                      ('JAX_PROCESS_ID', '1'), ('F2M_DISTRIBUTED_TIMEOUT_S', '20')):
    monkeypatch.setenv(name, value)
  before = sharding.jax.config.jax_enable_preemption_service
  try:
    assert sharding.maybe_initialize_distributed(False)
    # JAX's preemption notifier would take SIGTERM, which stopping.py's watcher must see
    assert sharding.jax.config.jax_enable_preemption_service is False
  finally:
    sharding.jax.config.update('jax_enable_preemption_service', before)
  assert calls == [{'coordinator_address': '10.0.0.1:1234', 'num_processes': 2, 'process_id': 1,
                    'initialization_timeout': 80, 'exit': 320}, 'f2m_jax: the collectives connect']
