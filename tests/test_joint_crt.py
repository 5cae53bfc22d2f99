"""Joint training and cRT through the pipeline (the paper's upper bound rows), on a tiny synthetic
protocol of one incremental session: end to end, resumable, cRT changes only the classifier, and its
class-aware sampler."""
import types

import chex
import jax
import numpy as np
import pytest

from configs import cifar100
from conftest import without_provenance
from f2m_jax import experiment as experiment_lib
from f2m_jax import train_loop, trees
from f2m_jax.data import protocol, sources
from f2m_jax.methods import joint
from f2m_jax.models import torch_import
from f2m_jax.run import pipeline
from f2m_jax.run import workdir as workdir_lib
from f2m_jax.run.checkpoint import Checkpoints, Folder


def tiny(config, method, num_sessions=2):
  config.method = method
  config.runs = 2
  config.data.synthetic.update(num_base=6, way=2, num_sessions=num_sessions, train_per_class=20, test_per_class=10)
  config.base.update(steps=12, milestones=(8,), batch_size=24, ways=6, log_every=4, checkpoint_every=4)
  config.crt.update(epochs=2, milestones=(1,), batch_size=12)
  return config


@pytest.fixture(scope='module')
def workdirs(tmp_path_factory):
  root = tmp_path_factory.mktemp('upper')
  joint = pipeline.run(tiny(cifar100.get_config('smoke'), 'joint'), str(root / 'joint'))
  crt = pipeline.run(tiny(cifar100.get_config('smoke'), 'crt'), str(root / 'crt'), checkpoint=str(root / 'joint'))
  return root, joint, crt


@pytest.mark.slow
def test_joint_sessions_start_from_the_pretrained_trunk(monkeypatch, tmp_path):
  """model.pretrained reaches the network of every joint session (and so cRT's), not only session
  1's: the trunk and BN statistics are the file's, the classifier of the session's size a fresh init
  from the session's key."""
  config = tiny(cifar100.get_config('smoke'), 'joint', num_sessions=3)
  weights = tmp_path / 'resnet18.pth'
  weights.touch()  # read_state_dict is replaced below; the file need only exist (validation checks it)
  config.model.arch, config.model.pretrained = 'resnet18', str(weights)
  config = pipeline.resolve(config)
  exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
  rng = np.random.default_rng(0)
  shapes = exp.state_shapes()  # the 6 base classes' network: the file's classifier has another size
  params, stats = (jax.tree_util.tree_map(lambda s: rng.normal(size=s.shape).astype(np.float32), tree)
                   for tree in (shapes.params, shapes.batch_stats))
  monkeypatch.setattr(torch_import, 'read_state_dict', lambda path: torch_import.to_state_dict(params, stats))
  started = []
  record = lambda exp_, model, noise, members, states, *rest: started.append(states) or states
  monkeypatch.setattr(train_loop, 'train_steps', record)
  fresh = types.SimpleNamespace(save=None, latest_step=lambda: None)  # a training, none saved yet
  network, key = exp.network(exp.bench.num_seen_classes(3)), exp.key(4, 0, 3)
  joint.train_network(exp, network, exp.bench.base_train, key, fresh, None, 'joint run 0 session 3',
                      (0, 3))
  state = trees.index(started[0], 0)
  trunk = lambda p: {k: v for k, v in p.items() if k != 'fc'}
  chex.assert_trees_all_equal(trunk(state.params), trunk(params))
  chex.assert_trees_all_equal(state.batch_stats, stats)
  chex.assert_trees_all_equal(state.params['fc'], exp.init_program(network)(key, None, None).params['fc'])
  assert state.params['fc']['kernel'].shape[-1] == 10


class Interrupt(Exception):
  pass


