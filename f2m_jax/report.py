"""Gather the `results.json` of several runs into tables and plots (README, 'What a workdir holds'):

    python -m f2m_jax.report W1 W2 ... [--out DIR] [--reference LABEL_OR_INDEX] [--labels a,b,..]
                             [--base-novel {last,all}]

Only the standard library is imported at module level (matplotlib lazily, without pyplot), so importing
this module never touches jax or a display.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import sys
from typing import Any, Iterable, Optional, Sequence

RESULTS_NAME = 'results.json'
SUMMARY_NAME = 'summary.json'  # a member sweep's (members.py), in results.json's format
FLATNESS_NAME = 'flatness.json'  # written by `run.py --mode flatness` into the workdir
STAT_SESSION_KEYS = ('acc', 'acc_base', 'acc_novel', 'hm')  # a session's statistics, in the tables' order
SESSION_HEADER = ['Session', 'Classes', 'Acc', 'Base', 'Novel', 'HM']  # the cells of `session_cells`
MISSING = '-'
PD_AVG = ('PD: accuracy of session 1 minus that of the last session (what was forgotten; lower is better); '
          'AVG: accuracy averaged over all sessions')
GAP = 'gap: last-session accuracy minus that of the reference row'
MATRIX = ("accuracy on each session's classes (rows: the session that brought them) after every later session "
          '(columns), mean over runs: the diagonal is what a session learned, the fall along a row what was forgotten')


class ResultsError(ValueError):
  """A results file that is missing, unreadable or not in the expected shape."""


@dataclasses.dataclass(frozen=True)
class Row:
  """One run of the report: its display label, its results dict and where it was read from."""
  label: str
  results: dict
  source: str = ''
  flatness: tuple = ()  # the workdir's flatness files (run.py --mode flatness), if any


# ----------------------------------------------------------------------------- loading


def results_path(path: str) -> str:
  """The results file for `path`: a directory's results.json, else its summary.json (a sweep's) where
  only that exists; a file itself."""
  if not os.path.isdir(path):
    return path
  summary = os.path.join(path, SUMMARY_NAME)
  results = os.path.join(path, RESULTS_NAME)
  return summary if os.path.isfile(summary) and not os.path.isfile(results) else results


def load_results(path: str) -> dict:
  """Read a results.json (a workdir or the file itself), or a sweep's summary.json."""
  file = results_path(path)
  if not os.path.isfile(file):
    raise ResultsError(f'{file}: no such results file' + (f' (nor a sweep\'s {SUMMARY_NAME} in {path})'
                                                          if os.path.isdir(path) else ''))
  try:
    with open(file, encoding='utf-8') as f:
      results = json.load(f)
  except json.JSONDecodeError as e:
    raise ResultsError(f'{file}: not valid JSON ({e})') from e
  if not isinstance(results, dict) or not ('sessions' in results or 'values' in results):
    raise ResultsError(f'{file}: not the results.json (or summary.json) of a run: it holds no sessions')
  return results


# ----------------------------------------------------------------------------- table helpers


def format_stat(stat: Optional[dict], interval: bool = True) -> str:
  """'mean ± ci95' to 2 decimals ('mean' alone without an interval), or '-' for a missing/null statistic."""
  if stat is None:
    return MISSING
  return f'{stat["mean"]:.2f}' + (f' ± {stat["ci95"]:.2f}' if interval else '')


def has_interval(results: dict) -> bool:
  """Whether the statistics rest on several runs: one run has no interval (its ci95 is written as 0)."""
  return results.get('runs', 2) > 1


def in_order(results: dict) -> list:
  """The session dicts by session number, the last session last."""
  return sorted(results['sessions'], key=lambda s: s['session'])


def session_numbers(rows: Sequence[Row]) -> list:
  """Sorted union of the session numbers of all rows (the table's session columns)."""
  return sorted({s['session'] for row in rows for s in row.results['sessions']})


