"""python summarize_bench.py [FOLDER of bench_<tag>_<ns>.json]: per run (in start order) the bench's medians (ms per step) of plain and f2m_shared at M = 2, 4; then new/ref
pair by pair (runs paired in start order: warm-up pair first, not counted) and the median of the ratios."""
import glob, json, os, statistics, sys
root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), 'bench_json')
runs = {'new': [], 'ref': []}
for path in sorted(glob.glob(f'{root}/bench_*_*.json'), key=lambda p: int(p[:-5].rsplit('_', 1)[1])):
  tag = os.path.basename(path).split('_')[1]
  recs = json.load(open(path))['records']
  row = {f"{r['variant']}{'' if r['M'] in (0, None) else r['M']}": r['step_ms_median'] for r in recs
         if r['variant'] in ('plain', 'f2m_shared', 'f2m_naive')}
  runs[tag].append(row)
keys = ['plain', 'f2m_shared2', 'f2m_shared4', 'f2m_naive2', 'f2m_naive4']
for tag in ('ref', 'new'):
  for i, r in enumerate(runs[tag]):
    print(tag, i, ' '.join(f'{k}={r[k]:.1f}' for k in keys), ' f2m2/plain=%.2f f2m4/plain=%.2f' % (
        r['f2m_shared2'] / r['plain'], r['f2m_shared4'] / r['plain']))
pairs = list(zip(runs['new'], runs['ref']))[1:]  # the first pair is the warm-up
print('counted pairs:', len(pairs))
for k in keys:
  ratios = [n[k] / r[k] for n, r in pairs]
  print(f'{k:12s} new/ref per pair: {" ".join(f"{x:.2f}" for x in ratios)}  median {statistics.median(ratios) if ratios else float("nan"):.2f}')
