"""Tests for f2m_jax.run.report on hand-made results.json files with known numbers."""
from __future__ import annotations

import csv
import json
import math
import os
import pathlib
import re

import numpy as np
import pytest
from scipy import stats as scipy_stats

from conftest import tiny_smoke
from f2m_jax import stats
from f2m_jax.run import cli
from f2m_jax.run import report


def stat(mean, ci95, runs=None):
  """A statistic dict as results.json stores it."""
  return {'mean': mean, 'ci95': ci95, 'runs': runs if runs is not None else [mean]}


def make_results(method, accs, cis, base_classes=60, way=5, dataset='cifar100', label=None):
  """A results dict with session accuracies `accs` (± `cis`); base = acc + 10, novel = acc - 20,
  hm = acc - 15 from session 2 on, PD = first - last, AVG = mean of accs, retention = last / first."""
  sessions = []
  for i, (a, c) in enumerate(zip(accs, cis)):
    first = i == 0
    sessions.append({
        'session': i + 1, 'num_classes': base_classes + i * way, 'acc': stat(a, c),
        'acc_base': stat(a + 10, c), 'acc_novel': None if first else stat(a - 20, c * 2),
        'hm': None if first else stat(a - 15, c * 3)})
  results = {'dataset': dataset, 'method': method, 'protocol': 'draws', 'runs': 10,
             'sessions': sessions, 'pd': stat(accs[0] - accs[-1], 0.31),
             'avg': stat(sum(accs) / len(accs), 0.27), 'retention': stat(100 * accs[-1] / accs[0], 0.21)}
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


def cells(line: str) -> list:
  """A markdown table line's cells."""
  return [c.strip() for c in line.strip().strip('|').split('|')]


def section(md: str, title: str) -> list:
  """The cells of the first table under `## title` (its header and rule included)."""
  return [cells(line) for line in md.split(f'## {title}')[1].split('##')[0].splitlines() if line.startswith('|')]


@pytest.fixture
def workdirs(tmp_path):
  """Three workdirs: f2m (labelled), a baseline (unlabelled) and a CUB run with 11 sessions."""
  cis = [0.1 * (i + 1) for i in range(11)]
  return [
      write_workdir(tmp_path, 'f2m_run', make_results('f2m', F2M_ACCS, cis, label='F2M')),
      write_workdir(tmp_path, 'base_run', make_results('baseline', BASE_ACCS, cis)),
      write_workdir(tmp_path, 'cub_run', make_results('f2m', CUB_ACCS, cis, 100, 10, 'cub200')),
  ]


def test_results_are_read_by_folder_or_file_and_labelled(workdirs):
  assert report.load_results(workdirs[0]) == report.load_results(os.path.join(workdirs[0], 'results.json'))
  assert [r['label'] for r in report.build_rows(workdirs)] == ['F2M', 'baseline base_run', 'f2m cub_run']
  assert [r['label'] for r in report.build_rows(workdirs, ['a', 'b', 'c'])] == ['a', 'b', 'c']
  with pytest.raises(ValueError, match='2 labels for 3'):
    report.build_rows(workdirs, ['a', 'b'])


def test_format_table_numbers_and_gap(workdirs):
  lines = report.format_table(report.build_rows(workdirs)).splitlines()
  assert cells(lines[0]) == ['Method'] + [str(n) for n in range(1, 12)] + ['PD', 'AVG', 'retention', 'gap']
  f2m, base, cub = map(cells, lines[2:])
  # 2 decimals, half-way cases as Python rounds them: 55.125 is exact in binary, so half-even to 55.12.
  assert f2m[1:5] == ['81.23 ± 0.10', '77.50 ± 0.20', '73.00 ± 0.30', '69.11 ± 0.40'] and f2m[9] == '55.12 ± 0.90'
  assert f2m[12:] == [f'{81.234 - 55.125:.2f} ± 0.31', f'{sum(F2M_ACCS) / 9:.2f} ± 0.27',
                      f'{100 * 55.125 / 81.234:.2f} ± 0.21', '+0.00']  # gap: to the first row's last session
  assert base[-1] == f'{50.0 - 55.125:+.2f}' == '-5.12' and cub[-1] == 'n/a'  # another dataset: no gap
  assert f2m[10:12] == ['-', '-'] == base[10:12] and '-' not in cub and cub[11] == '57.00 ± 1.10'


