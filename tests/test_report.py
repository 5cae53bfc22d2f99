"""Tests for f2m_jax.run.report on hand-made results.json files with known numbers."""
from __future__ import annotations

import csv
import json
import math
import os
import pathlib
import re

import pytest

from conftest import tiny_smoke
from f2m_jax import evaluation
from f2m_jax import stats
from f2m_jax.run import cli
from f2m_jax.run import report


def stat(mean, ci95, runs=None):
  """A statistic dict as results.json stores it."""
  return {'mean': mean, 'ci95': ci95, 'runs': runs if runs is not None else [mean]}


def make_results(method, accs, cis, base_classes=60, way=5, dataset='cifar100', label=None):
  """A results dict with session accuracies `accs` (± `cis`); base = acc + 10, novel = acc - 20,
  hm = acc - 15 from session 2 on, PD = first - last, AVG = mean of accs."""
  sessions = []
  for i, (a, c) in enumerate(zip(accs, cis)):
    first = i == 0
    sessions.append({
        'session': i + 1, 'num_classes': base_classes + i * way, 'acc': stat(a, c),
        'acc_base': stat(a + 10, c), 'acc_novel': None if first else stat(a - 20, c * 2),
        'hm': None if first else stat(a - 15, c * 3)})
  results = {'dataset': dataset, 'method': method, 'protocol': 'draws', 'runs': 10,
             'sessions': sessions, 'pd': stat(accs[0] - accs[-1], 0.31),
             'avg': stat(sum(accs) / len(accs), 0.27), 'config': {'lr': 0.1}}
  if label is not None:
    results['label'] = label
  return results


F2M_ACCS = [81.234, 77.5, 73.0, 69.11, 65.0, 62.0, 59.5, 57.25, 55.125]
BASE_ACCS = [80.0, 75.0, 70.0, 66.0, 62.0, 58.0, 55.0, 52.5, 50.0]
CUB_ACCS = [77.0, 73.0, 70.0, 67.0, 65.0, 63.0, 61.0, 60.0, 59.0, 58.0, 57.0]


def write_workdir(tmp_path, name, results):
  """Write `results` to tmp_path/name/results.json; return the workdir."""
  workdir = tmp_path / name
  workdir.mkdir()
  (workdir / 'results.json').write_text(json.dumps(results))
  return str(workdir)


@pytest.fixture
def workdirs(tmp_path):
  """Three workdirs: f2m (labelled), a baseline (unlabelled) and a CUB run with 11 sessions."""
  cis = [0.1 * (i + 1) for i in range(11)]
  return [
      write_workdir(tmp_path, 'f2m_run', make_results('f2m', F2M_ACCS, cis, label='F2M')),
      write_workdir(tmp_path, 'base_run', make_results('baseline', BASE_ACCS, cis)),
      write_workdir(tmp_path, 'cub_run', make_results('f2m', CUB_ACCS, cis, 100, 10, 'cub200')),
  ]


def test_load_results_accepts_workdir_and_file(workdirs):
  a = report.load_results(workdirs[0])
  b = report.load_results(os.path.join(workdirs[0], 'results.json'))
  assert a == b and a['label'] == 'F2M'


def test_default_labels(workdirs):
  rows = report.build_rows(workdirs)
  assert [r.label for r in rows] == ['F2M', 'baseline base_run', 'f2m cub_run']
  rows = report.build_rows(workdirs, ['a', 'b', 'c'])
  assert [r.label for r in rows] == ['a', 'b', 'c']
  with pytest.raises(ValueError, match='2 labels for 3'):
    report.build_rows(workdirs, ['a', 'b'])


