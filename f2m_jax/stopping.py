"""SIGINT and SIGTERM end run.py within seconds at any moment, with exit code 130, one line on stderr and
every checkpoint written complete. The standard library only: run.py calls `watch` on its first line.

Python runs a signal handler only between bytecodes of the main thread, so none runs while it is inside
an import's C code, an XLA compile or a long call. The interpreter's C handler still writes the signal's
number to a wakeup fd (`signal.set_wakeup_fd`), which a watcher thread reads. Outside a run (imports,
flags, the config) a signal ends the process at once: nothing is written there. Within `stopping` the
first signal makes the run's hook raise experiment.Interrupted at its next base call or session boundary (base
training saves its state there) if one comes within GRACE_S seconds; else, or at a second signal, or
where the stopping run has not ended 10 * GRACE_S seconds later, the watcher waits for the checkpoint
writes in flight, prints one line and ends the process. A mode that saves nothing (bench, flatness, a
dry run) ends at the first signal.
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
  """A run's stop, shared by the watcher and the main thread: the signals received, the deadline, and
  whether the main thread took the stop in hand (raised Interrupted at a boundary)."""

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
    """The watcher's part, at signals (`names`) or at the deadline (none)."""
    first = (self.received + names)[0]
    self.received += names
    if self.at_once:
      end(f'interrupted ({first}); {self.at_once} saves nothing: rerun the same command')
    if len(self.received) > 1:
      end(f'interrupted again ({self.received[-1]}): stopped at once; {RESUME}')
    if self.deadline is None:
      self.deadline = time.monotonic() + self.grace_s
    elif time.monotonic() >= self.deadline:
      end(f'interrupted ({first}): ' + (f'the run did not end {10 * self.grace_s:g} s after its boundary' if self.stopping else
                                         f'no step or session boundary came within {self.grace_s:g} s')
          + f', so it stopped at once; {RESUME}')

  def exit(self, code: int) -> int:
    """`code`, or where a signal came, the end of the process with that code once the checkpoint writes
    are complete and the exit handlers ran (TensorBoard's writer flushes there), for at most
    EXIT_HANDLERS_S: no computation still in flight keeps it alive."""
    if self.received:
      _finish_writes()
      handlers = threading.Thread(target=atexit._run_exitfuncs, daemon=True)  # pylint: disable=protected-access
      handlers.start()
      handlers.join(timeout=EXIT_HANDLERS_S)
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(code)  # pylint: disable=protected-access
    return code


def _finish_writes() -> None:
  """checkpoint.finish_writes and progress.end_lines where those modules are loaded (the watcher imports
  nothing: the main thread may be importing them)."""
  for module, name in (('f2m_jax.checkpoint', 'finish_writes'), ('f2m_jax.progress', 'end_lines')):
    getattr(sys.modules.get(module), name, lambda: None)()


def end(line: str) -> None:
  """Ends the process (exit code 130) once the checkpoint writes in flight are complete, with `line` on
  stderr on a line of its own."""
  _finish_writes()
  print(line, file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(EXIT_CODE)  # pylint: disable=protected-access


class _Watcher:
  """The watcher thread on the wakeup fd; `stop`: the run's Stop, None outside a run."""

  def __init__(self):
    self.stop, (self._reader, self._writer) = None, os.pipe()
    os.set_blocking(self._writer, False)
    self._previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
    self._previous_fd = signal.set_wakeup_fd(self._writer, warn_on_full_buffer=False)
    self._thread = threading.Thread(target=self._watch, daemon=True, name='f2m-signals')
    self._thread.start()

  def _watch(self) -> None:
    while True:
      deadline = self.stop and self.stop.deadline
      ready = select.select([self._reader], [], [], None if deadline is None else max(0.01, deadline - time.monotonic()))
      data = os.read(self._reader, 64) if ready[0] else None
      if data == b'':  # closed
        return
      stop = self.stop
      names = [signal.Signals(number).name for number in data or b'']
      if stop is None and names:
        end(f'interrupted ({names[0]}); {RESUME}')
      elif stop is not None and (names or time.monotonic() >= stop.deadline):
        stop.signalled(names)

  def close(self) -> None:
    signal.set_wakeup_fd(self._previous_fd)
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    os.close(self._writer)
    self._thread.join(timeout=1.0)
    os.close(self._reader)


_WATCHER = []  # the process's watcher, once `watch` started it


def watch() -> None:
  """Watches SIGINT and SIGTERM from now on, in the main thread (run.py's first line)."""
  if not _WATCHER:
    _WATCHER.append(_Watcher())


@contextlib.contextmanager
def stopping(at_once: str = '', grace_s: float = GRACE_S, error: type = KeyboardInterrupt):
  """Yields a Stop, with SIGINT and SIGTERM watched (module docstring): its `hook` is the run's boundary
  hook (raising `error`: experiment.Interrupted), its `exit(code)` ends the process after a signal. `at_once` names a mode that saves nothing
  (e.g. '--mode bench'): its first signal ends it. Without run.py's watcher, one is started for the block
  in the main thread (the previous handlers are restored afterwards); outside it nothing is watched."""
  stop = Stop(at_once, grace_s, error)
  own = not _WATCHER and threading.current_thread() is threading.main_thread()
  watcher = _WATCHER[0] if _WATCHER else _Watcher() if own else None
  if watcher:
    watcher.stop = stop
  try:
    yield stop
  finally:
    if watcher:
      watcher.stop = None
    if own:
      watcher.close()
