"""Checkpoints: bit-exact save/restore, resume after interruption, eval mode, and bad input (the NaN
stop and its last good checkpoint: tests/test_base_program.py)."""
import json
import os
import shutil

import chex
import jax
import numpy as np
import pytest

from conftest import snapshot, without_provenance
from f2m_jax import base as base_lib
from f2m_jax import experiment as experiment_lib
from f2m_jax import pipeline
from f2m_jax.data import sources
from f2m_jax.checkpoint import CheckpointError, Checkpoints
from f2m_jax.workdir import WorkdirError



def same_results(a: dict, b: dict) -> bool:
  """Equal results; only the provenance (when, how long) may differ between two runs."""
  return without_provenance(a) == without_provenance(b)

def tiny_config():
  from configs import cifar100
  c = cifar100.get_config('smoke')
  c.data.synthetic.num_sessions = 4
  c.base.steps = 30
  c.base.checkpoint_every = 10
  c.base.milestones = (20,)
  return c


class Interrupt(Exception):
  pass


def interrupt_at(event, **where):
  def hook(name, **info):
    if name == event and all(info[k] == v for k, v in where.items()):
      raise Interrupt(f'{name} {info}')
  return hook


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('reference'))
  return workdir, pipeline.run(tiny_config(), workdir)


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
  ckpts.save_base_state(1, state)
  _leaves_equal(jax.device_get(state), ckpts.restore_base_state(exp.state_template(), 1))  # zeros of the shapes
  protos = np.random.default_rng(0).normal(size=(20, 32)).astype(np.float32)
  ckpts.save_model(state.params, state.batch_stats, protos)
  template = {'params': state.params, 'batch_stats': state.batch_stats, 'prototypes': np.zeros_like(protos)}
  _leaves_equal({'params': jax.device_get(state.params), 'batch_stats': jax.device_get(state.batch_stats),
                 'prototypes': protos}, ckpts.restore_model(template))
  ckpts.close()


@pytest.mark.slow
def test_resume_after_interrupted_base_training(reference, tmp_path):
  ref_dir, ref = reference
  workdir = str(tmp_path / 'w')
  with pytest.raises(Interrupt):
    pipeline.run(tiny_config(), workdir, hook=interrupt_at('base_step', step=15))
  assert Checkpoints(workdir).latest_base_step() == 10
  assert same_results(pipeline.run(tiny_config(), workdir), ref)


@pytest.mark.slow
def test_resume_with_test_set_selection_keeps_the_best_so_far(tmp_path):
  """base.select_on_test resumed after the best model was saved: the selector restores the best
  accuracy so far, and the run ends as an uninterrupted one."""
  config = tiny_config()
  config.base.update(select_on_test=True, select_every=10)
  config.runs = 1
  whole = pipeline.run(config, str(tmp_path / 'whole'))
  workdir = str(tmp_path / 'w')
  with pytest.raises(Interrupt):
    pipeline.run(config, workdir, hook=interrupt_at('base_step', step=25))
  assert Checkpoints(workdir).best_base_step() in (10, 20)
  assert same_results(pipeline.run(config, workdir), whole)


@pytest.mark.slow
def test_resume_after_interrupted_sessions(reference, tmp_path):
  _, ref = reference
  workdir = str(tmp_path / 'w')
  with pytest.raises(Interrupt):
    pipeline.run(tiny_config(), workdir, hook=interrupt_at('session', run=1, session=3))
  assert Checkpoints(workdir).sessions_done(1) == [2, 3]
  assert same_results(pipeline.run(tiny_config(), workdir), ref)


@pytest.mark.slow
def test_eval_mode_reproduces_results(reference, capsys):
  ref_dir, ref = reference
  before = open(os.path.join(ref_dir, 'results.json')).read()
  assert same_results(pipeline.run(tiny_config(), ref_dir, mode='eval'), ref)
  assert 'reproduced' in capsys.readouterr().out
  assert open(os.path.join(ref_dir, 'results.json')).read() == before


@pytest.mark.slow
def test_new_sessions_from_another_workdirs_base_model(reference, tmp_path):
  ref_dir, ref = reference
  config = tiny_config()
  config.eval.normalize_prototypes = False
  workdir = str(tmp_path / 'other')
  results = pipeline.run(config, workdir, checkpoint=ref_dir)
  assert results != ref  # other incremental settings (raw prototypes) ...
  assert Checkpoints(workdir).latest_base_step() is None  # ... on the same base model: nothing retrained
  assert os.listdir(os.path.join(workdir, 'checkpoints', 'run_0'))
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    done = [json.loads(line) for line in f if '"done"' in line]
  assert done[-1]['base_checkpoint'] == os.path.abspath(ref_dir)  # where the base model came from


@pytest.mark.slow
def test_checkpoint_of_another_network_is_refused_before_anything_is_written(reference, tmp_path):
  ref_dir, _ = reference
  config = tiny_config()
  config.method = 'rebalance'  # a cosine classifier: the reference holds a linear one
  workdir = tmp_path / 'other'
  with pytest.raises(CheckpointError, match="model.head='linear' there, 'cosine' here"):
    pipeline.run(config, str(workdir), checkpoint=ref_dir)
  assert not workdir.exists()


def _copy(reference, tmp_path):
  workdir = str(tmp_path / 'copy')
  shutil.copytree(reference[0], workdir)
  return workdir


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['train', 'eval'])
def test_corrupt_checkpoint_is_reported(reference, tmp_path, mode):
  workdir = _copy(reference, tmp_path)
  if mode == 'train':  # a run that stopped after its sessions were saved: a finished one is not reread
    os.remove(os.path.join(workdir, 'results.json'))
  session_dir = os.path.join(workdir, 'checkpoints', 'run_0', '3')
  for root, _, files in os.walk(session_dir):
    for f in files:
      with open(os.path.join(root, f), 'wb') as fh:
        fh.write(b'garbage')
  before = snapshot(workdir)
  with pytest.raises(CheckpointError, match=r'run_0/3.*(corrupt|truncated)'):
    pipeline.run(tiny_config(), workdir, mode=mode)
  assert snapshot(workdir) == before


@pytest.mark.slow
def test_deleted_checkpoints_are_reported(reference, tmp_path):
  workdir = _copy(reference, tmp_path)
  os.remove(os.path.join(workdir, 'results.json'))  # stopped before the end: a finished run is not reread
  shutil.rmtree(os.path.join(workdir, 'checkpoints', 'run_1', '2'))
  before = snapshot(workdir)
  with pytest.raises(CheckpointError, match=r'run_1.*\[2\] are missing'):
    pipeline.run(tiny_config(), workdir)
  assert snapshot(workdir) == before
  shutil.rmtree(os.path.join(workdir, 'checkpoints', 'model'))
  with pytest.raises(CheckpointError, match='no base model checkpoint'):
    pipeline.run(tiny_config(), workdir)


@pytest.mark.slow
def test_changed_config_is_refused_but_eval_only_fields_are_not(reference, tmp_path):
  workdir = _copy(reference, tmp_path)
  config = tiny_config()
  config.incremental.lr = 0.02
  config.runs = 3
  before = snapshot(workdir)
  with pytest.raises(WorkdirError, match=r'incremental.lr: saved 0.01, now 0.02.*runs: saved 2, now 3'):
    pipeline.run(config, workdir)
  assert snapshot(workdir) == before
  config = tiny_config()
  config.eval.batch_size = 100
  assert same_results(pipeline.run(config, workdir, mode='eval'), reference[1])

