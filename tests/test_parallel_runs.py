"""Runs in parallel: the incremental sessions session by session over the runs,
F2M fine-tuning and evaluating a group of runs in one call each, mapped over a run axis, equal to
one run at a time, and an interrupted grouped run resuming bit-exactly; on several devices the run
axis is split over them (a child process with 4 fake CPU devices), equal to one run at a time as well."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import without_provenance, xla_flags
from f2m_jax import evaluator
from f2m_jax import pipeline
from f2m_jax import sessions
from f2m_jax import validation
from f2m_jax.checkpoint import Checkpoints


def _runs_config(parallel: int):
  """conftest.tiny_protocol's sizes for F2M (6 base classes, 2 sessions of 2-way 5-shot) with 3 runs:
  in groups of 2, runs 0 and 1 are mapped together and run 2 runs alone."""
  from configs import cifar100
  config = cifar100.get_config('smoke')
  config.runs = 3
  config.data.synthetic.update(num_base=6, way=2, num_sessions=3, train_per_class=20, test_per_class=10)
  config.base.update(steps=40, milestones=(30,), batch_size=24, log_every=10, checkpoint_every=20)
  config.incremental.parallel_runs = parallel
  return config


def test_parallel_runs_setting():
  config = _runs_config(0)
  assert sessions.parallel_runs(config) == 1  # the CPU's default: one run a call
  config.incremental.parallel_runs = 2
  assert sessions.parallel_runs(config) == 2
  config.incremental.parallel_runs = 50
  assert sessions.parallel_runs(config) == 3  # at most the runs
  config.incremental.parallel_runs = -1
  with pytest.raises(ValueError, match=r'incremental.parallel_runs=-1.*>= 0'):
    validation.validate(config)


@pytest.fixture(scope='module')
def parallel_pair(tmp_path_factory):
  """The tiny F2M protocol's sessions one run at a time, and 2 runs a call on the same base model."""
  from f2m_jax.methods import ncm
  root = tmp_path_factory.mktemp('runs')
  one, together = str(root / 'one'), str(root / 'together')
  groups, update_runs = [], ncm.NCMRunner.update_runs
  evaluated, accuracies_runs = [], evaluator.Evaluator.accuracies_runs

  def spy(self, states, runs, session, exemplars):
    groups.append(list(runs))
    return update_runs(self, states, runs, session, exemplars)

  def spy_evaluated(self, run_params, protos, session):
    evaluated.append((len(run_params), session))
    return accuracies_runs(self, run_params, protos, session)

  with pytest.MonkeyPatch.context() as m:
    m.setattr(ncm.NCMRunner, 'update_runs', spy)
    m.setattr(evaluator.Evaluator, 'accuracies_runs', spy_evaluated)
    pair = (one, pipeline.run(_runs_config(1), one)), (together, pipeline.run(_runs_config(2), together, checkpoint=one))
  assert groups == [[0], [1], [2]] * 2 + [[0, 1], [2]] * 2  # sessions 2 and 3, one at a time, then in groups
  assert evaluated == [(2, 2), (2, 3)]  # each group of 2 evaluated in one call; the rest run by run
  return pair


def _session_losses(workdir: str) -> dict:
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return {(r['run'], r['session']): r['losses'] for r in map(json.loads, f) if r.get('phase') == 'session'}


@pytest.mark.slow
def test_parallel_runs_equal_runs_one_by_one(parallel_pair):
  (one_dir, one), (together_dir, together) = parallel_pair
  for a, b in zip(one['sessions'], together['sessions']):
    np.testing.assert_allclose(a['acc']['runs'], b['acc']['runs'], atol=1e-9)
  losses_one, losses_together = _session_losses(one_dir), _session_losses(together_dir)
  assert sorted(losses_one) == sorted(losses_together) == [(r, s) for r in range(3) for s in (2, 3)]
  for k, v in losses_one.items():  # every fine-tuning step of every run and session
    np.testing.assert_allclose(losses_together[k], v, rtol=1e-5)
  for k in ('base_mean', 'novel_mean', 'novel_std'):  # novel prototypes: from the fine-tuned networks
    np.testing.assert_allclose(together['prototype_norms'][k]['runs'], one['prototype_norms'][k]['runs'], rtol=1e-5)


@pytest.mark.slow
def test_parallel_runs_resume_exactly(parallel_pair, tmp_path):
  (one_dir, _), (_, together) = parallel_pair

  class Interrupt(Exception):
    pass

  def stop(phase, **info):  # run 0's last session saved; run 1's (same call) and run 2's are not
    if phase == 'session' and (info['run'], info['session']) == (0, 3):
      raise Interrupt

  workdir = str(tmp_path / 'w')
  with pytest.raises(Interrupt):
    pipeline.run(_runs_config(2), workdir, checkpoint=one_dir, hook=stop)
  assert [Checkpoints(workdir).sessions_done(r) for r in range(3)] == [[2, 3], [2], [2]]
  resumed = pipeline.run(_runs_config(2), workdir, checkpoint=one_dir)
  assert without_provenance(resumed) == without_provenance(together)


