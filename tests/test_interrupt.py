"""Ctrl-C (SIGINT) and SIGTERM stop a run at its next step or session boundary, or within seconds where
none comes (a long compile or first call, a restore): one line saying where and how to resume, exit
code 130, no traceback; the rerun of the same command ends with the results of an uninterrupted run.
A long call is staged in the child by a sleep where it happens (PATCHES)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, TINY_SMOKE_ARGS, copy_of, without_provenance

# The reference run's config (conftest.tiny_smoke: 20 base steps, 5 a call, checkpoints every 10): its
# programs are in the persistent compilation cache, and the rerun is compared with its results.
ARGS = [*TINY_SMOKE_ARGS, '--config.tensorboard=False']


# Python run before run.py's main, staging where a signal comes: the base program's first call, or each
# restored session, takes a minute (a call that holds the main thread, as an XLA compile does); or every
# base call after the first takes a second more, so that base training is still under way when a signal
# sent after step 10 arrives.
def _base_calls_sleep(when: str, seconds: int) -> str:
  """Python making each base call for which `when` holds (`self`: the train loop's Records, whose bar
  is None until the first call) take `seconds` more."""
  return ('from f2m_jax import train_loop as m; f = m.Records.__call__; '
          f'm.Records.__call__ = lambda self, *a: (({when}) and time.sleep({seconds}), f(self, *a))[1]')


PATCHES = {
    'first_call': _base_calls_sleep('self.bar is None', 60),
    'restore': 'from f2m_jax import sessions as m; f = m.restore_session; '
               'm.restore_session = lambda *a: (time.sleep(60), f(*a))[1]',
    'slow_calls': _base_calls_sleep('self.bar is not None', 1),
}


def _run(workdir, *extra, patch=''):
  command = ['run.py', *ARGS, '--workdir', str(workdir), *extra]
  if patch:
    command = ['-c', f'import runpy, sys, time; sys.argv = {command!r}; {PATCHES[patch]}; '
                     "runpy.run_path('run.py', run_name='__main__')"]
  return subprocess.Popen([sys.executable, *command], cwd=REPO, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)


def _stop_when(child, sig, text: str) -> tuple:
  """Sends `sig` once the child prints a line holding `text`; (seconds until it ended, its stderr's lines)."""
  while text not in child.stdout.readline():
    assert child.poll() is None, child.stderr.read()[-3000:]
  t0 = time.time()
  child.send_signal(sig)
  _, err = child.communicate(timeout=300)
  return time.time() - t0, [line for line in err.splitlines() if line.strip()]


def _base_steps(workdir) -> list:
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line)['step'] for line in f if '"phase": "base"' in line]


@pytest.mark.slow
def test_signals_stop_the_run_cleanly_and_the_rerun_resumes_exactly(tmp_path, reference):
  """One workdir, two interruptions, then the rerun that ends it. SIGTERM during the first call, where
  no base step comes (0739cee waited for it, and a second signal left the process running on): the
  line says so, within seconds. SIGINT during base training: it stops at the next step boundary,
  one line, exit code 130, no results. The rerun of the same command gives the results of the
  uninterrupted run of the same config (conftest.reference)."""
  workdir = tmp_path / 'w'
  seconds, lines = _stop_when(_run(workdir, patch='first_call'), signal.SIGTERM, 'first call: ')
  assert seconds < 30 and lines == [
      'interrupted (SIGTERM): no step or session boundary came within 5 s, so it stopped at once; every checkpoint '
      'written is complete: rerun the same command to resume'], (seconds, lines)
  child = _run(workdir, patch='slow_calls')
  deadline = time.time() + 600
  while not [s for s in _base_steps(workdir) if s >= 10] and time.time() < deadline:
    assert child.poll() is None, child.stderr.read()[-3000:]
    time.sleep(0.05)
  child.send_signal(signal.SIGINT)
  _, err = child.communicate(timeout=300)
  lines = [line for line in err.splitlines() if line.strip()]
  assert child.returncode == 130, err[-3000:]
  assert 'Traceback' not in err and len(lines) == 1, lines
  assert lines[0].startswith('interrupted (SIGINT) after base step ') and 'rerun the same command' in lines[0]
  stopped_at = int(lines[0].split('after base step ')[1].split(';')[0])
  assert 10 <= stopped_at < 20 and not os.path.exists(workdir / 'results.json')
  rerun = _run(workdir)
  assert rerun.wait(timeout=900) == 0, rerun.stderr.read()[-2000:]
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
  """--mode bench (and flatness) calls no hook and saves nothing, so the first signal ends it at once:
  one line, exit 130. (Deferred to a boundary that never came, SIGTERM let the bench run on.)"""
  child = subprocess.Popen([sys.executable, 'run.py', '--config', 'configs/cifar100.py:smoke', '--mode', 'bench',
                            '--workdir', str(tmp_path / 'bench')], cwd=REPO, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
  assert child.stdout.readline().startswith('bench on ')  # the signal handlers are installed by now
  child.send_signal(signal.SIGTERM)
  _, err = child.communicate(timeout=60)
  assert child.returncode == 130, err[-3000:]
  assert err.strip() == 'interrupted (SIGTERM); --mode bench saves nothing: rerun the same command', err[-3000:]


@pytest.mark.slow
def test_a_signal_stops_eval_during_a_restore(tmp_path, reference):
  """--mode eval ignored SIGINT at 0739cee (no trained session, no boundary)."""
  workdir = copy_of(reference, tmp_path)
  seconds, lines = _stop_when(_run(workdir, '--mode', 'eval', patch='restore'), signal.SIGINT, 'session 1: ')
  assert seconds < 30 and len(lines) == 1 and lines[0].startswith('interrupted (SIGINT): no step or session '
                                                                  'boundary came within 5 s'), (seconds, lines)
  assert sorted(os.listdir(workdir)) == sorted(os.listdir(reference[0]))