def test_format_table_numbers_and_gap(workdirs):
  rows = report.build_rows(workdirs)
  table = report.format_table(rows)
  lines = table.splitlines()
  assert lines[0] == '| Method | ' + ' | '.join(str(n) for n in range(1, 12)) + ' | PD | AVG | gap |'
  f2m, base, cub = lines[2:]
  # Exact formatting: 2 decimals, half-way cases as Python rounds them.
  assert '| 81.23 ± 0.10 |' in f2m and '| 77.50 ± 0.20 |' in f2m and '| 69.11 ± 0.40 |' in f2m
  assert '| 55.12 ± 0.90 |' in f2m  # 55.125 is exact in binary: rounds half-even to 55.12
  assert f'| {81.234 - 55.125:.2f} ± 0.31 | {sum(F2M_ACCS) / 9:.2f} ± 0.27 |' in f2m
  # Gap: last-session accuracy minus the first row's (55.125).
  assert f2m.endswith('| +0.00 |')
  assert base.endswith(f'| {50.0 - 55.125:+.2f} |') and base.endswith('| -5.12 |')
  assert cub.endswith('| n/a |')  # another dataset and session count: nothing to subtract
  # Runs with 9 sessions are padded with '-' in the CUB run's sessions 10 and 11.
  cells = lambda line: [c.strip() for c in line.strip('|').split('|')]
  assert cells(f2m)[10:12] == ['-', '-'] and cells(base)[10:12] == ['-', '-']
  assert '-' not in cells(cub) and cells(cub)[11] == '57.00 ± 1.10'


def test_format_table_reference_by_label_and_index(workdirs):
  rows = report.build_rows(workdirs, ['f2m', 'base', 'cub'])
  by_label = report.format_table(rows, 'base').splitlines()
  by_index = report.format_table(rows, 1).splitlines()
  assert by_label == by_index
  assert by_label[2].endswith('| +5.12 |') and by_label[3].endswith('| +0.00 |')
  assert by_label[4].endswith('| n/a |')
  assert report.resolve_reference(rows, '-1') == 2
  for wrong in ('nope', 3, -4):
    with pytest.raises(ValueError, match=f'--reference {wrong!r} is neither a label .* nor an index of the 3 rows'):
      report.resolve_reference(rows, wrong)


def base_novel(md: str) -> list:
  """The base/novel table's lines of a report.md."""
  return md.split('## Base vs novel accuracy')[1].split('\n\n')[1].splitlines()


def test_base_novel_table(workdirs):
  rows = report.build_rows(workdirs, ['f2m', 'base', 'cub'])
  last = base_novel(report.format_report(rows))
  assert len(last) == 2 + 3
  # f2m last session 9: 100 classes, base 65.12, novel 35.12 ± 1.80, hm 40.12 ± 2.70.
  assert last[2] == '| f2m | 9 | 100 | 55.12 ± 0.90 | 65.12 ± 0.90 | 35.12 ± 1.80 | 40.12 ± 2.70 |'
  assert last[4].startswith('| cub | 11 | 200 | 57.00 ± 1.10 |')
  every = base_novel(report.format_report(rows, all_sessions=True))
  assert len(every) == 2 + 9 + 9 + 11
  assert every[2] == '| f2m | 1 | 60 | 81.23 ± 0.10 | 91.23 ± 0.10 | - | - |'