RUNS_CHILD = textwrap.dedent('''
    import json
    import jax, jax.numpy as jnp, numpy as np
    from f2m_jax import incremental, sharding, trees
    from f2m_jax.models import noise_set_paths, resnet20

    model = resnet20(6, width=4)
    variables = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False)
    paths = tuple(noise_set_paths(model, 4))
    flat = trees.flatten(variables['params'])
    anchor = {p: flat[p] for p in paths}
    settings = incremental.SessionSettings(
        model=model, trainable_paths=paths, steps=2, lr=0.01, momentum=0.9, weight_decay=5e-4, bound=0.05,
        clamp=True, distance='squared_euclidean', augment='crop_flip', image_size=16, mean=(0.5,) * 3,
        std=(0.25,) * 3)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (6, 16, 16, 3), dtype=np.uint8) for _ in range(3)]
    labels = [np.repeat(np.array([6, 7], np.int32), 3)] * 3
    stored = np.concatenate([rng.normal(size=(6, 16)), np.zeros((2, 16))]).astype(np.float32)
    keys = [jax.random.key(r) for r in range(3)]
    mesh = sharding.runs_mesh()
    finetune = incremental.make_finetune(settings, mesh=mesh)
    # 3 runs on 4 devices (padded with a copy of run 2), against each run alone on one device.
    together, losses = finetune.runs([variables['params']] * 3, variables['batch_stats'], anchor, images, labels,
                                     stored, keys)
    alone = [finetune(variables['params'], variables['batch_stats'], anchor, x, y, stored, k)
             for x, y, k in zip(images, labels, keys)]
    # Each run's difference to its run alone, relative to how far the run alone moved from phi*.
    trained = lambda params: np.concatenate([np.ravel(trees.flatten(params)[p]) for p in paths])
    start = np.concatenate([np.ravel(anchor[p]) for p in paths])
    out = {'mesh_size': mesh.size, 'losses_shape': list(np.shape(losses)),
           'losses': [np.asarray(losses).tolist(), [np.asarray(l).tolist() for _, l in alone]],
           'diff_over_move': [float(np.linalg.norm(trained(t) - trained(a)) / np.linalg.norm(trained(a) - start))
                              for t, (a, _) in zip(together, alone)]}
    # F2M's one-call evaluation of 3 runs, split over the 4 devices, against each run alone
    # (tests/test_accuracies_runs.py), with and without the trunk cache.
    from f2m_jax import evaluation
    from test_accuracies_runs import one_call_equals_per_run
    make_ncm_runs, meshes = evaluation.make_ncm_runs, []
    evaluation.make_ncm_runs = lambda *args: meshes.append(args[-1].size) or make_ncm_runs(*args)
    for cache in (True, False):
      one_call_equals_per_run(cache, normalize=True)
    out['evaluation_meshes'] = meshes
    print('RESULT ' + json.dumps(out))
''')


@pytest.mark.slow
def test_runs_split_over_four_devices_equal_runs_one_by_one():
  """make_finetune's runs with a 4-device mesh (`sharding.runs_mesh`): 3 runs padded to 4, one per
  device, against each run alone on one device; and so F2M's one-call evaluation of 3 runs."""
  tests = pathlib.Path(__file__).resolve().parent
  env = dict(os.environ, XLA_FLAGS=xla_flags('--xla_force_host_platform_device_count=4'), JAX_PLATFORMS='cpu',
             PYTHONPATH=os.pathsep.join([str(tests.parent), str(tests)]))
  proc = subprocess.run([sys.executable, '-c', RUNS_CHILD], env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  out = json.loads([l for l in proc.stdout.splitlines() if l.startswith('RESULT ')][-1][len('RESULT '):])
  assert out['mesh_size'] == 4 and out['losses_shape'] == [3, 2]  # the padding run's losses are dropped
  together, alone = out['losses']
  # The mapped program sums in another order than the single one (XLA:CPU's grouped convolutions),
  # as on one device: 6e-5 of the first loss here; losses near zero differ by up to 1.2e-5.
  np.testing.assert_allclose(together, alone, rtol=1e-3, atol=1e-4)
  assert max(out['diff_over_move']) < 0.01, out['diff_over_move']  # measured 1e-3; runs given each other's keys: 1.4
  assert out['evaluation_meshes'] == [4, 4]  # the one-call evaluation's run axis split over the 4 devices
