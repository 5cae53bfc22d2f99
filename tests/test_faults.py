"""Faults that must not produce records that look valid (issue 48): bad values and data limits
stopped before anything is written, one owner per workdir, checkpoints never used without their
config and read back only when whole, eval that computes every session again, a diverged session
stopped, a checkpoint that cannot be written failing fast, and resumes after SIGKILL equal to a whole
run. Each test here failed on 4928fab; those of the smaller faults of issue 73 on d41b789."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from conftest import REPO, TINY_SMOKE_ARGS, copy_of, run_py, snapshot, tiny_smoke as tiny_config, without_provenance
from f2m_jax import files
from f2m_jax import sessions
from f2m_jax.data import sources
from f2m_jax.files import CheckpointError, CheckpointFault
from f2m_jax.files import WorkdirError
from f2m_jax.run import cli
from f2m_jax.run import pipeline
from f2m_jax.run import workdir as workdir_lib
from f2m_jax.run.checkpoint import Checkpoints


def one_line_error(capsys) -> str:
  """The one line a failed cli.main printed to stderr."""
  lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith(('error: ', 'training stopped: ')), lines
  return lines[0]


# ----------------------------------------------------------------------------- 5. every check before any write

@pytest.mark.parametrize('field,value,message', [
    ('base.batch_size', 0, 'base.batch_size=0 is invalid'),
    ('base.log_every', 0, 'base.log_every=0 is invalid'),
    ('eval.batch_size', 0, 'eval.batch_size=0 is invalid'),
    ('base.momentum', -1.0, 'base.momentum=-1.0 is invalid: must be in [0, 1)'),
    ('incremental.momentum', 1.0, 'incremental.momentum=1.0 is invalid: must be in [0, 1)'),
    ('base.weight_decay', -0.1, 'base.weight_decay=-0.1 is invalid: must be >= 0'),
    ('data.synthetic.train_per_class', 0, 'data.synthetic.train_per_class=0 is invalid: must be >= 1'),
    ('noise.num_layers', 0, 'noise.num_layers=0 must be in [1, '),
    ('model.arch', 'resnet50', "model.arch='resnet50' is invalid: allowed: ('resnet20', 'resnet18')"),
    ('data.shots', 100, 'data.shots=100 is invalid: class 20 has 40 images in the shot pool'),
    ('data.protocol', 'topic', "data.protocol='topic' is invalid: it needs the TOPIC lists"),
    ('base.batch_size', 5000, 'has 40 base training images, fewer than the base.shots=500 a batch takes of each'),
    ('base.ways', 40, 'base.batch_size=80 exceeds one epoch of 20 classes x 2 shots: allowed up to 40'),
    ('model.width', -8, "model.width=-8 is invalid: an integer >= 1, or 0 for the architecture's standard width"),
    ('model.pretrained', '/no/such.pth', "model.pretrained='/no/such.pth' is invalid: no such file"),
    ('model.width', 4096, 'model.width=4096 is invalid: the run needs about '),  # sizes that cannot fit
    ('data.synthetic.train_per_class', 1000000, 'data.synthetic.train_per_class=1000000 is invalid: the run needs'),
    ('eval.batch_size', 100000000, 'eval.batch_size=100000000 is invalid: the run needs about '),
])
def test_a_bad_value_is_refused_by_the_checks(field, value, message):
  with pytest.raises(ValueError) as e:
    checked(tiny_config(**{field: value}))
  assert message in str(e.value)


def checked(config) -> None:
  """The checks a run passes before it writes anything: every value and the memory it needs
  (pipeline.resolve), then the network and the data's limits (pipeline.check)."""
  config = pipeline.resolve(config)
  pipeline.check(config, sources.load_benchmark(config))


def test_a_refused_run_writes_nothing(tmp_path):
  """The last of those checks (the data's limits) comes before the workdir is made, so the corrected
  command is not refused as 'a different config'."""
  workdir = tmp_path / 'w'
  with pytest.raises(ValueError, match='base.batch_size=80 exceeds one epoch of 20 classes'):
    pipeline.run(tiny_config(**{'base.ways': 40}), str(workdir))
  assert not workdir.exists()


def test_checkpoints_without_a_record_of_their_config_are_refused(tmp_path):
  workdir = tmp_path / 'w'
  (workdir / 'checkpoints' / 'model' / '0').mkdir(parents=True)  # a saved step, and no config.json or its copy
  before = snapshot(workdir)
  with pytest.raises(WorkdirError, match='holds checkpoints but no record of the config they were trained with'):
    workdir_lib.prepare(str(workdir), pipeline.resolve(tiny_config()).to_dict())
  assert snapshot(workdir) == before


# ----------------------------------------------------------------------------- 6. a workdir has one owner