def test_format_table_reference_by_label_and_index(workdirs):
  rows = report.build_rows(workdirs, ['f2m', 'base', 'cub'])
  by_label = report.format_table(rows, 'base').splitlines()
  assert by_label == report.format_table(rows, 1).splitlines()
  assert [cells(line)[-1] for line in by_label[2:]] == ['+5.12', '+0.00', 'n/a']
  assert report.resolve_reference(rows, '-1') == 2
  for wrong in ('nope', 3, -4):
    with pytest.raises(ValueError, match=f'--reference {wrong!r} is neither'):
      report.resolve_reference(rows, wrong)


def test_base_novel_table(workdirs):
  rows = report.build_rows(workdirs, ['f2m', 'base', 'cub'])
  last = section(report.format_report(rows), 'Base vs novel accuracy')
  # f2m's last session 9: 100 classes, base 65.12, novel 35.12 ± 1.80, hm 40.12 ± 2.70.
  assert len(last) == 2 + 3 and last[2] == ['f2m', '9', '100', '55.12 ± 0.90', '65.12 ± 0.90', '35.12 ± 1.80',
                                            '40.12 ± 2.70']
  assert last[4][:4] == ['cub', '11', '200', '57.00 ± 1.10']
  every = section(report.format_report(rows, all_sessions=True), 'Base vs novel accuracy')
  assert len(every) == 2 + 9 + 9 + 11 and every[2] == ['f2m', '1', '60', '81.23 ± 0.10', '91.23 ± 0.10', '-', '-']


def test_csv_round_trip_and_plots(workdirs, tmp_path):
  paths = report.write_report(report.build_rows(workdirs, ['f2m', 'base', 'cub']), str(tmp_path / 'out'))
  for name in ('accuracy.png', 'base_novel.png'):
    assert open(paths[name], 'rb').read(8) == b'\x89PNG\r\n\x1a\n' and os.path.getsize(paths[name]) > 1000
  with open(paths['report.csv'], newline='') as f:
    records = list(csv.DictReader(f))
  assert list(records[0])[:8] == ['label', 'dataset', 'method', 'protocol', 'runs', 'seeds', 's1', 's1_ci95']
  assert list(records[0])[-8:] == ['pd', 'pd_ci95', 'avg', 'avg_ci95', 'retention', 'retention_ci95', 'gap',
                                   'interval'] and len(records[0]) == 6 + 2 * 11 + 2 * 3 + 2
  f2m, base, cub = records
  assert [f2m[k] for k in ('label', 'dataset', 'method', 'protocol', 'runs', 'seeds')] == [
      'f2m', 'cifar100', 'f2m', 'draws', '10', '']
  assert [float(f2m[f's{n}']) for n in range(1, 10)] == F2M_ACCS
  assert [float(f2m[f's{n}_ci95']) for n in range(1, 10)] == [0.1 * (i + 1) for i in range(9)]
  assert f2m['s10'] == '' and f2m['s11_ci95'] == '' and [float(cub[f's{n}']) for n in range(1, 12)] == CUB_ACCS
  assert float(f2m['pd']) == 81.234 - 55.125 and float(f2m['pd_ci95']) == 0.31
  assert float(base['avg']) == sum(BASE_ACCS) / 9 and float(base['retention']) == 100 * 50.0 / 80.0
  assert float(f2m['gap']) == 0.0 and float(base['gap']) == 50.0 - 55.125 and cub['gap'] == ''


def test_main_prints_and_writes_the_report(workdirs, tmp_path, capsys):
  out = tmp_path / 'reports' / 'nested'  # created if missing
  argv = workdirs + ['--out', str(out), '--labels', 'f2m, base,cub', '--reference', 'base']
  assert report.main(argv) == 0
  md = (out / 'report.md').read_text()
  assert capsys.readouterr().out == md + 'wrote:\n' + ''.join(f'  {out / n}\n' for n in (
      'report.md', 'report.csv', 'accuracy.png', 'base_novel.png'))
  assert report.format_table(report.build_rows(workdirs, ['f2m', 'base', 'cub']), 1) in md
  assert 'lower is better' in md and 'gap: last-session accuracy minus that of the reference row "base"' in md
  assert report.main(argv + ['--base-novel', 'all']) == 0  # the report folder's own files are overwritten
  assert ['cub', '1', '100'] in [c[:3] for c in section((out / 'report.md').read_text(), 'Base vs novel')]


