"""The user's files: written atomically (a temporary beside the file, renamed when complete, removed
when a killed writer left it), read as JSON, and the errors that name them. The ground floor: every
layer may use it."""
import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
import time

import jax

MOVE = 'move it away, then rerun the same command'


class WorkdirError(RuntimeError):
  """The workdir belongs to another config or holds something we must not overwrite."""


class CheckpointError(RuntimeError):
  """A checkpoint is missing, was written for another config, or (a resume) computes other
  accuracies than it saved (exit code 2)."""


class CheckpointFault(CheckpointError):
  """A checkpoint that cannot be read back (unreadable, or not what was saved) or written (exit code
  3)."""


def sha256_file(path):
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()


# A temporary file or folder that no process holds locked, older than the moment between its
# writer's creating and locking it, was left by a killed writer: a live one holds its lock from then
# to the end.
STALE_AFTER_S = 2


def remove_stale(folder, pattern):
  """Removes the temporaries matching `pattern` in `folder` that no live process is writing: those
  older than STALE_AFTER_S that nobody holds locked (`held`)."""
  for p in pathlib.Path(folder).glob(pattern):
    with contextlib.suppress(OSError):  # gone, held by its live writer, or not ours to remove
      fd = os.open(p, os.O_RDONLY)
      try:
        if time.time() - os.fstat(fd).st_mtime >= STALE_AFTER_S:
          fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
          shutil.rmtree(p) if p.is_dir() else p.unlink()
      finally:
        os.close(fd)


@contextlib.contextmanager
def held(path):
  """An exclusive lock on the file or folder `path` while the block runs: its writer's mark that it
  is alive, which `remove_stale` respects. The OS drops it when the process ends, however it ends.
  """
  fd = os.open(path, os.O_RDONLY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)


@contextlib.contextmanager
def naming(path, temporary=None):
  """An OSError raised in the block without a file (a failed write() or flush()), or naming `path`'s
  `temporary`, names `path`."""
  try:
    yield
  except OSError as e:
    if e.filename not in (None, temporary):
      raise
    raise OSError(e.errno, e.strerror, str(path)) from e


@contextlib.contextmanager
def written_atomically(path, suffix=''):
  """A temporary file beside `path` to write in the block, readable by all and renamed to `path`
  when the block completes (removed when it fails, `held` while written); a killed writer's are
  removed first (`remove_stale`). A write that fails names `path`."""
  path = pathlib.Path(path)
  remove_stale(path.parent, f'.{glob.escape(path.name)}.*.tmp{glob.escape(suffix)}')
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix=f'.tmp{suffix}')
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    with naming(path, tmp):
      yield pathlib.Path(tmp)
      os.chmod(tmp, 0o644)  # mkstemp makes it private
      os.replace(tmp, path)
  finally:
    os.close(fd)  # and its lock
    if os.path.exists(tmp):
      os.remove(tmp)


def primary():
  """Whether this process writes the run's files (process 0; orbax coordinates the checkpoints
  itself)."""
  return jax.process_index() == 0


def atomic_write(path, text):
  """`text` into `path` through a temporary file (no reader sees half a file), on the primary
  process."""
  if primary():
    with written_atomically(path) as tmp:
      tmp.write_text(text)


def read_json(path, error=WorkdirError):
  """The JSON document in `path`; an `error` naming the file where it is not JSON (or not text)."""
  with open(path, 'rb') as f:
    try:
      return json.load(f)
    except ValueError as e:  # json's errors and UnicodeDecodeError
      raise error(f'{path} is not valid JSON ({e}); repair it or move it away') from e


def in_the_way(path, what='folder'):
  """The line naming the file that stands where `path`, or a folder above it, should be a `what`; or
  None."""
  found = nearest(os.path.abspath(path))
  # it lexists: `nearest`
  kind = 'a file' if os.path.exists(found) else 'a link to nothing or to itself'
  return None if os.path.isdir(found) else f'{found} is {kind} where a {what} should be; {MOVE}'


def nearest(path):
  """`path` or, where it does not exist, the nearest folder above it that does (as a file, or a
  link)."""
  return path if os.path.lexists(path) else nearest(os.path.dirname(path))


def describe_os_error(e):
  """An OSError as one line: a file where a folder should be, or a folder where a file should be,
  with what to do; otherwise the OS's reason and the file."""
  if e.filename and e.errno == errno.EISDIR:
    return f'{e.filename} is a folder where a file should be; {MOVE}'
  line = in_the_way(e.filename) if e.filename and e.errno in (errno.ENOTDIR, errno.EEXIST) else None
  return line or f'{e.strerror or e}' + f': {e.filename}' * bool(e.filename)