def session_cells(session: dict, interval: bool) -> list:
  """A session's number, classes, accuracy, base, novel and HM as table cells."""
  return ([str(session['session']), str(session['num_classes'])]
          + [format_stat(session.get(k), interval) for k in STAT_SESSION_KEYS])


def setting(results: dict) -> str:
  """'dataset, protocol, N sessions': what a gap needs two runs to share."""
  return f'{results["dataset"]}, {results["protocol"]}, {len(results["sessions"])} sessions'


def gap(row: Row, reference: Row) -> Optional[float]:
  """Last-session accuracy of `row` minus that of `reference`; None for runs of another dataset,
  protocol or session count (their difference measures nothing)."""
  if setting(row.results) != setting(reference.results):
    return None
  return in_order(row.results)[-1]['acc']['mean'] - in_order(reference.results)[-1]['acc']['mean']


def gap_warnings(rows: Sequence[Row], reference: Any = 0) -> list:
  """One line per row whose gap to the reference is refused (`gap`)."""
  ref = rows[resolve_reference(rows, reference)]
  return [f'no gap for "{r.label}" ({setting(r.results)}): the reference "{ref.label}" is {setting(ref.results)}, '
          'and only runs of the same dataset, protocol and session count are subtracted'
          for r in rows if gap(r, ref) is None]


def resolve_reference(rows: Sequence[Row], reference: Any = None) -> int:
  """Index of the reference row: None -> 0; an exact label match; else an integer index
  (0-based, negative counts from the end). Raises ValueError if nothing matches."""
  if reference is None:
    return 0
  labels = [row.label for row in rows]
  if isinstance(reference, str) and reference in labels:
    return labels.index(reference)
  try:
    index = int(reference)
  except (TypeError, ValueError):
    raise ValueError(f'reference {reference!r} is neither a label {labels} nor an index') from None
  if not -len(rows) <= index < len(rows):
    raise ValueError(f'reference index {index} out of range for {len(rows)} rows')
  return index % len(rows)


def _escape(text: str) -> str:
  """Make `text` safe inside a markdown table cell."""
  return str(text).replace('|', '\\|').replace('\n', ' ')


def markdown_table(header: Sequence[str], body: Iterable[Sequence[str]], align: str = 'r') -> str:
  """A GitHub markdown table; the first column is left-aligned, the others `align` ('l'/'r')."""
  rule = [':---'] + ['---:' if align == 'r' else ':---'] * (len(header) - 1)
  lines = [header, rule] + [list(r) for r in body]
  return '\n'.join('| ' + ' | '.join(_escape(c) for c in line) + ' |' for line in lines)


# ----------------------------------------------------------------------------- provenance


def reads_test_set(results: dict) -> bool:
  """Whether the run chose its base model on test images (base.select_on_test)."""
  return bool((results.get('base_model') or {}).get('reads_test_set'))


def base_budget(config: dict) -> str:
  """'S steps of B (sampler), lr L[, M=.., b=..]': the base training a config dict asks for."""
  b = config['base']
  batch = b['ways'] * b['shots'] if b['sampler'] == 'balanced' else b['batch_size']
  text = f'{b["steps"]} steps of {batch} ({b["sampler"]}), lr {b["lr"]:g}'
  if config['noise']['enabled']:
    text += f', M={config["noise"]["M"]}, b={config["noise"]["bound"]:g}'
  return text


def recorded(results: dict, key: str) -> Any:
  """results.json's provenance[key] (e.g. base_source: the --checkpoint workdir of the base model), or None."""
  return (results.get('provenance') or {}).get(key)


def budget(results: dict) -> str:
  """The base budget of a run ('' without a recorded config); for a base model from --checkpoint, that
  of the config that trained it (this run's config with the source's differing values)."""
  config, source = recorded(results, 'config'), recorded(results, 'base_source')
  if not config:
    return ''
  if source and source.get('differences'):
    config = json.loads(json.dumps(config))
    for field, (there, _) in source['differences'].items():
      *sections, name = field.split('.')
      node = config
      for section in sections:
        node = node.get(section) if isinstance(node, dict) else None
      if isinstance(node, dict) and name in node:
        node[name] = there
  return base_budget(config)


