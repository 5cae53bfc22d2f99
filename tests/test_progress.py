"""What a run shows while it works: bars in place on a terminal and as lines elsewhere, the status line
of a long call, and a message that never starts on a bar's line."""
import io
import json
import queue
import re
import sys
import threading
import types

import jax
import tqdm

from f2m_jax import progress
from f2m_jax.run import cli


class Terminal(io.StringIO):

  def isatty(self):
    return True


def test_an_error_after_a_progress_bar_starts_on_its_own_line(monkeypatch):
  """At 0739cee the line was glued to the bar's (stdout and stderr share the terminal)."""
  terminal = Terminal()
  monkeypatch.setattr(sys, 'stderr', terminal)
  bar = progress.bar(100, 'base session', file=terminal)
  bar.update(30)
  bar.refresh()
  assert cli.message('interrupted (SIGINT) after base step 30; every checkpoint written is complete', 130) == 130
  bar.close()
  lines = terminal.getvalue().split('\n')
  assert lines[0].split('\r')[-1].startswith('base session:  30%')
  assert lines[1] == 'interrupted (SIGINT) after base step 30; every checkpoint written is complete'


def test_the_status_line_of_a_long_call_is_kept_up_to_date(monkeypatch):
  """Redrawn in place every second on a terminal by its thread, with the time since its text was set
  (tqdm's mm:ss); the thread's waits and the clock are the test's (no wall clock)."""
  clock, waiting, wake = [0.0], queue.Queue(), queue.Queue()

  def sleep(seconds):  # the thread's wait: reported, then over when the test moves the clock
    waiting.put(seconds)
    clock[0] += wake.get()

  monkeypatch.setattr(tqdm.std, 'time', lambda: clock[0])
  monkeypatch.setattr(progress, 'time', types.SimpleNamespace(sleep=sleep))
  terminal, others = Terminal(), set(threading.enumerate())  # earlier tests' lines end at their next tick
  status = progress.status('base session: compiling the step', file=terminal)
  for _ in range(2):  # two seconds: two redraws
    assert waiting.get(timeout=60) == 1.0
    wake.put(1.0)
  assert waiting.get(timeout=60) == 1.0
  status.set('base session: compiled in 2 s; first call: 20 steps')
  progress.end_lines()  # as an error does: the line ends, the updates stop
  text = terminal.getvalue()
  wake.put(5.0)
  for thread in set(threading.enumerate()) - others:  # this line's
    thread.join(60)
  assert terminal.getvalue() == text and text.endswith('\n')
  assert [d.rstrip() for d in text.rstrip('\n').split('\r')[1:]] == [
      f'base session: compiling the step ({s})' for s in ('00:00', '00:01', '00:02')] + [
      'base session: compiled in 2 s; first call: 20 steps (00:00)'] * 2
  assert [progress.elapsed(s) for s in (45, 723, 7500)] == ['45 s', '12 min 03 s', '2 h 05 min']


def test_the_bench_says_what_it_compiles_and_times(capsys):
  """bench.time_cases (--mode bench, the dry run's step): each compile and each round on a status line
  (stderr), with its time; a record a case (a function not jitted: compiled by its first call); the
  table divides each base step's time by the plain step's."""
  from f2m_jax.run import bench  # pylint: disable=g-import-not-at-top
  ones, step = jax.numpy.ones(8), jax.jit(lambda state, x: (state + x, state.sum()))
  cases = [bench.Case('plain', 0, 8, step, (ones, ones), 4, True),
           bench.Case('eval', None, 8, lambda x: x * 2, (ones,))]
  records = bench.time_cases(cases, 'float32', 1, 2)
  assert [(r['variant'], r['steps_per_call'], r['peak_bytes'] is None) for r in records] == [
      ('plain', 4, False), ('eval', 1, True)]
  f2m = dict(records[0], variant='f2m', M=2, step_ms_median=3 * records[0]['step_ms_median'])
  table = bench.format_table(records + [f2m]).splitlines()
  assert [row.split()[-1] for row in table] == ['plain', '1.00', '-', '3.00']
  assert [line.rsplit(' (', 1)[0] for line in capsys.readouterr().err.splitlines()][1:5] == [
      'bench: compiling plain', 'bench: compiling eval',
      'bench: round 1 of 3 (the first 1 a warm-up), every case once',
      'bench: round 2 of 3 (the first 1 a warm-up), every case once']


def test_a_compile_says_how_long_it_took_here_last_time(tmp_path, monkeypatch):
  """The status line of a compile names its time on this machine from the cache folder's record (the first
  time, that there is none), which the compile then keeps; while the line is up XLA's C++ log shows fatal
  errors only (its 'Very slow compile?' alarm at 2 min read as a crash), and its level is back afterwards."""
  import jax  # pylint: disable=g-import-not-at-top
  levels = []
  monkeypatch.setattr(progress, 'absl_set_min_log_level', levels.append)
  monkeypatch.setenv('TF_CPP_MIN_LOG_LEVEL', '1')
  lowered = jax.jit(lambda x: x * 3.0 + 1.0).lower(jax.ShapeDtypeStruct((7,), 'float32'))
  shown = []
  for _ in range(2):
    log = io.StringIO()
    status = progress.status('base session: compiling the step', file=log)
    assert float(status.compile(lowered, str(tmp_path / 'cache'))(jax.numpy.ones(7))[0]) == 4.0
    status.close()
    shown.append(log.getvalue().splitlines()[-1])
  assert shown[0].startswith('base session: compiling the step: its first compile here: ')
  assert re.fullmatch(r'base session: compiling the step: \d+ s here last time \(00:0\d\)', shown[1]), shown[1]
  with open(tmp_path / 'cache' / progress.COMPILE_TIMES) as f:
    assert len(json.load(f)) == 1  # the same program: one record
  assert levels == [3, 1, 3, 1]
