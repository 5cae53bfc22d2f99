"""What a run shows while it works: tqdm bars, a status line kept alive while the main thread waits
in one long call (an XLA compile, saying how long it took here last time; a first call), and the end
of every line drawn before a message. On a terminal a line is redrawn in place; elsewhere (a log
file, a pipe) each update is a line of its own, at most every LOG_EVERY_S seconds."""
import contextlib
import hashlib
import json
import os
import sys
import threading
import time

import jax
from tqdm import tqdm

from f2m_jax import files

LOG_EVERY_S = 30.0
COMPILE_TIMES = 'compile_times.json'  # in the cache folder: {program key: its last compile's s}
try:  # XLA's C++ log threshold (0 info .. 3 fatal), as jax_logging_level sets it
  from jax._src.lib.utils import absl_set_min_log_level  # pylint: disable=g-import-not-at-top
except ImportError:  # another jaxlib: its messages stay on
  absl_set_min_log_level = lambda level: None  # pylint: disable=invalid-name


class _Lines:
  """A file for tqdm off a terminal: each redraw ('\\r' + the bar) becomes a line of its own."""

  def __init__(self, file):
    self.file, self.flush = file, file.flush

  def write(self, text):
    text = text.replace('\r', '').rstrip()
    if text:
      self.file.write(text + '\n')


def bar(total, desc, file=None, cls=tqdm, **kw):
  """A tqdm bar (`cls`) on `file` (default stdout), drawn in place (at most every 2 s) or as lines
  (module docstring)."""
  file = file or sys.stdout
  if file.isatty():
    return cls(total=total, desc=desc, file=file, mininterval=2.0, **kw)
  return cls(total=total, desc=desc, file=_Lines(file), mininterval=LOG_EVERY_S,
             maxinterval=LOG_EVERY_S, ascii=True, **kw)


def elapsed(seconds):
  """'45 s', '12 min 03 s', '2 h 05 min'."""
  s = int(seconds)
  if s < 60:
    return f'{s} s'
  if s < 3600:
    return f'{s // 60} min {s % 60:02d} s'
  return f'{s // 3600} h {s % 3600 // 60:02d} min'


class Status(tqdm):
  """`status`'s line: a tqdm of no total that draws its text and its time, redrawn by `tick`."""

  def tick(self, every):
    while not self.disable:
      time.sleep(every)
      self.refresh()

  def set(self, text):
    """A new text, its time counted from now."""
    self.set_description_str(text, refresh=False)
    self.reset()

  def compile(self, lowered, folder):
    """`lowered`, compiled, the line saying how long the same program (its text, the devices, XLA's
    flags) took here last time: <folder>/compile_times.json, which keeps this time (where it can be
    written)."""
    text = [jax.__version__, jax.devices()[0].device_kind, os.environ.get('XLA_FLAGS', ''),
            lowered.as_text()]
    key = hashlib.sha256('\n'.join(text).encode()).hexdigest()[:20]
    path, times = os.path.join(folder, COMPILE_TIMES), {}
    with contextlib.suppress(OSError, ValueError, TypeError), open(path) as f:
      times = dict(json.load(f))
    last = "its first compile here: a minute or more on a CPU, seconds where JAX's cache holds it"
    if key in times:
      last = f'{elapsed(times[key])} here last time'
    self.set_description_str(f'{self.desc}: {last}')
    program = lowered.compile()
    with contextlib.suppress(OSError):
      os.makedirs(folder, exist_ok=True)
      times[key] = round(self.format_dict['elapsed'], 1)
      files.atomic_write(path, json.dumps(times, indent=0))
    return program

  def close(self):
    super().close()
    absl_set_min_log_level(int(os.environ.get('TF_CPP_MIN_LOG_LEVEL', '1')))


def status(text, file=None):
  """One line saying what the main thread waits for and for how long, redrawn by a thread (every
  second on a terminal); `set` changes the text, `close` ends the line. While it is open XLA's C++
  log shows fatal errors only: its slow-compile alarm ('Very slow compile?' after 2 min) reads as a
  crash."""
  line = bar(None, text, file, cls=Status, bar_format='{desc} ({elapsed})', position=0)
  every = 1.0 if (file or sys.stdout).isatty() else LOG_EVERY_S
  threading.Thread(target=line.tick, args=(every,), daemon=True, name='f2m-status').start()
  absl_set_min_log_level(3)
  return line


def end_lines():
  """Closes every open bar and status line (each draws its last state and ends its line), so that
  what is printed next starts on a line of its own and no bar is drawn again after it."""
  for b in list(tqdm._instances):  # pylint: disable=protected-access
    with contextlib.suppress(OSError, ValueError):  # a closed stream
      b.close()
