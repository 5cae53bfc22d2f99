"""Ctrl-C (SIGINT) and SIGTERM stop run.py at any moment: before a run starts at once; in a run at
its next step or session boundary, base training saving its state there, or within seconds where
none comes (a long compile or first call, a restore): one line saying where and how to resume, exit
code 130, no traceback; the rerun resumes at the step it stopped at and ends with the results of an
uninterrupted run. A long call is staged in the child by a sleep where it happens (PATCHES)."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, TINY_SMOKE_ARGS, copy_of, without_provenance

# The reference run's config (conftest.tiny_smoke: 20 base steps, 5 a call, checkpoints every 10):
# its programs are in the persistent compilation cache, and the rerun is compared with its results.
ARGS = [*TINY_SMOKE_ARGS, '--config.tensorboard=False']


# Python run before run.py's main, staging where a signal comes: the base program's first call, or
# each restored session, takes a minute (a call that holds the main thread, as an XLA compile does);
# or the base call of steps 6-10 (the second, of 5 steps) takes 3 s more, the file <workdir>.marker
# made as it starts: a signal sent then arrives while base training is under way, after step 5's
# hook; or run.py's import of the f2m_jax package takes 2 s more, the marker made as it starts.
def _base_calls_sleep(when: str, seconds: int) -> str:
  """Python making each base call for which `when` holds (`self`: the train loop's Records, whose
  bar is None until the first call; `a[0]`: the call's first step) take `seconds` more."""
  return (f'from f2m_jax import train_loop as m; f = m.Records.__call__; {MARKER}; '
          f'm.Records.__call__ = lambda self, *a: (({when}) and (open(marker, "w").close(), '
          f'time.sleep({seconds})), f(self, *a))[1]')


MARKER = "marker = sys.argv[sys.argv.index('--workdir') + 1] + '.marker'"
PATCHES = {
    'first_call': _base_calls_sleep('self.bar is None', 60),
    'restore': 'from f2m_jax import sessions as m; f = m.restore_session; '
               'm.restore_session = lambda *a: (time.sleep(60), f(*a))[1]',
    'second_call': _base_calls_sleep('a[0] == 5', 3),
    'import': f"{MARKER}; sys.meta_path.insert(0, type('Slow', (), {{'find_spec': staticmethod("
              "lambda name, *a: (name == 'f2m_jax' and (open(marker, 'w').close(), time.sleep(2)), "
              "None)[1])}))",
    'short_restores': 'from f2m_jax import sessions as m; f = m.restore_session; '
                      'm.restore_session = lambda *a: (time.sleep(0.5), f(*a))[1]',
}


def _run(workdir, *extra, patch=''):
  command = ['run.py', *ARGS, '--workdir', str(workdir), *extra]
  if patch:
    command = ['-c', f'import runpy, sys, time; sys.argv = {command!r}; {PATCHES[patch]}; '
                     "runpy.run_path('run.py', run_name='__main__')"]
  return subprocess.Popen([sys.executable, *command], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _stop_when(child, sig, text: str) -> tuple:
  """Sends `sig` once the child prints `text`; (seconds until it ended, its stderr's lines)."""
  while text not in child.stdout.readline():
    assert child.poll() is None, child.stderr.read()[-3000:]
  t0 = time.time()
  child.send_signal(sig)
  _, err = child.communicate(timeout=300)
  return time.time() - t0, [line for line in err.splitlines() if line.strip()]


def _incomplete(workdir) -> list:
  """The files under `workdir` that a writer left unfinished: temporary files, a log whose last line
  is cut (a JSON file that does not parse raises here)."""
  for path in workdir.rglob('*.json'):
    json.loads(path.read_text())
  return [p for p in workdir.rglob('*') if 'tmp' in p.name
          or p.suffix == '.jsonl' and not p.read_text().endswith('\n')]


@pytest.mark.skipif(not os.path.exists('/proc/self/status'), reason="/proc tells the start's end")
@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGTERM], ids=['SIGINT', 'SIGTERM'])
def test_a_signal_at_any_moment_ends_run_py_with_one_line(tmp_path, sig):
  """From run.py's first statement (blocking both) on, in its imports (staged 2 s longer; 6f2b875:
  SIGTERM killed it silently), JAX's (d41b789 lost a SIGINT), its run: exit code 130 within 30 s,
  one line, only complete files. Before it, the interpreter's start (docs/development.md, "When a
  run stops"): Python's own end (exit code 1, or the signal's; or it swallows SIGINT, saying so)."""
  for i, after_s in enumerate([0.02, 0.05, 0.1] * 5 + [1.0, 3.0, None]):  # None: the staged import
    workdir = tmp_path / f'w{i}'
    child = _run(workdir, '--config.base.steps=100000', patch='' if after_s else 'import')
    try:
      while after_s is None and not os.path.exists(f'{workdir}.marker'):
        assert child.poll() is None, child.stderr.read()[-3000:]
      time.sleep(after_s or 0)
      # run.py's first statement ran: SIGTERM blocked (from there) or caught (by `stopping.watch`)
      status = dict(line.split(':', 1) for line in pathlib.Path(f'/proc/{child.pid}/status').open())
      started = (int(status['SigBlk'], 16) | int(status['SigCgt'], 16)) >> (signal.SIGTERM - 1) & 1
      child.send_signal(sig)
      with contextlib.suppress(subprocess.TimeoutExpired):  # it runs on: killed below
        child.communicate(timeout=30)
    finally:
      child.kill()  # where it ran on (d41b789)
    err = child.communicate()[1]
    if started or after_s is None:  # run.py's one line
      assert child.returncode == 130 and err.count('\n') == 1, (after_s, err[-3000:])
      assert err.startswith(f'interrupted ({sig.name})'), err
    elif child.returncode == -signal.SIGKILL:  # "Exception ignored in: ... KeyboardInterrupt"
      assert sig == signal.SIGINT and 'Exception ignored' in err, err[-3000:]
    assert child.returncode in (130, 1, -sig, -signal.SIGKILL) and not _incomplete(workdir)


