"""What a workdir records: a failed start writes nothing, a finished run is never rewritten, eval
reproduces its results or writes beside them, and the results name the base model they were computed
on (--checkpoint)."""
import json
import os

import numpy as np
import pytest

from conftest import copy_of, run_py, snapshot, tiny_smoke as tiny_config
from f2m_jax.data import cifar100, index_lists
from f2m_jax.data.types import DataError
from f2m_jax.files import CheckpointError
from f2m_jax.files import WorkdirError
from f2m_jax.run import cli
from f2m_jax.run import pipeline
from f2m_jax.run import report
from f2m_jax.run.checkpoint import Checkpoints


# ----------------------------------------------------------------------------- a failed start writes nothing

@pytest.fixture
def offline(monkeypatch, tmp_path):
  """No data anywhere and no network: the download addresses point at a file that does not exist."""
  monkeypatch.setenv('F2M_CACHE_DIR', str(tmp_path / 'cache'))
  monkeypatch.delenv('F2M_DATA_DIR', raising=False)
  monkeypatch.setenv('TFDS_DATA_DIR', str(tmp_path / 'tensorflow_datasets'))
  monkeypatch.setattr(cifar100, 'ARCHIVE_URL', (tmp_path / 'no-such-archive.tar.gz').as_uri())
  monkeypatch.setattr(index_lists, 'BASE_URL', (tmp_path / 'no-such-lists').as_uri())
  return tmp_path


def cifar100_config(arg=None):
  from configs import cifar100 as cifar100_config
  return cifar100_config.get_config(arg) if arg else cifar100_config.get_config()


def test_no_data_leaves_no_workdir_and_blocks_no_other_config(offline, tmp_path):
  workdir = tmp_path / 'w'
  with pytest.raises(DataError):
    pipeline.run(cifar100_config(), str(workdir))
  assert not workdir.exists()
  empty = tmp_path / 'data'
  empty.mkdir()
  config = cifar100_config('trainsplit')
  config.data.data_dir = str(empty)
  with pytest.raises(DataError, match='cifar100'):  # not WorkdirError: the first attempt left nothing behind
    pipeline.run(config, str(workdir))
  assert not workdir.exists()


def test_checkpoint_of_a_missing_folder_leaves_no_workdir(tmp_path):
  workdir = tmp_path / 'w'
  with pytest.raises(CheckpointError, match=str(tmp_path / 'no-such-run')):
    pipeline.run(tiny_config(), str(workdir), checkpoint=str(tmp_path / 'no-such-run'))
  (tmp_path / 'sweep' / 'member_0').mkdir(parents=True)
  with pytest.raises(CheckpointError, match=f'a sweep: pass a member, e.g. --checkpoint {tmp_path}/sweep/member_0$'):
    pipeline.run(tiny_config(), str(workdir), checkpoint=str(tmp_path / 'sweep'))
  assert not workdir.exists()


@pytest.mark.parametrize('exists', [False, True])
def test_eval_of_a_folder_without_a_run_changes_nothing(tmp_path, exists):
  workdir = tmp_path / 'w'
  if exists:
    workdir.mkdir()
    (workdir / 'notes.txt').write_text('mine')
  with pytest.raises(CheckpointError, match='nothing to evaluate'):
    pipeline.run(tiny_config(), str(workdir), mode='eval')
  assert (os.listdir(workdir) == ['notes.txt']) if exists else not workdir.exists()


# ----------------------------------------------------------------------------- a finished run is kept

@pytest.mark.slow
def test_rerun_of_a_finished_run_rewrites_nothing_but_a_lost_results_csv(reference, tmp_path, capsys):
  workdir = copy_of(reference, tmp_path)
  os.remove(os.path.join(workdir, 'results.csv'))
  before = snapshot(workdir)
  capsys.readouterr()
  assert cli.main(tiny_config(), workdir, 'train') == 0
  out = capsys.readouterr().out
  assert 'already complete' in out and 'results written' not in out and 'results.csv was missing and was' in out
  assert report.format_session_table(reference[1]) in out  # the saved table, printed again
  after = snapshot(workdir)
  assert after.pop('results.csv') == snapshot(reference[0])['results.csv']
  assert {k: v for k, v in after.items() if k != 'lock'} == {k: v for k, v in before.items() if k != 'lock'}


@pytest.mark.slow
def test_the_accuracy_matrix_agrees_with_the_session_accuracies(reference):
  """Run by run, the accuracy after session j is the mean of the matrix's column j weighted by each
  session's test images, and the base classes' row is acc_base."""
  _, results = reference
  runs = np.asarray(results['accuracy_matrix']['runs'], np.float64)  # [run, session of origin, after session]
  images = np.asarray([20 * 20, 20 * 2, 20 * 2], np.float64)  # 20 test images of each class: 20 base, then 2 a session
  for j, s in enumerate(results['sessions']):
    np.testing.assert_allclose(runs[:, :j + 1, j] @ images[:j + 1] / images[:j + 1].sum(), s['acc']['runs'], rtol=1e-12)
    np.testing.assert_allclose(runs[:, 0, j], s['acc_base']['runs'], rtol=1e-12)
    assert results['accuracy_matrix']['mean'][0][j] == pytest.approx(s['acc_base']['mean'], rel=1e-12)
  assert np.isnan(runs[:, 1, 0]).all() and results['accuracy_matrix']['mean'][2][1] is None


# ----------------------------------------------------------------------------- the base model's source

def sources_line(workdir: str) -> str:
  text = report.format_report(report.build_rows([workdir]))
  return text.split('## Sources', 1)[1].strip()


