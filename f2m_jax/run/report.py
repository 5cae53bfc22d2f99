"""Tables, plots and paired comparisons from the results.json of runs and the summary.json of sweeps
(README, 'What a workdir holds'); no JAX (matplotlib lazily)."""
import argparse
import csv
import json
import os
import pathlib
import sys

from f2m_jax import files
from f2m_jax import stats

PATHS = ('cache_dir', 'data_dir', 'tfds_data_dir')  # data fields that change nothing that is drawn
PD_AVG = ('PD: accuracy of session 1 minus that of the last session (what was forgotten; lower is '
          'better where session 1 is level, else read retention); AVG: accuracy averaged over all '
          "sessions; retention: the last session's accuracy in % of session 1's (higher: more "
          'kept)')
GAP = 'gap: last-session accuracy minus that of the reference row'
MATRIX = ("Accuracy on each session's classes (rows: the session that brought them) after every "
          'later session (columns), mean over runs: the diagonal is what a session learned, the '
          'fall along a row what was forgotten')
NO_MATRIX = 'none (written by an earlier version, which recorded no matrix)'
OLD = ("an earlier version's 1.96 * std(ddof=0) / sqrt(S) over the S seeds, too narrow (no "
       "members' results.json to recompute it from)")
SEEDS = (f'too few seeds for an interval, a p-value or a verdict: {stats.MIN_SEEDS} or more, e.g. '
         "--config.members.seeds='(0,1,2)'")
NAMES = {'pd': 'PD (lower: less forgotten)', 'avg': 'AVG',
         'retention': 'retention (higher: more kept)'}


def results_path(path):
  """A folder's results.json, or its summary.json (a sweep's) where only that exists; a file
  itself."""
  found = [f'{path}/results.json', f'{path}/summary.json'] if os.path.isdir(path) else [path]
  return next(filter(os.path.isfile, found), found[0])


def read_json(file, check, what):
  """`check` of `file`'s JSON (which raises where it is not `what`); a ValueError naming it."""
  try:
    return check(json.loads(pathlib.Path(file).read_bytes()))
  except FileNotFoundError:
    raise ValueError(f'{file}: no such results file' + f" (nor a sweep's summary.json in "
                     f'{os.path.dirname(file)})' * file.endswith('results.json')) from None
  except OSError as e:
    raise ValueError(files.describe_os_error(e)) from None
  except (AttributeError, KeyError, TypeError, ValueError) as e:  # str(e): repr quotes binary
    raise ValueError(f'{file}: not the {what} ({type(e).__name__}: {e})') from None


def check_results(data):
  """`data`, where it holds what the report reads of a result (of each value of a field's sweep)."""
  for r in data.get('values') or [data]:
    missing = [k for k in 'dataset method protocol sessions pd avg'.split() if not r.get(k)]
    if missing:
      raise ValueError(f'it holds no {", ".join(missing)}')
  return data


def load_results(path):
  """A results.json (its workdir or the file) or a sweep's summary.json, whose seeds count as
  `seeds`; one without `interval` (an earlier version's 1.96 * std(ddof=0)) recomputed from its
  members, or marked OLD where they are gone."""
  file = results_path(path)
  r = read_json(file, check_results, 'results.json (or summary.json) of a run')
  if file.endswith('summary.json') and 'values' not in r:
    if 'interval' not in r:
      found = members(file)
      r.update(stats.seed_summary(found) if found else {'interval': OLD})
    r.setdefault('seeds', r.pop('runs', None))  # an earlier version's count of the seeds
  return r


def members(file):
  """The results of the members beside a sweep's summary.json."""
  return [load_results(str(f)) for f in
          sorted(pathlib.Path(file).parent.glob('member_*/results.json'))]


def values(r):
  """[(label suffix, results)] per value of a field's sweep, or [('', r)]."""
  return [(f'{r["field"]}={v["value"]:g}', v) for v in r['values']] if 'values' in r else [('', r)]


