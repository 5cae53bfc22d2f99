"""A member axis (f2m_jax/run/members.py): S base trainings in one program equal S single runs, a resumed
sweep equals an uninterrupted one, the summary's intervals are Student's t over the seeds, and two sweeps of
the same seeds and draws compare pairwise (report --paired)."""
from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO, Interrupt, moved, rel_norm_diff, run_py, tiny_smoke, without_provenance
from f2m_jax import base as base_lib
from f2m_jax import sharding
from f2m_jax import stats
from f2m_jax import train_loop
from f2m_jax import trees
from f2m_jax.data import sources
from f2m_jax.experiment import Experiment
from f2m_jax.files import CheckpointError
from f2m_jax.run import cli
from f2m_jax.run import members
from f2m_jax.run import pipeline
from f2m_jax.run import report
from f2m_jax.run.checkpoint import Checkpoints

SEEDS = (0, 1)


def tiny(seed: int = 0, **members_fields):
  """conftest's tiny_smoke (a single run's programs are the reference run's) with checkpoints every 5
  steps (the steps a call unchanged)."""
  c = tiny_smoke(**{'seed': seed, 'tensorboard': False, 'base.checkpoint_every': 5})
  c.members.update(members_fields)
  return c


@pytest.fixture(scope='module')
def sweep(tmp_path_factory, reference):
  """(the sweep's folder, its summary, the folders of the single runs of each seed: seed 0's is
  conftest.reference, whose config is tiny(0) but for when it saves and logs)."""
  root = str(tmp_path_factory.mktemp('sweep') / 'sweep')
  origin = {'config': 'configs/cifar100.py:smoke', 'changes': {'base.steps': 20}}  # as run.py passes it
  assert cli.main(tiny(seeds=SEEDS, map='unroll'), root, 'train', origin=origin) == 0
  with open(os.path.join(root, 'summary.json')) as f:
    summary = json.load(f)
  assert SEEDS[0] == 0  # the reference run's seed
  singles = [reference[0]]
  for seed in SEEDS[1:]:
    singles.append(str(tmp_path_factory.mktemp(f'single{seed}') / 'run'))
    pipeline.run(tiny(seed), singles[-1])
  return root, summary, singles


def base_model(workdir: str, seed: int) -> dict:
  config = pipeline.resolve(tiny(seed))
  exp = Experiment.create(config, sources.load_benchmark(config))
  template = {**exp.variables_template(), 'prototypes': np.zeros((exp.bench.num_base_classes, exp.embedding_dim()), np.float32)}
  return Checkpoints(workdir, read_only=True).restore_model(template)


@pytest.mark.slow
def test_a_sweep_of_two_seeds_equals_two_single_runs(sweep):
  root, summary, singles = sweep
  for i, (seed, single) in enumerate(zip(SEEDS, singles)):
    member = os.path.join(root, f'member_{i}')
    with open(os.path.join(member, 'results.json')) as f:
      ours = json.load(f)
    with open(os.path.join(single, 'results.json')) as f:
      theirs = json.load(f)
    assert ours['provenance']['config']['seed'] == seed
    for a, b in zip(ours['sessions'], theirs['sessions']):  # accuracies equal
      assert a['acc'] == b['acc'] and a['acc_base'] == b['acc_base'], (seed, a['session'])
    mine, single_model = base_model(member, seed), base_model(single, seed)
    for x, y in zip(jax.tree_util.tree_leaves(mine), jax.tree_util.tree_leaves(single_model)):
      np.testing.assert_allclose(x, y, rtol=0, atol=1e-5 * np.abs(y).max())  # parameters to float tolerance
  # the seeds really differ, and the summary is over them
  accs = [summary['members'][i]['acc_last'] for i in range(len(SEEDS))]
  assert len(set(accs)) > 1
  assert summary['sessions'][-1]['acc']['mean'] == pytest.approx(np.mean(accs))