def origin(results: dict) -> str:
  """'configs/x.py:arg with field=value, ...': the command line's config and its changes ('' if
  not recorded)."""
  o = recorded(results, 'origin') or {}
  if not o.get('config'):
    return ''
  changes = o.get('changes') or {}
  return o['config'] + (' with ' + ', '.join(f'{k}={v!r}' for k, v in changes.items()) if changes else '')


def source_text(results: dict) -> str:
  """Where a --checkpoint run's base model came from: its folder, the method and commit that trained
  it and the fields its config set otherwise ('' for a base model trained in the run's own workdir)."""
  source = recorded(results, 'base_source')
  if not source:
    return ''
  commit = source.get('commit')
  text = (f'base model from `{source["path"]}` (trained by {source.get("method") or "an unrecorded method"}, commit '
          + (f'{commit[:10]}' + ('+dirty' if source.get('dirty') else '') if commit else 'unrecorded') + ')')
  diff = source.get('differences') or {}
  if diff:
    text += '; its config differs in ' + ', '.join(f'{k}={there!r} (here {here!r})' for k, (there, here) in diff.items())
  if source.get('note'):
    text = f'{source["note"]}: {text}'
  return text


def hardware(results: dict) -> str:
  """'N x device kind (backend), jax V, commit C[+dirty]' from the provenance ('' if absent)."""
  prov = results.get('provenance')
  if not prov:
    return ''
  hw, git = prov['hardware'], prov.get('git') or {}
  text = f'{hw["num_devices"]} x {hw["device_kind"]} ({hw["backend"]}), jax {prov["versions"]["jax"]}'
  if git:
    text += f', commit {git["commit"][:10]}' + ('+dirty' if git['dirty'] else '')
  return text


# ----------------------------------------------------------------------------- tables


def format_table(rows: Sequence[Row], reference: Any = 0) -> str:
  """The main markdown table: label, accuracy per session ('-' where a row has none), PD, AVG and the
  gap (the last-session accuracy minus that of the `reference` row, see `resolve_reference`)."""
  if not rows:
    raise ValueError('no rows to tabulate')
  ref = rows[resolve_reference(rows, reference)]
  numbers = session_numbers(rows)
  body = []
  for row in rows:
    r, ci, difference = row.results, has_interval(row.results), gap(row, ref)
    by_number = {s['session']: s['acc'] for s in r['sessions']}
    label = (row.label + ('' if ci else ' (1 run, no interval)')
             + (' (base model chosen on test images)' if reads_test_set(r) else ''))
    body.append([label] + [format_stat(by_number.get(n), ci) for n in numbers] + [
        format_stat(r['pd'], ci), format_stat(r['avg'], ci), 'n/a' if difference is None else f'{difference:+.2f}'])
  return markdown_table(['Method'] + [str(n) for n in numbers] + ['PD', 'AVG', 'gap'], body)


def format_base_novel_table(rows: Sequence[Row], all_sessions: bool = False) -> str:
  """Markdown table of base / novel accuracy and HM: each row's last session, or every session."""
  body = [[row.label] + session_cells(s, has_interval(row.results))
          for row in rows for s in (in_order(row.results) if all_sessions else in_order(row.results)[-1:])]
  return markdown_table(['Method'] + SESSION_HEADER, body)


