"""The accelerator data path of the base loop: training images held on the device, N steps per call
with lax.scan. N scanned steps equal N single steps on host batches; a whole run through it ends
where the host path ends, resumes bit-exactly, and stops on a NaN at the same step.

The equalities use base.lr=1e-3 and no std term: the scanned program is another XLA program than the
single step (other fusions), so a step may differ by float rounding, which training at the smoke
data's lr 0.1 amplifies step after step, and the std term's gradient, sign(L_j - mean) for M = 2,
flips where the two noisy losses are equal to rounding. With lr 1e-3 and gamma 0 the dynamics are
smooth and the comparison tests the scan, not the chaos. (On XLA:CPU the two paths are in fact bit
for bit equal; the tolerances stay for other backends and XLA versions.)
"""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import without_provenance
from f2m_jax import base as base_lib
from f2m_jax import experiment as experiment_lib
from f2m_jax import pipeline
from f2m_jax import sharding
from f2m_jax import train_loop
from f2m_jax import validation
from f2m_jax.checkpoint import Checkpoints
from f2m_jax.data import sources


def _smooth(config):
  config.base.lr = 1e-3
  config.noise.std_weight = 0.0
  return config


def _rel_norm_diff(a, b) -> float:
  """|a - b| / |b| over all leaves of two pytrees together."""
  flat = lambda t: np.concatenate([np.ravel(np.float64(v)) for v in jax.tree_util.tree_leaves(jax.device_get(t))])
  x, y = flat(a), flat(b)
  return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def _moved(state, init) -> tuple:
  """How far the parameters and BN statistics moved from `init`."""
  return jax.tree_util.tree_map(lambda a, b: np.float64(a) - np.float64(b), jax.device_get(
      (state.params, state.batch_stats)), jax.device_get((init.params, init.batch_stats)))


def test_scanned_steps_equal_single_steps(smoke_config):
  config = pipeline.resolve(_smooth(smoke_config))
  exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
  bench = exp.bench
  args = (exp.base_objective(), exp.optimizer(), bench.augment, bench.image_size, bench.mean, bench.std)
  single = base_lib.make_train_step(*args)
  mesh = sharding.data_mesh()
  multi = base_lib.make_multi_step(base_lib.members_step_fn([base_lib.train_step_fn(*args)], 'unroll'), mesh)
  key, n, per_call = exp.key(0), 7, 2  # the last call is 1 step, padded to 2 rows
  indices = np.stack([exp.batch_indices(s) for s in range(n)] + [exp.batch_indices(0)]).astype(np.int32)
  images, labels = jnp.asarray(bench.train.images), jnp.asarray(bench.train.labels)
  init, one = exp.init_state(), exp.init_state()  # the steps donate the state
  scanned, keys = sharding.replicate((train_loop.stack([exp.init_state()]), jnp.stack([key])), mesh)
  for first, steps in train_loop.call_spans(0, n, per_call):
    singles = []
    for s in range(first, first + steps):
      one, m = single(one, bench.train.images[indices[s]], bench.train.labels[indices[s]], key)
      singles.append(jax.device_get(m))
    scanned, metrics = multi(scanned, images, labels, jnp.asarray(indices[first:first + per_call, None]),
                             np.int32(steps), keys)
    metrics = jax.device_get(metrics)
    assert int(scanned.step[0]) == first + steps
    # Relative to how far the model moved (measured: 2e-6 with two XLA threads; 1.2e-4 with one,
    # where other reduction orders leave the near-zero BN biases 0.3% apart; a wrong batch or a
    # skipped step is off by order 1; a padding step applied, too).
    for a, b in zip(_moved(train_loop.unstack(scanned, 0), init), _moved(one, init)):
      assert _rel_norm_diff(a, b) < 1e-3, f'after step {first + steps}'
    for k in ('loss', 'ce', 'pf', 'acc', 'ce_clean'):
      assert metrics[k].shape == (per_call, 1)
      np.testing.assert_allclose(metrics[k][:steps, 0], [m[k] for m in singles], rtol=1e-5, atol=1e-6)
    assert metrics['finite'][:steps].all()
  assert multi._cache_size() == 1  # the short call ran the full calls' program


def test_placement_and_steps_per_call():
  from configs import cifar100
  config = cifar100.get_config()
  assert train_loop.data_placement(config, 150 << 20) == (False, 1)  # this CPU: host batches, one step a call
  config.base.update(data_placement='device', steps_per_call=12, log_every=50, checkpoint_every=500)
  assert train_loop.data_placement(config, 150 << 20) == (True, 2)  # 12 reduced to divide 50 and 500
  config.base.steps_per_call = 0
  assert train_loop.data_placement(config, 150 << 20) == (True, 1)  # the CPU's default, 1
  config.base.data_placement = 'host'
  config.base.steps_per_call = 10
  assert train_loop.data_placement(config, 150 << 20) == (False, 1)  # host batches: one step a call
  config.base.data_placement = 'gpu'
  with pytest.raises(ValueError, match=r"base.data_placement='gpu'.*'auto', 'host' or 'device'"):
    validation.validate(config)


