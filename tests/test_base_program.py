"""The base program (base.make_train_program): training images held on the devices, N steps per call
with lax.scan. N scanned steps equal N calls of one step; a whole run ends where it ends with one step a
call and stops on a NaN at the same step, whatever base.steps_per_call (a resume mid-run:
tests/test_checkpoint.py).

The equalities use base.lr=1e-3 and no std term: programs of other scan lengths are other XLA programs
(other fusions), so a step may differ by float rounding, which training at the smoke data's lr 0.1
amplifies step after step, and the std term's gradient, sign(L_j - mean) for M = 2, flips where the two
noisy losses are equal to rounding. With lr 1e-3 and gamma 0 the dynamics are smooth and the comparison
tests the scan, not the chaos. (On XLA:CPU they are in fact bit for bit equal; the tolerances stay for
other backends and XLA versions.)
"""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import moved, rel_norm_diff
from f2m_jax import base as base_lib
from f2m_jax import experiment as experiment_lib
from f2m_jax import sharding
from f2m_jax import train_loop
from f2m_jax import trees
from f2m_jax.data import sources
from f2m_jax.run import pipeline
from f2m_jax.run.checkpoint import Checkpoints


@pytest.mark.slow
def test_scanned_steps_equal_single_steps():
  """The program of the `runs` fixture's runs (one step a call, and five), as the train loop builds and
  feeds it: the scanned calls from step 0 equal single steps, the last one padded."""
  config = pipeline.resolve(_tiny(5))
  exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
  bench = exp.bench
  mesh = sharding.data_mesh()
  program = base_lib.train_program(exp.model, exp.loss, exp.optimizer_settings(), base_lib.Inputs.of(bench),
                                   config.members.map, mesh)
  n, per_call = 7, 5  # a full call from step 0, then one of 2 steps, padded to 5 rows
  indices = np.stack([exp.batch_indices(s) for s in range(n)] + [exp.batch_indices(0)] * 3).astype(np.int32)
  rows = lambda first, count: sharding.shard_member_rows(mesh, indices[first:first + count, None])
  data = sharding.replicate((bench.train.images, bench.train.labels), mesh)
  keys, bounds = sharding.replicate((jnp.stack([exp.key(0)]), np.asarray([config.noise.bound], np.float32)), mesh)
  init = exp.init_state()
  one, scanned = (sharding.replicate(trees.stack([exp.init_state()]), mesh) for _ in range(2))  # both donated
  for first, steps in train_loop.call_spans(0, n, per_call):
    singles = []
    for s in range(first, first + steps):
      one, m = program(one, *data, rows(s, 1), np.int32(1), keys, bounds)
      singles.append(jax.device_get(m))
    scanned, metrics = program(scanned, *data, rows(first, per_call), np.int32(steps), keys, bounds)
    metrics = jax.device_get(metrics)
    assert int(scanned.step[0]) == first + steps
    # Relative to how far the model moved (measured: 2e-6 with two XLA threads; 1.2e-4 with one,
    # where other reduction orders leave the near-zero BN biases 0.3% apart; a wrong batch or a
    # skipped step is off by order 1; a padding step applied, too).
    for a, b in zip(moved(trees.index(scanned, 0), init), moved(trees.index(one, 0), init)):
      assert rel_norm_diff(a, b) < 1e-3, f'after step {first + steps}'
    for k in metrics:
      assert metrics[k].shape == (per_call, 1)
      np.testing.assert_allclose(metrics[k][:steps, 0], [m[k][0, 0] for m in singles], rtol=1e-5, atol=1e-6)
    assert metrics['finite'][:steps].all()
  assert program._cache_size() == 2  # one program per scan length: the short call ran the full calls'


def test_steps_per_call_divides_the_intervals_and_calls_end_on_its_multiples():
  from configs import cifar100
  config = cifar100.get_config()
  config.base.update(steps_per_call=12, log_every=50, checkpoint_every=500)
  assert train_loop.steps_per_call(config.base, selecting=False) == 2  # 12 reduced to divide 50 and 500
  config.base.update(steps_per_call=20, select_every=1500)
  assert train_loop.steps_per_call(config.base, selecting=False) == 10
  assert train_loop.calls_text(config.base, False).startswith('10 a call: base.steps_per_call=20 cut to')
  config.base.select_every = 25
  assert train_loop.steps_per_call(config.base, selecting=True) == 5
  assert 'select_every' in train_loop.calls_text(config.base, True)
  config.base.steps_per_call = 5
  assert train_loop.calls_text(config.base, True) == '5 a call'  # the header's words (train_steps)
  # calls end on multiples of steps_per_call
  assert train_loop.call_spans(0, 20, 5) == [(0, 5), (5, 5), (10, 5), (15, 5)]
  assert train_loop.call_spans(12, 22, 5) == [(12, 3), (15, 5), (20, 2)]  # resumed at 12; 22 is no multiple
  assert train_loop.call_spans(19, 20, 5) == [(19, 1)]
  assert train_loop.call_spans(0, 3, 1) == [(0, 1), (1, 1), (2, 1)]