def hold_lock(workdir: str) -> subprocess.Popen:
  """A child process that takes `workdir`'s lock and keeps it until killed."""
  child = subprocess.Popen([sys.executable, '-c', 'import sys, time; from f2m_jax.run import workdir as w; '
                            'w.Lock(sys.argv[1]).claim(); print("held", flush=True); time.sleep(600)', workdir],
                           cwd=REPO, stdout=subprocess.PIPE, text=True)
  assert child.stdout.readline().strip() == 'held'
  return child


def test_a_held_workdir_is_refused_naming_the_holder(tmp_path, capsys):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  child = hold_lock(str(workdir))
  try:
    assert cli.main(tiny_config(), str(workdir), 'train') == 2
    line = one_line_error(capsys)
    assert f'{workdir} is in use by process {child.pid}' in line, line
    assert sorted(os.listdir(workdir)) == ['lock']  # nothing else written
  finally:
    child.kill()
    child.wait()


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  child = hold_lock(str(workdir))
  os.kill(child.pid, signal.SIGKILL)
  child.wait()
  assert (workdir / 'lock').read_text().strip() == str(child.pid)  # a stale lock file, a dead pid
  lock = workdir_lib.prepare(str(workdir), pipeline.resolve(tiny_config()).to_dict())
  try:
    assert (workdir / 'lock').read_text().strip() == str(os.getpid())
  finally:
    lock.close()


# ----------------------------------------------------------------------------- 7. files and folders a user broke

def test_invalid_config_json_is_named(tmp_path, capsys):
  workdir = tmp_path / 'w'
  workdir.mkdir()
  (workdir / 'config.json').write_text('{"method": "f2m",\n')
  assert cli.main(tiny_config(), str(workdir), 'train') == 2
  line = one_line_error(capsys)
  assert f'{workdir}/config.json is not valid JSON' in line, line


def writable(path) -> bool:
  return os.access(path, os.W_OK)  # root may write a read-only mode, not a read-only mount


@contextlib.contextmanager
def read_only(path):
  """`path` read-only for this process: by its mode, or (root ignores modes) a read-only bind mount;
  the test is skipped where neither works."""
  mode, mounted = os.stat(path).st_mode, False
  os.chmod(path, 0o555)
  try:
    if writable(path):
      mounted = subprocess.run(['mount', '--bind', '-o', 'ro', str(path), str(path)], capture_output=True,
                               check=False).returncode == 0
      if writable(path):
        pytest.skip('cannot make a folder read-only here (root, and no read-only mount)')
    yield
  finally:
    if mounted:
      subprocess.run(['umount', str(path)], check=False)
    os.chmod(path, mode)


@pytest.mark.parametrize('where', ['workdir', 'checkpoints', 'tensorboard', 'read-only workdir',
                                   'read-only checkpoints'])
def test_a_folder_that_cannot_be_written_is_one_line(tmp_path, capsys, where):
  workdir = tmp_path / 'w'
  name = where.split()[-1]
  target = workdir if name == 'workdir' else workdir / name
  if where.startswith('read-only'):
    target.mkdir(parents=True)
  else:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text('a file where a folder belongs')
  before = snapshot(tmp_path)
  with read_only(target) if where.startswith('read-only') else contextlib.nullcontext():
    rc = cli.main(tiny_config(), str(workdir), 'train')
  assert rc == 2
  line = one_line_error(capsys)
  assert f'cannot write into {target}: ' in line, line
  assert snapshot(tmp_path) == before


# ----------------------------------------------------------------------------- 1. checkpoints checked by their digests

def rewrite_checkpoint(step_dir: str, change) -> None:
  """The orbax checkpoint in `step_dir` (.../checkpoints/<folder>/<step>) saved again as change(tree)."""
  import jax  # pylint: disable=g-import-not-at-top
  tree = change(jax.tree_util.tree_map(np.array, ocp.StandardCheckpointer().restore(f'{step_dir}/default')))
  shutil.rmtree(step_dir)
  manager = ocp.CheckpointManager(os.path.dirname(step_dir))
  manager.save(int(os.path.basename(step_dir)), args=ocp.args.StandardSave(tree), force=True)
  manager.wait_until_finished()
  manager.close()