def test_csv_round_trip_and_plots(workdirs, tmp_path):
  rows = report.build_rows(workdirs, ['f2m', 'base', 'cub'])
  paths = report.write_report(rows, str(tmp_path / 'out'))
  for name in ('accuracy.png', 'base_novel.png'):
    assert open(paths[name], 'rb').read(8) == b'\x89PNG\r\n\x1a\n' and os.path.getsize(paths[name]) > 1000
  with open(paths['report.csv'], newline='') as f:
    records = list(csv.DictReader(f))
    f.seek(0)
    header = next(csv.reader(f))
  assert header[:5] == ['label', 'dataset', 'method', 'protocol', 'runs']
  assert header[5:9] == ['s1', 's1_ci95', 's2', 's2_ci95'] and header[-6:] == [
      'pd', 'pd_ci95', 'avg', 'avg_ci95', 'gap', 'interval']
  assert len(header) == 5 + 2 * 11 + 6
  f2m, base, cub = records
  assert (f2m['label'], f2m['dataset'], f2m['method'], f2m['protocol'], int(f2m['runs'])) == (
      'f2m', 'cifar100', 'f2m', 'draws', 10)
  assert [float(f2m[f's{n}']) for n in range(1, 10)] == F2M_ACCS
  assert [float(f2m[f's{n}_ci95']) for n in range(1, 10)] == [0.1 * (i + 1) for i in range(9)]
  assert f2m['s10'] == '' and f2m['s11_ci95'] == ''
  assert [float(cub[f's{n}']) for n in range(1, 12)] == CUB_ACCS
  assert float(f2m['pd']) == 81.234 - 55.125 and float(f2m['pd_ci95']) == 0.31
  assert float(base['avg']) == sum(BASE_ACCS) / 9 and float(base['avg_ci95']) == 0.27
  assert float(f2m['gap']) == 0.0
  assert float(base['gap']) == 50.0 - 55.125
  assert cub['gap'] == ''  # refused: another dataset and session count


def test_main_writes_report(workdirs, tmp_path, capsys):
  out = tmp_path / 'reports' / 'nested'  # created if missing
  argv = workdirs + ['--out', str(out), '--labels', 'f2m, base,cub', '--reference', 'base']
  assert report.main(argv) == 0
  stdout = capsys.readouterr().out
  table = report.format_table(report.build_rows(workdirs, ['f2m', 'base', 'cub']), 1)
  assert stdout == table + f'\n{report.PD_AVG}; {report.GAP} "base" (--reference)\nwrote:\n' + ''.join(f'  {out / n}\n' for n in (
      'report.md', 'report.csv', 'accuracy.png', 'base_novel.png'))
  assert '| f2m | 81.23 ± 0.10 |' in stdout and stdout.splitlines()[2].endswith('| +5.12 |')
  for name in ('report.md', 'report.csv', 'accuracy.png', 'base_novel.png'):
    assert (out / name).stat().st_size > 0
  md = (out / 'report.md').read_text()
  assert table in md
  assert 'reference row "base"' in md and '| cub | 11 | 200 |' in md
  # Overwriting the report folder's own files is fine.
  assert report.main(argv + ['--base-novel', 'all']) == 0
  assert '| cub | 1 | 100 |' in (out / 'report.md').read_text()


def _flatness(i_train, i_test, s_train, s_test):
  return {'bound': 0.005, 'distribution': 'uniform', 'num_layers': 4, 'checkpoint': '/x',
          'train': {'L_star': 0.1, 'I': i_train, 'sigma2': s_train, 'mean_loss': 0.3, 'num_draws': 1000,
                    'num_images': 30000},
          'test': {'L_star': 0.2, 'I': i_test, 'sigma2': s_test, 'mean_loss': 0.5, 'num_draws': 1000,
                   'num_images': 6000}}


def test_flatness_table_from_workdirs(workdirs, tmp_path):
  (pathlib.Path(workdirs[0]) / 'flatness.json').write_text(json.dumps(_flatness(0.0506, 0.08, 0.0296, 0.0334)))
  (pathlib.Path(workdirs[1]) / 'flatness.json').write_text(json.dumps(_flatness(0.2993, 0.4582, 0.1451, 0.2395)))
  later = {**_flatness(1.5, 2.5, 0.5, 0.75), 'bound': 0.05}  # a second --mode flatness run at another b
  (pathlib.Path(workdirs[1]) / 'flatness_20261126-020000.json').write_text(json.dumps(later))
  rows = report.build_rows(workdirs, ['F2M', 'Baseline', 'cub'])
  md = report.format_report(rows)
  assert '## Flatness' in md
  assert '| F2M | 0.005 | 0.0506 | 0.08 | 0.0296 | 0.0334 | 1000 | 30000 / 6000 |' in md
  assert '| Baseline | 0.005 | 0.2993 | 0.4582 | 0.1451 | 0.2395 | 1000 | 30000 / 6000 |' in md
  assert md.index('| Baseline | 0.005 |') < md.index('| Baseline | 0.05 | 1.5 | 2.5 | 0.5 | 0.75 |')
  assert '| cub |' not in md.split('## Flatness')[1].split('##')[0]  # no flatness file: no line
  assert '## Flatness' not in report.format_report(report.build_rows(workdirs[2:]))
  (pathlib.Path(workdirs[2]) / 'flatness.json').write_text('{"train": {}}')
  with pytest.raises(report.ResultsError, match='flatness.json'):
    report.build_rows(workdirs[2:])

