"""The paper's prototype-norm table: per run the mean and std of the L2 norms of the base and the
novel prototypes after the last session, summarised over runs, in results.json and the report."""
import numpy as np
import pytest

from f2m_jax import evaluation, stats
from f2m_jax.run import report


def test_prototype_norms_on_a_hand_made_case():
  protos = np.asarray([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0], [0.0, 2.0], [0.0, 0.5]], np.float32)
  n = evaluation.prototype_norms(protos, num_base=2)
  assert n == pytest.approx({'base_mean': 3.0, 'base_std': 2.0, 'novel_mean': 12.5 / 3,
                             'novel_std': float(np.std([10.0, 2.0, 0.5]))})
  assert evaluation.prototype_norms(protos[:2], num_base=2)['novel_mean'] is None


def test_norms_in_results_and_report(tmp_path):
  acc = {'acc': 50.0, 'acc_base': 50.0, 'acc_novel': None, 'hm': None}
  per_run = [[acc, dict(acc, acc_novel=40.0, hm=44.0)]] * 2
  norms = [{'base_mean': 3.0, 'base_std': 1.0, 'novel_mean': 2.0, 'novel_std': 0.5},
           {'base_mean': 5.0, 'base_std': 1.0, 'novel_mean': 4.0, 'novel_std': 0.5}]
  results = stats.build_results('cifar100', 'f2m', 'draws', [60, 65], per_run, norms)
  assert results['prototype_norms']['base_mean']['mean'] == 4.0
  assert results['prototype_norms']['novel_std'] == {'mean': 0.5, 'ci95': 0.0, 'runs': [0.5, 0.5]}
  row = {**results, 'label': 'F2M', 'source': 'x'}
  table = report.format_report([row]).split('## Prototype norms after the last session')[1]
  line = next(line for line in table.splitlines() if 'F2M |' in line)
  assert [c.strip() for c in line.split('|')[2:6]] == ['4.00 ± 1.39', '1.00 ± 0.00', '3.00 ± 1.39', '0.50 ± 0.00']
  old = dict(results)
  del old['prototype_norms']  # results written before norms were recorded: no table, no error
  assert '## Prototype norms' not in report.format_report([{**old, 'label': 'old'}])
