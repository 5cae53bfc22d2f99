"""experiments/device_data.py: CIFAR-100 packed into parts for the device machine comes back exact."""
import importlib.util
import json
import pathlib

import numpy as np

_SPEC = importlib.util.spec_from_file_location(
    'device_data', pathlib.Path(__file__).resolve().parents[1] / 'experiments' / 'device_data.py')
device_data = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(device_data)


def test_median_edge_residuals_invert_exactly():
  rng = np.random.default_rng(0)
  for shape in ((7, 5, 9, 3), (3, 32, 32, 3)):
    x = rng.integers(0, 256, shape, dtype=np.uint8)
    r = device_data.encode(x)
    assert r.dtype == np.uint8 and r.shape == (shape[0], shape[3], shape[1], shape[2])
    np.testing.assert_array_equal(device_data.decode(r), x)
  smooth = np.broadcast_to(np.arange(32, dtype=np.uint8)[None, :, None, None], (2, 32, 32, 3))
  assert np.count_nonzero(device_data.encode(smooth)) < smooth.size // 10  # predictable: small residuals


def test_pack_then_unpack_in_two_calls_rebuilds_the_npz(tmp_path):
  src = tmp_path / 'data'
  (src / 'index_list' / 'cifar100').mkdir(parents=True)
  (src / 'index_list' / 'LICENSE').write_text('MIT')
  (src / 'index_list' / 'cifar100' / 'session_1.txt').write_text('0\n1\n')
  rng = np.random.default_rng(1)
  arrays = dict(x_train=rng.integers(0, 256, (40, 32, 32, 3), dtype=np.uint8),
                y_train=rng.integers(0, 100, 40).astype(np.int16), label_names=np.array(['a', 'b']))
  np.savez_compressed(src / device_data.NPZ, **arrays)
  device_data.pack(str(src), str(tmp_path / 'packed'), 2)
  cache = tmp_path / 'cache'
  assert device_data.unpack(str(tmp_path / 'packed' / 'part1'), str(cache)) == 1  # part 0 not here yet
  assert not (cache / 'data' / device_data.NPZ).exists()
  assert device_data.unpack(str(tmp_path / 'packed' / 'part0'), str(cache)) == 0
  with np.load(cache / 'data' / device_data.NPZ) as d:
    assert sorted(d.files) == sorted(arrays)
    for k, v in arrays.items():
      np.testing.assert_array_equal(d[k], v)
  assert (cache / 'data' / 'index_list' / 'cifar100' / 'session_1.txt').read_text() == '0\n1\n'
  # A part whose images do not match the recorded sha256 is refused, nothing written.
  meta = json.loads((tmp_path / 'packed' / 'part0' / 'meta.json').read_text())
  meta['x_sha256'] = '0' * 64
  (tmp_path / 'packed' / 'part0' / 'meta.json').write_text(json.dumps(meta))
  assert device_data.unpack(str(tmp_path / 'packed' / 'part0'), str(tmp_path / 'other')) == 1
  (tmp_path / 'other' / 'parts' / 'x1.xz').write_bytes((tmp_path / 'packed' / 'part1' / 'x.xz').read_bytes())
  assert device_data.unpack(str(tmp_path / 'packed' / 'part0'), str(tmp_path / 'other')) == 2
  assert not (tmp_path / 'other' / 'data' / device_data.NPZ).exists()
