"""experiments/full_budget_seeds.py --tiny (synthetic data): stopped at its deadline, resumed to both
sweeps, the paired report at its endpoint, the times and the pack; the full plan stops without data."""
import json
import subprocess
import sys
import tarfile

import pytest

from conftest import REPO


@pytest.mark.slow
def test_tiny_run_stops_at_its_deadline_then_resumes_to_the_paired_report(tmp_path, monkeypatch):
  out = tmp_path / 'out'
  command = [sys.executable, 'experiments/full_budget_seeds.py', '--tiny', '--out', str(out)]
  run = lambda *flags: subprocess.run([*command, *flags], cwd=REPO, capture_output=True, text=True)
  monkeypatch.setenv('F2M_DATA_DIR', str(tmp_path))  # the full plan's cifar100_train.npz is not there
  stopped = run('--deadline-s', '0.5')
  assert stopped.returncode == 130 and 'the same command again' in stopped.stderr, stopped.stderr
  done = run('--pack', str(tmp_path))
  assert done.returncode == 0, done.stdout + done.stderr
  for method in ('f2m', 'baseline'):
    summary = json.loads((out / method / 'summary.json').read_text())
    assert summary['method'] == method and [m['seed'] for m in summary['members']] == [0, 1]
  lines = (out / 'report.txt').read_text().splitlines()
  assert 'Baseline at session 9 accuracy: ' in [line for line in lines if line.startswith('F2M ')][-1]
  assert 'Paired comparison' in (out / 'report' / 'report.md').read_text()
  times = json.loads((out / 'times.json').read_text())
  assert times['parts']['bench'][0]['rc'] != 0
  assert [calls[-1]['rc'] for calls in times['parts'].values()] == [0, 0, 0]
  sweeps = times['sweeps']
  assert sweeps['f2m']['members'] == 2 and sweeps['baseline']['base_steps_per_s_median'] > 0
  with tarfile.open(tmp_path / 'out.tar.gz') as tar:
    names = tar.getnames()
  assert {'out/f2m/summary.json', 'out/baseline/member_1/checkpoints/model'} <= set(names)
  assert not [n for n in names if '/checkpoints/base' in n or '/checkpoints/run_' in n]
  (out / 'f2m' / 'summary.json').unlink()  # the full plan's next part is f2m, which reads the data
  full = subprocess.run([*command[:2], '--out', str(out)], cwd=REPO, capture_output=True, text=True)
  assert full.returncode == 2 and 'cifar100_train.npz is missing, which f2m reads' in full.stderr
