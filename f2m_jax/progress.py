"""What a run shows while it works: tqdm bars, a status line kept alive while the main thread waits in
one long call (an XLA compile, a program's first call), the compile times of this machine, and the end
of every line drawing on before a message, so that a message never starts on a bar's line.

On a terminal a bar or the status line is redrawn in place; elsewhere (a log file, a pipe) each
update is a line of its own, at most every LOG_EVERY_S seconds.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
import time

import jax
from tqdm import tqdm

from f2m_jax import workdir as workdir_lib

LOG_EVERY_S = 30.0
COMPILE_TIMES = 'compile_times.json'  # in the cache folder: {program key: seconds its last compile took}
try:  # XLA's C++ log threshold (0 info, 1 warning, 2 error, 3 fatal), which jax_logging_level sets too
  from jax._src.lib.utils import absl_set_min_log_level  # pylint: disable=g-import-not-at-top
except ImportError:  # another jaxlib: its messages stay on
  absl_set_min_log_level = lambda level: None  # pylint: disable=invalid-name


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


def bar(total, desc: str, file=None, mininterval: float = 2.0, cls=tqdm, **kw) -> tqdm:
  """A tqdm bar (`cls`) on `file` (default stdout): redrawn in place on a terminal, else a line at most
  every LOG_EVERY_S seconds."""
  file = file or sys.stdout
  if interactive(file):
    return cls(total=total, desc=desc, file=file, mininterval=mininterval, **kw)
  return cls(total=total, desc=desc, file=_Lines(file), mininterval=LOG_EVERY_S, maxinterval=LOG_EVERY_S,
             ascii=True, **kw)


def elapsed(seconds: float) -> str:
  """'45 s', '12 min 03 s', '2 h 05 min'."""
  s = int(seconds)
  if s < 60:
    return f'{s} s'
  return f'{s // 60} min {s % 60:02d} s' if s < 3600 else f'{s // 3600} h {s % 3600 // 60:02d} min'


class _Status(tqdm):
  """`status`'s line: a tqdm of no total that draws its text and time, redrawn by a thread."""

  def tick(self, every: float) -> None:
    while not self.disable:
      time.sleep(every)
      self.refresh()

  def set(self, text: str) -> None:
    """A new text, its time counted from now."""
    self.set_description_str(text, refresh=False)
    self.reset()

  def close(self) -> None:
    super().close()
    absl_set_min_log_level(int(os.environ.get('TF_CPP_MIN_LOG_LEVEL', '1')))


def status(text: str, file=None) -> _Status:
  """One line saying what the main thread waits for and for how long, kept up to date by a thread: on a
  terminal redrawn every second, else a line every LOG_EVERY_S seconds; `set` changes the text, `close`
  draws it a last time and ends the line. While it is open XLA's C++ log shows fatal errors only: its
  slow-compile alarm ('Very slow compile?' after 2 min, which reads as a crash) and the like say
  nothing the line does not."""
  line = bar(None, text, file, cls=_Status, bar_format='{desc} ({elapsed})')
  threading.Thread(target=line.tick, args=(1.0 if interactive(file or sys.stdout) else LOG_EVERY_S,), daemon=True,
                   name='f2m-status').start()
  absl_set_min_log_level(3)
  return line


def program_key(lowered) -> str:
  """What identifies a lowered program's compile on this machine: its text, the devices, XLA's flags."""
  text = '\n'.join([jax.__version__, jax.devices()[0].device_kind, os.environ.get('XLA_FLAGS', ''), lowered.as_text()])
  return hashlib.sha256(text.encode()).hexdigest()[:20]


def compile_times(folder: str) -> dict:
  """{program key: seconds} of the compiles timed in the cache folder `folder` ({} where none is)."""
  with contextlib.suppress(OSError, ValueError), open(os.path.join(folder, COMPILE_TIMES)) as f:
    return dict(json.load(f))
  return {}


def last_compile(folder: str, key: str) -> str:
  """What a compile's status line says before it: how long the same program took on this machine."""
  seconds = compile_times(folder).get(key)
  if seconds is None:
    return ('not compiled on this machine before: a minute or more on a CPU, a second or two where JAX\'s '
            'compilation cache holds it')
  return f'{elapsed(seconds)} here last time'


def record_compile(folder: str, key: str, seconds: float) -> None:
  """Keeps `seconds` as the time of `key`'s compile (a folder that cannot be written keeps none)."""
  with contextlib.suppress(OSError):
    os.makedirs(folder, exist_ok=True)
    workdir_lib.atomic_write(os.path.join(folder, COMPILE_TIMES),
                             json.dumps({**compile_times(folder), key: round(seconds, 1)}, indent=0))


def end_lines() -> None:
  """Closes every open bar and status line (each draws its last state and ends its line), so that what
  is printed next (an error, the line of an interrupted run) starts on a line of its own and no bar is
  drawn again after it."""
  for b in list(tqdm._instances):  # pylint: disable=protected-access
    with contextlib.suppress(OSError, ValueError):  # a closed stream
      b.close()
