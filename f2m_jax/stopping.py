"""SIGINT and SIGTERM end a run within seconds in every phase, with exit code 130 and every
checkpoint written complete (f2m_jax/cli.py wraps every mode in `stopping`).

Python runs a signal handler only between bytecodes of the main thread, so while the main thread is
inside an XLA compile or a long call no handler runs. The interpreter's C handler still writes the
signal's number to a wakeup fd (`signal.set_wakeup_fd`), which a watcher thread reads. After the
first signal the run stops at its next base step or session boundary (the hook raises Interrupted
there) if one comes within GRACE_S seconds; else, or at a second signal, the watcher waits for the
checkpoint writes in flight (`checkpoint.finish_writes`), prints one line and ends the process. A
mode that saves nothing (bench, flatness, a dry run) ends at the first signal.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import sys
import threading
import time

from f2m_jax import checkpoint as checkpoint_lib
from f2m_jax import progress
from f2m_jax.experiment import Interrupted

GRACE_S = 5.0
EXIT_HANDLERS_S = 5.0
SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_CODE = 130
RESUME = 'every checkpoint written is complete: rerun the same command to resume'


class _Stop:
  """What the watcher and the main thread share: the signals received, and whether the main thread
  has taken the stop in hand (raised Interrupted at a boundary)."""

  def __init__(self, at_once: str, grace_s: float):
    self.at_once, self.grace_s = at_once, grace_s
    self.received, self.stopping = [], False

  def hook(self, kind, **info) -> None:
    """The run's boundary hook: raises Interrupted after a signal (pipeline's `hook`)."""
    if self.received:
      self.stopping = True
      where = ', '.join(f'{k} {v}' for k, v in info.items())
      raise Interrupted(f'interrupted ({self.received[0]}) after {"base " if kind == "base_step" else ""}{where}')

  def watch(self, sock: socket.socket) -> None:
    """The watcher thread: reads the signals' numbers until the mode ends (the other end closed);
    ends the process where the main thread does not stop in time."""
    deadline = None
    while True:
      sock.settimeout(None if deadline is None else max(0.01, deadline - time.monotonic()))
      try:
        data = sock.recv(64)
      except (socket.timeout, TimeoutError):
        data = None
      if data == b'':
        return
      self.received.extend(signal.Signals(number).name for number in data or b'')
      if self.at_once:
        end(f'interrupted ({self.received[0]}); {self.at_once} saves nothing: rerun the same command')
      if len(self.received) > 1:
        end(f'interrupted again ({self.received[-1]}): stopped at once; {RESUME}')
      if deadline is None:
        deadline = time.monotonic() + self.grace_s
      elif time.monotonic() >= deadline and not self.stopping:
        end(f'interrupted ({self.received[0]}): no step or session boundary came within {self.grace_s:g} s, '
            f'so it stopped at once; {RESUME}')
      elif time.monotonic() >= deadline:  # stopping at a boundary, it closes its checkpoints: give it time
        deadline, self.stopping = time.monotonic() + 10 * self.grace_s, False

  def exit(self, code: int) -> int:
    """`code`, or where a signal came, the end of the process with that code once the checkpoint
    writes are complete and the exit handlers ran (TensorBoard's writer flushes there), for at most
    EXIT_HANDLERS_S: no computation still in flight keeps it alive."""
    if self.received:
      checkpoint_lib.finish_writes()
      handlers = threading.Thread(target=atexit._run_exitfuncs, daemon=True)  # pylint: disable=protected-access
      handlers.start()
      handlers.join(timeout=EXIT_HANDLERS_S)
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(code)  # pylint: disable=protected-access
    return code


def end(line: str) -> None:
  """Ends the process (exit code 130) once the checkpoint writes in flight are complete, with `line`
  on stderr on a line of its own."""
  checkpoint_lib.finish_writes()
  progress.end_lines()
  print(line, file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(EXIT_CODE)  # pylint: disable=protected-access


@contextlib.contextmanager
def stopping(at_once: str = '', grace_s: float = GRACE_S):
  """Yields a _Stop, with SIGINT and SIGTERM watched (module docstring): its `hook` is the run's
  boundary hook, its `exit(code)` ends the process after a signal. `at_once` names a mode that saves
  nothing (e.g. '--mode bench'): its first signal ends it. Outside the main thread (which alone
  takes signals) nothing is watched. The previous handlers are restored afterwards."""
  stop = _Stop(at_once, grace_s)
  if threading.current_thread() is not threading.main_thread():
    yield stop
    return
  reader, writer = socket.socketpair()
  writer.setblocking(False)
  previous = {s: signal.signal(s, lambda *_: None) for s in SIGNALS}  # the watcher acts, not the handler
  previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
  watcher = threading.Thread(target=stop.watch, args=(reader,), daemon=True, name='f2m-signals')
  watcher.start()
  try:
    yield stop
  finally:
    signal.set_wakeup_fd(previous_fd)
    for s, handler in previous.items():
      signal.signal(s, handler)
    writer.close()
    watcher.join(timeout=1.0)
    reader.close()