def format_session_table(results: dict) -> str:
  """A short plain-text table of one results dict, printed at the end of a training run: per session
  the classes, accuracy, base, novel and HM (mean ± ci95), then PD and AVG."""
  ci = has_interval(results)
  lines = [session_cells(s, ci) for s in in_order(results)]
  widths = [max(len(r[i]) for r in [SESSION_HEADER] + lines) for i in range(len(SESSION_HEADER))]
  render = lambda r: '  '.join(c.rjust(w) for c, w in zip(r, widths)).rstrip()
  title = (f'{results.get("label") or results.get("method", "?")} on {results.get("dataset", "?")}'
           f' ({results.get("protocol", "?")}, {results.get("runs", "?")} runs, '
           f'{"mean ± 95% CI" if ci else "no interval"}, %)')
  rule = '-' * len(render(SESSION_HEADER))
  footer = f'PD  {format_stat(results["pd"], ci)}    AVG  {format_stat(results["avg"], ci)}\n{PD_AVG}'
  if reads_test_set(results):
    footer += (f'\nbase model: step {results["base_model"]["step"]}, chosen on the base classes\' TEST images '
               '(base.select_on_test)')
  matrix = matrix_lines(results)
  return '\n'.join([title, render(SESSION_HEADER), rule] + [render(r) for r in lines] + [rule, footer]
                   + (['', MATRIX[0].upper() + MATRIX[1:] + ':'] + matrix if matrix else []))


def matrix_cells(results: dict) -> list:
  """The accuracy matrix as rows of cells: a header of the sessions, then per session of origin the mean
  accuracy after each session ('' before it); [] for results without one."""
  mean = (results.get('accuracy_matrix') or {}).get('mean')
  if not mean:
    return []
  numbers = [str(s['session']) for s in in_order(results)]
  return [['from / after'] + numbers] + [[n] + ['' if v is None else f'{v:.2f}' for v in row]
                                          for n, row in zip(numbers, mean)]


def matrix_lines(results: dict) -> list:
  """`matrix_cells` as plain-text lines, right-aligned columns."""
  cells = matrix_cells(results)
  widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))] if cells else []
  return ['  '.join(c.rjust(w) for c, w in zip(r, widths)).rstrip() for r in cells]


def csv_rows(rows: Sequence[Row], reference: Any = 0) -> list:
  """The main table as dicts in the CSV's column order; '' for a missing session, for a refused gap and
  for the intervals of a single run."""
  ref, numbers = rows[resolve_reference(rows, reference)], session_numbers(rows)
  out = []
  for row in rows:
    r, difference = row.results, gap(row, ref)
    by_number = {s['session']: s['acc'] for s in r['sessions']}
    ci95 = lambda stat: '' if stat is None or not has_interval(r) else stat['ci95']  # one run: no interval
    record = {'label': row.label, **{k: r[k] for k in ('dataset', 'method', 'protocol', 'runs')}}
    for n in numbers:
      record.update({f's{n}': by_number[n]['mean'] if n in by_number else '', f's{n}_ci95': ci95(by_number.get(n))})
    record.update(pd=r['pd']['mean'], pd_ci95=ci95(r['pd']), avg=r['avg']['mean'],
                  avg_ci95=ci95(r['avg']), gap='' if difference is None else difference, budget=budget(r),
                  hardware=hardware(r))
    out.append(record)
  return out


def write_csv(rows: Sequence[Row], path: str, reference: Any = 0) -> str:
  """Write the main table to `path` as CSV (full-precision floats); return `path`."""
  records = csv_rows(rows, reference)
  with open(path, 'w', newline='', encoding='utf-8') as f:
    writer = csv.DictWriter(f, fieldnames=list(records[0]))
    writer.writeheader()
    writer.writerows(records)
  return path


def format_flatness_table(rows: Sequence[Row]) -> str:
  """The paper's flatness table (indicator I and variance sigma^2 on the training and test sets), one
  line per flatness file of each row; '' if no row has one."""
  body = [[_escape(r.label), f'{f["bound"]:g}'] + [f'{f[s][k]:.4g}' for k in ('I', 'sigma2') for s in ('train', 'test')]
          + [str(f['train']['num_draws']), f'{f["train"]["num_images"]} / {f["test"]["num_images"]}']
          for r in rows for f in r.flatness]
  header = ['Method', 'b', 'I (train)', 'I (test)', 'sigma^2 (train)', 'sigma^2 (test)', 'draws', 'images']
  return markdown_table(header, body) if body else ''


