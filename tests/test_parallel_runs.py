"""Runs in parallel (issue 15, item 3): the incremental sessions session by session over the runs,
F2M fine-tuning a group of runs in one call mapped over a run axis, equal to one run at a time, and
an interrupted grouped run resuming bit-exactly."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import without_provenance
from f2m_jax import pipeline
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
  assert pipeline.parallel_runs(config) == 1  # the CPU's default: one run a call
  config.incremental.parallel_runs = 2
  assert pipeline.parallel_runs(config) == 2
  config.incremental.parallel_runs = 50
  assert pipeline.parallel_runs(config) == 3  # at most the runs
  config.incremental.parallel_runs = -1
  with pytest.raises(ValueError, match=r'incremental.parallel_runs=-1.*>= 0'):
    pipeline.validate(config)


@pytest.fixture(scope='module')
def parallel_pair(tmp_path_factory):
  """The tiny F2M protocol's sessions one run at a time, and 2 runs a call on the same base model."""
  from f2m_jax.methods import ncm
  root = tmp_path_factory.mktemp('runs')
  one, together = str(root / 'one'), str(root / 'together')
  groups, update_runs = [], ncm.NCMRunner.update_runs

  def spy(self, states, runs, session, exemplars):
    groups.append(list(runs))
    return update_runs(self, states, runs, session, exemplars)

  with pytest.MonkeyPatch.context() as m:
    m.setattr(ncm.NCMRunner, 'update_runs', spy)
    pair = (one, pipeline.run(_runs_config(1), one)), (together, pipeline.run(_runs_config(2), together, checkpoint=one))
  assert groups == [[0], [1], [2]] * 2 + [[0, 1], [2]] * 2  # sessions 2 and 3, one at a time, then in groups
  return pair


def _session_losses(workdir: str) -> dict:
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return {(r['run'], r['session']): r['losses'] for r in map(json.loads, f) if r.get('phase') == 'session'}


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
