"""f2m_jax/data/make_trainsplit.py on a small archive of the official binary format: the npz the
trainsplit protocol reads, the archive's checksum checked, nothing overwritten."""
from __future__ import annotations

import hashlib
import io
import tarfile

import numpy as np
import pytest

from conftest import DATA_DIR
from f2m_jax.data import cifar100, make_trainsplit
from f2m_jax.data.types import DataError

N = 300


def _archive(path, with_names=True):
  """Official binary records of N training images; image k has fine label k % 100 and pixels encoding k."""
  records = bytearray()
  for k in range(N):
    planes = np.zeros((3, 32, 32), np.uint8)
    planes[0], planes[1], planes[2, 0, 1] = k % 256, k // 256, 9
    records += bytes([k % 20, k % 100]) + planes.tobytes()
  files = {'cifar-100-binary/train.bin': bytes(records), 'cifar-100-binary/test.bin': bytes(records[:3074])}
  if with_names:
    files['cifar-100-binary/fine_label_names.txt'] = '\n'.join(f'class_{c}' for c in range(100)).encode() + b'\n'
  with tarfile.open(path, 'w:gz', compresslevel=1) as tar:
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return path


@pytest.fixture
def pinned(tmp_path, monkeypatch):
  """The small archive with its size and sha256 pinned as the official one's."""
  archive = _archive(tmp_path / 'cifar-100-binary.tar.gz')
  data = archive.read_bytes()
  monkeypatch.setattr(cifar100, 'ARCHIVE_SIZE', len(data))
  monkeypatch.setattr(cifar100, 'ARCHIVE_SHA256', hashlib.sha256(data).hexdigest())
  return archive


def test_builds_the_npz_trainsplit_reads(pinned, tmp_path, capsys):
  out = tmp_path / 'data'
  assert make_trainsplit.main(['--archive', str(pinned), '--out', str(out)]) == 0
  split = cifar100.load_train_npz(out / 'cifar100_train.npz')
  k = np.arange(N)
  assert np.array_equal(split.labels, k % 100)
  assert np.array_equal(split.images[:, 4, 4, 0], k % 256) and np.array_equal(split.images[:, 4, 4, 1], k // 256)
  assert split.images[0, 0, 1, 2] == 9 and split.images[0, 1, 0, 2] == 0  # planes -> HWC
  with np.load(out / 'cifar100_train.npz') as f:
    assert f['y_train'].dtype == np.int16 and list(f['label_names'][:2]) == ['class_0', 'class_1']
  printed = capsys.readouterr().out
  digest = hashlib.sha256((out / 'cifar100_train.npz').read_bytes()).hexdigest()
  assert f'sha256 {digest}' in printed and 'NOT the arrays this project measured on' in printed


def test_existing_file_is_never_overwritten(pinned, tmp_path, capsys):
  out = tmp_path / 'data'
  out.mkdir()
  (out / 'cifar100_train.npz').write_bytes(b'mine')
  assert make_trainsplit.main(['--archive', str(pinned), '--out', str(out)]) == 2
  assert 'exists already' in capsys.readouterr().err
  assert (out / 'cifar100_train.npz').read_bytes() == b'mine'


def test_another_archive_is_refused_unless_told(tmp_path, capsys):
  archive = _archive(tmp_path / 'other.tar.gz')  # its checksum is not the pinned one
  out = tmp_path / 'data'
  assert make_trainsplit.main(['--archive', str(archive), '--out', str(out)]) == 2
  err = capsys.readouterr().err
  assert 'is not the official archive' in err and cifar100.ARCHIVE_SHA256 in err and '--no-verify' in err
  assert not out.exists()
  assert make_trainsplit.main(['--archive', str(archive), '--out', str(out), '--no-verify']) == 0


def test_archive_without_label_names_is_named(tmp_path):
  archive = _archive(tmp_path / 'partial.tar.gz', with_names=False)
  with pytest.raises(DataError, match='lacks fine_label_names.txt'):
    make_trainsplit.build(archive, tmp_path / 'data', verify=False)


def test_the_measured_arrays_are_recognised():
  real = DATA_DIR / 'cifar100_train.npz'
  if not real.is_file():
    pytest.skip(f'needs the real {real}')
  with np.load(real) as f:
    assert make_trainsplit.content_sha256({'x_train': f['x_train'], 'y_train': f['y_train']}) == \
        make_trainsplit.CONTENT_SHA256


@pytest.mark.parametrize('argv', [['--out'], ['--out', '']])
def test_an_empty_out_says_the_variable_is_unset(argv, capsys):
  """README's `make_trainsplit --out $F2M_DATA_DIR` with the variable unset (argv ['--out']), or quoted
  (['--out', '']): one line saying so, exit status 2, no usage dump."""
  assert make_trainsplit.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith('error: --out got no folder (is F2M_DATA_DIR unset?)') and len(err.splitlines()) == 1
  assert 'cifar100_train.npz' in err and 'usage' not in err
