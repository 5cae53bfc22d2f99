"""Section 15's table: the base-test curve of our seeds against the authors' seeds.

  python experiments/results/cpu_early_seeds/compare.py [--json]

Reads ours_seed*/base_test_curve.jsonl (experiments/base_test_curve.py) and authors_curves.jsonl
(oracle_tools/extract_curves.py over the authors' train logs). For each iteration: each side's mean,
sample standard deviation and range over its seeds, the difference of means (authors - ours) with a
Welch 95% interval, and whether the difference exceeds the larger of the two ranges (the seed spread).
"""
import glob
import json
import math
import os
import statistics
import sys

from scipy import stats

HERE = os.path.dirname(os.path.abspath(__file__))


def _read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def curves():
  """{side: {iteration: [accuracy per seed]}}. The authors' runs validate at 250, 500, 750, 1,000
  and once more at their last iteration (1,002), which is left out; of a seed run twice, the run that
  got further."""
  ours = {}
  for path in sorted(glob.glob(os.path.join(HERE, 'ours_seed*', 'base_test_curve.jsonl'))):
    for row in _read_jsonl(path):
      ours.setdefault(row['step'], []).append(row['base_test_acc'])
  rows = [r for r in _read_jsonl(os.path.join(HERE, 'authors_curves.jsonl')) if not r.get('final')]
  reach = {}  # (seed, run) -> the last iteration that run validated at
  for r in rows:
    reach[r['seed'], r['run']] = max(reach.get((r['seed'], r['run']), 0), r['iteration'])
  # seed -> its run that got furthest (a seed run twice counts once): the last one assigned wins
  chosen = {seed: run for (seed, run), _ in sorted(reach.items(), key=lambda kv: kv[1])}
  by_seed = {(r['seed'], r['iteration']): r['base_test_acc'] for r in rows if chosen[r['seed']] == r['run']}
  theirs = {}
  for (_, it), acc in sorted(by_seed.items()):
    theirs.setdefault(it, []).append(acc)
  return {'ours': ours, 'authors': theirs}


def summary(values):
  n = len(values)
  mean = sum(values) / n
  sd = statistics.stdev(values) if n > 1 else float('nan')
  return {'n': n, 'mean': mean, 'sd': sd, 'range': max(values) - min(values), 'values': values}


def welch(a, b):
  """(difference of means b - a, half-width of its 95% interval) by Welch's t."""
  va, vb = a['sd'] ** 2 / a['n'], b['sd'] ** 2 / b['n']
  df = (va + vb) ** 2 / (va ** 2 / (a['n'] - 1) + vb ** 2 / (b['n'] - 1))
  return b['mean'] - a['mean'], stats.t.ppf(0.975, df) * math.sqrt(va + vb)


def table():
  c = curves()
  rows = []
  for it in sorted(set(c['ours']) & set(c['authors'])):
    a, b = summary(c['ours'][it]), summary(c['authors'][it])
    row = {'iteration': it, 'ours': a, 'authors': b}
    if a['n'] > 1 and b['n'] > 1:
      diff, half = welch(a, b)
      row.update(difference=diff, interval95=half,
                 exceeds_seed_spread=abs(diff) > max(a['range'], b['range']))
    rows.append(row)
  return rows


def main():
  rows = table()
  if '--json' in sys.argv:
    print(json.dumps(rows, indent=1))
    return
  print('| iteration | ours: mean (sd, range, n) | authors: mean (sd, range, n) | authors - ours (95% Welch) | beyond seed spread |')
  print('| ---: | --- | --- | --- | --- |')
  for r in rows:
    fmt = lambda s: f"{s['mean']:.2f} ({s['sd']:.2f}, {s['range']:.2f}, {s['n']})"
    diff = f"{r['difference']:+.2f} ± {r['interval95']:.2f}" if 'difference' in r else '-'
    print(f"| {r['iteration']} | {fmt(r['ours'])} | {fmt(r['authors'])} | {diff} | "
          f"{'yes' if r.get('exceeds_seed_spread') else 'no'} |")


if __name__ == '__main__':
  main()