def test_a_file_of_another_kind_is_refused_in_one_line(tmp_path):
  """The report reads results as run.py writes them (0739cee also checked every key of its own
  output); a file that is no results file at all is refused in one line, naming it."""
  workdir = write_workdir(tmp_path, 'other', {'base': {'lr': 0.1}})
  with pytest.raises(report.ResultsError, match='results.json: not the results.json .* it holds no sessions'):
    report.load_results(workdir)


def test_unreadable_results_error(tmp_path, capsys):
  (tmp_path / 'broken').mkdir()
  (tmp_path / 'broken' / 'results.json').write_text('{"dataset": ')
  with pytest.raises(report.ResultsError, match='not valid JSON'):
    report.load_results(str(tmp_path / 'broken'))
  with pytest.raises(report.ResultsError, match='no such results file'):
    report.load_results(str(tmp_path / 'missing'))
  assert report.main([str(tmp_path / 'broken'), '--out', str(tmp_path / 'out')]) == 2
  assert 'broken' in capsys.readouterr().err


def test_format_session_table():
  results = make_results('f2m', F2M_ACCS, [0.1 * (i + 1) for i in range(9)], label='F2M')
  text = report.format_session_table(results)
  lines = text.splitlines()
  assert 'F2M on cifar100' in lines[0] and '10 runs' in lines[0]
  assert lines[1].split() == ['Session', 'Classes', 'Acc', 'Base', 'Novel', 'HM']
  body = lines[3:12]
  for i, line in enumerate(body):
    s = results['sessions'][i]
    assert line.split()[:2] == [str(i + 1), str(60 + 5 * i)]
    assert report.format_stat(s['acc']) in line and report.format_stat(s['acc_base']) in line
    if i == 0:
      assert line.split()[-2:] == ['-', '-']
    else:
      assert report.format_stat(s['acc_novel']) in line and report.format_stat(s['hm']) in line
  assert '81.23 ± 0.10' in body[0] and '35.12 ± 1.80' in body[8] and '40.12 ± 2.70' in body[8]
  assert lines[-2] == f'PD  {81.234 - 55.125:.2f} ± 0.31    AVG  {sum(F2M_ACCS) / 9:.2f} ± 0.27'


def test_one_run_shows_no_interval(tmp_path, workdirs):
  """A single run's ci95 is stored as 0; the report shows its means without '±' and says so, and the
  CSV leaves its interval columns empty, so that 0 never reads as 'no spread'."""
  one = make_results('joint', BASE_ACCS, [0.0] * 9)
  one['runs'] = 1
  rows = report.build_rows([workdirs[0], write_workdir(tmp_path, 'one_run', one)], labels=['F2M', 'joint'])
  table = report.format_table(rows).splitlines()
  f2m_line, joint_line = table[2], table[3]
  assert '81.23 ± 0.10' in f2m_line and '±' not in joint_line
  assert joint_line.startswith('| joint (1 run, no interval) | 80.00 | 75.00 |')
  assert '±' not in report.format_session_table(one) and 'no interval' in report.format_session_table(one)
  record = report.main_table(rows)[1]
  assert record['s1'] == 80.0 and record['s1_ci95'] is None and record['pd_ci95'] is None
  assert report.main_table(rows)[0]['s1_ci95'] == 0.1


