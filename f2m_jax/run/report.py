"""Tables, plots and paired comparisons from the results.json of runs and the summary.json of sweeps (README,
'What a workdir holds'). Only the standard library at module level (matplotlib, numpy, scipy lazily): no jax."""
from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import statistics
import sys
from typing import Any, NamedTuple, Optional, Sequence

from f2m_jax import stats

SESSION_HEADER = ['Method', 'Session', 'Classes', 'Acc', 'Base', 'Novel', 'HM']
PATHS = ('cache_dir', 'data_dir', 'tfds_data_dir')  # data fields that change nothing that is drawn
PD_AVG = ('PD: accuracy of session 1 minus that of the last session (what was forgotten; lower is better); '
          'AVG: accuracy averaged over all sessions')
GAP = 'gap: last-session accuracy minus that of the reference row'
MATRIX = ("Accuracy on each session's classes (rows: the session that brought them) after every later session "
          '(columns), mean over runs: the diagonal is what a session learned, the fall along a row what was forgotten')


class ResultsError(ValueError):
  """A results file that is missing, unreadable or not in the expected shape."""


class Row(NamedTuple):
  """A row of the report: its label, its results, the file they came from and the workdir's flatness files."""
  label: str
  results: dict
  source: str = ''
  flatness: tuple = ()


def results_path(path: str) -> str:
  """A folder's results.json, or its summary.json (a sweep's) where only that exists; a file itself."""
  files = [os.path.join(path, n) for n in ('results.json', 'summary.json')] if os.path.isdir(path) else [path]
  return next((f for f in files if os.path.isfile(f)), files[0])


def read_json(file: str, check, what: str) -> Any:
  """`file`'s JSON after `check` (which raises where it is not `what`); a ResultsError naming the file."""
  try:
    data = json.loads(pathlib.Path(file).read_text(encoding='utf-8'))
    check(data)
    return data
  except FileNotFoundError:
    raise ResultsError(f'{file}: no such results file' + (f" (nor a sweep's summary.json in {os.path.dirname(file)})"
                                                          if file.endswith('results.json') else '')) from None
  except json.JSONDecodeError as e:
    raise ResultsError(f'{file}: not valid JSON ({e})') from None
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    raise ResultsError(f'{file}: not the {what} ({e!r})') from None


def load_results(path: str) -> dict:
  """A results.json (its workdir or the file) or a sweep's summary.json."""
  return read_json(results_path(path), lambda d: d.get('sessions') or d['values'],
                   'results.json (or summary.json) of a run: it holds no sessions')


def load_flatness(path: str) -> tuple:
  """A workdir's flatness.json, then the flatness_<time>.json of later `--mode flatness` runs."""
  files = sorted(pathlib.Path(path).glob('flatness*.json'), key=lambda f: (f.name != 'flatness.json', f.name))
  def check(f):  # the numbers the table shows
    return [float(f['bound'])] + [float(f[s][k]) for s in ('train', 'test') for k in ('I', 'sigma2', 'num_draws')]
  return tuple(read_json(str(f), check, 'flatness file of run.py --mode flatness') for f in files)


def build_rows(paths: Sequence[str], labels: Optional[Sequence[str]] = None) -> list:
  """A Row per path (per value of a field's sweep), labelled `labels`, the results' label or '<method> <folder>'."""
  if labels is not None and len(labels) != len(paths):
    raise ValueError(f'got {len(labels)} labels for {len(paths)} results: {list(labels)}')
  rows = []
  for i, path in enumerate(paths):
    results, file, flatness = load_results(path), results_path(path), load_flatness(path)
    folder = os.path.basename(os.path.dirname(os.path.abspath(file)))
    for suffix, r in ([(f' {results["field"]}={v["value"]:g}', v) for v in results['values']]
                      if 'values' in results else [('', results)]):
      label = labels[i] if labels is not None else str(r.get('label') or f'{r["method"]} {folder}')
      rows.append(Row(label + suffix, r, file, flatness))
  return rows