@pytest.mark.slow
def test_a_sweep_records_the_command_that_started_it(sweep):
  root, summary, _ = sweep
  origin = summary['provenance']['origin']
  assert origin['config'] == 'configs/cifar100.py:smoke' and origin['changes']['base.steps'] == 20  # tiny's
  for i in range(len(SEEDS)):
    with open(os.path.join(root, f'member_{i}', 'results.json')) as f:
      assert json.load(f)['provenance']['origin'] == {**origin, 'sweep_member': i}
  config = tiny(seed=2)
  assert pipeline._what(config, {**origin, 'sweep_member': 2}).endswith('(method f2m, sweep member 2, seed 2)')  # pylint: disable=protected-access


@pytest.mark.slow
def test_two_sweeps_of_the_same_seeds_compare_pairwise(sweep, tmp_path, capsys):
  """report --paired: the sweep (F2M, seeds 0 and 1) against the Baseline's sessions on each member's base
  model (--checkpoint, as experiments/'s Baseline + PN rows: the same base models), members that record the
  same shot digest; B - A per seed from the members' results.json and its mean, computed here by hand, with
  no interval or verdict (2 seeds). A single workdir (one seed) does not pair with the sweep: one line, exit 2."""
  root = sweep[0]
  other = tmp_path / 'baseline'
  runs = []
  for i, seed in enumerate(SEEDS):
    config = tiny(seed)
    config.method = 'baseline'
    runs.append(pipeline.run(config, str(other / f'member_{i}'), checkpoint=os.path.join(root, f'member_{i}')))
  (other / 'summary.json').write_text(json.dumps({**stats.seed_summary(runs), 'members': []}))
  ours = [json.loads(open(os.path.join(root, f'member_{i}', 'results.json')).read()) for i in range(len(SEEDS))]
  assert [r['provenance']['shots'] for r in runs] == [r['provenance']['shots'] for r in ours]
  d = [b['sessions'][-1]['acc']['mean'] - a['sessions'][-1]['acc']['mean'] for a, b in zip(ours, runs)]
  capsys.readouterr()
  assert report.main([root, str(other), '--paired', '--labels', 'F2M,Baseline']) == 0
  out = capsys.readouterr().out
  assert f'Baseline - F2M at session 3 accuracy: {(d[0] + d[1]) / 2:+.2f} (no interval)' in out
  row = next(line for line in out.splitlines() if 'session 3 accuracy |' in line).split('|')
  assert [c.strip() for c in row[-3:-1]] == [f'{d[0]:+.2f}', f'{d[1]:+.2f}'] and 'resolved' not in out
  assert report.main([root, sweep[2][1], '--paired']) == 2
  assert 'pairs need the same seeds' in capsys.readouterr().err


def test_a_sweep_resumes_from_the_latest_step_every_member_holds():
  assert train_loop.resume_step([[40, 50, 60], [30, 40, 50]]) == 50  # one member's last save still in flight
  assert train_loop.resume_step([[5, 10, 15], [5, 10, 15]]) == 15
  assert train_loop.resume_step([[10, 20, 30], [40, 50, 60]]) == 0  # no step in common: from scratch
  assert train_loop.resume_step([[], [10]]) == 0 and train_loop.resume_step([[10]]) == 10
  saved = []
  save = train_loop.saving_after(lambda step, state: saved.append(step), 15)
  for step in (10, 15, 20):
    save(step, None)
  assert saved == [20]  # the steps it holds are not saved again


