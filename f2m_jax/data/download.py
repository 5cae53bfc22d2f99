"""Resumable downloads with a pinned size and sha256: written to `<dest>.part` (resumed by the next
call) and renamed to `dest` only once size and checksum match."""
from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import http.client
import os
import pathlib
import shutil
import tempfile
import time
import urllib.parse
import urllib.request

from f2m_jax.data.types import DataError

CHUNK = 1 << 20
TIMEOUT_S = 60


def sha256_file(path) -> str:
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()


# A temporary file or folder that no process holds locked, older than the moment between its writer's
# creating and locking it, was left by a killed writer: a live one holds its lock from then to the end.
STALE_AFTER_S = 2


def remove_stale(folder, pattern: str) -> None:
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
  """An exclusive lock on the file or folder `path` while the block runs: its writer's mark that it is
  alive, which `remove_stale` respects. The OS drops it when the process ends, however it ends."""
  fd = os.open(path, os.O_RDONLY)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)


@contextlib.contextmanager
def naming(path):
  """An OSError raised in the block without a file (a failed write() or flush()) names `path`."""
  try:
    yield
  except OSError as e:
    if e.filename is not None:
      raise
    raise OSError(e.errno, e.strerror, str(path)) from e


@contextlib.contextmanager
def written_atomically(path, suffix: str = ''):
  """A temporary file beside `path` to write in the block, readable by all and renamed to `path` when the
  block completes (removed when it fails, `held` while written); a killed writer's are removed first
  (`remove_stale`). A write that fails names `path`."""
  path = pathlib.Path(path)
  remove_stale(path.parent, f'.{glob.escape(path.name)}.*.tmp{glob.escape(suffix)}')
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix=f'.tmp{suffix}')
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    with naming(path):
      yield pathlib.Path(tmp)
    os.chmod(tmp, 0o644)  # mkstemp makes it private
    os.replace(tmp, path)
  finally:
    os.close(fd)  # and its lock
    if os.path.exists(tmp):
      os.remove(tmp)


def _open(url: str, offset: int):
  """(stream, resumed) reading `url` from byte `offset` where the server allows it."""
  if url.startswith('file:'):
    f = open(urllib.request.url2pathname(urllib.parse.urlparse(url).path), 'rb')
    f.seek(offset)
    return f, True
  response = urllib.request.urlopen(urllib.request.Request(url, headers={'Range': f'bytes={offset}-'}),
                                    timeout=TIMEOUT_S)
  return response, response.status == 206


def fetch(url: str, dest, sha256: str, size: int, what: str, help_text: str = '') -> pathlib.Path:
  """Downloads `url` to `dest` (skipped when `dest` exists) and checks `size` and `sha256`; a DataError
  naming the URL and what to do (a partial file is kept to resume; a checksum mismatch deletes it)."""
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  dest = pathlib.Path(dest)
  if dest.is_file():
    return dest
  dest.parent.mkdir(parents=True, exist_ok=True)
  part = dest.with_name(dest.name + '.part')
  offset = part.stat().st_size if part.is_file() else 0
  manual = f'Or download {url} yourself (sha256 {sha256}) and put it at {dest}. {help_text}'.strip()
  reason = 'truncated'
  if offset < size:
    try:
      stream, resumed = _open(url, offset)
      with stream, open(part, 'ab' if resumed else 'wb') as out, tqdm.wrapattr(
          out, 'write', total=size, initial=offset if resumed else 0, desc=f'downloading {what}', disable=None) as w:
        shutil.copyfileobj(stream, w, CHUNK)
    except (OSError, ValueError, http.client.HTTPException) as e:
      reason = str(e)
  got = part.stat().st_size if part.is_file() else 0
  if got < size:
    raise DataError(f'could not download {what} from {url}: it ended at {got:,} of {size:,} bytes ({reason}). '
                    f'Rerun to resume it. {manual}')
  digest = sha256_file(part)
  if digest != sha256:
    part.unlink()
    raise DataError(f'{what} from {url} has the wrong checksum ({got:,} bytes, sha256 {digest}; expected '
                    f'{size:,} bytes, sha256 {sha256}), so it was deleted. Rerun to download it again; if '
                    f'this repeats, the file at that address has changed or the network alters it. {manual}')
  os.replace(part, dest)
  return dest