def build_rows(paths, labels=None):
  """A row per path (per value of a field's sweep): its results with `label` (`labels`', the
  results' own or '<method> <folder>', the folder left out where it is the method's name), `source`
  (their file) and `flatness` (the rows of its flatness.json, then of later `--mode flatness`
  runs' flatness_<time>.json). The tables read rows; a results dict with a `label` is one."""
  if labels is not None and len(labels) != len(paths):
    raise ValueError(f'got {len(labels)} labels for {len(paths)} results: {list(labels)}')
  rows = []
  for path, label in zip(paths, labels or [None] * len(paths)):
    file = results_path(path)
    folder = pathlib.Path(file).parent.name
    flatness = [read_json(str(f), flatness_row, 'flatness file of --mode flatness')
                for f in sorted(pathlib.Path(path).glob('flatness*.json'))]
    for suffix, r in values(load_results(path)):
      default = r['method'] if folder == r['method'] else f'{r["method"]} {folder}'
      name = label or r.get('label') or default
      rows.append({**r, 'label': f'{name} {suffix}'.rstrip(), 'source': file, 'flatness': flatness})
  return rows


def flatness_row(f):
  """A flatness file's row: b, I and sigma^2 on the training and test images, draws and images."""
  return ([f'{float(f["bound"]):g}']
          + [f'{float(f[s][k]):.4g}' for k in ('I', 'sigma2') for s in ('train', 'test')]
          + [int(f['train']['num_draws']),
             f'{int(f["train"]["num_images"])} / {int(f["test"]["num_images"])}'])


def has_interval(r):
  """Whether the tables show intervals: not for one run (ci95 0 or null), too few seeds or OLD."""
  return (r.get('runs', 2) > 1 and r.get('seeds', stats.MIN_SEEDS) >= stats.MIN_SEEDS
          and r.get('interval') != OLD)


def count(r):
  """'S seeds' of a sweep's summary, 'R runs' of a run."""
  what = 'seeds' if 'seeds' in r else 'runs'
  return f'{r[what]} {what[:-1] if r[what] == 1 else what}'


def reads_test_set(r):
  return bool((r.get('base_model') or {}).get('reads_test_set'))  # base.select_on_test


def format_stat(stat, interval=True):
  """'mean ± ci95', 'mean ± n/a' where the runs give no interval, the mean alone for one run; '-'
  for none."""
  if not stat:
    return '-'
  ci = stat.get('ci95')
  return f'{stat["mean"]:.2f}' + (' ± n/a' if ci is None else f' ± {ci:.2f}') * interval


def table(header, body):
  """A GitHub markdown table, right-aligned and padded to read as text too."""
  rows = [[str(c).replace('|', '\\|') for c in r] for r in [header, *body]]
  widths = [max(map(len, column)) for column in zip(*rows)]
  rows.insert(1, ['-' * (w - 1) + ':' for w in widths])
  return '\n'.join(f'| {" | ".join(map(str.rjust, r, widths))} |' for r in rows)


def setting(r):
  return f'{r["dataset"]}, {r["protocol"]}, {len(r["sessions"])} sessions'  # what a gap needs


def resolve_reference(rows, reference):
  """Index of the reference row: a label, else an index (negative from the end); None: the first."""
  labels = [r['label'] for r in rows]
  try:
    return labels.index(reference) if reference in labels else range(len(rows))[int(reference or 0)]
  except (TypeError, ValueError, IndexError):
    raise ValueError(f'--reference {reference!r} is neither a label {labels} nor an index of the '
                     f'{len(rows)} rows') from None


def notes(rows, ref):
  """A line per refused gap (another setting than the reference row `ref`'s) and per row of too few
  seeds."""
  return ([f'no gap for "{r["label"]}" ({setting(r)}): the reference "{ref["label"]}" is '
           f'{setting(ref)}, and only runs of the same dataset, protocol and session count are '
           'subtracted' for r in rows if setting(r) != setting(ref)]
          + [f'"{r["label"]}": {count(r)}, {SEEDS}' for r in rows
             if 'seeds' in r and not has_interval(r)])