def test_the_log_times_after_the_first_call_and_marks_short_windows(monkeypatch):
  """The Records of 2 members resumed at step 330 (log_every 50): the line at 350 averages the 20
  steps since the resume and says so; its steps_per_s counts the steps after the first call, whose
  time holds the warm-up (big_vision's Chrono): 10 steps in 2 s; a line of the first call alone has
  none. The bar shows each member's loss and acc."""
  import types  # pylint: disable=g-import-not-at-top
  from configs import cifar100  # pylint: disable=g-import-not-at-top
  config = cifar100.get_config()
  config.base.update(steps=400, log_every=50, checkpoint_every=500)
  class Log(list):  # a metrics log: its lines
    open, write = lambda self: None, lambda self, **line: self.append(line)
  logs = [Log(), Log()]
  members = [train_loop.Member(None, None, 0.0, lambda *a: None, log) for log in logs]
  monkeypatch.setattr(train_loop, 'time', types.SimpleNamespace(time=iter([10.0, 12.0, 13.0, 18.0, 19.0]).__next__))
  records = train_loop.Records(config, members, 'base', 'test', 330, None, None, types.SimpleNamespace(close=lambda: None))
  calls = lambda n: {'loss': np.tile([1.0, 2.0], (n, 1)), 'acc': np.tile([0.5, 0.25], (n, 1)),
                     'finite': np.ones((n, 2), bool)}
  for first, n in ((330, 10), (340, 10), (350, 50)):
    records(first, n, calls(n), None)
  assert [(l['step'], l['steps_averaged'], l['steps_per_s'], l['loss']) for l in logs[1]] == [
      (350, 20, 5.0, 2.0), (400, 50, 10.0, 2.0)]
  assert records.bar.postfix == 'loss=1.000/2.000, acc=0.500/0.250' and logs[0][0]['members'] == 2
  records = train_loop.Records(config, members[:1], 'base', 'test', 350, None, None, records.status)
  monkeypatch.setattr(train_loop, 'time', types.SimpleNamespace(time=iter([20.0, 21.0]).__next__))
  records(350, 50, {k: v[:, :1] for k, v in calls(50).items()}, None)
  assert logs[0][-1]['steps_per_s'] is None and 'members' not in logs[0][-1]


def _tiny(per_call: int):
  from configs import cifar100
  config = cifar100.get_config('smoke')
  config.method = 'baseline'  # the data path is the same for every method; the Baseline compiles fastest
  config.runs = 1
  config.data.synthetic.num_sessions = 3
  config.noise.std_weight = 0.0  # and lr 1e-3: smooth dynamics (the module docstring)
  config.base.update(steps=20, milestones=(15,), log_every=5, checkpoint_every=10, steps_per_call=per_call, lr=1e-3)
  return config


def _base_steps(workdir: str) -> list:
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [r['step'] for r in map(json.loads, f) if r.get('phase') == 'base']


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """The tiny run at one step a call and at 5 steps a call."""
  root = tmp_path_factory.mktemp('speed')
  return {n: (str(root / str(n)), pipeline.run(_tiny(n), str(root / str(n)))) for n in (1, 5)}


def _final_base_state(workdir: str):
  config = pipeline.resolve(_tiny(5))
  exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
  ckpts = Checkpoints(workdir, read_only=True)
  return ckpts.base.restore(exp.init_state(), config.base.steps)


@pytest.mark.slow
def test_a_run_does_not_depend_on_steps_per_call(runs):
  (host_dir, host), (device_dir, device) = runs[1], runs[5]
  assert _base_steps(device_dir) == _base_steps(host_dir) == [5, 10, 15, 20]
  device_state, host_state = _final_base_state(device_dir), _final_base_state(host_dir)
  # The model after 20 steps (measured: 2e-8 params, 1e-7 BN statistics). Not the momentum: it is the
  # recent gradients, which move by up to 1% of a leaf's scale with differences in the 7th digit.
  assert rel_norm_diff(device_state.params, host_state.params) < 1e-5
  assert rel_norm_diff(device_state.batch_stats, host_state.batch_stats) < 1e-5
  for a, b in zip(host['sessions'], device['sessions']):
    np.testing.assert_allclose(a['acc']['runs'], b['acc']['runs'], atol=1e-9)