def _flatness(i_train, i_test, s_train, s_test):
  return {'bound': 0.005, 'distribution': 'uniform', 'num_layers': 4, 'checkpoint': '/x',
          'train': {'L_star': 0.1, 'I': i_train, 'sigma2': s_train, 'mean_loss': 0.3, 'num_draws': 1000,
                    'num_images': 30000},
          'test': {'L_star': 0.2, 'I': i_test, 'sigma2': s_test, 'mean_loss': 0.5, 'num_draws': 1000,
                   'num_images': 6000}}


def test_flatness_table_from_workdirs(workdirs):
  (pathlib.Path(workdirs[0]) / 'flatness.json').write_text(json.dumps(_flatness(0.0506, 0.08, 0.0296, 0.0334)))
  (pathlib.Path(workdirs[1]) / 'flatness.json').write_text(json.dumps(_flatness(0.2993, 0.4582, 0.1451, 0.2395)))
  later = {**_flatness(1.5, 2.5, 0.5, 0.75), 'bound': 0.05}  # a second --mode flatness run at another b
  (pathlib.Path(workdirs[1]) / 'flatness_20261126-020000.json').write_text(json.dumps(later))
  table = section(report.format_report(report.build_rows(workdirs, ['F2M', 'Baseline', 'cub'])), 'Flatness')
  assert table[2:] == [['F2M', '0.005', '0.0506', '0.08', '0.0296', '0.0334', '1000', '30000 / 6000'],
                       ['Baseline', '0.005', '0.2993', '0.4582', '0.1451', '0.2395', '1000', '30000 / 6000'],
                       ['Baseline', '0.05', '1.5', '2.5', '0.5', '0.75', '1000', '30000 / 6000']]  # no cub line
  assert '## Flatness' not in report.format_report(report.build_rows(workdirs[2:]))
  (pathlib.Path(workdirs[2]) / 'flatness.json').write_text('{"train": {}}')
  with pytest.raises(ValueError, match='flatness.json'):
    report.build_rows(workdirs[2:])


@pytest.mark.parametrize('content, cause', [
    (None, 'no such results file'), (b'{"dataset": ', 'JSONDecodeError'),
    (json.dumps({'base': {'lr': 0.1}}).encode(), 'holds no dataset, method, protocol, sessions'),
    (json.dumps({**make_results('f2m', BASE_ACCS, [0.1] * 9), 'method': None}).encode(), 'holds no method'),
    (b'\x89PNG\r\n\x1a\n' + bytes(range(256)) * 2, 'UnicodeDecodeError')],
    ids=['missing', 'not JSON', 'another file', 'no method', 'binary'])
def test_a_file_that_holds_no_results_is_refused_in_one_line(tmp_path, capsys, content, cause):
  """Missing, not JSON, another JSON file, a results.json without the method that labels it, a binary file:
  exit 2 and one short line naming the file and the cause."""
  (tmp_path / 'w').mkdir()
  if content is not None:
    (tmp_path / 'w' / 'results.json').write_bytes(content)
  assert report.main([str(tmp_path / 'w')]) == 2
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1 and f'{tmp_path}/w/results.json' in err and cause in err and len(err) < 250


def test_one_run_shows_no_interval(tmp_path, workdirs):
  """A single run's ci95 is stored as 0; the report shows its means without '±' and says so, and the
  CSV leaves its interval columns empty, so that 0 never reads as 'no spread'."""
  one = make_results('joint', BASE_ACCS, [0.0] * 9)
  one['runs'] = 1
  rows = report.build_rows([workdirs[0], write_workdir(tmp_path, 'one_run', one)], labels=['F2M', 'joint'])
  f2m_line, joint_line = report.format_table(rows).splitlines()[2:]
  assert '81.23 ± 0.10' in f2m_line and '±' not in joint_line
  assert cells(joint_line)[:3] == ['joint (1 run, no interval)', '80.00', '75.00']
  f2m, joint = report.main_table(rows)
  assert joint['s1'] == 80.0 and joint['s1_ci95'] is None and joint['pd_ci95'] is None and f2m['s1_ci95'] == 0.1


