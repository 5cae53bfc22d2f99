"""What a run shows while it works: progress bars, a status line kept alive while the main thread waits
in one long call (an XLA compile, a program's first call), and the end of the line either draws on
before a message, so that a message never starts on a bar's line.

On a terminal a bar or the status line is redrawn in place; elsewhere (a log file, a pipe) each
update is a line of its own, at most every LOG_EVERY_S seconds.
"""
from __future__ import annotations

import sys
import threading
import time
import weakref

from tqdm import tqdm

LOG_EVERY_S = 30.0
_STATUS = weakref.WeakSet()  # the open status lines


class _Lines:
  """A file for tqdm off a terminal: each redraw ('\\r' + the bar) becomes a line of its own."""

  def __init__(self, file):
    self.file = file

  def write(self, text: str) -> None:
    text = text.replace('\r', '').rstrip()
    if text:
      self.file.write(text + '\n')

  def flush(self) -> None:
    self.file.flush()


def interactive(file) -> bool:
  isatty = getattr(file, 'isatty', None)
  return bool(isatty and isatty())


def bar(total: int, desc: str, file=None, mininterval: float = 2.0, **kw) -> tqdm:
  """A tqdm bar on `file` (default stdout): redrawn in place on a terminal, else a line at most every
  LOG_EVERY_S seconds."""
  file = file or sys.stdout
  if interactive(file):
    return tqdm(total=total, desc=desc, file=file, mininterval=mininterval, **kw)
  return tqdm(total=total, desc=desc, file=_Lines(file), mininterval=LOG_EVERY_S, maxinterval=LOG_EVERY_S,
              ascii=True, **kw)


def elapsed(seconds: float) -> str:
  """'45 s', '12 min 03 s', '2 h 05 min'."""
  s = int(seconds)
  if s < 60:
    return f'{s} s'
  return f'{s // 60} min {s % 60:02d} s' if s < 3600 else f'{s // 3600} h {s % 3600 // 60:02d} min'


class Status:
  """One line saying what the main thread waits for and for how long, kept up to date by a thread of
  its own: on a terminal redrawn every second, else a line every LOG_EVERY_S seconds. `set` changes
  the text; `close` draws it a last time and ends the line."""

  def __init__(self, text: str, file=None):
    self.file = file or sys.stdout
    self.tty = interactive(self.file)
    self.text, self.t0, self.width = text, time.monotonic(), 0
    self._done = threading.Event()
    self._lock = threading.Lock()
    _STATUS.add(self)
    self._draw()
    self._thread = threading.Thread(target=self._tick, daemon=True, name='f2m-status')
    self._thread.start()

  def _draw(self, last: bool = False) -> None:
    with self._lock:
      if self._done.is_set():
        return
      line = f'{self.text} ({elapsed(time.monotonic() - self.t0)})'
      if self.tty:
        self.file.write('\r' + line.ljust(self.width) + ('\n' if last else ''))
        self.width = len(line)
      else:
        self.file.write(line + '\n')
      self.file.flush()
      if last:
        self._done.set()

  def _tick(self) -> None:
    while not self._done.wait(1.0 if self.tty else LOG_EVERY_S):
      self._draw()

  def set(self, text: str) -> None:
    """A new text, its time counted from now."""
    self.text, self.t0 = text, time.monotonic()
    self._draw()

  def close(self) -> None:
    """Draws the line a last time (its time), ends it and stops the updates."""
    self._draw(last=True)
    _STATUS.discard(self)


def end_lines() -> None:
  """Closes every open bar and status line (each draws its last state and ends its line), so that
  what is printed next (an error, the line of an interrupted run) starts on a line of its own and no
  bar is drawn again after it."""
  for status in list(_STATUS):
    status.close()
  for b in list(tqdm._instances):  # pylint: disable=protected-access
    try:
      b.close()
    except (OSError, ValueError):  # a closed stream
      pass