def format_norms_table(rows: Sequence[Row]) -> str:
  """The paper's norm table: per row the mean and std over classes of the L2 norms of the base and novel
  prototypes after the last session, averaged over runs; '' when no row has them (older results)."""
  body = [[_escape(r.label)] + [format_stat(r.results['prototype_norms'][k], has_interval(r.results))
                                for k in ('base_mean', 'base_std', 'novel_mean', 'novel_std')]
          for r in rows if r.results.get('prototype_norms')]
  header = ['Method', 'base norm mean', 'base norm std', 'novel norm mean', 'novel norm std']
  return markdown_table(header, body) if body else ''


# ----------------------------------------------------------------------------- plots


def _plot(rows: Sequence[Row], path: str, title: str, curves: Sequence[tuple], alpha: float) -> str:
  """Each row's `curves` ((statistic, line style, label suffix)) per session with a shaded mean ± ci95
  band, one colour per row, skipping null sessions; PNG at `path`. Draws on an Agg canvas of its own."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  fig = Figure(figsize=(7.0, 4.5))
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  for i, row in enumerate(rows):
    for key, style, suffix in curves:
      points = [(s['session'], s[key]['mean'], s[key]['ci95']) for s in in_order(row.results) if s.get(key)]
      if not points:
        continue
      x, mean, ci = (list(v) for v in zip(*points))
      ax.plot(x, mean, style, marker='o', markersize=3, color=f'C{i % 10}', label=row.label + suffix)
      ax.fill_between(x, [m - c for m, c in zip(mean, ci)], [m + c for m, c in zip(mean, ci)],
                      color=f'C{i % 10}', alpha=alpha, linewidth=0)
  ax.set_xticks(session_numbers(rows))
  ax.set_xlabel('session')
  ax.set_ylabel('accuracy (%)')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize='small')
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return path


def plot_accuracy(rows: Sequence[Row], path: str) -> str:
  """Accuracy per session, one line per row with a shaded mean ± ci95 band; PNG at `path`."""
  return _plot(rows, path, 'Accuracy per session (mean ± 95% CI)', [('acc', '-', '')], 0.2)


def plot_base_novel(rows: Sequence[Row], path: str) -> str:
  """Base (solid) and novel (dashed) accuracy per session, one colour per row; PNG at `path`."""
  return _plot(rows, path, 'Base (solid) and novel (dashed) accuracy',
               [('acc_base', '-', ' base'), ('acc_novel', '--', ' novel')], 0.12)


def plot_matrix(rows: Sequence[Row], path: str) -> Optional[str]:
  """One heatmap per row with an accuracy matrix, on one colour scale from the lowest cell (to the ten
  below) to 100; PNG at `path`, or None where no row has a matrix."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  shown = [r for r in rows if matrix_cells(r.results)]
  if not shown:
    return None
  fig = Figure(figsize=(4.6 * len(shown), 4.2))
  FigureCanvasAgg(fig)
  low = 10 * math.floor(min(v for r in shown for row in r.results['accuracy_matrix']['mean'] for v in row
                            if v is not None) / 10)
  for k, row in enumerate(shown):
    ax = fig.add_subplot(1, len(shown), k + 1)
    mean = [[float('nan') if v is None else v for v in r] for r in row.results['accuracy_matrix']['mean']]
    image = ax.imshow(mean, vmin=low, vmax=100, cmap='viridis')
    label_cells(ax, mean, low)
    numbers = [s['session'] for s in in_order(row.results)]
    ax.set_xticks(range(len(numbers)), numbers)
    ax.set_yticks(range(len(numbers)), numbers)
    ax.set_xlabel('after session')
    ax.set_ylabel('classes of session')
    ax.set_title(row.label, fontsize='small')
  fig.colorbar(image, ax=fig.axes, label='accuracy (%)', shrink=0.8)
  fig.savefig(path, dpi=120)
  return path