@pytest.mark.slow
def test_nan_stop_names_the_same_step_and_keeps_the_last_good_checkpoint(tmp_path):
  steps, messages = {}, {}
  for calls in ('one', 'four'):  # one step a call, and 4
    config = _tiny(5)
    config.base.update(lr=1e3, steps_per_call=4, log_every=20, checkpoint_every=20)  # diverges at step 6
    if calls == 'one':
      config.base.update(checkpoint_every=2, steps_per_call=1)  # a checkpoint before the divergence
    with pytest.raises(experiment_lib.TrainingError, match=r'method baseline diverged at base step (\d+): ') as e:
      pipeline.run(config, str(tmp_path / calls))
    steps[calls] = int(str(e.value).split('base step ')[1].split(':')[0])
    messages[calls] = str(e.value)
  assert steps['one'] == steps['four'] and steps['one'] % 4  # a step inside one of the device path's calls
  assert '; no checkpoint was saved yet. ' in messages['four'] and 'try a tenth of it, --config.base.lr=100,' in messages['four']
  # The host run's last checkpoint is the last one before the divergence, and finite.
  ckpts = Checkpoints(str(tmp_path / 'one'), read_only=True)
  last = ckpts.base.latest_step()
  assert last is not None and steps['one'] - 2 <= last < steps['one']
  assert f'; the last good checkpoint (step {last}) is kept. ' in messages['one']
  config = pipeline.resolve(_tiny(5))
  state = ckpts.base.restore(experiment_lib.Experiment.create(config, sources.load_benchmark(config)).init_state(), last)
  assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(jax.device_get(state.params)))


def test_a_diverged_training_says_why_and_which_lr_to_try():
  """The stop names the loss that was not finite, or the finite loss (4.10, 1e29) after which the
  parameters were not (0739cee called both 'non-finite loss'), what was kept, and a tenth of the lr."""
  said = lambda loss, saved, fc_lr=-1.0: train_loop.diverged(loss, 188, 'method f2m', 'base', saved, 0.1, fc_lr)
  assert said(4.10, None).startswith('method f2m diverged at base step 188: the parameters became non-finite '
                                     'after a finite loss of 4.1; no checkpoint was saved yet. The learning rate')
  assert 'loss of 1e+29; the last good checkpoint (step 150) is kept. ' in said(1.0e29, 150)
  assert ': the loss was nan; the last good checkpoint' in said(float('nan'), 150)
  assert 'try a tenth of it, --config.base.lr=0.01, in a new --workdir' in said(4.10, None)
  assert ('the loss was inf; no checkpoint was saved yet. ' in said(float('inf'), None, 0.01) and
          '--config.base.lr=0.01 --config.base.classifier_lr=0.001, in a new' in said(float('inf'), None, 0.01))


def test_the_programs_are_built_once_per_process_for_the_same_arguments():
  """base.train_program and incremental.make_finetune key on every value that shapes their programs:
  equal values (new objects, as the next run of a process builds them) give the same jitted program,
  whose traces and executables jax.jit keeps; a change of any one of them gives another program."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from f2m_jax import incremental  # pylint: disable=g-import-not-at-top
  from f2m_jax.methods import ncm  # pylint: disable=g-import-not-at-top

  def parts(config):  # train_loop.train_steps's arguments of base.train_program for `config`
    config = pipeline.resolve(config)
    exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
    return exp, [exp.model, exp.loss, exp.optimizer_settings(), base_lib.Inputs.of(exp.bench), config.members.map,
                 sharding.data_mesh()]

  exp, args = parts(_tiny(5))
  program = base_lib.train_program(*args)
  assert base_lib.train_program(*parts(_tiny(5))[1]) is program  # another run's equal arguments
  changes = {1: lambda c: c.noise.update(M=3), 2: lambda c: c.base.update(lr=2e-3),
             3: lambda c: c.data.synthetic.update(image_size=8), 4: lambda c: c.members.update(map='vmap')}
  for i, change in changes.items():
    config = _tiny(5)
    change(config)
    other = parts(config)[1]
    assert other[i] != args[i] and base_lib.train_program(*other) is not program, i
  settings = ncm.session_settings(exp, exp.noise_paths)
  finetune = incremental.make_finetune(settings)
  assert incremental.make_finetune(dataclasses.replace(settings)) is finetune
  for field, value in (('lr', settings.lr / 2), ('steps', settings.steps + 1), ('bound', settings.bound * 2)):
    assert incremental.make_finetune(dataclasses.replace(settings, **{field: value})) is not finetune, field