def negated(tree):
  """Other values, all finite, saved consistently (as another seed's checkpoint copied in would be): every
  kernel and the prototypes negated."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree_util.tree_map_with_path(
      lambda path, x: -x if any(getattr(k, 'key', None) in ('kernel', 'prototypes') for k in path) else x, tree)


def flip_a_byte(step_dir: str) -> None:
  """One bit of the middle byte of the largest array data file under `step_dir` (ocdbt's d/ folders)
  flipped: tensorstore reads it back as one value changed."""
  files = [os.path.join(root, n) for root, _, names in os.walk(step_dir) for n in names
           if os.path.basename(root) == 'd']
  path = max(files, key=os.path.getsize)
  data = bytearray(open(path, 'rb').read())
  data[len(data) // 2] ^= 0x01
  open(path, 'wb').write(bytes(data))


def edit_json(path: str, change) -> None:
  with open(path) as f:
    doc = json.load(f)
  change(doc)
  with open(path, 'w') as f:
    json.dump(doc, f)


def ledger(change):
  """What a case does to the copy W: change(entries) of its ledger's."""
  return lambda w: edit_json(f'{w}/checkpoints/digests.json', lambda d: change(d['checkpoints']))


def entry_config(rel, field, value):
  return ledger(lambda entries: entries[rel].setdefault('config', {}).update({field: value}))


CHANGED = 'is not the one saved there: the digest of its arrays differs'
# case (its checkpoint first): (what it does to the copy W, the exit code, what the one line holds). The base
# state's cases stop a resume before the base model is made (which is deleted, with the sessions).
CASES = {
    'base/20 with a byte flipped': (lambda w: flip_a_byte(f'{w}/checkpoints/base/20'), 3, f'base/20 {CHANGED}'),
    'model/0 with a byte flipped': (lambda w: flip_a_byte(f'{w}/checkpoints/model/0'), 3, f'model/0 {CHANGED}'),
    'run_0/2 with a byte flipped': (lambda w: flip_a_byte(f'{w}/checkpoints/run_0/2'), 3, f'run_0/2 {CHANGED}'),
    'base/20 saved again': (lambda w: rewrite_checkpoint(f'{w}/checkpoints/base/20', negated), 3, f'20 {CHANGED}'),
    'model/0 saved again': (lambda w: rewrite_checkpoint(f'{w}/checkpoints/model/0', negated), 3, f'0 {CHANGED}'),
    'run_0/2 saved again': (lambda w: rewrite_checkpoint(f'{w}/checkpoints/run_0/2', negated), 3, f'2 {CHANGED}'),
    'base/20 of seed 1 with its entry': (entry_config('base/20', 'seed', 1), 3,
                                         'base/20 was saved by another run: seed=1 there, 0 here'),
    'base/20 without its entry': (ledger(lambda entries: entries.pop('base/20')), 3,
                                  'base/20 has no entry in {w}/checkpoints/digests.json: it was not saved by this'),
    'base/20 without the ledger': (lambda w: os.remove(f'{w}/checkpoints/digests.json'), 3,
                                   'base/20 has no entry in {w}/checkpoints/digests.json (which is missing)'),
    'run_0/2 of incremental.lr=0.05 with its entry': (entry_config('run_0/2', 'incremental.lr', 0.05), 3,
                                                      'run_0/2 was saved by another run: incremental.lr=0.05 there'),
    'run_0/3 truncated': (lambda w: [open(os.path.join(r, n), 'wb').write(b'garbage') for r, _, names in
                                     os.walk(f'{w}/checkpoints/run_0/3') for n in names], 3,
                          'truncated or corrupt; delete it and the later sessions in {w}/checkpoints/run_0,'),
    'run_0 a file': (lambda w: shutil.rmtree(f'{w}/checkpoints/run_0') or open(f'{w}/checkpoints/run_0', 'w'), 3,
                     '{w}/checkpoints/run_0 is a file where a checkpoint folder should be; move it away, then rerun'),
    'run_0/2 with config.json edited': (lambda w: edit_json(f'{w}/config.json', lambda c: c['incremental'].update(
        lr=0.05)), 2, '{w}/config.json differs from the config its checkpoints were saved with, which '
        '{w}/checkpoints/digests.json keeps (incremental.lr: saved 0.01, now 0.05)'),
    'a finished run with config.json edited': (lambda w: edit_json(f'{w}/config.json', lambda c: c.update(
        method='baseline')), 2, "(method: saved 'f2m', now 'baseline'): restore it, or start a new run from"),
}


@pytest.mark.slow
@pytest.mark.parametrize('case', CASES)
def test_a_changed_or_another_runs_checkpoint_or_an_edited_config_is_refused(reference, tmp_path, capsys,
                                                                             monkeypatch, case):
  """`run.py --workdir W` (its config.json's run, resumed) after a checkpoint's arrays changed, an intact one
  of another run was put in with its ledger entry (the identity is checked before the arrays are read) or
  without one, or config.json was edited: one line naming it, nothing written (6f2b875: rc 0 but digests)."""
  change, code, said = CASES[case]
  workdir = copy_of(reference, tmp_path, unfinished='finished' not in case)
  if case.startswith('base'):
    for name in ('model', 'run_0', 'run_1'):
      shutil.rmtree(os.path.join(workdir, 'checkpoints', name))
  change(workdir)
  before = snapshot(workdir)
  capsys.readouterr()
  assert run_py(['run.py', '--workdir', workdir], monkeypatch) == code
  assert said.format(w=workdir) in one_line_error(capsys)
  assert {k: v for k, v in snapshot(workdir).items() if k != 'lock'} == {k: v for k, v in before.items() if k != 'lock'}


@pytest.mark.slow
def test_another_runs_session_under_shared_shots_is_refused(reference, tmp_path, capsys):
  """Where every run trains on the same shots (a pool of data.shots images a class), run 1's session 2 with
  its entry in run 0's slot: its exemplars are run 0's too, so only its identity tells (6f2b875: rc 0)."""
  workdir, shared = str(tmp_path / 'w'), tiny_config(**{'data.shots': 40})
  pipeline.run(shared, workdir, checkpoint=reference[0])
  os.remove(os.path.join(workdir, 'results.json'))
  shutil.rmtree(os.path.join(workdir, 'checkpoints', 'run_0', '2'))
  shutil.copytree(os.path.join(workdir, 'checkpoints', 'run_1', '2'), os.path.join(workdir, 'checkpoints', 'run_0', '2'))
  ledger(lambda entries: entries.update({'run_0/2': entries['run_1/2']}))(workdir)
  capsys.readouterr()
  assert cli.main(shared, workdir, 'train', checkpoint=reference[0]) == 3
  assert "run_0/2 was saved by another run: saved as='run_1/2' there, 'run_0/2' here; delete it" in one_line_error(capsys)


@pytest.mark.parametrize('text', ['[]', '{"run_0/5": "abc"}', '{"config": null, "checkpoints": {"model/0": {}}}',
                                  '\x8b\xff\x00binary'])
def test_a_ledger_of_another_shape_is_one_line_naming_it(tmp_path, text):
  (tmp_path / 'checkpoints').mkdir()
  (tmp_path / 'checkpoints' / 'digests.json').write_bytes(text.encode('latin-1'))
  with pytest.raises(CheckpointFault) as e:
    Checkpoints(str(tmp_path))
  assert str(e.value).startswith(f'{tmp_path}/checkpoints/digests.json is not ') and '\n' not in str(e.value)


@pytest.mark.slow
def test_a_workdir_saved_before_the_ledger_is_used_and_said_once(reference, tmp_path, capsys):
  """A workdir of an earlier version (no digests.json, nor config.json's record that it keeps one; its base
  model with the record of its accuracy that d41b789 kept) is evaluated, one line saying it cannot be checked."""
  workdir = copy_of(reference, tmp_path)
  os.remove(os.path.join(workdir, 'checkpoints', 'digests.json'))
  edit_json(os.path.join(workdir, 'config.json'), lambda c: c.pop('ledger'))
  rewrite_checkpoint(os.path.join(workdir, 'checkpoints', 'model', '0'),
                     lambda tree: {**tree, 'ncm_accuracy': np.asarray(76.25, np.float64)})
  capsys.readouterr()
  assert cli.main(tiny_config(), workdir, 'eval') == 0
  out = capsys.readouterr().out
  assert out.count('so it cannot be checked') == 1 and 'reproduced' in out, out


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['eval', 'train'])
def test_accuracies_computed_otherwise_than_saved(reference, tmp_path, capsys, monkeypatch, mode):
  """Two correct predictions of run 0 session 3 made wrong whenever it is computed again. --mode eval computes
  every session again: a line names what differs, who saved and who computed it and the possible causes (the
  code only where the commit or machine differs); results_eval.json (a new file each time) holds both values,
  results.json (of an earlier version: without accuracy_matrix, no difference) is unchanged. A resume trusts
  the checkpoint (digest and identity hold) and computes none again: the results are the uninterrupted run's."""
  from f2m_jax import evaluation  # pylint: disable=g-import-not-at-top
  workdir = copy_of(reference, tmp_path, unfinished=mode == 'train')
  real, seen, path = evaluation.accuracies_from_predictions, reference[1]['sessions'][1]['num_classes'], ''

  def flipping(pred, labels, *args, **kwargs):
    pred = np.array(pred)
    right = np.flatnonzero(pred == labels)[:2] if labels.max() >= seen else []  # session 3's test images
    pred[right] = (pred[right] + 1) % (labels.max() + 1)
    return real(pred, labels, *args, **kwargs)

  if mode == 'eval':
    path = os.path.join(workdir, 'results.json')
    edit_json(path, lambda saved: saved.pop('accuracy_matrix'))
    before = open(path).read()
  monkeypatch.setattr(evaluation, 'accuracies_from_predictions', flipping)
  capsys.readouterr()
  assert cli.main(tiny_config(), workdir, mode) == 0
  out = capsys.readouterr().out
  if mode == 'train':
    with open(os.path.join(workdir, 'results.json')) as f:
      assert without_provenance(json.load(f)) == without_provenance(reference[1]) and 'note:' not in out
    return
  checkpoint = f'{workdir}/checkpoints/run_0/3'
  assert f'note: run 0 session 3: the accuracies computed again from {checkpoint} differ from those it saved (acc' in out
  assert f'differs from {path} in avg, pd, retention, sessions; wrote results_eval.json' in out and 'possible causes: ' in out
  evaluated = json.loads((tmp_path / 'copy' / 'results_eval.json').read_text())
  difference = evaluated['checkpoint_differences'][0]
  assert difference['checkpoint'] == checkpoint and difference['saved_by'] == difference['recomputed_by']
  assert difference['saved']['acc'] == reference[1]['sessions'][2]['acc']['runs'][0]
  assert difference['saved']['acc'] - difference['recomputed']['acc'] == pytest.approx(100 * 2 / 480)
  clean, acc = {'commit': 'c', 'dirty': False, 'backend': 'cpu', 'device': 'cpu'}, difference['saved']
  for by, cause in ((clean, 'causes: the data, or'), ({**clean, 'commit': 'd'}, 'causes: the code or machine, the')):
    assert cause in sessions.difference_line(0, 3, path, acc, acc, by, clean)  # the code named where it differs
  assert ' wrote results_eval_' in pipeline.write_outputs(workdir, evaluated, 'eval')  # the first one's kept
  assert open(path).read() == before and len(list((tmp_path / 'copy').glob('results_eval*.json'))) == 2


