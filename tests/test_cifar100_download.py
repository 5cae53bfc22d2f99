"""CIFAR-100 without manual steps (data.source 'tfds'): the official archive is downloaded into the
cache once (resumable, size and sha256 checked, progress bar) and read from there. Offline here, so a
small archive in the official binary format stands in, served from a file:// URL: the whole path, a
truncated download resumed, a checksum mismatch, no network, index lists that do not fit the labels."""
from __future__ import annotations

import hashlib
import io
import pathlib
import tarfile

import numpy as np
import pytest

from f2m_jax.data import cifar100
from f2m_jax.data.types import DataError

N_TRAIN, N_TEST = 600, 200


def _records(n: int) -> bytes:
  """Official binary records; image k has fine label k % 100 and pixels encoding k."""
  out = bytearray()
  for k in range(n):
    image = np.zeros((3, 32, 32), np.uint8)
    image[0], image[1], image[2, 0, 0] = k % 256, k // 256, 7
    out += bytes([k % 20, k % 100]) + image.tobytes()
  return bytes(out)


def _archive(path: pathlib.Path) -> pathlib.Path:
  names = '\n'.join(f'class_{c}' for c in range(100)).encode()
  with tarfile.open(path, 'w:gz', compresslevel=1) as tar:
    for name, data in (('train.bin', _records(N_TRAIN)), ('test.bin', _records(N_TEST)), ('fine_label_names.txt', names)):
      info = tarfile.TarInfo(f'cifar-100-binary/{name}')
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return path


def _lists(folder: pathlib.Path) -> pathlib.Path:
  """TOPIC-shaped lists for this fake (6 base images per class; shots of classes 60..99)."""
  folder.mkdir(parents=True)
  (folder / 'session_1.txt').write_text('\n'.join(str(c + 100 * j) for c in range(60) for j in range(6)))
  for t in range(2, 10):
    classes = range(60 + 5 * (t - 2), 65 + 5 * (t - 2))
    (folder / f'session_{t}.txt').write_text('\n'.join(str(c + 100 * j) for c in classes for j in range(5)))
  return folder


@pytest.fixture
def served(tmp_path, monkeypatch):
  """The fake archive as ARCHIVE_URL (file://) with its size and sha256 pinned. Returns (archive path,
  cache dir, lists dir)."""
  (tmp_path / 'served').mkdir()
  archive = _archive(tmp_path / 'served' / 'cifar-100-binary.tar.gz')
  data = archive.read_bytes()
  monkeypatch.setattr(cifar100, 'ARCHIVE_URL', archive.as_uri())
  monkeypatch.setattr(cifar100, 'ARCHIVE_SIZE', len(data))
  monkeypatch.setattr(cifar100, 'ARCHIVE_SHA256', hashlib.sha256(data).hexdigest())
  monkeypatch.setenv('TFDS_DATA_DIR', str(tmp_path / 'tfds'))  # no prepared TFDS cifar100: the archive is read
  return archive, tmp_path / 'cache', _lists(tmp_path / 'lists')