@pytest.mark.slow
def test_signals_stop_the_run_cleanly_and_the_rerun_resumes_exactly(tmp_path, reference):
  """One workdir, two interruptions, then the rerun that ends it. SIGTERM during the first call, where
  no base step comes (0739cee waited for it, and a second signal left the process running on): the
  line says so, within seconds. SIGINT during base training, between the checkpoints of steps 10 and
  20: it stops after the call in flight and saves its state there (d41b789 kept step 10's only, and
  the rerun computed 11-15 again), one line, exit code 130, no results. The rerun of the same command
  resumes at that step and gives the results of the uninterrupted run of the same config
  (conftest.reference)."""
  workdir = tmp_path / 'w'
  seconds, lines = _stop_when(_run(workdir, patch='first_call'), signal.SIGTERM, 'first call: ')
  assert seconds < 30 and lines == [
      'interrupted (SIGTERM): no step or session boundary came within 5 s, so it stopped at once; every checkpoint '
      'written is complete: rerun the same command to resume'], (seconds, lines)
  pathlib.Path(f'{workdir}.marker').unlink(missing_ok=True)
  child = _run(workdir, patch='second_call')
  while not os.path.exists(f'{workdir}.marker'):
    assert child.poll() is None, child.stderr.read()[-3000:]
    time.sleep(0.05)
  child.send_signal(signal.SIGINT)
  _, err = child.communicate(timeout=300)
  lines = [line for line in err.splitlines() if line.strip()]
  assert child.returncode == 130, err[-3000:]
  assert 'Traceback' not in err and lines == [  # the hook of step 10 raised; the call of steps 11-15 ended it
      'interrupted (SIGINT) after base step 15, where its state is saved; every checkpoint written is complete: '
      'rerun the same command to resume'], lines
  assert sorted(os.listdir(workdir / 'checkpoints' / 'base')) == ['10', '15'] and not (workdir / 'results.json').exists()
  rerun = _run(workdir)
  out, err = rerun.communicate(timeout=900)
  assert rerun.returncode == 0, err[-2000:]
  assert 'base session: resuming at step 15/20' in out, out[-2000:]  # the stopped step: none recomputed
  with open(workdir / 'results.json') as f:
    results = json.load(f)
  assert without_provenance(results) == without_provenance(reference[1])
  # The log holds each base step once (a step logged after the checkpoint the rerun resumed from is not
  # written again) and the start of each invocation that logged something (the first logged nothing);
  # the wall time is the sum of theirs, the interrupted one's (a second or more of staged calls) too.
  with open(workdir / 'metrics.jsonl') as f:
    records = [json.loads(line) for line in f]
  assert [r['step'] for r in records if r['phase'] == 'base'] == [5, 10, 15, 20]
  assert [r['mode'] for r in records if r['phase'] == 'start'] == ['train', 'train']
  times = results['provenance']['invocation_times_s']
  assert len(times) == 2 and times[0] >= 1.0 and results['provenance']['wall_time_s'] == round(sum(times), 1)


def test_a_signal_stops_a_mode_without_boundaries_at_once(tmp_path):
  """--mode bench (and flatness) calls no hook and saves nothing, so the first signal ends it at
  once: one line, exit 130. (Deferred to a boundary that never came, SIGTERM let the bench run
  on.)"""
  child = subprocess.Popen([sys.executable, 'run.py', '--config', 'configs/cifar100.py:smoke',
                            '--mode', 'bench', '--workdir', str(tmp_path / 'bench')], cwd=REPO,
                           text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  assert child.stdout.readline().startswith('bench on ')  # the signal handlers are installed by now
  child.send_signal(signal.SIGTERM)
  _, err = child.communicate(timeout=60)
  assert child.returncode == 130, err[-3000:]
  assert err == 'interrupted (SIGTERM); --mode bench saves nothing: rerun the same command\n', err


@pytest.mark.slow
@pytest.mark.parametrize('patch,said', [
    ('restore', 'interrupted (SIGINT): no step or session boundary came within 5 s'),
    ('short_restores', 'interrupted (SIGINT) after run 0, session 2; every checkpoint written is complete')])
def test_a_signal_stops_eval(tmp_path, reference, patch, said):
  """--mode eval ignored SIGINT at 0739cee (no trained session, no boundary); 6f2b875 dropped one that came
  as an eval's restores (0.5 s each) began, ending within the grace (rc 0, no line): each is a boundary."""
  workdir = copy_of(reference, tmp_path)
  child = _run(workdir, '--mode', 'eval', patch=patch)
  seconds, lines = _stop_when(child, signal.SIGINT, 'session 1: ')
  assert child.returncode == 130 and seconds < 30 and len(lines) == 1 and lines[0].startswith(said), lines
  assert sorted(os.listdir(workdir)) == sorted(os.listdir(reference[0]))
