"""All runs of a group evaluated in one call (`Runner.accuracies_runs`): a method without its own
evaluates the group's runs one by one through `accuracies`."""
from __future__ import annotations

import numpy as np
import pytest

from f2m_jax import experiment as experiment_lib
from f2m_jax import pipeline
from f2m_jax import sessions
from f2m_jax.checkpoint import Checkpoints
from f2m_jax.data import sources
from f2m_jax.methods import Runner


class _OneValueRunner(Runner):
  """A method without its own `accuracies_runs`: a run's state is one number, 100 * run + session."""

  def __init__(self):
    self.evaluated = []

  def first_accuracies(self):
    return {'acc': 50.0, 'acc_base': 50.0, 'acc_novel': None, 'hm': None}

  def start(self):
    return 0.0

  def update(self, state, run, session, exemplars):
    return 100.0 * run + session, {}

  def accuracies(self, state, session):
    self.evaluated.append((state, session))
    return {'acc': state, 'acc_base': state, 'acc_novel': -state, 'hm': 0.0}

  def template(self, session):
    return {'value': np.zeros((), np.float64)}

  def item(self, state):
    return {'value': np.float64(state)}

  def restore(self, saved):
    return float(saved['value'])

  def norms(self, state):
    return None


class _Log:
  def write(self, **record):
    pass


def test_sessions_evaluate_through_the_runner_default(smoke_config, tmp_path):
  """run_sessions calls `accuracies_runs` once per group; `Runner`'s default calls `accuracies` for
  each of the group's states, in order."""
  smoke_config.runs = 3
  smoke_config.incremental.parallel_runs = 2
  smoke_config.data.synthetic.num_sessions = 3
  config = pipeline.resolve(smoke_config)
  exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
  runner, groups, default = _OneValueRunner(), [], Runner.accuracies_runs

  def spy(self, states, session):
    groups.append((list(states), session))
    return default(self, states, session)

  with pytest.MonkeyPatch.context() as m:
    m.setattr(Runner, 'accuracies_runs', spy)
    accs, norms = sessions.run_sessions(exp, runner, Checkpoints(str(tmp_path)), _Log())
  assert groups == [([2.0, 102.0], 2), ([202.0], 2), ([3.0, 103.0], 3), ([203.0], 3)]
  assert runner.evaluated == [(s, t) for states, t in groups for s in states]
  assert [[a['acc'] for a in run] for run in accs] == [[50.0, 2.0, 3.0], [50.0, 102.0, 103.0], [50.0, 202.0, 203.0]]
  assert norms == [None] * 3