def has_interval(results: dict) -> bool:
  return results.get('runs', 2) > 1  # one run's results hold ci95 0 (earlier versions) or null


def reads_test_set(results: dict) -> bool:
  return bool((results.get('base_model') or {}).get('reads_test_set'))  # base.select_on_test


def format_stat(stat: Optional[dict], interval: bool = True) -> str:
  """'mean ± ci95', 'mean ± n/a' where the runs give no interval, the mean alone for one run; '-' for none."""
  if not stat:
    return '-'
  ci = stat.get('ci95')
  return f'{stat["mean"]:.2f}' + ((' ± n/a' if ci is None else f' ± {ci:.2f}') if interval else '')


def table(header: Sequence, body: Sequence[Sequence], plain: bool = False) -> str:
  """A GitHub markdown table (the first column left-aligned), or `plain` text in right-aligned columns."""
  rows = [[str(c) for c in r] for r in [header, *body]]
  if plain:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return '\n'.join('  '.join(c.rjust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
  rows.insert(1, [':---'] + ['---:'] * (len(header) - 1))
  return '\n'.join('| ' + ' | '.join(c.replace('|', '\\|').replace('\n', ' ') for c in r) + ' |' for r in rows)


def setting(results: dict) -> str:
  return f'{results["dataset"]}, {results["protocol"]}, {len(results["sessions"])} sessions'  # what a gap needs


def resolve_reference(rows: Sequence[Row], reference: Any = None) -> int:
  """Index of the reference row: a label, else an index (negative from the end); None: the first."""
  labels = [row.label for row in rows]
  try:
    return labels.index(reference) if reference in labels else range(len(rows))[int(reference or 0)]
  except (TypeError, ValueError, IndexError):
    raise ValueError(f'--reference {reference!r} is neither a label {labels} nor an index of the {len(rows)} '
                     'rows') from None


def notes(rows: Sequence[Row], reference: int) -> list:
  """A line per refused gap (another setting) and per row without an interval (every run on the same shots)."""
  ref = rows[reference]
  return ([f'no gap for "{r.label}" ({setting(r.results)}): the reference "{ref.label}" is {setting(ref.results)}, '
           'and only runs of the same dataset, protocol and session count are subtracted'
           for r in rows if setting(r.results) != setting(ref.results)]
          + [f'"{r.label}": interval {r.results["interval"]}' for r in rows
             if str(r.results.get('interval')).startswith('n/a')])


def main_table(rows: Sequence[Row], reference: Any = 0) -> list:
  """report.csv's records: each session's accuracy (s<n>), PD and AVG as mean and ci95 (None: none); the gap."""
  ref = rows[resolve_reference(rows, reference)].results
  names = [f's{n}' for n in sorted({s['session'] for r in rows for s in r.results['sessions']})] + ['pd', 'avg']
  last = lambda r: r['sessions'][-1]['acc']['mean']
  out = []
  for row in rows:
    r = row.results
    stats = {**{f's{s["session"]}': s['acc'] for s in r['sessions']}, 'pd': r['pd'], 'avg': r['avg']}
    out.append({'label': row.label, **{k: r[k] for k in ('dataset', 'method', 'protocol', 'runs')}})
    for name, stat in ((n, stats.get(n) or {}) for n in names):
      out[-1].update({name: stat.get('mean'), f'{name}_ci95': stat.get('ci95') if has_interval(r) else None})
    out[-1].update(gap=last(r) - last(ref) if setting(r) == setting(ref) else None, interval=r.get('interval'))
  return out


def format_table(rows: Sequence[Row], reference: Any = 0) -> str:
  """The main table in markdown: accuracy per session ('-' where a row has none), PD, AVG and the gap."""
  records = main_table(rows, reference)
  names = [k for k in records[0] if f'{k}_ci95' in records[0]]
  body = [[row.label + ('' if has_interval(row.results) else ' (1 run, no interval)')
           + (' (base model chosen on test images)' if reads_test_set(row.results) else '')]
          + [format_stat(r[n] is not None and {'mean': r[n], 'ci95': r[f'{n}_ci95']}, has_interval(row.results))
             for n in names] + ['n/a' if r['gap'] is None else f'{r["gap"]:+.2f}'] for row, r in zip(rows, records)]
  return table(['Method'] + [n[1:] for n in names[:-2]] + ['PD', 'AVG', 'gap'], body)


def matrix_table(results: dict, plain: bool = True) -> str:
  """The accuracy matrix, a row per session of origin ('' before it); '' without one."""
  mean, numbers = (results.get('accuracy_matrix') or {}).get('mean'), [s['session'] for s in results['sessions']]
  return table(['from / after'] + numbers, [[n] + ['' if v is None else f'{v:.2f}' for v in row]
                                            for n, row in zip(numbers, mean)], plain) if mean else ''


def session_rows(rows: Sequence[Row], all_sessions: bool = True) -> list:
  """Label, session, classes, accuracy, base, novel and HM of each row's sessions (or last session)."""
  return [[r.label, s['session'], s['num_classes']] + [format_stat(s.get(k), has_interval(r.results)) for k in stats.KEYS]
          for r in rows for s in r.results['sessions'][0 if all_sessions else -1:]]


def format_session_table(results: dict) -> str:
  """The plain table printed after a run or a seed sweep: sessions, PD and AVG, the accuracy matrix."""
  ci, matrix = has_interval(results), matrix_table(results)
  lines = table(SESSION_HEADER[1:], [r[1:] for r in session_rows([Row('', results)])], plain=True).splitlines()
  lines[1:1] = ['-' * len(lines[0])]
  title = (f'{results.get("label") or results["method"]} on {results["dataset"]} ({results["protocol"]}, '
           f'{results["runs"]} {"seeds" if "members" in results else "runs"}, %, '
           + (f'mean ± 95% interval: {results.get("interval", "1.96 * std / sqrt(R)")})' if ci else 'no interval)'))
  footer = [lines[1], f'PD  {format_stat(results["pd"], ci)}    AVG  {format_stat(results["avg"], ci)}', PD_AVG]
  if reads_test_set(results):
    footer.append(f'base model: step {results["base_model"]["step"]}, chosen on the base classes\' TEST images '
                  '(base.select_on_test)')
  return '\n'.join([title] + lines + footer + (['', f'{MATRIX}:', matrix] if matrix else []))


def seed_runs(path: str) -> dict:
  """{seed: results} of a seed sweep's members, or of one run."""
  file, results = results_path(path), load_results(path)
  if 'values' in results:
    raise ResultsError(f'{path}: a sweep over {results["field"]} holds no seeds to pair')
  members = sorted(str(f) for f in pathlib.Path(file).parent.glob('member_*/results.json'))
  runs = {((r.get('provenance') or {}).get('config') or {}).get('seed'): r
          for r in map(load_results, members if file.endswith('summary.json') else [file])}
  if None in runs:
    raise ResultsError(f'{path}: a run there records no seed (no provenance.config): nothing to pair it by')
  return runs


def shared(r: dict) -> dict:
  """What two paired runs share; without a digest of the draws (older runs) the seed, runs and data config."""
  prov, data = r['provenance'], {k: v for k, v in r['provenance']['config']['data'].items() if k not in PATHS}
  return {'setting': setting(r), 'classes': [s['num_classes'] for s in r['sessions']], 'number of runs': r['runs'],
          'shot draws': prov.get('shots') or json.dumps([prov['config']['seed'], r['runs'], data], sort_keys=True)}


def pair(a: str, b: str) -> list:
  """[(seed, A's results, B's)] of two seed sweeps or runs of the same seeds, setting, classes, runs and draws."""
  runs = [seed_runs(a), seed_runs(b)]
  if sorted(runs[0]) != sorted(runs[1]):
    raise ValueError(f'--paired: {a} holds seeds {sorted(runs[0])}, {b} {sorted(runs[1])}; pairs need the same seeds')
  for seed in sorted(runs[0]):
    x, y = shared(runs[0][seed]), shared(runs[1][seed])
    what = next((k for k in x if x[k] != y[k]), None)
    if what:
      raise ValueError(f'--paired: seed {seed} has another {what} in {a} ({str(x[what])[:60]}) than in {b} '
                       f'({str(y[what])[:60]}); pairs need the same draws of the same protocol')
  return [(seed, runs[0][seed], runs[1][seed]) for seed in sorted(runs[0])]


def format_paired(pairs: list, a: str, b: str) -> str:
  """B - A per session, PD and AVG: the mean over the seeds of each seed's difference of its means over the
  same draws, its t-interval over the seeds and a verdict (resolved where the interval excludes 0)."""
  names = [f'session {s["session"]}' for s in pairs[0][1]['sessions']] + ['PD', 'AVG']
  means = lambda r: [s['acc']['mean'] for s in r['sessions']] + [r['pd']['mean'], r['avg']['mean']]
  diffs = zip(*[[y - x for x, y in zip(means(ra), means(rb))] for _, ra, rb in pairs])
  rows = [(name, statistics.fmean(d), stats.t_interval(d)) for name, d in zip(names, diffs)]
  verdict = lambda m, h: 'n/a (one seed)' if h is None else 'resolved' if abs(m) > h else 'not resolved'
  ci = lambda m, h: 'n/a' if h is None else f'[{m - h:+.2f}, {m + h:+.2f}]'
  name, m, h = rows[-3]
  return (f'{b} - {a}, paired over seeds {[s for s, _, _ in pairs]} ({pairs[0][1]["runs"]} draws each, averaged '
          'within a seed); 95% interval t(0.975, S-1) * std(ddof=1) / sqrt(S) over the S seeds:\n\n'
          + table(['', f'{b} - {a}', '95% CI', 'verdict'], [[n, f'{x:+.2f}', ci(x, y), verdict(x, y)]
                                                           for n, x, y in rows], plain=True)
          + f'\n\n{b} {"above" if m > 0 else "below" if m < 0 else "level with"} {a} at {name}: {m:+.2f}, '
          f'95% CI {ci(m, h)}: {verdict(m, h)}')


def plot(rows: Sequence[Row], out: str) -> list:
  """accuracy.png and base_novel.png (per session, ± ci95 bands) and, where a row has one, accuracy_matrix.png (a
  heatmap per matrix on one colour scale, cells labelled) into `out`; returns their names."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  for name, title, curves in (('accuracy.png', 'Accuracy per session (mean ± 95% CI)', [('acc', '-', '')]),
                              ('base_novel.png', 'Base (solid) and novel (dashed) accuracy',
                               [('acc_base', '-', ' base'), ('acc_novel', '--', ' novel')])):
    ax = Figure(figsize=(7.0, 4.5)).add_subplot()
    for i, row in enumerate(rows):
      for key, style, suffix in curves:
        points = [(s['session'], s[key]['mean'], s[key].get('ci95')) for s in row.results['sessions'] if s.get(key)]
        x, mean, ci = zip(*points) if points else ((), (), ())
        ax.plot(x, mean, style, marker='o', markersize=3, color=f'C{i % 10}', label=row.label + suffix)
        if points and None not in ci and has_interval(row.results):
          ax.fill_between(x, np.subtract(mean, ci), np.add(mean, ci), color=f'C{i % 10}', alpha=0.2 / len(curves), lw=0)
    ax.set(xlabel='session', ylabel='accuracy (%)', title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize='small')
    ax.figure.savefig(os.path.join(out, name), dpi=120, bbox_inches='tight')
  return ['accuracy.png', 'base_novel.png'] + plot_matrices(rows, out)


def plot_matrices(rows: Sequence[Row], out: str) -> list:
  """accuracy_matrix.png where a row has a matrix: a heatmap each on one colour scale, cells labelled."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  shown = [(r.label, np.array(r.results['accuracy_matrix']['mean'], float)) for r in rows
           if (r.results.get('accuracy_matrix') or {}).get('mean')]
  if shown:
    fig = Figure(figsize=(4.6 * len(shown), 4.2))
    low = 10 * (min(np.nanmin(m) for _, m in shown) // 10)  # None cells are NaN: left blank
    for ax, (label, mean) in zip(fig.subplots(1, len(shown), squeeze=False)[0], shown):
      n = len(mean)  # sessions 1..n
      image = ax.imshow(mean, vmin=low, vmax=100, cmap='viridis', extent=(0.5, n + 0.5, n + 0.5, 0.5))
      for i, j in np.argwhere(~np.isnan(mean)):
        ax.text(j + 1, i + 1, f'{mean[i, j]:.0f}', ha='center', va='center', fontsize=7,
                color='white' if mean[i, j] < low + 0.6 * (100 - low) else 'black')
      ax.set(xticks=range(1, n + 1), yticks=range(1, n + 1), xlabel='after session', ylabel='classes of session')
      ax.set_title(label, fontsize='small')
    fig.colorbar(image, ax=fig.axes, label='accuracy (%)', shrink=0.8)
    fig.savefig(os.path.join(out, 'accuracy_matrix.png'), dpi=120)
  return ['accuracy_matrix.png'] * bool(shown)


def source_line(row: Row) -> str:
  """Where a row was read from: its setting and interval, the command line, --checkpoint's base model."""
  r, prov = row.results, row.results.get('provenance') or {}
  origin, src = prov.get('origin') or {}, prov.get('base_source') or {}
  changes = ', '.join(f'{k}={v!r}' for k, v in (origin.get('changes') or {}).items())
  differs = ', '.join(src.get('differences') or []) or 'nothing'
  parts = [f'{r["dataset"]}, {r["method"]}, {r["protocol"]}, {r["runs"]} runs', r.get('interval'),
           origin.get('config') and origin['config'] + (changes and f' with {changes}'),
           src and f'{src.get("note") or "base model"} from `{src["path"]}` (trained by {src.get("method")}, commit '
                   f'{str(src.get("commit"))[:10]}; config differs in {differs})',
           reads_test_set(r) and f'base model of step {r["base_model"]["step"]}, chosen on the base classes\' test '
                                 'images']
  return f'- {row.label}: `{row.source}` (' + '; '.join(p for p in parts if p) + ')'


def extra_rows(rows: Sequence[Row]) -> tuple:
  """The flatness table's rows (one per flatness file of each row) and the prototype norms' (where recorded)."""
  flatness = [[r.label, f'{f["bound"]:g}'] + [f'{f[s][k]:.4g}' for k in ('I', 'sigma2') for s in ('train', 'test')]
              + [f['train']['num_draws'], f'{f["train"]["num_images"]} / {f["test"]["num_images"]}']
              for r in rows for f in r.flatness]
  norms = [[r.label] + [format_stat(r.results['prototype_norms'][k], has_interval(r.results))
                        for k in ('base_mean', 'base_std', 'novel_mean', 'novel_std')]
           for r in rows if r.results.get('prototype_norms')]
  return flatness, norms


def format_report(rows: Sequence[Row], reference: Any = 0, all_sessions: bool = False, paired: str = '') -> str:
  """report.md: a section per table (where a row has its data), the paired comparison and the sources."""
  ref = resolve_reference(rows, reference)
  gap_notes = notes(rows, ref)
  matrices = [f'{r.label}:\n\n{m}\n' for r in rows for m in [matrix_table(r.results, plain=False)] if m]
  flatness, norms = extra_rows(rows)
  sections = [
      ("Accuracy per session (%, mean ± 95% CI over runs; each row's interval in Sources)",
       f'{format_table(rows, ref)}\n\n{PD_AVG}; {GAP} "{rows[ref].label}".' + ''.join(f'\n- {n}' for n in gap_notes)),
      (f'Base vs novel accuracy ({"every" if all_sessions else "last"} session)',
       table(SESSION_HEADER, session_rows(rows, all_sessions))),
      ('Accuracy matrix (%, mean over runs)', matrices and f'{MATRIX}.\n\n' + '\n'.join(matrices)),
      ('Flatness of the base model (base loss over noise draws)', flatness and table(
          ['Method', 'b', 'I (train)', 'I (test)', 'sigma^2 (train)', 'sigma^2 (test)', 'draws', 'images'], flatness)),
      ('Prototype norms after the last session (L2; mean ± 95% CI over runs)', norms and table(
          ['Method', 'base norm mean', 'base norm std', 'novel norm mean', 'novel norm std'], norms)),
      ('Paired comparison', paired and f'```\n{paired}\n```'), ('Sources', '\n'.join(source_line(r) for r in rows))]
  return '# F2M report\n\n' + ''.join(f'## {title}\n\n{text.rstrip()}\n\n' for title, text in sections if text)


def write_report(rows: Sequence[Row], out: str, reference=0, all_sessions: bool = False, paired: str = '') -> dict:
  """The report's files into `out` (created if missing, these files overwritten); returns {name: path}."""
  if not out or (os.path.exists(out) and not os.path.isdir(out)):
    raise ValueError(f"--out {out!r} is not a folder: give a folder (created if missing) for the report's files")
  os.makedirs(out, exist_ok=True)
  pathlib.Path(out, 'report.md').write_text(format_report(rows, reference, all_sessions, paired), encoding='utf-8')
  records = main_table(rows, reference)
  with open(os.path.join(out, 'report.csv'), 'w', newline='', encoding='utf-8') as f:
    csv.writer(f).writerows([list(records[0])] + [list(r.values()) for r in records])  # None: empty
  return {n: os.path.join(out, n) for n in ['report.md', 'report.csv'] + plot(rows, out)}


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Print the tables (notes on stderr) and write the report where --out asks; exit status 2: bad input."""
  parser = argparse.ArgumentParser(prog='python -m f2m_jax.run.report', description='Tables, plots, paired comparisons.')
  parser.add_argument('paths', nargs='+', help="workdirs (results.json), sweeps' folders (summary.json) or those files")
  parser.add_argument('--out', help='folder for report.md, report.csv and the plots (created if missing)')
  parser.add_argument('--reference', help='the row the gap subtracts: a label or a 0-based index (default: the first)')
  parser.add_argument('--labels', help='comma-separated labels, one per path')
  parser.add_argument('--base-novel', choices=('last', 'all'), default='last', help='last session or every one')
  parser.add_argument('--paired', action='store_true', help='A B, same seeds and draws: B - A, t-interval over seeds')
  args = parser.parse_args(argv)
  try:
    rows = build_rows(args.paths, args.labels and [s.strip() for s in args.labels.split(',')])
    reference = resolve_reference(rows, args.reference)
    if args.paired and len(args.paths) != 2:
      raise ValueError(f'--paired compares two runs or sweeps (A B), got {len(args.paths)} paths')
    comparison = format_paired(pair(*args.paths), *[r.label for r in rows]) if args.paired else ''
    written = {} if args.out is None else write_report(rows, args.out, reference, args.base_novel == 'all', comparison)
  except ValueError as e:  # ResultsError included
    print(f'report: error: {e}', file=sys.stderr)
    return 2
  print(''.join(f'report: warning: {n}\n' for n in notes(rows, reference)), end='', file=sys.stderr)
  print(f'{format_table(rows, reference)}\n{PD_AVG}; {GAP} "{rows[reference].label}" (--reference)')
  print(''.join(f'\n{r.label}: {MATRIX[0].lower()}{MATRIX[1:]}\n{m}\n' for r in rows for m in [matrix_table(r.results)]
                if m) + (f'\n{comparison}\n' if comparison else ''), end='')
  print('\n'.join(['wrote:'] + [f'  {p}' for p in written.values()]) if written else
        '(nothing written: --out DIR writes report.md, report.csv, accuracy.png, base_novel.png and '
        'accuracy_matrix.png)')
  return 0


if __name__ == '__main__':
  sys.exit(main())