def label_cells(ax, mean: list, low: float) -> None:
  """Each cell's mean written on it (none on NaN), white on the darker colours."""
  for i, row in enumerate(mean):
    for j, v in enumerate(row):
      if v == v:  # not NaN
        ax.text(j, i, f'{v:.0f}', ha='center', va='center', fontsize=7,
                color='white' if v < low + 0.6 * (100 - low) else 'black')


# ----------------------------------------------------------------------------- report


def build_rows(paths: Sequence[str], labels: Optional[Sequence[str]] = None) -> list:
  """One Row per path (a sweep over a field: one per value, never pooled), labelled by `labels` (one per
  path), else by the results' "label", else "<method> <workdir basename>"."""
  if labels is not None and len(labels) != len(paths):
    raise ValueError(f'got {len(labels)} labels for {len(paths)} results: {list(labels)}')
  rows = []
  for i, path in enumerate(paths):
    results, file, flatness = load_results(path), results_path(path), load_flatness(path)
    values = ([(f' {results["field"]}={v["value"]:g}', v) for v in results['values']] if 'values' in results
              else [('', results)])
    for suffix, r in values:
      if labels is not None:
        label = labels[i]
      elif r.get('label'):
        label = str(r['label'])
      else:
        label = f'{r["method"]} {os.path.basename(os.path.dirname(os.path.abspath(file)))}'
      rows.append(Row(label=label + suffix, results=r, source=file, flatness=flatness))
  return rows


def load_flatness(path: str) -> tuple:
  """The flatness files of a workdir: flatness.json, then any flatness_<time>.json that later runs of
  `--mode flatness` (e.g. at another bound) wrote beside it; () if there are none."""
  if not os.path.isdir(path):
    return ()
  names = [n for n in os.listdir(path)
           if n == FLATNESS_NAME or (n.startswith('flatness_') and n.endswith('.json'))]
  out = []
  for name in sorted(names, key=lambda n: (n != FLATNESS_NAME, n)):
    file = os.path.join(path, name)
    try:
      with open(file, encoding='utf-8') as f:
        flat = json.load(f)
      for split in ('train', 'test'):
        for key in ('I', 'sigma2', 'num_draws', 'num_images'):
          float(flat[split][key])
      float(flat['bound'])
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise ResultsError(f'{file}: not a flatness file of run.py --mode flatness ({e})') from e
    out.append(flat)
  return tuple(out)


def format_report(rows: Sequence[Row], reference: Any = 0, all_sessions: bool = False) -> str:
  """The full report.md text: main table, base/novel table, flatness and norm tables (where there are
  any) and the list of sources."""
  ref = rows[resolve_reference(rows, reference)]
  sources = [f'- {_escape(r.label)}: `{r.source}` ({r.results["dataset"]}, {r.results["method"]}, '
             f'{r.results["protocol"]}, {r.results["runs"]} runs'
             + (f'; base model of step {r.results["base_model"]["step"]}, chosen on the base classes\' test '
                'images' if reads_test_set(r.results) else '')
             + ''.join(f'; {x}' for x in (origin(r.results), source_text(r.results), budget(r.results),
                                          hardware(r.results)) if x) + ')' for r in rows]
  flatness = format_flatness_table(rows)
  norms = format_norms_table(rows)
  matrices = [line for r in rows if matrix_cells(r.results) for line in
              [f'{_escape(r.label)}:', '', markdown_table(matrix_cells(r.results)[0], matrix_cells(r.results)[1:]), '']]
  refused = [f'- {_escape(w)}' for w in gap_warnings(rows, reference)]
  return '\n'.join([
      '# F2M report', '',
      '## Accuracy per session (%, mean ± 95% CI over runs)', '',
      format_table(rows, reference), '',
      f'{PD_AVG}; {GAP} "{_escape(ref.label)}".', '',
  ] + refused + [''] * bool(refused) + [
      f'## Base vs novel accuracy ({"every" if all_sessions else "last"} session)', '',
      format_base_novel_table(rows, all_sessions), '',
  ] + (['## Accuracy matrix (%, mean over runs)', '', MATRIX[0].upper() + MATRIX[1:] + '.', ''] + matrices
       if matrices else [])
      + (['## Flatness of the base model (base loss over noise draws)', '', flatness, ''] if flatness else [])
      + (['## Prototype norms after the last session (L2; mean ± 95% CI over runs)', '', norms, ''] if norms else [])
      + ['## Sources', ''] + sources) + '\n'