@pytest.mark.slow
def test_joint_sessions_chosen_on_test_keep_the_best_network_through_a_resume(monkeypatch, tmp_path):
  """base.select_on_test on joint (the authors' model selection, docs/method.md): every base.select_every
  steps a session's network is measured on the test images of the classes seen so far (the selector's
  accuracy is joint's linear one), and the session ends with the network of the best accuracy (staged here:
  step 4's; step 12's equal one does not replace it), not the last step's; a training interrupted after the
  selection of step 8 and resumed from the checkpoint of step 4 ends with the same network, and the log holds
  each of its select lines once, beside the base session's of the same steps. The config is the `workdirs`
  fixture's with selections every 4 steps: its programs are the fixture's."""
  config = tiny(cifar100.get_config('smoke'), 'joint')  # a checkpoint every 4 steps
  config.base.update(select_on_test=True, select_every=4)
  config = pipeline.resolve(config)
  exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
  staged = {4: 50.0, 8: 40.0, 12: 50.0}
  seen, measure, select = {}, train_loop.TestSetSelector.accuracy, train_loop.TestSetSelector.__call__
  monkeypatch.setattr(train_loop.TestSetSelector, '__call__',
                      lambda self, step, state: seen.update(step=step, **{str(step): state.params}) or
                      select(self, step, state))
  monkeypatch.setattr(train_loop.TestSetSelector, 'accuracy', lambda self, variables: staged[seen['step']])
  shots = protocol.session_shots(exp.bench, 'draws', 0, 2, 5, 0)

  def session(name, save_fails_at=None):
    save = Folder.save

    def failing(self, step, state):  # the interruption: the save of that step, after its selection
      if step == save_fails_at:
        raise Interrupt(step)
      save(self, step, state)

    ckpts = Checkpoints(str(tmp_path / name))
    with monkeypatch.context() as m:
      m.setattr(Folder, 'save', failing)
      runner = joint.JointRunner(exp, exp.variables_template(), ckpts, log=workdir_lib.MetricsLog(str(tmp_path / name)))
      try:
        return runner, runner.update(None, 0, 2, shots)[0]
      finally:
        ckpts.close()

  for name in ('whole', 'resumed'):
    (tmp_path / name).mkdir()
  for s in staged:  # the base session's selections, logged by an earlier invocation
    workdir_lib.MetricsLog(str(tmp_path / 'whole')).write(phase='select_on_test', step=s, base_test_acc=0.0)
  runner, whole = session('whole')
  assert seen.get('step') == 12  # the selection ran
  chex.assert_trees_all_equal(whole['params'], seen['4'])
  assert not np.array_equal(whole['params']['fc']['kernel'], seen['12']['fc']['kernel'])
  lines = [r for r in workdir_lib.MetricsLog(str(tmp_path / 'whole')).records() if r.get('session') == 2]
  assert [(r['run'], r['step'], r['seen_test_acc'], r['best_step']) for r in lines] == [
      (0, s, a, 4) for s, a in staged.items()]
  assert not list((tmp_path / 'whole' / 'checkpoints' / 'training').iterdir())  # the train states, the best: removed
  network, unused = runner.network(2), Checkpoints(str(tmp_path / 'probe'))
  probe = train_loop.TestSetSelector(exp, network, 2, unused.best_base, None)
  assert measure(probe, whole) == runner.accuracies(whole, 2)['acc']  # the seen classes'
  unused.close()
  with pytest.raises(Interrupt):
    session('resumed', save_fails_at=8)
  ckpts = Checkpoints(str(tmp_path / 'resumed'))
  training = ckpts.training(0, 2)
  assert training.latest_step() == 4 and training.best.latest_step() == 4
  training.close()
  ckpts.close()
  _, resumed = session('resumed')
  chex.assert_trees_all_equal(resumed, whole)
  lines = [r for r in workdir_lib.MetricsLog(str(tmp_path / 'resumed')).records() if r.get('session') == 2]
  assert [r['step'] for r in lines] == list(staged)


def test_crt_reinitialises_any_head_of_the_linear_family():
  """cRT's fresh classifier, N(0, 0.001) and a zero bias, also for the bias-free head
  (model.head='linear_no_bias'); the trunk untouched."""
  trunk = {'conv1': {'kernel': np.ones((3, 3, 3, 4), np.float32)}}
  linear = {**trunk, 'fc': {'kernel': np.ones((64, 10), np.float32), 'bias': np.ones(10, np.float32)}}
  fresh = joint._reinit_classifier(linear, jax.random.key(0))  # pylint: disable=protected-access
  assert np.all(np.asarray(fresh['fc']['bias']) == 0) and np.abs(np.asarray(fresh['fc']['kernel'])).max() < 1e-2
  no_bias = joint._reinit_classifier({**trunk, 'fc': {'kernel': linear['fc']['kernel']}}, jax.random.key(0))  # pylint: disable=protected-access
  assert set(no_bias['fc']) == {'kernel'}
  np.testing.assert_array_equal(no_bias['fc']['kernel'], fresh['fc']['kernel'])
  chex.assert_trees_all_equal(no_bias['conv1'], trunk['conv1'])


