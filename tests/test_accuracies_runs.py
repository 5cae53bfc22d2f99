"""All runs of a group evaluated in one call (`Runner.accuracies_runs`): F2M's one program mapped over
the runs (`Evaluator.accuracies_runs`) predicts what evaluating each run on its own predicts, with and
without the trunk cache and prototype normalisation; a method without its own evaluates the group's
runs one by one through `accuracies`. tests/test_parallel_runs.py runs the one-call evaluation through
the pipeline, and on 4 devices with `one_call_equals_per_run` below."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import far_above_chance
from f2m_jax import evaluation
from f2m_jax import evaluator as evaluator_lib
from f2m_jax import experiment as experiment_lib
from f2m_jax import objectives
from f2m_jax import pipeline
from f2m_jax import sessions
from f2m_jax import trees
from f2m_jax.checkpoint import Checkpoints
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.data import sources
from f2m_jax.methods import Runner

# The mapped program and a run's own round differently (other summation orders, grouped
# convolutions): in float64 by a few ulps per operation, far below TIE_MARGIN even through the whole
# network, so a prediction could only change where a test image's two nearest prototypes are within
# TIE_MARGIN (relative to its nearest distance) of a tie. The tests check that no image is, so that
# equal predictions are what correct code gives, and then ask for them exactly.
TIE_MARGIN = 1e-9


def _float64_setup(cache: bool, normalize: bool):
  """The smoke config's benchmark and network in float64 (eval.batch_size 250: its 720 test images
  are 3 batches, the last one padded), an Evaluator of its noise set, and 3 runs whose noise sets
  moved by different amounts. Call under jax.enable_x64."""
  from configs import cifar100  # pylint: disable=g-import-not-at-top
  config = cifar100.get_config('smoke')
  config.eval.update(cache_trunk=cache, normalize_prototypes=normalize)
  config = pipeline.resolve(config)
  exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
  exp = dataclasses.replace(exp, model=exp.model.clone(dtype=jnp.float64))
  state = exp.init_state()
  to64 = lambda tree: jax.tree_util.tree_map(lambda v: np.asarray(v, np.float64), tree)
  params, stats = to64(state.params), to64(state.batch_stats)
  paths = exp.trainable_paths(params)
  ev = evaluator_lib.Evaluator(exp, {'params': params, 'batch_stats': stats}, paths)
  assert (ev._trunk is not None) == cache  # pylint: disable=protected-access
  rng = np.random.default_rng(0)
  flat = trees.flatten(params)
  runs = [trees.unflatten({p: v + scale * np.std(v) * rng.normal(size=v.shape) if p in set(paths) else v
                           for p, v in flat.items()}) for scale in (0.1, 0.3, 0.6)]
  return exp, ev, stats, runs


def one_call_equals_per_run(cache: bool, normalize: bool) -> None:
  """Asserts that `Evaluator.accuracies_runs` of 3 runs predicts, for sessions 2 and the last, exactly
  what `Evaluator.accuracies` predicts for each run alone (float64, no test image near a tie), and
  that the classes past the seen ones are never predicted."""
  with jax.enable_x64(True):
    exp, ev, stats, runs = _float64_setup(cache, normalize)
    bench = exp.bench
    embeddings = [ev.embeddings({'params': p, 'batch_stats': stats}, changed=True) for p in runs]
    # Each run's prototypes: its own class means of the test embeddings, so that NCM is far from chance
    # and a mix-up of runs would show.
    all_protos = [evaluation.prototypes(e, bench.test.labels, range(bench.num_seen_classes(bench.num_sessions)))
                  for e in embeddings]
    predicted, original = [], evaluation.accuracies_from_predictions

    def record(pred, labels, num_base):
      predicted.append(np.asarray(pred))
      return original(pred, labels, num_base)

    for session in (2, bench.num_sessions):
      seen, idx = bench.num_seen_classes(session), protocol_lib.test_indices(bench, session)
      protos = [p[:seen] for p in all_protos]
      for e, p in zip(embeddings, protos):  # the premise of comparing predictions exactly
        d = np.sort(objectives.pairwise_distance(e[idx], objectives.normalize_prototypes(p) if normalize else p,
                                                 'squared_euclidean'), axis=1)
        assert np.min((d[:, 1] - d[:, 0]) / np.maximum(d[:, 0], 1e-30)) > TIE_MARGIN
      with pytest.MonkeyPatch.context() as m:
        m.setattr(evaluation, 'accuracies_from_predictions', record)
        alone = [ev.accuracies({'params': p, 'batch_stats': stats}, q, session, changed=True)
                 for p, q in zip(runs, protos)]
        together = ev.accuracies_runs(runs, protos, session)
      assert len(predicted) == 6 and all(len(p) == len(idx) for p in predicted)
      for a, b in zip(predicted[:3], predicted[3:]):
        np.testing.assert_array_equal(b, a)
      assert together == alone
      assert len({a['acc'] for a in alone}) == 3  # the runs predict differently: a mix-up would show
      assert all(far_above_chance(a['acc'], len(idx), seen) for a in alone)  # NCM means something here
      # The padding classes are never predicted, whatever their rows: here each is a copy of a test
      # embedding, at distance 0 of its image.
      if session == 2:
        classes = evaluation.eval_shapes(bench)[1]
        decoys = [np.concatenate([p, e[:classes - seen]]) for p, e in zip(protos, embeddings)]
        ncm_runs = exp.programs.get(*evaluator_lib.ncm_runs_spec(exp, ev.paths, ev.block))
        inputs = bench.test.images if ev._trunk is None else ev._trunk  # pylint: disable=protected-access
        pred = ncm_runs([trees.split(p, ev.paths)[0] for p in runs], trees.split(runs[0], ev.paths)[1], stats, inputs,
                        decoys, seen)
        np.testing.assert_array_equal(pred[:, idx], predicted[3:])
      predicted.clear()


@pytest.mark.parametrize('cache,normalize', [(True, False), (False, True)])  # each value of each switch
def test_one_call_equals_each_run_alone(cache, normalize):
  one_call_equals_per_run(cache, normalize)


def test_evaluator_accuracies_runs_checks_its_arguments():
  with jax.enable_x64(True):
    _, ev, _, runs = _float64_setup(True, True)
    protos = [np.zeros((22, 4)), np.zeros((24, 4)), np.zeros((22, 4))]
    with pytest.raises(ValueError, match=r'same number of classes per run.*\[22, 24\] classes for 3 runs'):
      ev.accuracies_runs(runs, protos, 2)


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