def columns(rows, reference):
  """Per row: its statistic per column of the main table (s<n> per session, then stats.ENDS; None
  where it has none) and its gap (None: another setting)."""
  ref = rows[resolve_reference(rows, reference)]
  names = [f's{n + 1}' for n in range(max(len(r['sessions']) for r in rows))] + [*stats.ENDS]
  for r in rows:
    found = {**{f's{s["session"]}': s['acc'] for s in r['sessions']}, **r}
    gap = r['sessions'][-1]['acc']['mean'] - ref['sessions'][-1]['acc']['mean']
    yield r, {n: found.get(n) for n in names}, gap if setting(r) == setting(ref) else None


def main_table(rows, reference=0):
  """report.csv's records: the setting, each session's accuracy (s<n>), PD, AVG and retention as
  mean and ci95 (None: none, or not shown), the gap and the interval's formula."""
  return [{**{k: r.get(k) for k in 'label dataset method protocol runs seeds'.split()},
           **{k: v for n, s in found.items() for k, v in (
               (n, s and s['mean']),
               (f'{n}_ci95', s.get('ci95') if s and has_interval(r) else None))},
           'gap': gap, 'interval': r.get('interval')} for r, found, gap in columns(rows, reference)]


def format_table(rows, reference=0):
  """The main table: accuracy per session ('-' where a row has none), PD, AVG, retention, gap."""
  body = [[r['label'] + f' ({count(r)}, no interval)' * (not has_interval(r))
           + ' (base model chosen on test images)' * reads_test_set(r)]
          + [format_stat(s, has_interval(r)) for s in found.values()]
          + ['n/a' if gap is None else f'{gap:+.2f}'] for r, found, gap in columns(rows, reference)]
  n = max(len(r['sessions']) for r in rows)
  return table(['Method', *range(1, n + 1), *'PD AVG retention gap'.split()], body)


def matrix_table(r):
  """The accuracy matrix, a row per session of origin ('' before it); False without one."""
  return 'accuracy_matrix' in r and table(
      ['from / after', *range(1, len(r['sessions']) + 1)],
      [[n, *('' if v is None else f'{v:.2f}' for v in row)]
       for n, row in enumerate(r['accuracy_matrix']['mean'], 1)])


def format_session_table(r):
  """The report printed after a run or a sweep (a row per value of a field's): every session, the
  matrix, the sources."""
  rows = [{**v, 'label': suffix or r.get('label') or r['method']} for suffix, v in values(r)]
  x = values(r)[0][1]
  return (f'{x.get("label") or x["method"]} on {x["dataset"]} ({x["protocol"]}, {count(x)})\n\n'
          + format_report(rows, all_sessions=True))


def seed_runs(path):
  """{seed: results} of a seed sweep's members, or of one run."""
  results = load_results(path)
  if 'values' in results:
    raise ValueError(f'{path}: a sweep over {results["field"]} holds no seeds to pair')
  runs = {((r.get('provenance') or {}).get('config') or {}).get('seed'): r
          for r in (members(results_path(path)) if 'seeds' in results else [results])}
  if not runs or None in runs:
    raise ValueError(f'{path}: no run, or one without a seed (provenance.config.seed), to pair')
  return runs


def shared(r):
  """What paired runs share: the setting, classes, runs, draws (without their digest, older runs:
  the data config) and the seed that trained the base model (--checkpoint's where
  base_source.differences has one; unknown where W had no config to compare)."""
  prov = r['provenance']
  differences = (prov.get('base_source') or {'differences': {}})['differences']
  return {'setting': setting(r), 'classes': [s['num_classes'] for s in r['sessions']],
          'number of runs': r['runs'], 'shot draws': prov.get('shots') or {
              k: v for k, v in prov['config']['data'].items() if k not in PATHS},
          "base model's seed": None if differences is None else differences.get(
              'seed', [prov['config']['seed']])[0]}