def test_without_out_the_report_is_printed_and_nothing_written(workdirs, tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)
  before = sorted(p for p in tmp_path.rglob('*'))
  assert report.main(workdirs[:2]) == 0
  out = capsys.readouterr().out
  assert out.startswith(report.format_report(report.build_rows(workdirs[:2]))) and 'nothing written' in out
  assert sorted(p for p in tmp_path.rglob('*')) == before


def member(seed, accs, runs=2, shots='d1', protocol='draws', source=None):
  """A member's results.json: session accuracies `accs` (means over `runs` draws), its seed, shot digest and
  --checkpoint's base model (`source`)."""
  return {**make_results('f2m', accs, [0.1] * len(accs)), 'runs': runs, 'protocol': protocol,
          'provenance': {'config': {'seed': seed, 'data': {'shots': 5, 'data_dir': f'/x{seed}'}}, 'shots': shots,
                         'base_source': source}}


def sweep_folder(tmp_path, name, members, summary=None):
  """A seed sweep's folder: its members and summary.json (by default as members.run writes it)."""
  root = tmp_path / name
  root.mkdir()
  (root / 'summary.json').write_text(json.dumps(summary or {**stats.seed_summary(members), 'members': []}))
  for i, r in enumerate(members):
    write_workdir(root, f'member_{i}', r)
  return str(root)


def test_a_sweeps_folder_is_read_through_its_summary(tmp_path, capsys):
  """A seed sweep's folder holds summary.json and no results.json: the report reads it by the folder as by the
  file, its seeds counted as such. An earlier version's summary (no `interval`: 1.96 * std(ddof=0), `runs`
  counting seeds) is recomputed from its members (Student's t), or shown without interval where they are gone."""
  accs = [[60.0, 50.0], [62.0, 54.0], [58.0, 49.0]]
  sweep = sweep_folder(tmp_path, 'seeds', [member(s, a) for s, a in enumerate(accs)])
  for path in (sweep, os.path.join(sweep, 'summary.json')):
    assert report.main([path]) == 0
    assert cells(capsys.readouterr().out.split('\n| f2m seeds')[1].splitlines()[0])[:2] == [
        f'60.00 ± {stats.t_interval([60.0, 62.0, 58.0]):.2f}', f'51.00 ± {stats.t_interval([50.0, 54.0, 49.0]):.2f}']
  (pathlib.Path(sweep) / 'member_3').mkdir()  # a folder without results
  with pytest.raises(ValueError, match=r"member_3/results.json: no such results file \(nor a sweep's"):
    report.load_results(os.path.join(sweep, 'member_3'))
  old = {**make_results('f2m', [60.0, 51.0], [1.6, 2.0]), 'runs': 3, 'interval_over': 'members'}
  recomputed = report.load_results(sweep_folder(tmp_path, 'old', [member(s, a) for s, a in enumerate(accs)], old))
  assert recomputed['seeds'] == 3 and 'runs' not in recomputed and recomputed['interval'] == stats.INTERVALS['seeds']
  assert recomputed['sessions'][0]['acc']['ci95'] == stats.t_interval([60.0, 62.0, 58.0])
  (tmp_path / 'gone').mkdir()
  (tmp_path / 'gone' / 'summary.json').write_text(json.dumps(old))
  rows = report.build_rows([str(tmp_path / 'gone')])
  assert rows[0]['interval'] == report.OLD and '±' not in report.format_table(rows)
  assert "an earlier version's 1.96" in report.source_line(rows[0])


def test_a_field_sweep_is_one_row_per_value(tmp_path):
  """A sweep over noise.bound (members.summarize_values) is read as one row per value, never pooled."""
  values = [{'value': b, **make_results('f2m', [a - i for a in F2M_ACCS], [0.5] * 9)}
            for i, b in enumerate((0.0025, 0.01))]
  (tmp_path / 'bounds').mkdir()
  (tmp_path / 'bounds' / 'summary.json').write_text(json.dumps({'field': 'noise.bound', 'values': values}))
  rows = report.build_rows([str(tmp_path / 'bounds')])
  assert [r['label'] for r in rows] == ['f2m bounds noise.bound=0.0025', 'f2m bounds noise.bound=0.01']
  assert [r['sessions'][0]['acc']['mean'] for r in rows] == [F2M_ACCS[0], F2M_ACCS[0] - 1]


