"""End to end on the smoke config (3 sessions): results files, learning, and run.py's command line."""
import json
import os

import pytest

from configs import cifar100
from conftest import far_above_chance, run_py, tiny_smoke, without_provenance
from f2m_jax.run import cli, pipeline


@pytest.mark.slow
def test_f2m_learns_at_a_quarter_of_the_authors_batch(tmp_path):
  """The dataset configs' sampler (16 classes per batch) at base.batch_size=64 on the smoke data:
  F2M learns. At 0739cee a batch of 64 held 4 classes of 16 images and session 1 stayed at chance
  (5.00% of 20 classes)."""
  config = cifar100.get_config('smoke')
  full = cifar100.get_config().base
  config.base.update(ways=full.ways, shots=full.shots, batch_size=64)
  config.runs, config.tensorboard = 1, False
  config.data.synthetic.num_sessions = 2
  results = pipeline.run(config, str(tmp_path / 'w'))
  assert far_above_chance(results['sessions'][0]['acc']['mean'], images=400, classes=20), results['sessions'][0]


@pytest.mark.slow
def test_smoke_results_file_is_valid_and_learns(reference):
  """conftest's reference run (the smoke config with 3 sessions and 20 base steps): every record's kind."""
  workdir, results = reference
  with open(os.path.join(workdir, 'results.json')) as f:
    saved = json.load(f)
  assert saved == json.loads(json.dumps(results))
  assert saved['dataset'] == 'synthetic' and saved['method'] == 'f2m' and saved['runs'] == 2
  assert [s['session'] for s in saved['sessions']] == [1, 2, 3]
  assert [s['num_classes'] for s in saved['sessions']] == [20, 22, 24]
  first = saved['sessions'][0]
  assert first['acc_novel'] is None and first['hm'] is None
  assert far_above_chance(first['acc']['mean'], images=400, classes=20)  # chance is 5%
  for s in saved['sessions'][1:]:
    assert len(s['acc']['runs']) == 2 and s['acc_novel'] is not None and s['hm'] is not None
  assert set(saved['pd']) == {'mean', 'ci95'} and set(saved['avg']) == {'mean', 'ci95'}
  with open(os.path.join(workdir, 'results.csv')) as f:
    assert len(f.read().strip().splitlines()) == 4
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    phases = {json.loads(line)['phase'] for line in f}
  assert {'base', 'session', 'done'} <= phases
  # Where it came from: the effective config, the commit, the versions, the hardware.
  prov = saved['provenance']
  assert prov['config']['base']['steps'] == 20 and prov['config']['method'] == 'f2m'
  assert set(prov['git']) <= {'commit', 'dirty'} and set(prov['versions']) >= {'jax', 'jaxlib'}
  assert prov['hardware']['backend'] == 'cpu' and prov['hardware']['num_devices'] >= 1
  assert prov['wall_time_s'] > 0
  assert saved['base_model'] == {'selection': 'last', 'step': 20}
  norms = saved['prototype_norms']  # the paper's norm table, per run after the last session
  assert len(norms['base_mean']['runs']) == 2 and norms['base_mean']['mean'] > 0 and norms['novel_mean']['mean'] > 0
  # TensorBoard: the same numbers as event files beside metrics.jsonl.
  scalars = _tensorboard_scalars(os.path.join(workdir, 'tensorboard'))
  assert [step for step, _ in scalars['base/loss']] == [5, 10, 15, 20]
  assert {'base/acc', 'base/ce', 'base/pf', 'base/steps_per_s', 'run_0/acc', 'run_1/acc_base'} <= set(scalars)
  assert [step for step, _ in scalars['run_1/acc']] == [2, 3]
  session_acc = {s['session']: s['acc']['runs'][1] for s in saved['sessions'][1:]}
  assert all(abs(v - session_acc[step]) < 1e-3 for step, v in scalars['run_1/acc'])
  from f2m_jax.run import report
  text = report.format_report(report.build_rows([workdir]))
  assert f'{workdir}/results.json` (synthetic, f2m, draws, 2 runs; the authors\': 1.96 * std(ddof=0)' in text
  assert pipeline.base_budget(pipeline.resolve(tiny_smoke())) == '20 steps of 80 (task_epochs), lr 0.1, M=2, b=0.005'