def pair(paths):
  """[(seed, A's results, B's)] of two seed sweeps or runs (`paths`: A, B) of the same seeds,
  setting, classes, draws and base models; not the same results twice."""
  if len(paths) != 2:
    raise ValueError(f'--paired compares two runs or sweeps (A B), got {len(paths)} paths')
  a, b = paths
  x, y = map(seed_runs, paths)
  if os.path.samefile(results_path(a), results_path(b)):
    raise ValueError(f'--paired: {a} and {b} are the same results; pair two runs or sweeps')
  if sorted(x) != sorted(y):
    raise ValueError(f'--paired: {a} holds seeds {sorted(x)}, {b} {sorted(y)}; pairs need the '
                     'same seeds')
  for seed in x:
    p, q = shared(x[seed]), shared(y[seed])
    for what in p:
      if p[what] != q[what]:
        raise ValueError(f'--paired: seed {seed} has another {what} in {a} ({str(p[what])[:60]}) '
                         f'than in {b} ({str(q[what])[:60]}); pairs need the same draws and base '
                         'models')
  return [(seed, x[seed], y[seed]) for seed in sorted(x)]


def format_paired(pairs, a, b, primary):
  """B - A per session, PD, AVG and retention (stats.paired over the seeds), and the verdict for
  the declared `primary` row alone (s<n>, pd, avg or retention; default: the last session)."""
  seeds, *runs = zip(*pairs)
  keys = [f's{s["session"]}' for s in runs[0][0]['sessions']] + [*stats.ENDS]
  primary = primary or keys[-4]
  if primary not in keys:
    raise ValueError(f'--primary {primary!r} is none of {keys}')
  rows = stats.paired(*[list(map(stats.seed_values, side)) for side in runs])
  names, i = [NAMES.get(k, f'session {k[1:]} accuracy') for k in keys], keys.index(primary)
  body = [[n, f'{r["mean"]:+.2f}', f'[{r["ci"][0]:.2f}, {r["ci"][1]:.2f}]' if r['ci'] else 'n/a',
           f'{r["holm"]:.2g}' if r['holm'] else 'n/a',
           f'{r["above"]} of {len(seeds)}', *(f'{d:+.2f}' for d in r['diffs'])]
          for n, r in zip(names, rows)]
  header = ['', f'{b} - {a}', '95% CI', 'p (Holm)', 'B > A', *(f'seed {s}' for s in seeds)]
  return (f'{b} - {a}, paired over seeds {[*seeds]} ({runs[0][0]["runs"]} draws each, averaged '
          'within a seed): the paired t-test over the seeds (95% CI; p Holm-adjusted over the '
          "rows), how many seeds have B > A, each seed's difference:\n\n" + table(header, body)
          + f'\n\nprimary: {names[i]}; other rows descriptive\n{b} - {a} at {names[i]}: '
          f'{rows[i]["mean"]:+.2f} ' + verdict(rows[i], len(seeds), a, b))


def verdict(r, seeds, a, b):
  """The primary row's 95% interval, p-value and verdict (resolved where the interval excludes 0),
  or why there is none: too few seeds, or no spread."""
  if seeds < stats.MIN_SEEDS:
    return f'(no interval): {SEEDS}'
  if not r['ci']:
    return f"(no interval): every seed's difference is {r['mean']:+.2f} (the same runs twice?)"
  low, high = r['ci']
  side = f'resolved, {b} {"above" if low > 0 else "below"} {a}'
  if low <= 0 <= high:
    side = 'not resolved'
  return f'[{low:.2f}, {high:.2f}] (95% CI), p = {r["p"]:.2g}: {side}'


