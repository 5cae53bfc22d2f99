"""SIGINT and SIGTERM end run.py within seconds at any moment, with exit code 130, one line on stderr and
every checkpoint written complete. The standard library only: run.py calls `watch` on its first line.

Python runs a signal handler only between bytecodes of the main thread, so none runs while it is inside an
import's C code, an XLA compile or a long call; the interpreter's C handler still writes the signal's number
to a wakeup fd, which a watcher thread reads. Outside a run's `stopping` (imports, flags) and in a mode that
saves nothing (bench, flatness, a dry run) a signal ends the process at once. In a run the first signal
makes its hook raise at the next base call or session boundary (base training saves its state there) if
one comes within GRACE_S seconds; else, at a second signal, or where the stopping run has not ended
10 * GRACE_S seconds later, the watcher ends the process once the checkpoint writes in flight are complete.
"""
import atexit
import contextlib
import os
import select
import signal
import sys
import threading
import time

GRACE_S = 5.0
EXIT_HANDLERS_S = 5.0
EXIT_CODE = 130
RESUME = 'every checkpoint written is complete: rerun the same command to resume'


class Stop:
  """A run's stop: the signals received, the watcher's deadline, and whether the main thread took the stop
  in hand (its hook raised `error`, experiment.Interrupted, at a boundary)."""

  def __init__(self, at_once: str = '', grace_s: float = GRACE_S, error: type = KeyboardInterrupt):
    self.at_once, self.grace_s, self.error = at_once, grace_s, error
    self.received, self.stopping, self.deadline = [], False, None

  def hook(self, kind, **info) -> None:
    """The run's boundary hook (pipeline's `hook`): raises `error` after a signal."""
    if self.received:
      self.stopping, self.deadline = True, time.monotonic() + 10 * self.grace_s
      where = ', '.join(f'{k} {v}' for k, v in info.items())
      raise self.error(f'interrupted ({self.received[0]}) after {"base " if kind == "base_step" else ""}{where}')

  def signalled(self, names: list) -> None:
    """The watcher's part: at signals (`names`), or at the deadline (none)."""
    if names and self.at_once:
      end(f'interrupted ({names[0]}); {self.at_once} saves nothing: rerun the same command')
    self.received += names
    if len(self.received) > 1:
      end(f'interrupted again ({self.received[-1]}): stopped at once; {RESUME}')
    if self.deadline is None:
      self.deadline = time.monotonic() + self.grace_s
    elif time.monotonic() >= self.deadline:
      end(f'interrupted ({self.received[0]}): ' + (f'the run did not end {10 * self.grace_s:g} s after its '
          'boundary' if self.stopping else f'no step or session boundary came within {self.grace_s:g} s')
          + f', so it stopped at once; {RESUME}')

  def exit(self, code: int) -> int:
    """`code`, or where a signal came, the end of the process with it once the checkpoint writes are
    complete and the exit handlers ran (TensorBoard's writer flushes there) for at most EXIT_HANDLERS_S:
    no computation still in flight keeps it alive."""
    if self.received:
      end(None, code, EXIT_HANDLERS_S)
    return code


def end(line, code: int = EXIT_CODE, handlers_s: float = 0.0) -> None:
  """Ends the process with `code` once the checkpoint writes in flight are complete, with `line` (if any) on
  stderr on a line of its own, the exit handlers run for at most `handlers_s` (the main thread's end only:
  they close what a running main thread uses). The modules that write are looked up, not imported: the
  main thread may be importing them."""
  for module, name in (('f2m_jax.checkpoint', 'finish_writes'), ('f2m_jax.progress', 'end_lines')):
    getattr(sys.modules.get(module), name, lambda: None)()
  if line:
    print(line, file=sys.stderr, flush=True)
  if handlers_s:
    handlers = threading.Thread(target=atexit._run_exitfuncs, daemon=True)  # pylint: disable=protected-access
    handlers.start()
    handlers.join(timeout=handlers_s)
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  os._exit(code)  # pylint: disable=protected-access


class _Watcher(threading.Thread):
  """The thread reading the wakeup fd; `stop`: the run's Stop, None outside a run."""

  def __init__(self):
    super().__init__(daemon=True, name='f2m-signals')
    self.stop, (self.reader, writer) = None, os.pipe()
    os.set_blocking(writer, False)
    for s in (signal.SIGINT, signal.SIGTERM):
      signal.signal(s, lambda *_: None)  # Python's part does nothing: the watcher acts
    signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
    self.start()

  def run(self) -> None:
    while True:
      deadline = self.stop and self.stop.deadline
      wait = None if deadline is None else max(0.01, deadline - time.monotonic())
      data = os.read(self.reader, 64) if select.select([self.reader], [], [], wait)[0] else b''
      stop, names = self.stop, [signal.Signals(n).name for n in data]
      if stop is not None and (names or stop.received):
        stop.signalled(names)
      elif names:
        end(f'interrupted ({names[0]}); {RESUME}')


_WATCHER = []  # the process's watcher, once `watch` started it


def watch() -> None:
  """Watches SIGINT and SIGTERM from now on (in the main thread: run.py's first line)."""
  if not _WATCHER:
    _WATCHER.append(_Watcher())


@contextlib.contextmanager
def stopping(at_once: str = '', grace_s: float = GRACE_S, error: type = KeyboardInterrupt):
  """Yields a Stop whose `hook` is the run's boundary hook and whose `exit(code)` ends the process after a
  signal, handed to run.py's watcher (module docstring; without it, as in a test's run, nothing is
  watched); `at_once` names a mode that saves nothing ('--mode bench'): a signal ends it at once."""
  stop = Stop(at_once, grace_s, error)
  for watcher in _WATCHER:
    watcher.stop = stop
  try:
    yield stop
  finally:
    for watcher in _WATCHER:
      watcher.stop = None
