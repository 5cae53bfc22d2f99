"""Resumable downloads with a pinned size and sha256: written to `<dest>.part` (resumed by the next
call) and renamed to `dest` only once size and checksum match."""
import http.client
import os
import shutil
import urllib.parse
import urllib.request

from f2m_jax.data.types import DataError
from f2m_jax.files import sha256_file

TIMEOUT_S = 60


def _open(url, offset):
  """(stream, start): `url` read from byte `start`, `offset` where the server allows it, else 0."""
  if url.startswith('file:'):
    f = open(urllib.request.url2pathname(urllib.parse.urlparse(url).path), 'rb')
    f.seek(offset)
    return f, offset
  request = urllib.request.Request(url, headers={'Range': f'bytes={offset}-'})
  response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
  return response, offset if response.status == 206 else 0


def fetch(url, dest, sha256, size, what, help_text):
  """Downloads `url` to `dest` (a pathlib.Path; skipped when it exists) and checks `size` and
  `sha256`; a DataError naming the URL and what to do (a partial file is kept to resume; a
  checksum mismatch deletes it)."""
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  if dest.is_file():
    return dest
  dest.parent.mkdir(parents=True, exist_ok=True)
  part = dest.with_name(dest.name + '.part')
  offset = part.stat().st_size if part.is_file() else 0
  manual = f'Or download {url} yourself (sha256 {sha256}) and put it at {dest}. {help_text}'.strip()
  reason = 'truncated'
  if offset < size:
    try:
      stream, start = _open(url, offset)
      with stream, open(part, 'ab' if start else 'wb') as out, tqdm.wrapattr(
          out, 'write', total=size, initial=start, desc=f'downloading {what}', disable=None) as w:
        shutil.copyfileobj(stream, w)
    except (OSError, ValueError, http.client.HTTPException) as e:
      reason = str(e)
  got = part.stat().st_size if part.is_file() else 0
  if got < size:
    raise DataError(f'could not download {what} from {url}: it ended at {got:,} of {size:,} bytes '
                    f'({reason}). Rerun to resume it. {manual}')
  digest = sha256_file(part)
  if digest != sha256:
    part.unlink()
    raise DataError(f'{what} from {url} has the wrong checksum ({got:,} bytes, sha256 {digest}; '
                    f'expected {size:,} bytes, sha256 {sha256}), so it was deleted. Rerun to '
                    'download it again; if this repeats, the file at that address has changed or '
                    f'the network alters it. {manual}')
  os.replace(part, dest)
  return dest
