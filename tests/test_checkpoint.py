"""Checkpoints: bit-exact save/restore, resume after interruption, and bad input (eval mode:
tests/test_records.py; the NaN stop and its last good checkpoint: tests/test_base_program.py; resume
of base training after a signal: tests/test_interrupt.py, after SIGKILL: tests/test_faults.py)."""
import json
import os
import shutil

import chex
import jax
import numpy as np
import pytest

from conftest import Interrupt, copy_of, snapshot, tiny_smoke as tiny_config, without_provenance
from f2m_jax import base as base_lib
from f2m_jax import experiment as experiment_lib
from f2m_jax import train_loop
from f2m_jax.data import sources
from f2m_jax.files import CheckpointError
from f2m_jax.run import pipeline
from f2m_jax.run.checkpoint import Checkpoints


def interrupt_at(event, **where):
  """A hook that raises Interrupt at the `event` whose info has `where`'s values."""
  def hook(name, **info):
    if name == event and all(info[k] == v for k, v in where.items()):
      raise Interrupt(f'{name} {info}')
  return hook


def _leaves_equal(a, b):
  """The same tree bit for bit: structure, dtypes, shapes and every byte of every leaf."""
  chex.assert_trees_all_equal(a, b, strict=True)
  as_bytes = lambda tree: jax.tree.map(lambda x: np.frombuffer(np.asarray(x).tobytes(), np.uint8), tree)
  chex.assert_trees_all_equal(as_bytes(a), as_bytes(b))


def test_save_restore_is_bit_identical(tmp_path):
  config = pipeline.resolve(tiny_config())
  bench = sources.load_benchmark(config)
  exp = experiment_lib.Experiment.create(config, bench)
  rng = np.random.default_rng(0)
  # Every float leaf random, the momentum included (a fresh optimizer's is all zeros).
  rand = lambda tree: jax.tree.map(lambda x: rng.normal(size=np.shape(x)).astype(x.dtype)
                                   if np.issubdtype(x.dtype, np.floating) else np.asarray(x), jax.device_get(tree))
  init = exp.init_state()
  state = base_lib.TrainState(np.int32(1), rand(init.params), rand(init.batch_stats), rand(init.opt_state))
  assert any(np.abs(x).max() > 0 for x in jax.tree.leaves(state.opt_state))  # a momentum to save
  ckpts = Checkpoints(str(tmp_path))
  ckpts.base.save(1, state)
  _leaves_equal(jax.device_get(state), ckpts.base.restore(exp.state_template(), 1))  # zeros of the shapes
  protos = np.random.default_rng(0).normal(size=(20, 32)).astype(np.float32)
  ckpts.model.save(0, {'params': state.params, 'batch_stats': state.batch_stats, 'prototypes': protos})
  template = {'params': state.params, 'batch_stats': state.batch_stats, 'prototypes': np.zeros_like(protos)}
  _leaves_equal({'params': jax.device_get(state.params), 'batch_stats': jax.device_get(state.batch_stats),
                 'prototypes': protos}, ckpts.restore_model(template))
  ckpts.close()


def _check_the_selection_is_said_and_used(results: dict, workdir: str, config) -> None:
  """base.select_on_test's outputs: results.json says the base model was chosen on test images and
  which step (the first of equal bests: a strictly better one replaces), the metrics log holds every
  selection, and the base model the sessions used is the selected one."""
  info = results['base_model']
  assert info['selection'] == 'best_base_test_accuracy' and info['reads_test_set'] and info['every'] == 5
  with open(os.path.join(workdir, 'results.json')) as f:
    assert json.load(f)['base_model'] == info
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    selections = [m for m in map(json.loads, f) if m['phase'] == 'select_on_test']
  assert [m['step'] for m in selections] == [5, 10, 15, 20]
  accs = [m['base_test_acc'] for m in selections]
  assert info['step'] == selections[int(np.argmax(accs))]['step']
  assert selections[-1]['best_base_test_acc'] == max(accs)
  resolved = pipeline.resolve(config)
  exp = experiment_lib.Experiment.create(resolved, sources.load_benchmark(resolved))
  ckpts = Checkpoints(workdir, read_only=True)
  best = ckpts.best_base.restore({**exp.variables_template(), 'test_acc': np.zeros((), np.float64)})
  model = ckpts.restore_model({**exp.variables_template(),
                               'prototypes': np.zeros((exp.bench.num_base_classes, exp.embedding_dim()), np.float32)})
  chex.assert_trees_all_equal((model['params'], model['batch_stats']), (best['params'], best['batch_stats']))
  if info['step'] != config.base.steps:
    last = ckpts.base.restore(exp.state_template(), config.base.steps)
    assert not np.array_equal(last.params['fc']['kernel'], best['params']['fc']['kernel'])
  ckpts.close()
  from f2m_jax.run import report  # pylint: disable=g-import-not-at-top
  assert 'chosen on test images' in report.format_session_table(results)
  rows = report.build_rows([workdir], ['selected'])
  assert 'chosen on test images' in report.format_table(rows)
  assert 'chosen on the base classes\' test images' in report.format_report(rows)
  # Without the field the result says it used the last step.
  assert train_loop.selection_info(tiny_config(), None) == {'selection': 'last', 'step': config.base.steps}


