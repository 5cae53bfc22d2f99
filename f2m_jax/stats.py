"""The statistics of the results: results.json's means and intervals over draws or seeds, PD, AVG
and retention, and paired differences over seeds (the paired t-test, Holm's adjustment). numpy and
scipy, no JAX: the report reads results without starting it."""
import math
import statistics

import numpy as np

KEYS = ('acc', 'acc_base', 'acc_novel', 'hm')  # a session's statistics, in the tables' order
ENDS = ('pd', 'avg', 'retention')  # a run's statistics over its sessions
MIN_SEEDS = 3  # fewer: no interval over seeds shown, no p-value, no verdict (t(0.975, 1) is 12.7)
INTERVALS = {'draws': "the authors': 1.96 * std(ddof=0) / sqrt(R) over the R draws",
             'seeds': "t(0.975, S-1) * std(ddof=1) / sqrt(S) over the S seeds (each seed's mean "
                      'over its draws)'}
SAME_SHOTS = ('n/a: every run trained on the same shots (fixed lists, or shot pools of data.shots '
              'images a class), so the runs are no draws of them')


def t_interval(values):
  """Half-width of the 95% interval of a mean over few values: t(0.975, n-1) * std(ddof=1) /
  sqrt(n)."""
  n = len(values)
  if n < 2:
    return None
  from scipy.stats import t  # pylint: disable=g-import-not-at-top
  return float(t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n))


def summarize(values, over='draws'):
  """Mean, 95% interval (`INTERVALS[over]`; None where `over` is None or there is one value) and the
  values; None where a run has no value (e.g. no novel classes in session 1)."""
  if None in values:
    return None
  v = np.asarray(values, np.float64)
  ci = None
  if over == 'seeds':
    ci = t_interval(v.tolist())
  elif over and len(v) > 1:
    ci = float(1.96 * v.std() / np.sqrt(len(v)))
  return {'mean': float(v.mean()), 'ci95': ci, 'runs': v.tolist()}


def endpoints(acc):
  """Per row of `acc` ([runs, sessions] accuracies): PD (session 1 minus the last), AVG (the mean
  over the sessions) and retention (the last in % of session 1; None where session 1 is 0)."""
  acc = np.asarray(acc, np.float64)
  return {'pd': acc[:, 0] - acc[:, -1], 'avg': acc.mean(1),
          'retention': [100 * last / first if first else None for first, last in acc[:, [0, -1]]]}


def build_results(dataset, method, protocol, num_classes, per_run, norms=None, over='draws',
                  same_shots=False):
  """The results.json document from per-run, per-session accuracy dicts ([runs][sessions]) and
  optional per-run `prototype_norms`; intervals over `over` (`INTERVALS`; 'seeds' counts them as
  `seeds`), none where every run trained on the same shots; with the runs' acc_sessions, the
  accuracy matrix (session i's classes after session j)."""
  over = None if same_shots else over
  ends = endpoints([[s['acc'] for s in run] for run in per_run])
  out = {'dataset': dataset, 'method': method, 'protocol': protocol,
         'seeds' if over == 'seeds' else 'runs': len(per_run),
         'sessions': [{'session': t + 1, 'num_classes': int(n),
                       **{k: summarize([run[t][k] for run in per_run], over) for k in KEYS}}
                      for t, n in enumerate(num_classes)],
         **{k: summarize(ends[k], over) for k in ENDS},
         'interval': INTERVALS.get(over, SAME_SHOTS)}
  for k in ('pd', 'avg'):  # their runs are the sessions' (and results.json has none: eval compares)
    del out[k]['runs']
  if norms:
    out['prototype_norms'] = {key: summarize([n[key] for n in norms], over) for key in norms[0]}
  if all(s.get('acc_sessions') for run in per_run for s in run):
    out['accuracy_matrix'] = accuracy_matrix(per_run, over)
  return out


def accuracy_matrix(per_run, over):
  """Each run's accuracy on session i's classes after session j (None for j < i), and its
  statistics."""
  n = len(per_run[0])
  runs = [[[run[j]['acc_sessions'][i] if i <= j else None for j in range(n)] for i in range(n)]
          for run in per_run]
  cells = [[summarize(v, over) for v in zip(*rows)] for rows in zip(*runs)]  # [i][j] over runs
  return {'rows': 'session whose classes are tested', 'columns': 'after session',
          **{k: [[c and c[k] for c in r] for r in cells] for k in ('mean', 'ci95')}, 'runs': runs}


def seed_summary(member_results):
  """results.json's format over seeds: per session, PD, AVG, retention and matrix cell each seed's
  mean over its draws, with the t-interval over the seeds (members x draws taken as independent
  would give too narrow an interval)."""
  head = member_results[0]
  per_seed = [[{**{k: s[k] and s[k]['mean'] for k in KEYS},
                'acc_sessions': matrix and [row[t] for row in matrix[:t + 1]]}
               for t, s in enumerate(r['sessions'])]
              for r in member_results for matrix in [(r.get('accuracy_matrix') or {}).get('mean')]]
  return build_results(head['dataset'], head['method'], head['protocol'],
                       [s['num_classes'] for s in head['sessions']], per_seed, over='seeds')


def results_rows(results):
  """Flat rows (one per session) for results.csv: classes, then each statistic's mean and ci95."""
  return [{'session': s['session'], 'num_classes': s['num_classes'],
           **{f'{k}_{f}': s[k] and s[k][f] and round(s[k][f], 4) for k in KEYS
              for f in ('mean', 'ci95')}}
          for s in results['sessions']]


def seed_values(results):
  """A run's values to pair: each session's accuracy (its mean over the draws), then PD, AVG and
  retention of those means."""
  acc = [s['acc']['mean'] for s in results['sessions']]
  ends = endpoints([acc])
  return acc + [ends[k][0] for k in ENDS]


def holm(p):
  """Holm's step-down adjustment of m p-values: the i-th smallest (from 0) times m - i, then the
  running maximum in that order, at most 1; in the order given (`p` an array)."""
  order = np.argsort(p)
  adjusted = np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1)).clip(max=1)
  return adjusted[np.argsort(order)]


def paired(a, b):
  """B - A over S paired seeds (a, b: [S, rows] of each seed's values), per row: the mean, each
  seed's difference and how many are above 0; from MIN_SEEDS seeds on, where they are not all
  equal, the paired t-test's 95% interval and p-value (scipy.stats.ttest_rel) and its
  Holm-adjusted p over those rows."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  a, b = np.asarray([a, b], np.float64)
  diffs = (b - a).T
  rows = [{'mean': d.mean(), 'diffs': d, 'above': int((d > 0).sum()), 'ci': None, 'p': None,
           'holm': None} for d in diffs]
  tested = [i for i, d in enumerate(diffs) if len(d) >= MIN_SEEDS and d.min() < d.max()]
  if tested:
    test = stats.ttest_rel(b[:, tested], a[:, tested])
    for i, low, high, p, q in zip(tested, *test.confidence_interval(), test.pvalue,
                                  holm(test.pvalue)):
      rows[i].update(ci=(low, high), p=p, holm=q)
  return rows
