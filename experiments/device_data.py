"""Takes the CIFAR-100 training set to the device machine, whose calls carry at most 64 MiB each.

The npz is 140 MB and does not compress below 64 MiB with xz alone (0.76). Here the images pass
through the median edge predictor of LOCO-I / JPEG-LS (residuals mod 256, per channel), then xz:
about 0.65 of the raw size, about 99 MB, split into parts that travel in separate calls. `unpack`
collects the parts a call carried in a cache folder that stays on the machine between calls and,
once all are there, rebuilds `cifar100_train.npz`, its images checked against the original's sha256.

  python experiments/device_data.py pack $F2M_DATA_DIR .devdata 2     # here (about 2 minutes)
  python experiments/device_data.py unpack .devdata/part0 .devcache   # there, in each call
    -> prints the data folder (for F2M_DATA_DIR) once every part has arrived, else what is missing
"""
from __future__ import annotations

import hashlib
import json
import lzma
import pathlib
import shutil
import sys

import numpy as np

NPZ = 'cifar100_train.npz'


def _median_edge(a, b, c):
  hi, lo = np.maximum(a, b), np.minimum(a, b)
  return np.where(c >= hi, lo, np.where(c <= lo, hi, a + b - c))


def encode(images: np.ndarray) -> np.ndarray:
  """uint8 [N, H, W, C] -> residuals uint8 [N, C, H, W]."""
  q = images.transpose(0, 3, 1, 2).astype(np.int16)
  a = np.pad(q, ((0, 0), (0, 0), (0, 0), (1, 0)))[..., :-1]
  b = np.pad(q, ((0, 0), (0, 0), (1, 0), (0, 0)))[..., :-1, :]
  c = np.pad(q, ((0, 0), (0, 0), (1, 0), (1, 0)))[..., :-1, :-1]
  return ((q - _median_edge(a, b, c)) % 256).astype(np.uint8)


def decode(residuals: np.ndarray) -> np.ndarray:
  """The inverse of `encode`, one anti-diagonal i + j = d at a time (a pixel's prediction needs its
  decoded left, upper and upper-left neighbours, which lie on earlier diagonals)."""
  n, ch, h, w = residuals.shape
  q = np.zeros((n, ch, h + 1, w + 1), np.int16)  # pixel (i, j) at [i + 1, j + 1]; zeros outside
  for d in range(h + w - 1):
    i = np.arange(max(0, d - w + 1), min(d, h - 1) + 1)
    j = d - i
    pred = _median_edge(q[:, :, i + 1, j], q[:, :, i, j + 1], q[:, :, i, j])
    q[:, :, i + 1, j + 1] = (residuals[:, :, i, j] + pred) % 256
  return q[:, :, 1:, 1:].astype(np.uint8).transpose(0, 2, 3, 1)


def _copy_lists(src: pathlib.Path, dst: pathlib.Path) -> None:
  """The CIFAR-100 session lists and their licence (contents only: the shared folder is read-only)."""
  (dst / 'cifar100').mkdir(parents=True, exist_ok=True)
  for f in [src / 'LICENSE', *sorted((src / 'cifar100').iterdir())]:
    shutil.copyfile(f, dst / f.relative_to(src))


def pack(data_dir: str, out: str, parts: int) -> None:
  src, out = pathlib.Path(data_dir), pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  with np.load(src / NPZ) as d:
    arrays = {k: d[k] for k in d.files}
  x = arrays.pop('x_train')
  stream = lzma.compress(encode(x).tobytes(), preset=6)
  size = -(-len(stream) // parts)
  for p in range(parts):
    (out / f'part{p}').mkdir(exist_ok=True)
    (out / f'part{p}' / 'x.xz').write_bytes(stream[p * size:(p + 1) * size])
    np.savez(out / f'part{p}' / 'meta.npz', **arrays)
    (out / f'part{p}' / 'meta.json').write_text(json.dumps(dict(
        part=p, parts=parts, shape=list(x.shape), x_sha256=hashlib.sha256(x.tobytes()).hexdigest())))
    _copy_lists(src / 'index_list', out / f'part{p}' / 'index_list')
  print(f'{x.nbytes / 1e6:.1f} MB -> {len(stream) / 1e6:.1f} MB in {parts} parts under {out}')


def unpack(part: str, cache: str) -> int:
  part, cache = pathlib.Path(part), pathlib.Path(cache)
  meta = json.loads((part / 'meta.json').read_text())
  data = cache / 'data'
  if (data / NPZ).exists():
    print(data.resolve())
    return 0
  (cache / 'parts').mkdir(parents=True, exist_ok=True)
  shutil.copyfile(part / 'x.xz', cache / 'parts' / f"x{meta['part']}.xz")
  missing = [p for p in range(meta['parts']) if not (cache / 'parts' / f'x{p}.xz').exists()]
  if missing:
    print(f'parts {missing} of {meta["parts"]} not here yet', file=sys.stderr)
    return 1
  stream = b''.join((cache / 'parts' / f'x{p}.xz').read_bytes() for p in range(meta['parts']))
  n, h, w, ch = meta['shape']
  x = decode(np.frombuffer(lzma.decompress(stream), np.uint8).reshape(n, ch, h, w))
  with np.load(part / 'meta.npz') as d:
    arrays = {k: d[k] for k in d.files}
  digest = hashlib.sha256(x.tobytes()).hexdigest()
  if digest != meta['x_sha256']:
    print(f"rebuilt images have sha256 {digest}, the original {meta['x_sha256']}", file=sys.stderr)
    return 2
  data.mkdir(exist_ok=True)
  tmp = data / f'.{NPZ}'
  with open(tmp, 'wb') as f:
    np.savez(f, x_train=x, **arrays)
  tmp.rename(data / NPZ)
  _copy_lists(part / 'index_list', data / 'index_list')
  print(data.resolve())
  return 0


if __name__ == '__main__':
  if len(sys.argv) == 5 and sys.argv[1] == 'pack':
    pack(sys.argv[2], sys.argv[3], int(sys.argv[4]))
  elif len(sys.argv) == 4 and sys.argv[1] == 'unpack':
    sys.exit(unpack(sys.argv[2], sys.argv[3]))
  else:
    sys.exit(__doc__)