@pytest.mark.slow
def test_a_resumed_sweep_equals_an_uninterrupted_one(sweep, tmp_path):
  """Killed after step 15's saves, one of which had not finished: member 0 holds base step 15, member 1
  only 10. The sweep resumes both from 10 (member 0 does not save its 15 again) and ends as the
  uninterrupted sweep."""
  root = str(tmp_path / 'sweep')

  def stop(kind, **info):
    if kind == 'base_step' and info['step'] == 15:
      raise Interrupt

  with pytest.raises(Interrupt):
    members.run(tiny(seeds=SEEDS, map='unroll'), root, hook=stop)
  assert not os.path.exists(os.path.join(root, 'summary.json'))
  shutil.rmtree(os.path.join(root, 'member_1', 'checkpoints', 'base', '15'))
  steps = lambda i: sorted(int(n) for n in os.listdir(os.path.join(root, f'member_{i}', 'checkpoints', 'base')))
  assert [steps(0), steps(1)] == [[5, 10, 15], [5, 10]]
  resumed = members.run(tiny(seeds=SEEDS, map='unroll'), root)
  strip = lambda s: {k: v for k, v in without_provenance(s).items() if k != 'members'}
  assert strip(resumed) == strip(sweep[1])
  for i in range(len(SEEDS)):
    with open(os.path.join(root, f'member_{i}', 'results.json')) as f, \
         open(os.path.join(sweep[0], f'member_{i}', 'results.json')) as g:
      assert without_provenance(json.load(f)) == without_provenance(json.load(g))


@pytest.mark.slow
def test_the_gpu_layout_equals_single_steps_of_each_member(reference):
  """The member axis mapped with jax.vmap and XLA's convolution backward (model.conv_backward='xla':
  with members.map='vmap', the layout for a GPU) gives each member, of its own seed and noise bound, its
  own single run's first base step to float rounding. The single runs' program is conftest.reference's
  (unrolled, the CPU backward: the default here), which this worker has built; one step, as further
  steps at the smoke config's lr of 0.1 would amplify the rounding. (The CPU backward under vmap, member
  by member: test_fidelity.py.)"""
  mesh = sharding.data_mesh()

  def parts(**changes):
    exps = []
    for seed in SEEDS:
      config = pipeline.resolve(tiny_smoke(seed=seed, **changes))
      exps.append(Experiment.create(config, sources.load_benchmark(config)))
    e = exps[0]
    return exps, base_lib.train_program(e.model, e.loss, e.optimizer_settings(), base_lib.Inputs.of(e.bench),
                                        e.config.members.map, mesh)

  exps, single = parts()
  _, ours = parts(**{'model.conv_backward': 'xla', 'members.map': 'vmap'})
  bench = exps[0].bench
  data = (bench.train.images, bench.train.labels)
  per_call = train_loop.steps_per_call(exps[0].config.base, selecting=False)  # the reference run's calls, 1 step used
  indices = np.stack([np.stack([e.batch_indices(0) for e in exps])] * per_call).astype(np.int32)  # [N, S, B]
  keys, bounds = jnp.stack([e.key(0) for e in exps]), np.asarray([0.002, 0.02], np.float32)
  inits = [e.init_state() for e in exps]
  singles = [trees.index(single(trees.stack([init]), *data, indices[:, i:i + 1], np.int32(1), keys[i:i + 1],
                                bounds[i:i + 1])[0], 0) for i, init in enumerate(inits)]
  mapped, _ = ours(trees.stack(inits), *data, indices[:1], np.int32(1), keys, bounds)  # a call of one step
  assert single._cache_size() == 1  # the reference run's program, not another
  # The step each member took, relative to its size: float32 rounding of the gradient's sums (up to about
  # 2e4 terms, sqrt(2e4) x 1.2e-7 = 2e-5 apart for two orders of summing) against order 1 for another
  # member's seed, batch or noise, or a step not taken (measured: 2e-7 and 1.1e-6; 0.44 with the bounds
  # swapped).
  for i, (want, init) in enumerate(zip(singles, inits)):
    assert rel_norm_diff(moved(trees.index(mapped, i), init), moved(want, init)) < 1e-3, f'member {i}'
    assert rel_norm_diff(moved(singles[1 - i], inits[1 - i]), moved(want, init)) > 0.1  # the members differ