def fail_rename(monkeypatch, part: str) -> None:
  """os.rename of the temporary folder of checkpoint `part` (e.g. 'run_1/2') fails as on a full disk:
  the last act of orbax's save, in its background thread for the sessions."""
  rename = os.rename

  def failing(src, dst, *args, **kwargs):
    if '.orbax-checkpoint-tmp' in str(src) and str(dst).endswith(os.sep + part):
      raise OSError(28, 'No space left on device', str(src))
    return rename(src, dst, *args, **kwargs)

  monkeypatch.setattr(os, 'rename', failing)


@pytest.mark.slow
def test_a_failed_background_write_is_one_line_naming_it_and_logs_nothing(reference, tmp_path, capfd, monkeypatch):
  """The save of run 1 session 2 fails in the background; orbax raises it at the next save (session
  3's). The one line names session 2 and the OS's reason, nothing else is printed, and neither session
  has a metrics line (session 2's was written before its save was known to be complete)."""
  workdir = copy_of(reference, tmp_path, unfinished=True)
  run_1 = os.path.join(workdir, 'checkpoints', 'run_1')
  shutil.rmtree(run_1)
  metrics = os.path.join(workdir, 'metrics.jsonl')
  before = lines_of(metrics, 'session')
  fail_rename(monkeypatch, os.path.join('run_1', '2'))
  capfd.readouterr()
  assert cli.main(tiny_config(), workdir, 'train') == 3
  err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
  assert len(err) == 1 and err[0].startswith(f'error: cannot write the run 1 session 2 checkpoint {run_1}/2: '
                                             'No space left on device ('), err
  assert lines_of(metrics, 'session') == before