@pytest.mark.slow
def test_resume_with_test_set_selection_keeps_the_best_so_far(tmp_path):
  """base.select_on_test (opt-in: the reference run selects nothing, test_fidelity.py) resumed after the
  best model was saved: the selector restores the best accuracy so far, and the run ends as an
  uninterrupted one, whose outputs say the selection and use it."""
  config = tiny_config(**{'base.select_on_test': True, 'base.select_every': 5, 'runs': 1})  # the reference's shapes
  whole = pipeline.run(config, str(tmp_path / 'whole'))
  _check_the_selection_is_said_and_used(whole, str(tmp_path / 'whole'), config)
  workdir = str(tmp_path / 'w')
  with pytest.raises(Interrupt):  # after the selections of steps 5, 10 and 15; the checkpoint is step 10's
    pipeline.run(config, workdir, hook=interrupt_at('base_step', step=15))
  ckpts = Checkpoints(workdir, read_only=False)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    selected = [json.loads(line) for line in f if '"select_on_test"' in line]
  assert [r['step'] for r in selected] == [5, 10, 15] and ckpts.best_base.latest_step() in (5, 10, 15)
  resolved = pipeline.resolve(config)
  exp = experiment_lib.Experiment.create(resolved, sources.load_benchmark(resolved))
  selector = train_loop.TestSetSelector(exp, exp.model, 1, ckpts.best_base, log=None)
  assert selector.best == max(r['base_test_acc'] for r in selected)  # not -1
  ckpts.close()
  assert without_provenance(pipeline.run(config, workdir)) == without_provenance(whole)


@pytest.mark.slow
def test_resume_after_interrupted_sessions(reference, tmp_path):
  _, ref = reference
  workdir = str(tmp_path / 'w')
  with pytest.raises(Interrupt):
    pipeline.run(tiny_config(), workdir, hook=interrupt_at('session', run=1, session=2))
  assert Checkpoints(workdir).sessions_done(1) == [2]
  assert without_provenance(pipeline.run(tiny_config(), workdir)) == without_provenance(ref)


@pytest.mark.slow
@pytest.mark.parametrize('change,message', [
    ({'method': 'rebalance'}, "model.head='linear' there, 'cosine' here"),  # a cosine classifier
    ({'data.synthetic.num_base': 30}, r"checkpoints/model/0 holds arrays of other shapes.*"
                                      r"\['fc'\]\['bias'\] \(20,\) there, \(30,\) here"),
], ids=['other head', 'other base classes'])
def test_checkpoint_of_another_network_is_refused_before_anything_is_written(reference, tmp_path, change, message):
  workdir = tmp_path / 'other'
  with pytest.raises(CheckpointError, match=message):
    pipeline.run(tiny_config(**change), str(workdir), checkpoint=reference[0])
  assert not workdir.exists()


@pytest.mark.slow
def test_deleted_checkpoints_are_reported(reference, tmp_path):
  workdir = copy_of(reference, tmp_path, unfinished=True)  # stopped before the end: a finished run is not reread
  shutil.rmtree(os.path.join(workdir, 'checkpoints', 'run_1', '2'))
  before = snapshot(workdir)
  with pytest.raises(CheckpointError, match=r'run_1.*\[2\] are missing'):
    pipeline.run(tiny_config(), workdir)
  assert snapshot(workdir) == before
  shutil.rmtree(os.path.join(workdir, 'checkpoints', 'model'))
  with pytest.raises(CheckpointError, match='no base model checkpoint'):
    pipeline.run(tiny_config(), workdir)