@pytest.mark.slow
def test_sessions_on_another_workdirs_base_model_name_their_source(reference, tmp_path, monkeypatch, capsys):
  """--checkpoint W: new sessions on W's base model, nothing retrained; the start line, results.json,
  config.json and the report's sources line name W and the command line's changes; the workdir is then
  resumed and evaluated only with that --checkpoint."""
  ref_dir, ref = reference
  workdir = str(tmp_path / 'bl')
  changes = {'method': 'baseline', 'incremental.clamp': False}
  origin = {'config': 'configs/cifar100.py:smoke', 'changes': changes}  # as run.py passes it
  config = tiny_config(**changes)
  capsys.readouterr()
  assert cli.main(config, workdir, 'train', checkpoint=ref_dir, origin=origin) == 0
  [start] = [line for line in capsys.readouterr().out.splitlines() if line.startswith('f2m-jax train: ')]
  assert start.startswith('f2m-jax train: configs/cifar100.py:smoke with ') and "incremental.clamp=False" in start
  assert f'base model from --checkpoint {os.path.abspath(ref_dir)}' in start
  with open(os.path.join(workdir, 'results.json')) as f:
    results = json.load(f)
  assert results['provenance']['origin'] == origin
  assert Checkpoints(workdir).base.latest_step() is None  # the base model was not trained again ...
  assert os.listdir(os.path.join(workdir, 'checkpoints', 'run_0'))  # ... and the sessions were
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    done = [json.loads(line) for line in f if '"done"' in line]
  assert done[-1]['base_checkpoint'] == os.path.abspath(ref_dir)
  source = results['provenance']['base_source']
  assert source['path'] == os.path.abspath(ref_dir) and source['method'] == 'f2m'
  assert source['commit'] == ref['provenance']['git'].get('commit')
  assert source['differences']['method'] == ['f2m', 'baseline']
  assert source['differences']['noise.enabled'] == [True, False]
  assert source['note'] == 'baseline sessions on a base model trained by f2m'
  assert results['base_model']['step'] == 20
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f)['base_source'] == source
  line = sources_line(workdir)
  assert 'baseline sessions on a base model trained by f2m' in line and os.path.abspath(ref_dir) in line
  assert 'method' in line.split('config differs in ')[1]  # where the source's config differs
  assert 'incremental.clamp=False' in line and 'incremental.clamp' not in sources_line(ref_dir)
  with pytest.raises(WorkdirError, match=f'was started with --checkpoint {os.path.abspath(ref_dir)}, now without'):
    pipeline.run(tiny_config(**changes), workdir, origin=origin)
  assert run_py(['run.py', '--workdir', workdir, '--mode', 'eval'], monkeypatch) == 0  # with its --checkpoint
  with open(os.path.join(ref_dir, 'config.json')) as f:
    assert json.load(f)['base_source'] is None  # a base model of its own


# ----------------------------------------------------------------------------- a workdir is enough

@pytest.mark.slow
def test_eval_of_a_workdir_alone_reproduces_its_results_and_says_so(reference, tmp_path, monkeypatch, capsys):
  """run.py --workdir W --mode eval (and flatness) reads W's config.json; eval computes every session again,
  says it reproduced results.json exactly, and writes nothing but its log lines. A change given beside W of no
  result is taken (eval.batch_size), another (or another config file) refused by name, one line, before
  anything is read or written. Each 'auto' kept resolves on another backend (a GPU, mocked), named."""
  import jax  # pylint: disable=g-import-not-at-top
  workdir = copy_of(reference, tmp_path)
  with open(os.path.join(workdir, 'config.json')) as f:
    assert json.load(f)['noise']['draw_map'] == 'auto'
  before = snapshot(workdir)
  capsys.readouterr()
  with monkeypatch.context() as gpu:
    gpu.setattr(jax, 'default_backend', lambda: 'gpu')
    assert run_py(['run.py', '--workdir', workdir, '--mode', 'eval', '--config.eval.batch_size=100'], monkeypatch) == 0
  out = capsys.readouterr().out
  assert f'reproduced {workdir}/results.json exactly' in out and 'results.json unchanged' in out
  assert 'results written' not in out
  assert "noise.draw_map: 'unroll' when this workdir was last run (cpu), 'vmap' now (gpu); " in out  # backend.moved
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    start = [json.loads(line) for line in f if '"start"' in line][-1]
  assert start['choices'] == {'noise.draw_map': 'vmap', 'model.conv_backward': 'xla'} and start['backend'] == 'gpu'
  for change, refused in (('--config.incremental.lr=0.02', 'incremental.lr: saved 0.01, now 0.02'),
                          ('--config=configs/folder.py', "data.dataset: saved 'cifar100', now 'folder'")):
    assert run_py(['run.py', '--workdir', workdir, '--mode', 'eval', change], monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.startswith(f'error: {workdir} holds a run of a different config (') and err.count('\n') == 1, err
    assert refused in err and 'Drop --config and its changes to use the recorded config' in err
  after = snapshot(workdir)
  assert after.pop('metrics.jsonl') != before.pop('metrics.jsonl') and after == before  # the eval's lines
  flatness = ['run.py', '--workdir', workdir, '--mode', 'flatness', '--config.flatness.num_draws=2',
              '--config.flatness.max_images=8']
  assert run_py(flatness + ['--config.noise.bound=0.01'], monkeypatch) == 2
  assert 'noise.bound: saved 0.005, now 0.01' in capsys.readouterr().err
  assert run_py(flatness, monkeypatch) == 0 and os.path.exists(os.path.join(workdir, 'flatness.json'))