def test_runs_of_another_protocol_or_session_count_are_not_subtracted(tmp_path, capsys):
  """Draws with 9 sessions against the validation protocol with 6: a note naming both settings, and
  no gap (n/a in the table, empty in the CSV); rows of the reference's setting keep theirs."""
  validation = {**make_results('f2m', F2M_ACCS[:6], [0.1] * 6, base_classes=35), 'protocol': 'validation'}
  dirs = [write_workdir(tmp_path, n, r) for n, r in (('d', make_results('f2m', F2M_ACCS, [0.1] * 9)),
                                                     ('o', make_results('baseline', BASE_ACCS, [0.1] * 9)),
                                                     ('v', validation))]
  assert report.main(dirs) == 0 and report.main(dirs + ['--out', str(tmp_path / 'out')]) == 0
  assert 'no gap for "f2m v" (cifar100, validation, 6 sessions)' in capsys.readouterr().out
  assert [r['gap'] for r in report.main_table(report.build_rows(dirs))][1:] == [50.0 - 55.125, None]
  assert 'no gap for "f2m v"' in (tmp_path / 'out' / 'report.md').read_text()


def test_an_out_that_is_a_file_is_refused(workdirs, tmp_path, capsys):
  (tmp_path / 'taken').write_text('mine')
  for out in ('taken', 'taken/sub'):  # the file, or a folder under it
    assert report.main(workdirs + ['--out', str(tmp_path / out)]) == 2
    assert '/taken is a file where a folder' in capsys.readouterr().err and (tmp_path / 'taken').read_text() == 'mine'


def with_matrix(results, top=90.0, step=5.0):
  """`results` with an accuracy matrix: session i's classes at top - i after session i, step less per later one."""
  n = len(results['sessions'])
  mean = [[None if j < i else top - i - step * (j - i) for j in range(n)] for i in range(n)]
  results['accuracy_matrix'] = {'mean': mean, 'ci95': [[None if v is None else 0.5 for v in r] for r in mean]}
  return results