def write_report(rows: Sequence[Row], out: str, reference: Any = 0,
                 all_sessions: bool = False) -> dict:
  """Write report.md, report.csv, accuracy.png and base_novel.png into `out` (created if missing,
  files overwritten); return {name: path}."""
  if not out or (os.path.exists(out) and not os.path.isdir(out)):
    raise ValueError(f'--out {out!r} is not a folder: give a folder (created if missing) for the report\'s files')
  os.makedirs(out, exist_ok=True)
  paths = {name: os.path.join(out, name)
           for name in ('report.md', 'report.csv', 'accuracy.png', 'base_novel.png', 'accuracy_matrix.png')}
  with open(paths['report.md'], 'w', encoding='utf-8') as f:
    f.write(format_report(rows, reference, all_sessions))
  write_csv(rows, paths['report.csv'], reference)
  plot_accuracy(rows, paths['accuracy.png'])
  plot_base_novel(rows, paths['base_novel.png'])
  if not plot_matrix(rows, paths['accuracy_matrix.png']):
    del paths['accuracy_matrix.png']
  return paths


def main(argv: Optional[Sequence[str]] = None) -> int:
  """CLI entry point (see the module docstring): print the main table (and the gaps refused), write the
  report where --out asks and name its files. Returns the exit status."""
  parser = argparse.ArgumentParser(prog='python -m f2m_jax.report',
                                   description='Tabulate (and with --out, plot) the results of training runs.')
  parser.add_argument('paths', nargs='+', help="workdirs holding results.json, sweeps' folders holding "
                                               'summary.json, or those files')
  parser.add_argument('--out', default=None, help='report folder for report.md, report.csv and the plots '
                                                   '(created if missing); without it, nothing is written')
  parser.add_argument('--reference', default=None,
                      help='row whose last-session accuracy the gap column subtracts: a label or a '
                           '0-based index (default: the first row)')
  parser.add_argument('--labels', default=None, help='comma-separated labels, one per path')
  parser.add_argument('--base-novel', choices=('last', 'all'), default='last',
                      help='base/novel table for the last session only or for every session')
  args = parser.parse_args(argv)
  labels = [s.strip() for s in args.labels.split(',')] if args.labels is not None else None
  try:
    rows = build_rows(args.paths, labels)
    reference = resolve_reference(rows, args.reference)
    written = write_report(rows, args.out, reference, args.base_novel == 'all') if args.out is not None else {}
  except ValueError as e:  # ResultsError included
    print(f'report: error: {e}', file=sys.stderr)
    return 2
  for warning in gap_warnings(rows, reference):
    print(f'report: warning: {warning}', file=sys.stderr)
  print(format_table(rows, reference))
  print(f'{PD_AVG}; {GAP} "{rows[reference].label}" (--reference)')
  for row in rows:
    if matrix_cells(row.results):
      print('\n'.join(['', f'{row.label}: {MATRIX}'] + matrix_lines(row.results)))
  print('\n'.join(['wrote:'] + [f'  {p}' for p in written.values()]) if written else
        '(nothing written: --out DIR writes report.md, report.csv, accuracy.png, base_novel.png and '
        'accuracy_matrix.png)')
  return 0


if __name__ == '__main__':
  sys.exit(main())