def _check(bench):
  k = np.arange(N_TRAIN)
  assert np.array_equal(bench.train.labels, k % 100)
  assert np.array_equal(bench.train.images[:, 5, 5, 0], k % 256)
  assert np.array_equal(bench.train.images[:, 5, 5, 1], k // 256)
  assert bench.train.images[0, 0, 0, 2] == 7 and bench.train.images[0, 1, 1, 2] == 0  # planes -> HWC
  assert np.array_equal(bench.test.labels, np.arange(N_TEST) % 100)
  assert len(bench.base_train) == 360 and len(bench.topic_shots) == 8


def test_downloads_once_and_reuses(served):
  archive, cache, lists = served
  _check(cifar100.load_official(lists, cache))
  assert [p.name for p in (cache / 'downloads').iterdir()] == ['cifar-100-binary.tar.gz']
  archive.unlink()  # no second download: the archive in the cache is read
  _check(cifar100.load_official(lists, cache))


def test_truncated_download_is_kept_and_resumed(served, monkeypatch):
  archive, cache, lists = served
  full = archive.read_bytes()
  short = archive.with_name('short.tar.gz')
  short.write_bytes(full[:len(full) // 2])
  monkeypatch.setattr(cifar100, 'ARCHIVE_URL', short.as_uri())
  with pytest.raises(DataError, match=r'ended at [\d,]+ of [\d,]+ bytes \(truncated\)\. Rerun to resume') as e:
    cifar100.load_official(lists, cache)
  assert 'trainsplit' in str(e.value)
  part = cache / 'downloads' / 'cifar-100-binary.tar.gz.part'
  assert part.stat().st_size == len(full) // 2
  monkeypatch.setattr(cifar100, 'ARCHIVE_URL', archive.as_uri())  # the connection is back: resume
  _check(cifar100.load_official(lists, cache))
  assert not part.exists()


def test_checksum_mismatch_deletes_and_says_what_to_do(served):
  archive, cache, lists = served
  data = bytearray(archive.read_bytes())
  data[len(data) // 2] ^= 0xFF
  archive.write_bytes(bytes(data))
  with pytest.raises(DataError, match='wrong checksum') as e:
    cifar100.load_official(lists, cache)
  assert 'Rerun to download it again' in str(e.value) and 'put it at' in str(e.value)
  assert not list((cache / 'downloads').iterdir())


def test_no_network_names_the_address_and_the_alternatives(served, monkeypatch, tmp_path):
  _, cache, lists = served
  monkeypatch.setattr(cifar100, 'ARCHIVE_URL', (tmp_path / 'nowhere.tar.gz').as_uri())
  with pytest.raises(DataError) as e:
    cifar100.load_official(lists, cache)
  msg = str(e.value)
  for part in ('could not download CIFAR-100', 'nowhere.tar.gz', 'put it at', str(cache), 'trainsplit'):
    assert part in msg, part


def test_the_first_line_says_what_is_missing_where_it_goes_and_where_it_comes_from(served, monkeypatch, tmp_path,
                                                                                    capsys):
  _, cache, lists = served
  monkeypatch.setattr(cifar100, 'ARCHIVE_URL', (tmp_path / 'nowhere.tar.gz').as_uri())
  with pytest.raises(DataError, match='could not download CIFAR-100'):
    cifar100.load_official(lists, cache)
  first = capsys.readouterr().err.splitlines()[0]
  assert first.startswith(f'CIFAR-100: no TFDS cifar100 prepared in {tmp_path / "tfds"}, nor the official archive in '
                          f'the cache ({cache}') and 'downloading the archive once' in first
  assert (tmp_path / 'nowhere.tar.gz').as_uri() in first


def test_index_lists_that_do_not_fit_the_labels_are_named(served):
  """The TOPIC lists are checked against the labels (a wrong image order would pass unnoticed otherwise)
  and against the number of images."""
  _, cache, lists = served
  (lists / 'session_2.txt').write_text('\n'.join(['1'] * 25))  # class 1, not 60..64
  with pytest.raises(DataError, match='TOPIC lists do not match'):
    cifar100.load_official(lists, cache)
  (lists / 'session_2.txt').write_text('\n'.join([str(N_TRAIN)] * 25))  # one past the last image
  with pytest.raises(DataError, match=f'the index lists point outside the {N_TRAIN} training images'):
    cifar100.load_official(lists, cache)


def test_offline_the_first_message_names_the_archive_and_the_lists(tmp_path, monkeypatch):
  """configs/cifar100.py offline with nothing at hand: the first message names the 169 MB official
  archive (where it goes, what to do offline) and the TOPIC index lists, not the lists alone; with
  the archive at hand, only the lists."""
  from configs import cifar100 as cifar_cfg
  from f2m_jax.data import index_lists, sources
  monkeypatch.delenv('F2M_DATA_DIR', raising=False)
  monkeypatch.setattr(index_lists, 'BASE_URL', (tmp_path / 'offline').as_uri())  # every download fails
  config = cifar_cfg.get_config()
  config.data.cache_dir = str(tmp_path / 'cache')
  with pytest.raises(DataError) as e:
    sources.load_benchmark(config)
  msg = str(e.value)
  for part in ('CIFAR-100 needs two things', '1. The official archive cifar-100-binary.tar.gz (169 MB',
               str(tmp_path / 'cache' / 'downloads'), 'offline, put it there yourself', 'trainsplit',
               '2. The TOPIC index lists for cifar100'):
    assert part in msg, part
  (tmp_path / 'cache' / 'downloads').mkdir(parents=True)
  (tmp_path / 'cache' / 'downloads' / 'cifar-100-binary.tar.gz').write_bytes(b'at hand')
  with pytest.raises(DataError) as e:
    sources.load_benchmark(config)
  assert str(e.value).startswith('The TOPIC index lists for cifar100')