def test_the_accuracy_matrix_is_reported_and_plotted(tmp_path, capsys):
  """Rows: the session whose classes are tested; columns: after which session; mean over runs. The heatmap's
  colour scale spans the data (2 to 15 here, as a hard benchmark's), cells to one decimal."""
  results = with_matrix(make_results('f2m', F2M_ACCS, [0.1] * 9, label='F2M'))
  text = section(report.format_session_table(results), 'Accuracy matrix')
  assert text[0] == ['from / after'] + [str(i) for i in range(1, 10)]
  assert text[2] == ['1', '90.00', '85.00', '80.00', '75.00', '70.00', '65.00', '60.00', '55.00', '50.00']
  assert text[10] == ['9'] + [''] * 8 + ['82.00'] and len(text) == 11
  plain = write_workdir(tmp_path, 'baseline', make_results('baseline', BASE_ACCS, [0.1] * 9))  # an earlier version's
  assert report.main([write_workdir(tmp_path, 'f2m', results), plain, '--out', str(tmp_path / 'out')]) == 0
  assert f'baseline:\n\n{report.NO_MATRIX}' in capsys.readouterr().out
  assert (tmp_path / 'out' / 'accuracy_matrix.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert 'accuracy_matrix.png' not in report.write_report(report.build_rows([plain]), str(tmp_path / 'none'))
  hard = with_matrix(make_results('f2m', [15.0, 12.0, 9.0], [0.1] * 3), top=15.0, step=6.5)  # 15 down to 2
  figure = report.heatmaps([{**hard, 'label': 'hard'}])
  assert figure.axes[0].images[0].get_clim() == (2.0, 15.0)
  assert sorted(t.get_text() for t in figure.axes[0].texts if t.get_text()) == ['13.0', '14.0', '15.0', '2.0',
                                                                                '7.5', '8.5']


def test_a_sweeps_report_carries_its_matrix(tmp_path):
  """A seed sweep's summary holds the matrix as the mean over its seeds of each member's: the report writes
  accuracy_matrix.png from it."""
  members = [with_matrix(member(s, [70.0 - s, 60.0]), top=90.0 - s) for s in range(3)]
  sweep = sweep_folder(tmp_path, 'seeds', members)
  assert report.load_results(sweep)['accuracy_matrix']['mean'] == [[89.0, 84.0], [None, 88.0]]
  assert 'accuracy_matrix.png' in report.write_report(report.build_rows([sweep]), str(tmp_path / 'out'))


A5 = [[60.0, 50.0, 40.0], [62.0, 54.0, 41.0], [58.5, 47.0, 39.0], [61.0, 52.5, 44.0], [59.0, 49.0, 37.5]]
B5 = [[61.0, 51.5, 42.0], [62.5, 54.0, 43.5], [60.0, 49.5, 39.5], [61.0, 53.0, 45.5], [60.5, 51.0, 40.0]]


def test_a_paired_comparison_of_five_seeds_in_float64(tmp_path, capsys):
  """B - A per seed (each seed's means over the same draws; B's runs took A's base models by --checkpoint, as
  a Baseline + PN sweep), checked against scipy.stats' t in float64: each row's mean, 95% interval and p of the
  paired t-test over the 5 seeds, Holm's adjustment by its definition and the count of seeds with B > A; one
  verdict, for the declared primary row alone (the last session, or PD by --primary)."""
  a = sweep_folder(tmp_path, 'a', [member(s, x) for s, x in enumerate(A5)])
  source = {'path': a, 'differences': {'method': ['baseline', 'baseline']}}
  b = sweep_folder(tmp_path, 'b', [member(s, x, source=source) for s, x in enumerate(B5)][::-1])  # by seed
  ends = lambda accs: np.array([x + [x[0] - x[-1], math.fsum(x) / len(x), 100 * x[-1] / x[0]] for x in accs])
  d = ends(B5) - ends(A5)  # [seeds, rows]
  mean, half = d.mean(0), scipy_stats.t.ppf(0.975, 4) * d.std(0, ddof=1) / math.sqrt(5)
  p = 2 * scipy_stats.t.sf(np.abs(mean) / (d.std(0, ddof=1) / math.sqrt(5)), 4)
  holm, running = np.empty(6), 0.0
  for i, k in enumerate(np.argsort(p)):  # Holm: the i-th smallest times (6 - i), never below an earlier one
    running = max(running, min(1.0, (6 - i) * p[k]))
    holm[k] = running
  rows = stats.paired(ends(A5), ends(B5))
  np.testing.assert_allclose([r['ci'] for r in rows], np.stack([mean - half, mean + half], 1), rtol=1e-12)
  np.testing.assert_allclose([r['p'] for r in rows], p, rtol=1e-10)
  np.testing.assert_allclose([r['holm'] for r in rows], holm, rtol=1e-10)
  assert [r['above'] for r in rows] == [4, 4, 5, 1, 5, 4] == list((d > 0).sum(0))
  assert report.main([a, b, '--paired', '--labels', 'A,B']) == 0
  out = capsys.readouterr().out
  table = section(out, 'Paired comparison')
  assert table[0] == ['', 'B - A', '95% CI', 'p (Holm)', 'B > A'] + [f'seed {s}' for s in range(5)]
  for row, m, h, q, above, diffs in zip(table[2:], mean, half, holm, (d > 0).sum(0), d.T):
    assert row[1:] == [f'{m:+.2f}', f'[{m - h:.2f}, {m + h:.2f}]', f'{q:.2g}', f'{above} of 5'] + [
        f'{x:+.2f}' for x in diffs]
  assert (f'primary: session 3 accuracy; other rows descriptive\nB - A at session 3 accuracy: +1.80 '
          f'[{mean[2] - half[2]:.2f}, {mean[2] + half[2]:.2f}] (95% CI), p = {p[2]:.2g}: resolved, B above A') in out
  assert out.count('resolved') == 1 and holm[2] < 0.05 < holm[0] and p[0] < 0.05  # session 1: Holm's doing
  assert report.main([a, b, '--paired', '--primary', 'pd']) == 0
  assert f'at PD (lower: less forgotten): -0.90 [{mean[3] - half[3]:.2f}, ' in capsys.readouterr().out
  assert report.main([a, b, '--paired', '--primary', 's4']) == 2 and '--primary' in capsys.readouterr().err
  copy = sweep_folder(tmp_path, 'copy', [member(s, x) for s, x in enumerate(A5)])  # A's runs again
  assert report.main([a, copy, '--paired']) == 0
  assert "+0.00 (no interval): every seed's difference is +0.00" in capsys.readouterr().out


def test_two_seeds_or_one_give_no_interval_and_no_verdict(tmp_path, capsys):
  """2 seeds (t(0.975, 1) = 12.7) or 1: the differences and counts, no interval, p-value or verdict word, and
  the command for more seeds; tables show means alone. B's base models (--checkpoint of an equal config) pair."""
  a = sweep_folder(tmp_path, 'a', [member(s, x) for s, x in enumerate(A5[:2])])
  b = sweep_folder(tmp_path, 'b', [member(s, x, source={'path': a, 'differences': {}}) for s, x in enumerate(B5[:2])])
  for paths in ([a, b], [os.path.join(a, 'member_0'), os.path.join(b, 'member_0')]):
    assert report.main(paths + ['--paired']) == 0
    out = capsys.readouterr().out
    assert 'resolved' not in out and "--config.members.seeds='(0,1,2)'" in out and '(no interval)' in out
    assert {tuple(r[2:4]) for r in section(out, 'Paired comparison')[2:]} == {('n/a', 'n/a')}
  assert report.main([a]) == 0
  row = section(capsys.readouterr().out, 'Accuracy per session')[2]
  assert row[:2] == ['f2m a (2 seeds, no interval)', '61.00'] and '±' not in ''.join(row)


@pytest.mark.parametrize('change, message', [
    (dict(seed=2), r'holds seeds \[0, 1\], .* \[0, 2\]; pairs need the same seeds'),
    (dict(runs=3), 'seed 1 has another number of runs'), (dict(shots='d2'), 'seed 1 has another shot draws'),
    (dict(protocol='validation'), 'seed 1 has another setting'),
    (dict(source={'path': '/w', 'differences': {'seed': [0, 1]}}),
     r"seed 1 has another base model's seed in \S+ \(1\) than in \S+ \(0\)"),
])
def test_a_paired_comparison_refuses_runs_that_do_not_pair(tmp_path, capsys, change, message):
  """Other seeds, draws, protocol; base models of shifted seeds (--checkpoint of seed 0's for seed 1); the same
  results twice: one line, exit 2."""
  a = sweep_folder(tmp_path, 'a', [member(0, [60.0, 50.0]), member(1, [62.0, 54.0])])
  b = sweep_folder(tmp_path, 'b', [member(0, [60.0, 50.0]), member(**{'seed': 1, 'accs': [61.0, 52.0], **change})])
  assert report.main([a, b, '--paired']) == 2
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1 and re.search(message, err), err
  assert report.main([a, a, '--paired']) == 2 and 'the same results' in capsys.readouterr().err
  assert report.main([a, b, a, '--paired']) == 2 and 'got 3 paths' in capsys.readouterr().err


def test_runs_on_the_same_shots_show_no_interval(tmp_path, capsys):
  """Every run trained on the same shots: ci95 null, shown as '± n/a' (not '± 0.00') and empty in the CSV,
  with the reason in the sources."""
  same = {**make_results('baseline', BASE_ACCS, [0.0] * 9), 'interval': stats.SAME_SHOTS}
  for s in same['sessions']:
    for k in stats.KEYS:
      if s[k]:
        s[k]['ci95'] = None
  same['pd']['ci95'] = same['avg']['ci95'] = None
  workdir = write_workdir(tmp_path, 'same', same)
  assert report.main([workdir]) == 0
  out = capsys.readouterr().out
  assert cells(out.split('\n| baseline same')[1].splitlines()[0])[:2] == ['80.00 ± n/a', '75.00 ± n/a']
  assert '± 0.00' not in out and out.count(stats.SAME_SHOTS) == 1
  assert report.main_table(report.build_rows([workdir]))[0]['s1_ci95'] is None


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
  assert results['interval'] == stats.SAME_SHOTS and len(results['sessions'][-1]['acc']['runs']) == 2
  assert all(s['acc']['ci95'] is None for s in results['sessions']) and results['pd']['ci95'] is None
  assert out.count(stats.SAME_SHOTS) == 1 and '± n/a' in out and '± 0.00' not in out
  with open(workdir / 'results.csv', newline='') as f:
    assert {r['acc_ci95'] for r in csv.DictReader(f)} == {''}
  assert reference[1]['interval'] == stats.INTERVALS['draws'] and reference[1]['pd']['ci95'] > 0
  assert reference[1]['retention']['runs'] == [100 * s / f for f, s in zip(*(
      reference[1]['sessions'][t]['acc']['runs'] for t in (0, -1)))]