def _tensorboard_scalars(folder) -> dict:
  """{tag: [(step, value)]} from the TFRecord-framed event files in `folder`."""
  import struct
  from tensorboardX.proto import event_pb2
  out = {}
  for name in sorted(os.listdir(folder)):
    with open(os.path.join(folder, name), 'rb') as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack('<Q', data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4
      for v in event.summary.value:
        out.setdefault(v.tag, []).append((event.step, v.simple_value))
  return out


def test_runs_use_a_persistent_compilation_cache_in_the_cache_folder(tmp_path, monkeypatch):
  """config.compilation_cache puts JAX's persistent cache in <cache folder>/jax_compilation_cache,
  for programs of any compile time unless JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says otherwise;
  a folder JAX was already given (JAX_COMPILATION_CACHE_DIR) is kept with JAX's settings; False
  leaves it off. In this process, with JAX's two settings put back afterwards."""
  import jax  # pylint: disable=g-import-not-at-top
  names = ('jax_compilation_cache_dir', 'jax_persistent_cache_min_compile_time_secs')
  saved = [getattr(jax.config, n) for n in names]

  def run(on, folder=None, min_secs=None):
    jax.config.update(names[0], folder)
    jax.config.update(names[1], 1.0)  # JAX's default
    if min_secs is None:
      monkeypatch.delenv('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', raising=False)
    else:
      monkeypatch.setenv('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', min_secs)
    c = cifar100.get_config('smoke')
    c.data.cache_dir, c.compilation_cache = str(tmp_path), on
    cli.enable_compilation_cache(c)
    return [getattr(jax.config, n) for n in names]

  folder = str(tmp_path / 'jax_compilation_cache')
  try:
    assert run(True) == [folder, 0.0]
    assert run(True, min_secs='2') == [folder, 1.0]  # JAX reads the variable itself at import
    assert run(False) == [None, 1.0]
    assert run(True, folder=str(tmp_path / 'own')) == [str(tmp_path / 'own'), 1.0]
  finally:
    for n, v in zip(names, saved):
      jax.config.update(n, v)


def test_run_py_rejects_bad_values_with_clear_messages(tmp_path, monkeypatch, capsys):
  """Through run.py's flags and main in this process (conftest.run_py): exit code 2 and a line naming
  the value, nothing written. Unknown fields, config arguments and python run.py's own exit code:
  tests/test_cli.py."""
  smoke = ['run.py', '--config', 'configs/cifar100.py:smoke', '--workdir', str(tmp_path / 'w')]
  for argv, named in [
      (smoke + ['--config.noise.bound=-1.0'], 'noise.bound=-1.0'),
      (['run.py', '--config', 'configs/cifar100.py:trainsplit', '--workdir', str(tmp_path / 'w'),
        '--config.data.data_dir=/no/such/folder'], '/no/such/folder')]:
    assert run_py(argv, monkeypatch) == 2, argv
    assert named in capsys.readouterr().err, argv
  assert not os.path.exists(tmp_path / 'w')


@pytest.mark.slow
def test_workdir_of_another_config_is_refused(reference):
  from f2m_jax.files import WorkdirError
  workdir, _ = reference
  config = tiny_smoke(**{'noise.bound': 0.01})
  before = open(os.path.join(workdir, 'results.json')).read()
  with pytest.raises(WorkdirError, match=r'noise.bound: saved 0.005, now 0.01'):
    pipeline.run(config, workdir)
  assert open(os.path.join(workdir, 'results.json')).read() == before


def test_bench_needs_no_data_folder(monkeypatch):
  """--mode bench times random data of the config's shapes, so a dataset config without its data
  folder (here trainsplit, F2M_DATA_DIR unset) resolves for it; training itself still refuses it."""
  monkeypatch.delenv('F2M_DATA_DIR', raising=False)
  config = cifar100.get_config('trainsplit')
  with pytest.raises(ValueError, match="data.source='trainsplit' needs a data folder"):
    pipeline.resolve(config)
  assert pipeline.resolve(config, reads_data=False).data.source == 'trainsplit'


@pytest.mark.slow
def test_validation_protocol_run_never_reads_a_test_image(tmp_path, monkeypatch):
  """A run on data.protocol='validation': 12 pseudo-base classes + 4 sessions of 2 from the smoke
  config's 20 base classes; the results are unchanged when every real test image and every image of
  a real novel class is replaced by noise, so none of them is read."""
  import numpy as np
  from f2m_jax.data import sources
  config = cifar100.get_config('smoke')
  config.data.protocol = 'validation'
  config.method = 'baseline'  # the data a run reads is every method's; the Baseline's programs compile fastest
  config.runs = 1
  config.base.update(steps=20, milestones=(10,), checkpoint_every=10)
  clean = pipeline.run(config, str(tmp_path / 'clean'))
  assert clean['protocol'] == 'validation' and clean['dataset'] == 'synthetic_validation'
  assert [s['num_classes'] for s in clean['sessions']] == [12, 14, 16, 18, 20]

  load = sources._load

  def poisoned(cfg):
    bench = load(cfg)
    rng = np.random.default_rng(1)
    bench.test.images[...] = rng.integers(0, 256, bench.test.images.shape, dtype=np.uint8)
    novel = ~np.isin(bench.train.labels, bench.session_classes[0])
    bench.train.images[novel] = rng.integers(0, 256, bench.train.images[novel].shape, dtype=np.uint8)
    return bench

  monkeypatch.setattr(sources, '_load', poisoned)
  other = pipeline.run(config, str(tmp_path / 'poisoned'))
  assert without_provenance(other) == without_provenance(clean)


def test_bench_keeps_the_command_lines_values_and_records_them(tmp_path, smoke_config):
  """--config.method=baseline --config.noise.enabled=True benches the Baseline with noise, as every
  other mode runs it (the Baseline's presets turned the noise off), and bench.json records the origin;
  a second bench writes bench_<timestamp>.json beside it."""
  smoke_config.method, smoke_config.noise.enabled = 'baseline', True
  smoke_config.bench.update(dtypes=())  # nothing timed: the config and the record only
  origin = {'config': 'configs/cifar100.py:smoke', 'changes': {'method': 'baseline', 'noise.enabled': True}}
  for _ in range(2):
    assert cli.main(smoke_config, str(tmp_path / 'b'), 'bench', origin=origin) == 0
  assert [p.name[:6] for p in sorted((tmp_path / 'b').iterdir())] == ['bench.', 'bench_']
  with open(tmp_path / 'b' / 'bench.json') as f:
    provenance = json.load(f)['provenance']
  assert provenance['config']['noise']['enabled'] is True and provenance['config']['base']['sampler'] == 'shuffle'
  assert provenance['origin'] == origin


def test_bench_takes_the_shapes_of_your_own_folder_from_its_layout():
  from configs import folder
  from f2m_jax.run import bench
  config = folder.get_config('smoke')
  shapes = bench.dataset_shapes(config)
  assert (shapes['num_base'], shapes['way'], shapes['num_sessions'], shapes['image_size']) == (10, 2, 6, 32)
  config.data.folder.num_base = 0  # 'the rest': only the data could say how many
  with pytest.raises(ValueError, match='data.folder.num_base=0 is invalid for --mode bench'):
    bench.dataset_shapes(config)