def doc(per_run):
  """results.json of runs whose sessions 1 and 2 have accuracies `per_run` (every statistic: the same)."""
  return stats.build_results('d', 'f2m', 'draws', [10, 12], [[{'acc': a, 'acc_base': a, 'hm': None,
                                                               'acc_novel': None if t == 0 else a}
                                                              for t, a in enumerate(run)] for run in per_run])


def test_a_seed_summary_is_over_the_seeds_means_with_students_t():
  """Per session the seeds' means over their draws, with t(0.975, S-1) * std(ddof=1) / sqrt(S) over them
  (draws averaged within a seed: members x draws are not independent, and no such interval is given); the
  retention of each seed's means."""
  a, b = doc([[50.0, 40.0], [52.0, 42.0]]), doc([[60.0, 30.0], [62.0, 34.0]])
  s = stats.seed_summary([a, b])
  t1 = 12.706204736174698  # t(0.975, 1)
  assert s['sessions'][1]['acc'] == {'mean': 36.5, 'ci95': pytest.approx(t1 * (41.0 - 32.0) / np.sqrt(2) / np.sqrt(2)),
                                     'runs': [41.0, 32.0]}
  assert s['pd'] == {'mean': pytest.approx(19.5), 'ci95': pytest.approx(t1 * 19.0 / 2)}  # PD 10 and 29
  assert s['retention']['runs'] == [100 * 41.0 / 51.0, 100 * 32.0 / 61.0]
  assert s['seeds'] == 2 and 'runs' not in s and s['interval'] == stats.INTERVALS['seeds']
  assert a['interval'] == stats.INTERVALS['draws']


@pytest.mark.parametrize('fields, message', [
    (dict(seeds=(0, 1), field='noise.bound', field_values=(0.01, 0.02)), 'not both'),
    (dict(field='base.lr', field_values=(0.1, 0.2)), "members.field='base.lr' is invalid"),
    (dict(seeds=(0, 0)), 'distinct'),
    (dict(seeds=(0, 1), map='scan'), "members.map='scan' is invalid"),
    (dict(seeds=(0, 1), draw_map='vamp'), "noise.draw_map='vamp' is invalid"),
])
def test_bad_sweeps_are_refused_before_anything_is_written(tmp_path, fields, message):
  config = tiny(**{k: v for k, v in fields.items() if k != 'draw_map'})
  config.noise.draw_map = fields.get('draw_map', config.noise.draw_map)
  with pytest.raises(ValueError, match=message):
    members.run(config, str(tmp_path / 'w'))
  assert not (tmp_path / 'w').exists()


def test_eval_of_a_folder_without_a_sweep_writes_nothing(tmp_path):
  with pytest.raises(CheckpointError, match='holds no sweep'):
    members.run(tiny(seeds=(0, 1)), str(tmp_path / 'w'), mode='eval')
  assert not (tmp_path / 'w').exists()


def test_a_sweeps_records_hold_the_effective_config(tmp_path, monkeypatch):
  """The sweep's config.json and each member's, written before training (stopped where it would
  start): the method's presets applied (a Baseline sweep has no noise) and every 'auto' kept."""
  config = tiny(seeds=(0, 1))
  config.method = 'baseline'

  def stop(*_, **__):
    raise Interrupt

  monkeypatch.setattr(train_loop, 'train_base_sessions', stop)
  with pytest.raises(Interrupt):
    members.run(config, str(tmp_path / 'w'), origin={'config': 'x', 'changes': {'method': 'baseline'}})
  for folder in ('w', 'w/member_0', 'w/member_1'):
    saved = json.loads((tmp_path / folder / 'config.json').read_text())
    assert saved['noise']['enabled'] is False and saved['eval']['normalize_prototypes'] is False, folder
    assert (saved['noise']['draw_map'], saved['model']['conv_backward']) == ('auto', 'auto'), folder