def test_a_full_disk_under_tensorstore_is_the_oss_reason_and_the_file():
  from f2m_jax.run import checkpoint  # pylint: disable=g-import-not-at-top
  folder = '/w/checkpoints/run_0/3.orbax-checkpoint-tmp/default.orbax-checkpoint-tmp/ocdbt.process_0/'
  e = ValueError(f'RESOURCE_EXHAUSTED: Error writing "trainable.layer3_1.conv2.kernel/0.0.0.0" in OCDBT database at '
                 f'local file "{folder}": Failed writing: "{folder}d/8f5e": Failed to write 41591 bytes to file 15: No '
                 "space left on device [os_error_code='28'] [tensorstore_spec='{\"context\":{}}'] "
                 "[source locations='tensorstore/kvstore/file/file_key_value_store.cc:402']")
  cause = checkpoint._cause(e)  # pylint: disable=protected-access
  assert f'"{folder}d/8f5e": Failed to write 41591 bytes to file 15: No space left on device' in cause, cause
  assert 'tensorstore_spec' not in cause and 'source locations' not in cause


def test_orbax_speaks_only_through_exceptions(tmp_path, caplog):
  """What orbax logs (its notes on every read-only manager, a failed background write's tracebacks)
  and tensorstore's 'Event loop is closed' after a failed write are off while a command runs."""
  import sys  # pylint: disable=g-import-not-at-top
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  from f2m_jax.run.checkpoint import quiet_orbax  # pylint: disable=g-import-not-at-top
  ckpts = Checkpoints(str(tmp_path))
  ckpts.model.save(0, {'w': np.zeros(2, np.float32)})
  ckpts.close()
  seen = []
  previous, sys.unraisablehook = sys.unraisablehook, lambda u: seen.append(str(u.exc_value))
  try:
    with caplog.at_level('INFO'), quiet_orbax():
      Checkpoints(str(tmp_path), read_only=True).close()
      absl_logging.error('Failed to run 3 Handler Commit operations')  # as orbax's background thread does
      for text in ('Event loop is closed', 'another'):
        sys.unraisablehook(type('U', (), {'exc_value': RuntimeError(text)})())
  finally:
    sys.unraisablehook = previous
  assert not [r.getMessage() for r in caplog.records if r.name == 'absl'], caplog.records
  assert seen == ['another']


# ----------------------------------------------------------------------------- a file where a folder should be

