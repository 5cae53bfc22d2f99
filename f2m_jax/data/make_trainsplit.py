"""Builds `cifar100_train.npz`, the file the `trainsplit` protocol reads, from the official
CIFAR-100 binary archive:

    python -m f2m_jax.data.make_trainsplit --out DATA_FOLDER [--archive cifar-100-binary.tar.gz]

What it writes and prints: docs/data.md.

"""
import argparse
import hashlib
import pathlib
import sys

import numpy as np

from f2m_jax import files
from f2m_jax.data import cifar100, index_lists
from f2m_jax.data.types import DataError

# sha256 of x_train's and of y_train's (int16, little-endian) bytes in the copy of the official
# training set this project's CIFAR-100 numbers were measured on.
CONTENT_SHA256 = {'x_train': '4e457917601a66aed021f5fa37957b56c6319557c0a8ed5484de3c390af45430',
                  'y_train': '1b4e4a7e6f08db2814efc0132c4c0df0b1b2b648aa74cb470f3e8e6976f2936b'}


def content_sha256(arrays):
  """{'x_train': sha256, 'y_train': sha256} of the arrays' bytes (labels as little-endian int16)."""
  return {k: hashlib.sha256(np.ascontiguousarray(arrays[k], dtype).tobytes()).hexdigest()
          for k, dtype in (('x_train', np.uint8), ('y_train', '<i2'))}


def build(archive, out_dir, verify):
  """Writes <out_dir>/cifar100_train.npz from `archive` (checked against the pinned size and
  sha256 where `verify`); returns {'path', 'sha256', 'content', 'as_measured'}. Refuses an
  existing file."""
  archive, out = pathlib.Path(archive), pathlib.Path(out_dir) / cifar100.NPZ_NAME
  if out.exists():
    raise DataError(f'{out} exists already; it is never overwritten (move it away to rebuild it)')
  if not archive.is_file():
    raise DataError(f'archive {archive} not found; download {cifar100.ARCHIVE_URL} (sha256 '
                    f'{cifar100.ARCHIVE_SHA256}) or drop --archive to download it into the cache '
                    'folder')
  if verify:
    size, digest = archive.stat().st_size, files.sha256_file(archive)
    if (size, digest) != (cifar100.ARCHIVE_SIZE, cifar100.ARCHIVE_SHA256):
      raise DataError(f'{archive} is not the official archive ({size:,} bytes, sha256 {digest}; '
                      f'expected {cifar100.ARCHIVE_SIZE:,} bytes, sha256 '
                      f'{cifar100.ARCHIVE_SHA256}); download it again from {cifar100.ARCHIVE_URL}, '
                      'or pass --no-verify to build from it anyway')
  every = cifar100.read_archive(archive)
  arrays = {k: every[k] for k in ('x_train', 'y_train', 'label_names')}
  out.parent.mkdir(parents=True, exist_ok=True)
  with files.written_atomically(out, '.npz') as tmp:
    np.savez(tmp, source=np.asarray(f'{cifar100.ARCHIVE_URL} (train.bin, file order)'), **arrays)
  content = content_sha256(arrays)
  return {'path': str(out), 'sha256': files.sha256_file(out), 'content': content,
          'as_measured': content == CONTENT_SHA256}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--out', nargs='?', const='', required=True,
                 help='the data folder to write cifar100_train.npz into')
  p.add_argument('--archive', help=f'a local {cifar100.ARCHIVE_NAME} (default: downloaded into '
                                   'the cache folder)')
  p.add_argument('--cache_dir',
                 help='the cache folder (default: $F2M_CACHE_DIR, else ~/.cache/f2m_jax)')
  p.add_argument('--no-verify', dest='verify', action='store_false',
                 help="build from an archive whose size or sha256 is not the official one's")
  args = p.parse_args(argv)
  if not args.out:  # `--out $F2M_DATA_DIR` with the variable unset
    print('error: --out got no folder (is F2M_DATA_DIR unset?): name the data folder to write '
          f'{cifar100.NPZ_NAME} into, e.g. `export F2M_DATA_DIR=~/f2m_data` and rerun, or --out '
          '~/f2m_data', file=sys.stderr)
    return 2
  try:
    archive = args.archive or cifar100.fetch_archive(index_lists.cache_folder(args.cache_dir))
    done = build(archive, args.out, args.verify)
  except DataError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(f'wrote {done["path"]} (sha256 {done["sha256"]})')
  print(f'x_train sha256 {done["content"]["x_train"]}, y_train sha256 '
        f'{done["content"]["y_train"]}: '
        + ('the arrays this project measured on' if done['as_measured'] else
           'NOT the arrays this project measured on (a different archive, or --no-verify)'))
  return 0


if __name__ == '__main__':
  sys.exit(main())