def test_calls_end_on_multiples_of_steps_per_call():
  assert train_loop.call_spans(0, 20, 5) == [(0, 5), (5, 5), (10, 5), (15, 5)]
  assert train_loop.call_spans(12, 22, 5) == [(12, 3), (15, 5), (20, 2)]  # resumed at 12; 22 is no multiple
  assert train_loop.call_spans(19, 20, 5) == [(19, 1)]
  assert train_loop.call_spans(0, 3, 1) == [(0, 1), (1, 1), (2, 1)]


def _tiny(placement: str, per_call: int):
  from configs import cifar100
  config = _smooth(cifar100.get_config('smoke'))
  config.method = 'baseline'  # the data path is the same for every method; the Baseline compiles fastest
  config.runs = 1
  config.data.synthetic.num_sessions = 3
  config.base.update(steps=20, milestones=(15,), log_every=5, checkpoint_every=10, data_placement=placement,
                     steps_per_call=per_call)
  return config


def _base_steps(workdir: str) -> list:
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [r['step'] for r in map(json.loads, f) if r.get('phase') == 'base']


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """The tiny run through the host path and through the device path (5 steps a call)."""
  root = tmp_path_factory.mktemp('speed')
  return {p: (str(root / p), pipeline.run(_tiny(p, 5), str(root / p))) for p in ('host', 'device')}


def _final_base_state(workdir: str, placement: str):
  config = pipeline.resolve(_tiny(placement, 5))
  exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
  ckpts = Checkpoints(workdir, read_only=True)
  return ckpts.restore_base_state(exp.init_state(), config.base.steps)


@pytest.mark.slow
def test_device_path_run_equals_host_path_run(runs):
  (host_dir, host), (device_dir, device) = runs['host'], runs['device']
  assert _base_steps(device_dir) == _base_steps(host_dir) == [5, 10, 15, 20]
  device_state, host_state = _final_base_state(device_dir, 'device'), _final_base_state(host_dir, 'host')
  # The model after 20 steps (measured: 2e-8 params, 1e-7 BN statistics). Not the momentum: it is the
  # recent gradients, which move by up to 1% of a leaf's scale with differences in the 7th digit.
  assert _rel_norm_diff(device_state.params, host_state.params) < 1e-5
  assert _rel_norm_diff(device_state.batch_stats, host_state.batch_stats) < 1e-5
  for a, b in zip(host['sessions'], device['sessions']):
    np.testing.assert_allclose(a['acc']['runs'], b['acc']['runs'], atol=1e-9)


@pytest.mark.slow
def test_device_path_resumes_exactly(runs, tmp_path):
  class Interrupt(Exception):
    pass

  def hook(name, **info):
    if name == 'base_step' and info['step'] == 15:
      raise Interrupt

  workdir = str(tmp_path / 'w')
  with pytest.raises(Interrupt):
    pipeline.run(_tiny('device', 5), workdir, hook=hook)
  assert Checkpoints(workdir).latest_base_step() == 10
  assert without_provenance(pipeline.run(_tiny('device', 5), workdir)) == without_provenance(runs['device'][1])


@pytest.mark.slow
def test_nan_stop_names_the_same_step_and_keeps_the_last_good_checkpoint(tmp_path):
  steps, messages = {}, {}
  for placement in ('host', 'device'):
    config = _tiny(placement, 5)
    config.base.update(lr=1e3, steps_per_call=4, log_every=20, checkpoint_every=20)  # diverges at step 6
    if placement == 'host':
      config.base.checkpoint_every = 2  # a checkpoint before the divergence
    with pytest.raises(experiment_lib.TrainingError, match=r'non-finite loss or parameters .* at base step (\d+);') as e:
      pipeline.run(config, str(tmp_path / placement))
    steps[placement] = int(str(e.value).split('base step ')[1].split(';')[0])
    messages[placement] = str(e.value)
  assert steps['host'] == steps['device'] and steps['host'] % 4  # a step inside one of the device path's calls
  assert messages['device'].endswith('; no checkpoint was saved yet')
  # The host run's last checkpoint is the last one before the divergence, and finite.
  ckpts = Checkpoints(str(tmp_path / 'host'), read_only=True)
  last = ckpts.latest_base_step()
  assert last is not None and steps['host'] - 2 <= last < steps['host']
  assert messages['host'].endswith(f'; the last good checkpoint (step {last}) is kept')
  config = pipeline.resolve(_tiny('host', 5))
  state = ckpts.restore_base_state(experiment_lib.Experiment.create(config, sources.load_benchmark(config)).init_state(), last)
  assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(jax.device_get(state.params)))