def plot(rows, out):
  """accuracy.png and base_novel.png (per session, ± ci95 bars) and the matrices' `heatmaps` into
  `out`; returns their names."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  for name, keys in (('accuracy.png', ['acc']), ('base_novel.png', ['acc_base', 'acc_novel'])):
    ax = Figure(figsize=(7, 4.5)).add_subplot(xlabel='session',
                                              ylabel='accuracy (%, mean ± 95% CI)')
    for i, r in enumerate(rows):
      for key, style in zip(keys, ('-o', '--o')):
        points = [(s['session'], s[key]['mean'], has_interval(r) and s[key]['ci95'] or 0)
                  for s in r['sessions'] if s[key]]
        ax.errorbar(*zip(*points), fmt=style, capsize=2, color=f'C{i}', label=f'{r["label"]} {key}')
    ax.legend(fontsize='small')
    ax.figure.savefig(f'{out}/{name}', dpi=120, bbox_inches='tight')
  if figure := heatmaps(rows):
    figure.savefig(f'{out}/accuracy_matrix.png', dpi=120)
  return ['accuracy.png', 'base_novel.png'] + ['accuracy_matrix.png'] * bool(figure)


def heatmaps(rows):
  """The rows' accuracy matrices (None without any): a heatmap each, on one colour scale from the
  lowest to the highest mean shown, cells labelled to one decimal."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  shown = [(r['label'], np.array(r['accuracy_matrix']['mean'], float)) for r in rows
           if 'accuracy_matrix' in r]  # None: NaN, left blank
  if not shown:
    return None
  every = np.hstack([m.ravel() for _, m in shown])
  low, high = np.nanmin(every), np.nanmax(every)
  fig = Figure(figsize=(4.6 * len(shown), 4.2))
  for k, (label, m) in enumerate(shown):
    ax = fig.add_subplot(1, len(shown), k + 1, title=label, xlabel='after session',
                         ylabel='classes of session')
    image = ax.imshow(m, vmin=low, vmax=high)
    ticks, sessions = range(len(m)), range(1, len(m) + 1)
    ax.set_xticks(ticks, sessions)
    ax.set_yticks(ticks, sessions)
    for (i, j), v in np.ndenumerate(m):
      ax.text(j, i, '' if np.isnan(v) else f'{v:.1f}', ha='center', va='center', fontsize=7,
              color='white' if v < (low + high) / 2 else 'black')
  fig.colorbar(image, ax=fig.axes, label='accuracy (%)')
  return fig


def source_line(r):
  """Where a row was read from: its setting and interval, the command line, --checkpoint's base
  model."""
  prov = r.get('provenance') or {}
  origin, src = prov.get('origin') or {}, prov.get('base_source') or {}
  changes = ', '.join(f'{k}={v!r}' for k, v in (origin.get('changes') or {}).items())
  parts = [f'{r["dataset"]}, {r["method"]}, {r["protocol"]}, {count(r)}', r.get('interval'),
           origin.get('config') and origin['config'] + (changes and f' with {changes}'),
           src and f'{src.get("note") or "base model"} from `{src["path"]}` (trained by '
                   f'{src.get("method")}, commit {str(src.get("commit"))[:10]}; config differs in '
                   f'{", ".join(src.get("differences") or []) or "nothing"})',
           reads_test_set(r) and f'base model of step {r["base_model"]["step"]}, chosen on the '
                                 "base classes' test images"]
  return (f'- {r["label"]}' + f': `{r.get("source")}`' * ('source' in r)
          + f' ({"; ".join(filter(None, parts))})')


def session_rows(rows, all_sessions):
  """Label, session, classes, accuracy, base, novel and HM of each row's sessions (or last one)."""
  return [[r['label'], s['session'], s['num_classes']]
          + [format_stat(s[k], has_interval(r)) for k in stats.KEYS]
          for r in rows for s in r['sessions'][0 if all_sessions else -1:]]