def test_a_file_in_place_of_any_folder_is_named(tmp_path, monkeypatch):
  """Any folder a run writes (the cache's too), through the OSError the OS gives for it; a link to itself
  (6f2b875: 'a file'); a rename onto a read-only digests.json (EBUSY: 6f2b875 named the temporary)."""
  blocker, loop = tmp_path / 'cache', tmp_path / 'run_0'
  blocker.write_text('')
  for make in (lambda: os.makedirs(blocker / 'arrays' / 'cub200'), lambda: os.makedirs(blocker),
               lambda: open(blocker / 'x.npy', 'w')):
    with pytest.raises(OSError) as e:
      make()
    assert files.describe_os_error(e.value).startswith(f'{blocker} is a file where a folder should be; move it')
  e = OSError(28, 'No space left on device', str(tmp_path / 'metrics.jsonl'))
  assert files.describe_os_error(e) == f'No space left on device: {tmp_path}/metrics.jsonl'
  loop.symlink_to(loop)
  assert files.in_the_way(str(loop), 'checkpoint folder').startswith(f'{loop} is a link to nothing or to itself')

  def busy(src, dst):
    raise OSError(errno.EBUSY, 'Device or resource busy', src, dst)

  monkeypatch.setattr(os, 'replace', busy)
  with pytest.raises(OSError) as e:
    files.atomic_write(str(tmp_path / 'digests.json'), '{}')
  assert files.describe_os_error(e.value) == f'Device or resource busy: {tmp_path}/digests.json'
  assert sorted(os.listdir(tmp_path)) == ['cache', 'run_0']  # nor is the temporary left


# ----------------------------------------------------------------------------- 2. a diverged session stops