def test_the_printed_table_explains_pd_and_avg():
  text = report.format_session_table(make_results('f2m', F2M_ACCS, [0.1] * 9))
  assert text.splitlines()[-1] == ('PD: accuracy of session 1 minus that of the last session (what was forgotten; '
                                   'lower is better); AVG: accuracy averaged over all sessions')


def test_without_out_the_table_is_printed_and_nothing_written(workdirs, tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  before = sorted(p for p in tmp_path.rglob('*'))
  assert report.main(workdirs[:2]) == 0
  out = capsys.readouterr().out
  assert out.startswith(report.format_table(report.build_rows(workdirs[:2])))
  assert out.rstrip().endswith('(nothing written: --out DIR writes report.md, report.csv, accuracy.png, '
                               'base_novel.png and accuracy_matrix.png)')
  assert sorted(p for p in tmp_path.rglob('*')) == before


def test_a_sweeps_folder_is_read_through_its_summary(tmp_path, capsys):
  """A member sweep's folder holds summary.json (results.json's format over the members) and no
  results.json: the report reads it, by the folder as by the file (docs/performance.md's command)."""
  summary = {**make_results('f2m', F2M_ACCS, [0.5] * 9), 'runs': 3, 'interval_over': 'members',
             'members': [{'workdir': f'member_{i}', 'seed': i} for i in range(3)]}
  sweep = tmp_path / 'seeds'
  sweep.mkdir()
  (sweep / 'summary.json').write_text(json.dumps(summary))
  (sweep / 'member_0').mkdir()
  for path in (str(sweep), str(sweep / 'summary.json')):
    assert report.main([path]) == 0
    assert '| f2m seeds | 81.23 ± 0.50 |' in capsys.readouterr().out
  with pytest.raises(report.ResultsError, match=r"member_0/results.json: no such results file \(nor a sweep's "
                                                 r'summary.json in'):
    report.load_results(str(sweep / 'member_0'))


def test_a_field_sweep_is_one_row_per_value(tmp_path, capsys):
  """A sweep over noise.bound (members.summarize_values) is read as one row per value, never pooled."""
  values = [{'value': b, **make_results('f2m', [a - i for a in F2M_ACCS], [0.5] * 9), 'interval_over': 'draws'}
            for i, b in enumerate((0.0025, 0.01))]
  sweep = tmp_path / 'bounds'
  sweep.mkdir()
  (sweep / 'summary.json').write_text(json.dumps({'field': 'noise.bound', 'values': values, 'members': []}))
  rows = report.build_rows([str(sweep)])
  assert [r.label for r in rows] == ['f2m bounds noise.bound=0.0025', 'f2m bounds noise.bound=0.01']
  assert [r.results['sessions'][0]['acc']['mean'] for r in rows] == [F2M_ACCS[0], F2M_ACCS[0] - 1]


def test_runs_of_another_protocol_or_session_count_are_not_subtracted(tmp_path, capsys):
  """Draws with 9 sessions against the validation protocol with 6: a warning naming both settings, and
  no gap (n/a in the table, empty in the CSV); rows of the reference's setting keep theirs."""
  draws = make_results('f2m', F2M_ACCS, [0.1] * 9)
  other = make_results('baseline', BASE_ACCS, [0.1] * 9)
  validation = {**make_results('f2m', F2M_ACCS[:6], [0.1] * 6, base_classes=35), 'protocol': 'validation'}
  dirs = [write_workdir(tmp_path, n, r) for n, r in (('d', draws), ('o', other), ('v', validation))]
  assert report.main(dirs + ['--out', str(tmp_path / 'out')]) == 0
  captured = capsys.readouterr()
  lines = report.format_table(report.build_rows(dirs)).splitlines()
  assert lines[3].endswith(f'| {50.0 - 55.125:+.2f} |') and lines[4].endswith('| n/a |')
  assert captured.err == ('report: warning: no gap for "f2m v" (cifar100, validation, 6 sessions): the reference '
                          '"f2m d" is cifar100, draws, 9 sessions, and only runs of the same dataset, protocol and '
                          'session count are subtracted\n')
  assert [r['gap'] for r in report.main_table(report.build_rows(dirs))][1:] == [50.0 - 55.125, None]
  assert 'no gap for "f2m v"' in (tmp_path / 'out' / 'report.md').read_text()


def test_an_out_that_is_a_file_is_refused(workdirs, tmp_path, capsys):
  (tmp_path / 'taken').write_text('mine')
  assert report.main(workdirs + ['--out', str(tmp_path / 'taken')]) == 2
  assert "is not a folder" in capsys.readouterr().err and (tmp_path / 'taken').read_text() == 'mine'


def with_matrix(results):
  """`results` with an accuracy matrix: session i's classes at 90 - i after session i, 5 less per later session."""
  n = len(results['sessions'])
  mean = [[None if j < i else 90.0 - i - 5.0 * (j - i) for j in range(n)] for i in range(n)]
  results['accuracy_matrix'] = {'mean': mean, 'ci95': [[None if v is None else 0.5 for v in r] for r in mean]}
  return results


def test_the_accuracy_matrix_is_printed_reported_and_plotted(tmp_path, capsys):
  """Rows: the session whose classes are tested; columns: after which session; mean over runs."""
  results = with_matrix(make_results('f2m', F2M_ACCS, [0.1] * 9, label='F2M'))
  text = report.format_session_table(results).splitlines()
  first = text.index("Accuracy on each session's classes (rows: the session that brought them) after every later "
                     'session (columns), mean over runs: the diagonal is what a session learned, the fall along a '
                     'row what was forgotten:')
  assert text[first + 1].split() == ['from', '/', 'after'] + [str(i) for i in range(1, 10)]
  assert text[first + 2].split() == ['1', '90.00', '85.00', '80.00', '75.00', '70.00', '65.00', '60.00', '55.00', '50.00']
  assert text[first + 10].split() == ['9', '82.00'] and len(text) == first + 11
  workdir = write_workdir(tmp_path, 'f2m', results)
  plain = write_workdir(tmp_path, 'baseline', make_results('baseline', BASE_ACCS, [0.1] * 9))  # an earlier version's
  assert report.main([workdir, plain, '--out', str(tmp_path / 'out')]) == 0
  out = capsys.readouterr().out
  assert ['2', '89.00', '84.00', '79.00', '74.00', '69.00', '64.00', '59.00', '54.00'] in [l.split() for l in out.splitlines()]
  assert 'F2M: accuracy on each session' in out and 'baseline: accuracy on' not in out
  md = (tmp_path / 'out' / 'report.md').read_text()
  assert "## Accuracy matrix (%, mean over runs)\n\nAccuracy on each session's classes" in md
  assert '| 9 |  |  |  |  |  |  |  |  | 82.00 |' in md and md.count('| from / after |') == 1
  assert (tmp_path / 'out' / 'accuracy_matrix.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert '## Accuracy matrix' not in report.format_report(report.build_rows([plain]))
  assert 'accuracy_matrix.png' not in report.write_report(report.build_rows([plain]), str(tmp_path / 'none'))


def test_the_printed_table_explains_the_gap(workdirs, capsys):
  assert report.main(workdirs[:2]) == 0
  assert ('gap: last-session accuracy minus that of the reference row "F2M" (--reference)'
          in capsys.readouterr().out.splitlines()[4])


def member(seed, accs, pd=None, runs=2, shots='d1', protocol='draws'):
  """A member's results.json: session accuracies `accs` (means over `runs` draws), its seed and shot digest."""
  r = {**make_results('f2m', accs, [0.1] * len(accs)), 'runs': runs, 'protocol': protocol,
       'provenance': {'config': {'seed': seed, 'data': {'shots': 5, 'data_dir': f'/x{seed}'}}, 'shots': shots}}
  if pd is not None:
    r['pd'] = {'mean': pd, 'ci95': 0.1}
  return r


def sweep_folder(tmp_path, name, members):
  """A seed sweep's folder: summary.json (its own numbers do not matter to a paired comparison) and members."""
  root = tmp_path / name
  root.mkdir()
  (root / 'summary.json').write_text(json.dumps({**members[0], 'members': [{'seed': 0}]}))
  for i, r in enumerate(members):
    write_workdir(root, f'member_{i}', r)
  return str(root)


def test_a_paired_comparison_by_hand(tmp_path, capsys):
  """B - A per seed (each seed's mean over its draws), then the mean and t(0.975, 1) * std(ddof=1) / sqrt(2)
  over the 2 seeds, as computed here by hand: session 2 resolved, session 3 (the last) not; PD and AVG too."""
  a = sweep_folder(tmp_path, 'a', [member(0, [60.0, 50.0, 40.0]), member(1, [62.0, 54.0, 41.0])])
  b = sweep_folder(tmp_path, 'b', [member(1, [63.0, 55.1, 44.0]), member(0, [60.5, 51.0, 41.0])])  # by seed, not place
  assert report.main([a, b, '--paired', '--labels', 'A,B']) == 0
  out = capsys.readouterr().out
  t1 = 12.706204736174698  # t(0.975, 1)
  half = lambda d0, d1: t1 * abs(d0 - d1) / math.sqrt(2) / math.sqrt(2)
  rows = {''.join(line.split()[:2]): line.split()[2:] for line in out.splitlines() if line.lstrip().startswith('session')}
  s1, s2, s3 = (0.5, 1.0), (1.0, 1.1), (1.0, 3.0)  # seed 0's and seed 1's B - A
  for (d0, d1), name in zip((s1, s2, s3), ('session1', 'session2', 'session3')):
    m, h = (d0 + d1) / 2, half(d0, d1)
    assert rows[name][:3] == [f'{m:+.2f}', f'[{m - h:+.2f},', f'{m + h:+.2f}]'], name
  assert rows['session2'][3:] == ['resolved'] and rows['session3'][3:] == ['not', 'resolved']
  m, h = 2.0, half(1.0, 3.0)
  assert out.splitlines()[-2] == f'B above A at session 3: +2.00, 95% CI [{m - h:+.2f}, {m + h:+.2f}]: not resolved'
  pd = [(60.5 - 41.0) - (60.0 - 40.0), (63.0 - 44.0) - (62.0 - 41.0)]  # PD from the sessions (make_results)
  assert [l for l in out.splitlines() if l.strip().startswith('PD ')][0].split()[1] == f'{sum(pd) / 2:+.2f}'


@pytest.mark.parametrize('change, message', [
    (dict(seed=2), r'holds seeds \[0, 1\], .* \[0, 2\]; pairs need the same seeds'),
    (dict(runs=3), 'seed 1 has another number of runs'),
    (dict(shots='d2'), 'seed 1 has another shot draws'),
    (dict(protocol='validation'), 'seed 1 has another setting'),
])
def test_a_paired_comparison_refuses_runs_that_do_not_pair(tmp_path, capsys, change, message):
  a = sweep_folder(tmp_path, 'a', [member(0, [60.0, 50.0]), member(1, [62.0, 54.0])])
  b = sweep_folder(tmp_path, 'b', [member(0, [60.0, 50.0]), member(**{'seed': 1, 'accs': [61.0, 52.0], **change})])
  assert report.main([a, b, '--paired']) == 2
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1 and re.search(message, err), err
  assert report.main([a, b]) == 0 and 'paired' not in capsys.readouterr().out  # without --paired: the table alone


def test_two_sweeps_and_two_single_runs_are_paired(tmp_path, capsys):
  """Two seed sweeps of the same seeds and draws, by their folders' labels; one workdir (one seed) paired with
  another gets no interval; --paired takes two paths."""
  a = sweep_folder(tmp_path, 'a', [member(0, [60.0, 50.0]), member(1, [62.0, 54.0])])
  b = sweep_folder(tmp_path, 'b', [member(0, [61.0, 50.0]), member(1, [62.0, 56.0])])
  assert report.main([a, b, '--paired']) == 0
  assert 'f2m b above f2m a at session 2: +1.00, 95% CI [-11.71, +13.71]: not resolved' in capsys.readouterr().out
  one_a, one_b = (os.path.join(x, 'member_0') for x in (a, b))
  assert report.main([one_a, one_b, '--paired', '--labels', 'A,B']) == 0
  assert 'B level with A at session 2: +0.00, 95% CI n/a: n/a (one seed)' in capsys.readouterr().out
  assert report.main([one_a, one_b, a, '--paired']) == 2 and 'got 3 paths' in capsys.readouterr().err


def test_runs_on_the_same_shots_show_no_interval(tmp_path, capsys):
  """Every run trained on the same shots: ci95 null, shown as '± n/a' (not '± 0.00') in the tables and empty in
  the CSV, with the reason once on stderr and in report.md."""
  same = {**make_results('baseline', BASE_ACCS, [0.0] * 9), 'interval': evaluation.SAME_SHOTS}
  for s in same['sessions']:
    for k in stats.KEYS:
      if s[k]:
        s[k]['ci95'] = None
  same['pd']['ci95'] = same['avg']['ci95'] = None
  workdir = write_workdir(tmp_path, 'same', same)
  assert report.main([workdir, '--out', str(tmp_path / 'out')]) == 0
  out, err = capsys.readouterr()
  assert '| baseline same | 80.00 ± n/a | 75.00 ± n/a |' in out and '± 0.00' not in out
  assert err == f'report: warning: "baseline same": interval {evaluation.SAME_SHOTS}\n'
  assert f'- "baseline same": interval {evaluation.SAME_SHOTS}' in (tmp_path / 'out' / 'report.md').read_text()
  assert report.main_table(report.build_rows([workdir]))[0]['s1_ci95'] is None
  text = report.format_session_table(same)
  assert evaluation.SAME_SHOTS in text.splitlines()[0] and '80.00 ± n/a' in text


@pytest.mark.slow
def test_a_run_whose_runs_draw_the_same_shots_says_so(reference, tmp_path, capsys):
  """Shot pools of data.shots images a class (the synthetic source's 40 a class, 40 shots): every run trains on
  the same shots, so results.json, results.csv and the printed table give no interval (null, empty, '± n/a';
  the per-run values stay) and say why once. The Baseline's sessions (no training) on the reference run's
  base model (--checkpoint): programs the suite has built."""
  workdir = tmp_path / 'same'
  assert cli.main(tiny_smoke(**{'method': 'baseline', 'data.shots': 40}), str(workdir), 'train',
                  checkpoint=reference[0]) == 0
  out = capsys.readouterr().out
  results = json.loads((workdir / 'results.json').read_text())
  assert results['interval'] == evaluation.SAME_SHOTS and len(results['sessions'][-1]['acc']['runs']) == 2
  assert all(s['acc']['ci95'] is None for s in results['sessions']) and results['pd']['ci95'] is None
  assert out.count(evaluation.SAME_SHOTS) == 1 and '± n/a' in out and '± 0.00' not in out
  with open(workdir / 'results.csv', newline='') as f:
    assert {r['acc_ci95'] for r in csv.DictReader(f)} == {''}
  assert reference[1]['interval'] == evaluation.INTERVALS['draws'] and reference[1]['pd']['ci95'] > 0