def format_report(rows, reference=0, all_sessions=False, paired=''):
  """report.md: a section per table (where a row has its data), the paired comparison, sources."""
  ref = resolve_reference(rows, reference)
  flatness = [[r['label'], *f] for r in rows for f in r.get('flatness', ())]
  norms = [[r['label']] + [format_stat(r['prototype_norms'][k], has_interval(r))
                           for k in 'base_mean base_std novel_mean novel_std'.split()]
           for r in rows if r.get('prototype_norms')]
  sections = [
      ("Accuracy per session (%, mean ± 95% CI over runs; each row's interval in Sources)",
       f'{format_table(rows, ref)}\n\n{PD_AVG}; {GAP} "{rows[ref]["label"]}".'
       + ''.join(f'\n- {n}' for n in notes(rows, rows[ref]))),
      (f'Base vs novel accuracy ({"every" if all_sessions else "last"} session)',
       table('Method Session Classes Acc Base Novel HM'.split(), session_rows(rows, all_sessions))),
      ('Accuracy matrix (%, mean over runs)', f'{MATRIX}.\n\n' + '\n'.join(
          f'{r["label"]}:\n\n{matrix_table(r) or NO_MATRIX}\n' for r in rows)),
      ('Flatness of the base model (base loss over noise draws)', flatness and table(
          'Method,b,I (train),I (test),sigma^2 (train),sigma^2 (test),draws,images'.split(','),
          flatness)),
      ('Prototype norms after the last session (L2; mean ± 95% CI over runs)', norms and table(
          'Method,base norm mean,base norm std,novel norm mean,novel norm std'.split(','), norms)),
      ('Paired comparison', paired), ('Sources', '\n'.join(map(source_line, rows)))]
  return '# F2M report\n\n' + ''.join(f'## {title}\n\n{text.rstrip()}\n\n'
                                      for title, text in sections if text)


def write_report(rows, out, md='', reference=0):
  """report.md (`md`, by default `format_report`'s), report.csv and the plots into `out` (created
  if missing, these files overwritten); returns {name: path}."""
  if problem := files.in_the_way(out):
    raise ValueError(f'--out {out!r}: {problem}')
  os.makedirs(out, exist_ok=True)
  pathlib.Path(out, 'report.md').write_text(md or format_report(rows, reference), encoding='utf-8')
  records = main_table(rows, reference)
  with open(f'{out}/report.csv', 'w', newline='', encoding='utf-8') as f:
    csv.writer(f).writerows([records[0], *map(dict.values, records)])  # the keys; None: empty
  return {n: f'{out}/{n}' for n in ['report.md', 'report.csv'] + plot(rows, out)}


def main(argv=None):
  """Print the report and write it where --out asks; exit status 2: bad input."""
  parser = argparse.ArgumentParser(prog='python -m f2m_jax.run.report', description=__doc__)
  add = parser.add_argument
  add('paths', nargs='+', help="workdirs (results.json), sweeps' folders (summary.json), files")
  add('--out', help='folder for report.md, report.csv and the plots (created if missing)')
  add('--reference', help='the row the gap subtracts: a label or a 0-based index (default: 0)')
  add('--labels', help='comma-separated labels, one per path')
  add('--base-novel', choices=('last', 'all'), default='last', help='last session or every one')
  add('--paired', action='store_true', help='A B (same seeds, draws and base models): B - A')
  add('--primary', help="--paired's declared endpoint, the one with a verdict: s<n>, pd, avg or "
      'retention (default: the last session)')
  args = parser.parse_args(argv)
  try:
    rows = build_rows(args.paths, args.labels and [s.strip() for s in args.labels.split(',')])
    paired = args.paired and format_paired(pair(args.paths), *[r['label'] for r in rows],
                                           args.primary)
    md = format_report(rows, args.reference, args.base_novel == 'all', paired)
    written = args.out and write_report(rows, args.out, md, args.reference)
  except ValueError as e:
    print(f'report: error: {e}', file=sys.stderr)
    return 2
  print(md + ('\n  '.join(['wrote:', *written.values()]) if written else
              '(nothing written: --out DIR writes report.md, report.csv and plots)'))
  return 0


if __name__ == '__main__':
  sys.exit(main())