@pytest.mark.slow
def test_joint_and_crt_end_to_end(workdirs):
  root, joint, crt = workdirs
  for results in (joint, crt):
    assert [s['num_classes'] for s in results['sessions']] == [6, 8]
    assert len(results['sessions'][1]['acc']['runs']) == 2 and 'prototype_norms' not in results
  assert joint['method'] == 'joint' and crt['method'] == 'crt'
  assert crt['sessions'][0] == joint['sessions'][0]  # session 1 is joint's network and classifier, as theirs
  # every run trains on its own draw of the shots: a session's network differs between runs
  ck = Checkpoints(str(root / 'joint'), read_only=True)
  assert ck.sessions_done(0) == ck.sessions_done(1) == [2]
  assert not list((root / 'joint' / 'checkpoints' / 'training').iterdir())  # train states removed once saved


def _session(root, name, run, session, runner_exp):
  ck = Checkpoints(str(root / name), read_only=True)
  template = runner_exp.variables_template(runner_exp.network(runner_exp.bench.num_seen_classes(session)))
  exemplars = np.concatenate([protocol.session_shots(runner_exp.bench, 'draws', run, t, 5, 0)
                              for t in range(2, session + 1)])
  return ck.run(run).restore({**template, 'exemplars': exemplars, 'accuracy': np.zeros(4)}, session)


@pytest.mark.slow
def test_crt_changes_only_the_classifier(workdirs):
  root, _, _ = workdirs
  config = pipeline.resolve(tiny(cifar100.get_config('smoke'), 'joint'))
  exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
  a, b = _session(root, 'joint', 1, 2, exp), _session(root, 'crt', 1, 2, exp)
  trunk = lambda params: {k: v for k, v in params.items() if k != 'fc'}
  chex.assert_trees_all_equal(trunk(a['params']), trunk(b['params']))
  for path, v in trees.flatten(a['params']['fc']).items():
    assert not np.allclose(v, trees.flatten(b['params']['fc'])[path])
  chex.assert_trees_all_equal(a['batch_stats'], b['batch_stats'])  # BN statistics frozen while the classifier retrains


@pytest.mark.slow
def test_crt_resumes_and_needs_a_joint_workdir(workdirs, tmp_path):
  root, _, crt = workdirs
  again = pipeline.run(tiny(cifar100.get_config('smoke'), 'crt'), str(root / 'crt'), mode='eval',
                       checkpoint=str(root / 'joint'))
  assert without_provenance(again) == without_provenance(crt)  # everything restored, nothing retrained
  with pytest.raises(ValueError, match='--checkpoint JOINT_WORKDIR'):
    pipeline.run(tiny(cifar100.get_config('smoke'), 'crt'), str(tmp_path / 'alone'))


def test_class_aware_sampler_is_balanced():
  labels = np.repeat(np.arange(6), [30, 30, 5, 30, 12, 30])  # imbalanced, as base + few shots
  pool = np.arange(len(labels))
  epoch = protocol.class_aware_epoch(labels, pool, per_class=4, seed=0, epoch=0)
  assert len(epoch) == 30 * 6
  counts = np.bincount(labels[epoch], minlength=6)
  assert counts.max() - counts.min() <= 4  # each visit takes 4 of one class
  blocks = labels[epoch][:len(epoch) // 4 * 4].reshape(-1, 4)
  assert (blocks == blocks[:, :1]).all()  # 4 consecutive images of one class per visit
  # a rare class's 5 images are cycled, each at least 5 times in the epoch
  assert np.bincount(epoch[labels[epoch] == 2], minlength=len(labels))[labels == 2].min() >= 5
  np.testing.assert_array_equal(epoch, protocol.class_aware_epoch(labels, pool, 4, 0, 0))
