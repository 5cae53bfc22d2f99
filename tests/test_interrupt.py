"""Ctrl-C (SIGINT) and SIGTERM stop a run at its next step or session boundary: one line saying where
and how to resume, exit code 130, no traceback; the rerun of the same command ends with the results
of an uninterrupted run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, without_provenance

ARGS = ['--config', 'configs/cifar100.py:smoke', '--config.tensorboard=False', '--config.runs=1',
        '--config.data.synthetic.num_sessions=3', '--config.base.steps=200', '--config.base.milestones=(150,)',
        '--config.base.checkpoint_every=50']


def _run(workdir, **kw):
  return subprocess.Popen([sys.executable, 'run.py', *ARGS, '--workdir', str(workdir)], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _base_steps(workdir) -> list:
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line)['step'] for line in f if '"phase": "base"' in line]


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """The uninterrupted run's results.json, shared by both signals."""
  workdir = tmp_path_factory.mktemp('reference')
  run = _run(workdir)
  assert run.wait(timeout=900) == 0, run.stderr.read()[-2000:]
  with open(workdir / 'results.json') as f:
    return json.load(f)


@pytest.mark.slow
@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_run_cleanly_and_the_rerun_resumes_exactly(tmp_path, reference, sig):
  child = _run(tmp_path / 'w')
  deadline = time.time() + 600
  while not [s for s in _base_steps(tmp_path / 'w') if s >= 60] and time.time() < deadline:
    time.sleep(0.05)
  child.send_signal(sig)
  _, err = child.communicate(timeout=300)
  lines = [line for line in err.splitlines() if line.strip()]
  assert child.returncode == 130, err[-3000:]
  assert 'Traceback' not in err and len(lines) == 1, lines
  assert lines[0].startswith(f'interrupted ({sig.name}) after base step ') and 'rerun the same command' in lines[0]
  stopped_at = int(lines[0].split('after base step ')[1].split(';')[0])
  assert 60 <= stopped_at < 200 and not os.path.exists(tmp_path / 'w' / 'results.json')
  rerun = _run(tmp_path / 'w')
  assert rerun.wait(timeout=900) == 0, rerun.stderr.read()[-2000:]
  with open(tmp_path / 'w' / 'results.json') as f:
    assert without_provenance(json.load(f)) == without_provenance(reference)


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