def test_a_field_sweep_gives_each_member_its_value():
  configs = members.member_configs(tiny(field='noise.bound', field_values=(0.001, 0.01)))
  assert [c.noise.bound for c in configs] == [0.001, 0.01]
  assert all(c.seed == 0 and not members.enabled(c) for c in configs)
  with pytest.raises(ValueError, match=r'^members.field_values=\(0.01, 0.01\) is invalid: values must be'):
    members.member_configs(tiny(field='noise.bound', field_values=(0.01, 0.01)))


def test_the_member_table_times_members_against_single_steps():
  """experiments/bench_members.py: the base program of S = 1 and of each member size, on arguments of S
  members (traced, not compiled: bench.time_cases compiles and times a case, tests/test_cli.py's dry run);
  the table gives each S's steps against S single steps (S x the single step's ms over its own)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location('bench_members', REPO / 'experiments' / 'bench_members.py')
  table_lib = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(table_lib)
  cases = table_lib.member_cases(pipeline.resolve(tiny()), (2,))
  assert [(c.variant, c.m, c.batch) for c in cases] == [('members_1_unroll', 1, 80), ('members_2_unroll', 2, 160)]
  for c in cases:
    state, metrics = jax.eval_shape(c.fn, *c.args)
    assert state.step.shape == (c.m,) and metrics['loss'].shape == (c.steps, c.m), c.variant
  records = [dict(variant=c.variant, M=c.m, step_ms_median=ms, compile_s=1.5) for c, ms in zip(cases, (10.0, 16.0))]
  table = table_lib.format_members(records).splitlines()
  assert [line.split()[1:] for line in table[1:]] == [['1', '10.0', '100.00', '1.00', '1.5'],
                                                      ['2', '16.0', '125.00', '1.25', '1.5']]


def test_a_field_sweep_reports_each_value_apart():
  """A sweep over noise.bound is never pooled across values: summary.json and the printed table give
  each value's mean and interval over its own draws."""
  a, b = doc([[50.0, 40.0], [52.0, 42.0]]), doc([[60.0, 30.0], [62.0, 34.0]])
  s = members.summarize_values('noise.bound', (0.0025, 0.01), [a, b])
  assert 'sessions' not in s and [v['value'] for v in s['values']] == [0.0025, 0.01]
  assert s['values'][1]['sessions'][1]['acc'] == stats.summarize([30.0, 34.0])  # its own draws only
  assert s['values'][1]['interval'] == stats.INTERVALS['draws']
  table = report.format_session_table(s).splitlines()  # the report, a row per value
  assert table[0] == 'f2m on d (draws, 2 runs)'
  assert [c.strip() for c in table[6].split('|')[1:-1]] == ['Method', '1', '2', 'PD', 'AVG', 'retention', 'gap']
  assert [c.strip() for c in table[9].split('|')[1:-1]] == [  # 1.96 std / sqrt(2)
      'noise.bound=0.01', '61.00 ± 1.39', '32.00 ± 2.77', '29.00 ± 1.39', '46.50 ± 2.08',
      report.format_stat(stats.summarize([50.0, 100 * 34.0 / 62.0])), '-9.00']


@pytest.mark.slow
def test_eval_of_a_sweep_leaves_its_summary_alone(sweep, capsys, monkeypatch):
  root, summary, _ = sweep
  before = open(os.path.join(root, 'summary.json')).read()
  members.run(tiny(seeds=SEEDS, map='unroll'), root, mode='eval')
  assert open(os.path.join(root, 'summary.json')).read() == before
  assert 'it is unchanged' in capsys.readouterr().out
  assert run_py(['run.py', '--workdir', root, '--mode', 'eval'], monkeypatch) == 0  # the sweep's config.json alone
  assert 'it is unchanged' in capsys.readouterr().out
  assert open(os.path.join(root, 'summary.json')).read() == before
  assert run_py(['run.py', '--workdir', root, '--mode', 'flatness'], monkeypatch) == 2  # one base model a call
  assert f'pass --workdir {root}/member_0 (to member_1)' in capsys.readouterr().err
  assert sorted(os.listdir(root)) == ['config.json', 'lock', 'member_0', 'member_1', 'summary.json']
