"""SIGINT and SIGTERM end run.py within seconds at any moment: exit code 130, one line on stderr,
every checkpoint written complete. The standard library only.

run.py's first statement blocks both signals (one sent then waits); `watch`, right after, serves
them. Python runs a signal handler only between bytecodes of the main thread (never inside an
import's C code, an XLA compile or a long call), but its C handler writes the signal to a wakeup fd,
which a watcher thread reads. Outside a run's `Stop` (imports, flags) and in a mode that saves
nothing (bench, flatness, a dry run) a signal ends the process at once. In a run the hook raises at
the next base call or session boundary (base training saves its state there) if one comes within
GRACE_S seconds; else, at a second signal, or 10 * GRACE_S seconds after the boundary, the watcher
ends the process once the checkpoint writes are complete. Before run.py's first statement the
interpreter starts (docs/development.md, "When a run stops"): a signal then meets Python's own
handling."""
import atexit
import os
import select
import signal
import sys
import threading
import time

GRACE_S = 5.0
EXIT_CODE = 130
RESUME = 'every checkpoint written is complete: rerun the same command to resume'
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stop:
  """A run's stop, which the watcher serves within its `with` (nothing is watched without
  `watch`, as in a test's run): the signals received, the deadline and why it ends the process.
  `at_once`: the end of the line of a mode that saves nothing (its first signal ends it); `error`:
  what the hook raises."""
  late = f'no step or session boundary came within {GRACE_S:g} s'
  deadline = None  # when the watcher ends the process

  def __init__(self, at_once='', error=KeyboardInterrupt):
    self.at_once, self.error, self.received = at_once, error, []

  def __enter__(self):
    self.outside, Stop.current = Stop.current, self
    return self

  def __exit__(self, *_):
    Stop.current = self.outside

  def hook(self, kind, **info):
    """The run's boundary hook (pipeline's `hook`): raises `error` after a signal."""
    if self.received:
      self.deadline = time.monotonic() + 10 * GRACE_S
      self.late = f'the run did not end {10 * GRACE_S:g} s after its boundary'
      raise self.error(f'interrupted ({self.received[0]}) after {"base " * (kind == "base_step")}'
                       f'{", ".join(f"{k} {v}" for k, v in info.items())}')

  def exit(self, code):
    """`code`, or where a signal came, the end of the process with it (`end`: no computation still
    in flight keeps it alive), the exit handlers run for at most GRACE_S (TensorBoard's writer
    flushes there)."""
    if self.received:
      end(None, code, handlers=True)
    return code


Stop.current = Stop(RESUME)  # the Stop the watcher serves; outside a run, one ending at once


def message(line, code):
  """Prints `line` (if any) to stderr on a line of its own, every progress bar's line ended first;
  returns `code`. f2m_jax.progress is looked up, not imported: the main thread may be importing
  it."""
  getattr(sys.modules.get('f2m_jax.progress'), 'end_lines', lambda: None)()
  if line:
    print(line, file=sys.stderr)  # line-buffered (Python >= 3.9): written at once
  return code


def end(line, code=EXIT_CODE, handlers=False):
  """Ends the process with `code` once the checkpoint writes in flight are complete, `line` (if any)
  on stderr; with `handlers`, the exit handlers (which close what a running main thread uses) for at
  most GRACE_S."""
  getattr(sys.modules.get('f2m_jax.run.checkpoint'), 'finish_writes', lambda: None)()
  message(line, code)
  if handlers:
    # pylint: disable-next=protected-access
    run = threading.Thread(target=atexit._run_exitfuncs, daemon=True)
    run.start()
    run.join(GRACE_S)
  sys.stdout.flush()  # stderr is: `message`
  os._exit(code)  # pylint: disable=protected-access


def watch():
  """Serves SIGINT and SIGTERM from now on (called once, in the main thread, by run.py): a signal
  held back since run.py's first statement (which blocks them) is served now."""
  reader, writer = os.pipe()
  os.set_blocking(writer, False)
  for s in SIGNALS:
    signal.signal(s, lambda *_: None)  # Python's part does nothing: the watcher acts
  signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
  threading.Thread(target=_watcher, args=(reader,), daemon=True).start()
  signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def _watcher(reader):
  """Serves `Stop.current` (module docstring): at each signal, and at its deadline."""
  while True:  # every 0.1 s at least: a deadline is met within that
    data = select.select([reader], [], [], 0.1)[0] and os.read(reader, 64)  # [] where none came
    stop = Stop.current
    stop.received += [signal.Signals(n).name for n in data]
    if not stop.received:
      continue
    if stop.at_once:
      end(f'interrupted ({stop.received[0]}); {stop.at_once}')
    if len(stop.received) > 1:
      end(f'interrupted again ({stop.received[-1]}): stopped at once; {RESUME}')
    if stop.deadline is None:
      stop.deadline = time.monotonic() + GRACE_S
    elif time.monotonic() >= stop.deadline:
      end(f'interrupted ({stop.received[0]}): {stop.late}, so it stopped at once; {RESUME}')