@pytest.mark.slow
def test_a_diverged_session_stops_unsaved(reference, tmp_path, capsys, monkeypatch):
  """A session's fine-tuning that ends in NaN (staged: the reference's program, its weights times NaN)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from f2m_jax import incremental  # pylint: disable=g-import-not-at-top
  make = incremental.make_finetune

  def diverging(settings):
    finetune = make(settings)

    def run(*args):
      params, losses = finetune(*args)
      return jax.tree_util.tree_map(lambda x: x * jnp.nan, params), losses
    return run

  monkeypatch.setattr(incremental, 'make_finetune', diverging)
  workdir = str(tmp_path / 'diverged')
  assert cli.main(tiny_config(), workdir, 'train', checkpoint=reference[0]) == 3
  line = one_line_error(capsys)
  assert line.startswith('training stopped: non-finite values (') and 'of method f2m in run 0 session 2;' in line
  assert line.endswith('it was not saved, the last good checkpoint (the base model) is kept'), line
  assert Checkpoints(workdir).sessions_done(0) == []
  assert lines_of(os.path.join(workdir, 'metrics.jsonl'), 'session') == 0
  assert not os.path.exists(os.path.join(workdir, 'results.json'))


# ----------------------------------------------------------------------------- 3. a checkpoint that cannot be written

@pytest.mark.slow
@pytest.mark.parametrize('how', ['file', 'read-only'])
def test_a_checkpoint_that_cannot_be_written_fails_fast(reference, tmp_path, capsys, how):
  workdir = copy_of(reference, tmp_path, unfinished=True)
  run_1 = os.path.join(workdir, 'checkpoints', 'run_1')
  shutil.rmtree(run_1)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    lines = len(f.readlines())
  if how == 'file':
    open(run_1, 'w').close()
  else:
    os.mkdir(run_1)
  start = time.time()
  with read_only(run_1) if how == 'read-only' else contextlib.nullcontext():
    rc = cli.main(tiny_config(), workdir, 'train')
  assert rc == 3 and time.time() - start < 120
  line = one_line_error(capsys)
  if how == 'file':
    assert line == f'error: {run_1} is a file where a checkpoint folder should be; move it away, then rerun the same command', line
  else:
    assert line.startswith(f'error: cannot write the run 1 session 2 checkpoint {run_1}/2: Read-only file system'), line
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    new = [json.loads(line) for line in f.readlines()[lines:]]
  assert not [r for r in new if r['phase'] == 'session'] and not os.path.exists(os.path.join(workdir, 'results.json'))


@pytest.mark.slow
def test_a_folder_that_turns_read_only_during_the_run_fails_fast(reference, tmp_path):
  workdir = copy_of(reference, tmp_path, unfinished=True)
  run_1 = os.path.join(workdir, 'checkpoints', 'run_1')
  shutil.rmtree(run_1)
  shutil.rmtree(os.path.join(workdir, 'checkpoints', 'run_0', '3'))
  before = lines_of(os.path.join(workdir, 'metrics.jsonl'), 'session')
  stack = contextlib.ExitStack()

  def hook(name, **info):  # run_1 exists (its manager is open) when run 0's last session is saved
    if name == 'session' and (info['run'], info['session']) == (0, 3):
      stack.enter_context(read_only(run_1))

  start = time.time()
  with stack, pytest.raises(CheckpointFault, match=f'cannot write the run 1 session 2 checkpoint {run_1}/2: Read-only'):
    pipeline.run(tiny_config(), workdir, hook=hook)
  assert time.time() - start < 120
  assert lines_of(os.path.join(workdir, 'metrics.jsonl'), 'session') == before + 1  # run 0 session 3 only
  assert not os.listdir(run_1)


# ----------------------------------------------------------------------------- 7. the smaller ones

def test_a_cut_or_undecodable_line_of_the_metrics_log_is_skipped(tmp_path):
  """A kill in the middle of a write leaves a cut last line: the next invocation's lines start on a line of
  their own (both became unparsable when appended to it), and readers skip it, as a line of other bytes
  (6f2b875 read those as a codec error naming no file)."""
  path = tmp_path / 'metrics.jsonl'
  path.write_bytes(b'{"time": 1.0, "phase": "start", "mode": "train"}\n\xff\xfe{"ph\n{"time": 2.0, "phase": "base", "st')
  log = workdir_lib.MetricsLog(str(tmp_path))
  assert [(i['mode'], i['end'] - i['time']) for i in log.invocations] == [('train', 0.0)]
  log.start('train')
  log.write(phase='base', step=10, loss=1.5)
  log.write(phase='base', step=20, loss=1.0)
  lines = path.read_bytes().splitlines()
  assert lines[2] == b'{"time": 2.0, "phase": "base", "st' and len(lines) == 6
  assert [(r['phase'], r.get('step')) for r in log.records()] == [('start', None), ('start', None), ('base', 10),
                                                                   ('base', 20)]


@pytest.mark.parametrize('when', ['write', 'close'])
def test_a_full_disk_under_tensorboard_names_the_event_file(tmp_path, monkeypatch, when):
  """During the run or at its end: one OSError naming the file, raised in this thread (before: a
  writer thread's traceback, then 'No space left on device' naming no file and tensorboardX's exit
  hook's traceback)."""
  import threading  # pylint: disable=g-import-not-at-top
  from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top
  threads = threading.active_count()
  log = workdir_lib.MetricsLog(str(tmp_path), tensorboard=True)
  log.write(phase='session', run=0, session=1, acc=50.0)
  assert threading.active_count() == threads

  def full(*_):
    raise OSError(errno.ENOSPC, 'No space left on device')

  monkeypatch.setattr(record_writer.RecordWriter, when, full)
  with pytest.raises(OSError) as e:
    log.write(phase='session', run=0, session=2, acc=40.0)
    log.close()
  [events] = (tmp_path / 'tensorboard').iterdir()
  assert files.describe_os_error(e.value) == f'No space left on device: {events}'


def test_an_invalid_results_json_is_named_before_any_work(tmp_path, monkeypatch):
  workdir = tmp_path / 'w'
  workdir_lib.prepare(str(workdir), pipeline.effective(tiny_config()).to_dict()).close()
  (workdir / 'results.json').write_text('{"sessions": [')

  def work(*_):
    raise AssertionError('the data were loaded')

  monkeypatch.setattr(pipeline.sources, 'load_benchmark', work)
  with pytest.raises(WorkdirError, match=f'{workdir}/results.json is not valid JSON'):
    pipeline.run(tiny_config(), str(workdir), mode='eval')


@pytest.mark.parametrize('name', ['metrics.jsonl', 'lock'])
def test_a_folder_in_place_of_a_workdirs_file_is_one_line(tmp_path, capsys, name):
  workdir = tmp_path / 'w'
  (workdir / name).mkdir(parents=True)
  assert cli.main(tiny_config(), str(workdir), 'train') == 3
  assert one_line_error(capsys).startswith(f'error: {workdir / name} is a folder where a file should be; move it')


def stale(path, seconds: float = 60.0) -> None:
  """`path`'s modification time set `seconds` into the past."""
  old = time.time() - seconds
  os.utime(path, (old, old))


@contextlib.contextmanager
def locked(path):
  """`path` held as its live writer holds it: an exclusive flock of its own open file description."""
  import fcntl  # pylint: disable=g-import-not-at-top
  fd = os.open(path, os.O_RDONLY)
  fcntl.flock(fd, fcntl.LOCK_EX)
  try:
    yield
  finally:
    os.close(fd)


def test_a_killed_writers_leftovers_are_removed_and_a_live_writers_kept(tmp_path):
  """A killed decode leaves its whole temporary file and a killed fake-folder generation its
  temporary folder; the next write removes those no live process holds (a minute old: before, only
  after an hour), however old the live ones, and spares one just made (its writer about to lock it)."""
  from f2m_jax.data import fake_folders, folder  # pylint: disable=g-import-not-at-top
  image = fake_folders.fake_folder(tmp_path) / 'folder' / 'train' / 'class_00' / '000.jpg'
  arrays = tmp_path / 'arrays'
  arrays.mkdir()
  killed, other, live, fresh = (arrays / f'.{n}.npy.x{i}.tmp' for i, n in enumerate(('train-a', 'test-b', 'train-a',
                                                                                        'train-a')))
  for p in (killed, other, live, fresh):
    p.write_bytes(b'\0' * 100)
  for p in (killed, other, live):
    stale(p)
  with locked(live):  # another process writing it
    images = folder.decode_cached([image], arrays, 'train', 8, 8, decode=lambda p, r, c: np.zeros((8, 8, 3), np.uint8))
    assert images.shape == (1, 8, 8, 3)
    assert sorted(p.name for p in arrays.iterdir() if p.name.startswith('.')) == sorted([live.name, fresh.name])
  killed_folder, live_folder = tmp_path / 'fake_folder' / '.v2-dead', tmp_path / 'fake_folder' / '.v2-live'
  for p in (killed_folder, live_folder):
    (p / 'miniimagenet').mkdir(parents=True)
    stale(p)
  shutil.rmtree(tmp_path / 'fake_folder' / 'v2')
  with locked(live_folder):
    fake_folders.fake_folder(tmp_path)
  assert sorted(os.listdir(tmp_path / 'fake_folder')) == ['.v2-live', 'v2']


@pytest.mark.slow
def test_a_read_only_finished_run_is_evaluated(reference, tmp_path, capsys):
  """No lock, no metrics line, no results_eval.json: it compares, and what it would write follows as
  JSON on stdout."""
  workdir = copy_of(reference, tmp_path)
  path = os.path.join(workdir, 'results.json')
  with open(path) as f:
    changed = json.load(f)
  changed['pd']['mean'] += 1.0
  before = snapshot(workdir)
  for results in (None, changed):
    if results:
      os.chmod(path, 0o644)
      with open(path, 'w') as f:
        json.dump(results, f)
      before = snapshot(workdir)
    capsys.readouterr()
    with read_only(workdir):
      assert cli.main(tiny_config(), workdir, 'eval') == 0
    out = capsys.readouterr().out
    assert snapshot(workdir) == before
    if results is None:
      assert f'evaluation reproduced {path} exactly' in out, out
    else:
      assert f'evaluation differs from {path} in pd; {workdir} is read-only, so the results follow as JSON:' in out
      shown, _ = json.JSONDecoder().raw_decode(out.split('follow as JSON:\n', 1)[1])  # the table follows it
      assert shown['pd'] == reference[1]['pd']


@pytest.mark.slow
def test_the_fall_back_advice_works(reference, tmp_path):
  """A corrupt base model, then a corrupt base train state: each message says what to delete (the base
  model: with the sessions computed from it), and doing it works (the run resumes from step 10's state)."""
  workdir = copy_of(reference, tmp_path, unfinished=True)
  garbage = lambda *parts: [open(os.path.join(root, name), 'wb').write(b'garbage')
                            for root, _, files in os.walk(os.path.join(workdir, 'checkpoints', *parts))
                            for name in files]
  garbage('model')
  with pytest.raises(CheckpointError, match=r'checkpoints/model/0 \(.*\): it is missing, truncated or corrupt; '
                                            r'delete it and .*/checkpoints/run_\*, then run without --mode eval'):
    pipeline.run(tiny_config(), workdir)
  shutil.rmtree(os.path.join(workdir, 'checkpoints', 'model'))
  for name in ('run_0', 'run_1'):
    shutil.rmtree(os.path.join(workdir, 'checkpoints', name))
  garbage('base', '20')  # as a run stopped after the last base step's save, before the base model
  with pytest.raises(CheckpointError, match=r'checkpoints/base/20 \(.*\): it is missing, truncated or corrupt; '
                                            'delete it, then run without --mode eval'):
    pipeline.run(tiny_config(), workdir)
  shutil.rmtree(os.path.join(workdir, 'checkpoints', 'base', '20'))
  assert without_provenance(pipeline.run(tiny_config(), workdir)) == without_provenance(reference[1])


# ----------------------------------------------------------------------------- SIGKILL at chosen moments

def wait_for(condition, child, timeout: float = 300.0) -> None:
  end = time.time() + timeout
  while not condition():
    assert child.poll() is None, 'the run ended before the moment to kill it'
    assert time.time() < end
    time.sleep(0.01)


def lines_of(path: str, phase: str) -> int:
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    return sum(f'"phase": "{phase}"' in line for line in f)


@pytest.mark.slow
def test_sigkill_then_the_same_command_gives_the_same_results(reference, tmp_path):
  """run.py killed with SIGKILL once its first session is logged (that session's checkpoint possibly
  still being written in the background, its lock held), then run again: the lock is taken over and
  the results equal an uninterrupted run's."""
  workdir = str(tmp_path / 'w')
  metrics = os.path.join(workdir, 'metrics.jsonl')
  command = [sys.executable, 'run.py', *TINY_SMOKE_ARGS, '--workdir', workdir]
  child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    wait_for(lambda: lines_of(metrics, 'session') >= 1, child)
  finally:
    child.kill()
    child.wait()
  assert not os.path.exists(os.path.join(workdir, 'results.json'))
  r = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  with open(os.path.join(workdir, 'results.json')) as f:
    assert without_provenance(json.load(f)) == without_provenance(reference[1])
