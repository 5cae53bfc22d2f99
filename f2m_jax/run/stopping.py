"""SIGINT and SIGTERM end run.py within seconds at any moment: exit code 130, one line on stderr, every
checkpoint written complete. The standard library only: run.py calls `watch` on its first line.

Python runs a signal handler only between bytecodes of the main thread (never inside an import's C code, an
XLA compile or a long call), but its C handler writes the signal to a wakeup fd, which a watcher thread reads.
Outside a run's `Stop` (imports, flags) and in a mode that saves nothing (bench, flatness, a dry run) a
signal ends the process at once. In a run the hook raises at the next base call or session boundary (base
training saves its state there) if one comes within GRACE_S seconds; else, at a second signal, or 10 *
GRACE_S seconds after the boundary, the watcher ends the process once the checkpoint writes are complete."""
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


class Stop:
  """A run's stop, which the watcher serves within its `with` (nothing is watched without `watch`, as in a
  test's run): the signals received, the deadline and why it ends the process. `at_once`: the end of the
  line of a mode that saves nothing (its first signal ends it); `error`: what the hook raises."""
  current = None  # the Stop the watcher serves; outside a run, one that ends the process at once (below)

  def __init__(self, at_once: str = '', error: type = KeyboardInterrupt):
    self.at_once, self.error, self.received, self.deadline = at_once, error, [], None
    self.late = f'no step or session boundary came within {GRACE_S:g} s'

  def __enter__(self) -> 'Stop':
    self.outside, Stop.current = Stop.current, self
    return self

  def __exit__(self, *_) -> None:
    Stop.current = self.outside

  def hook(self, kind, **info) -> None:
    """The run's boundary hook (pipeline's `hook`): raises `error` after a signal."""
    if self.received:
      self.deadline = time.monotonic() + 10 * GRACE_S
      self.late = f'the run did not end {10 * GRACE_S:g} s after its boundary'
      where = ', '.join(f'{k} {v}' for k, v in info.items())
      raise self.error(f'interrupted ({self.received[0]}) after {"base " if kind == "base_step" else ""}{where}')

  def exit(self, code: int) -> int:
    """`code`, or where a signal came, the end of the process with it (`end`: no computation still in
    flight keeps it alive), the exit handlers run for at most 5 s (TensorBoard's writer flushes there)."""
    if self.received:
      end(None, code, handlers_s=5.0)
    return code


Stop.current = Stop(RESUME)


def message(line, code: int) -> int:
  """Prints `line` (if any) to stderr on a line of its own, every progress bar's line ended first; returns
  `code`. f2m_jax.progress is looked up, not imported: the main thread may be importing it."""
  getattr(sys.modules.get('f2m_jax.progress'), 'end_lines', lambda: None)()
  if line:
    print(line, file=sys.stderr, flush=True)
  return code


def end(line, code: int = EXIT_CODE, handlers_s: float = 0.0) -> None:
  """Ends the process with `code` once the checkpoint writes in flight are complete, `line` (if any) on
  stderr; the exit handlers, which close what a running main thread uses, run for at most `handlers_s`."""
  getattr(sys.modules.get('f2m_jax.run.checkpoint'), 'finish_writes', lambda: None)()
  message(line, code)
  if handlers_s:
    handlers = threading.Thread(target=atexit._run_exitfuncs, daemon=True)  # pylint: disable=protected-access
    handlers.start()
    handlers.join(timeout=handlers_s)
  sys.stdout.flush()  # stderr is: `message`
  os._exit(code)  # pylint: disable=protected-access


def watch() -> None:
  """Watches SIGINT and SIGTERM from now on (called once, in the main thread: run.py's first line)."""
  reader, writer = os.pipe()
  os.set_blocking(writer, False)
  for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, lambda *_: None)  # Python's part does nothing: the watcher acts
  signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
  threading.Thread(target=_watcher, args=(reader,), daemon=True, name='f2m-signals').start()
  signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))  # one held back since the start: now


def _watcher(reader: int) -> None:
  """Serves `Stop.current` (module docstring): at each signal, and at its deadline."""
  while True:
    deadline = Stop.current.deadline
    wait = None if deadline is None else max(0.01, deadline - time.monotonic())
    data = os.read(reader, 64) if select.select([reader], [], [], wait)[0] else b''
    stop, names = Stop.current, [signal.Signals(n).name for n in data]
    if names and stop.at_once:
      end(f'interrupted ({names[0]}); {stop.at_once}')
    stop.received += names
    if len(stop.received) > 1:
      end(f'interrupted again ({stop.received[-1]}): stopped at once; {RESUME}')
    if stop.received and stop.deadline is None:
      stop.deadline = time.monotonic() + GRACE_S
    elif stop.received and time.monotonic() >= stop.deadline:
      end(f'interrupted ({stop.received[0]}): {stop.late}, so it stopped at once; {RESUME}')
