"""run.py's command line as a user types it: a bad --config, override or value is one line naming
the field, the value and what is allowed, exit code 2, no traceback, no workdir left behind; a
missing flag is one line; a workdir's config.json is a config, and --workdir alone reads it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, run_py
from f2m_jax.run import cli
from f2m_jax.run import pipeline
from f2m_jax.run import workdir as workdir_lib

CASES = [
    ('--config.nosuchkey=1', 'unknown config field config.nosuchkey', 'config.noise'),
    ('--config.noise.nosuch=1', 'unknown config field config.noise.nosuch', 'bound'),
    ('--config.noise.bond=0.1', 'unknown config field config.noise.bond', 'did you mean config.noise.bound'),
    ('--config.noize.bound=1', "config has no field 'noize'", 'did you mean config.noise?'),
    ('--config.base.milestones=a', "base.milestones=('a',) is invalid", 'a tuple of step numbers such as (15000,)'),
    ('--config.base.steps=abc', 'flag --config.base.steps=abc: ', 'invalid literal for int()'),  # absl's own words
    ('--config.noise.enabled=maybe', 'flag --config.noise.enabled=maybe: ', 'Non-boolean argument'),
    ('--config.noise.M=-1', 'noise.M=-1 is invalid', 'must be >= 1'),
    ('--config.seed=9223372036854775808', 'seed=9223372036854775808 is', '< 2^32'),  # issue 82
    ('--config.incremental.steps=2147483648', 'incremental.steps=2147483648 is', '< 2^31'),
    ('--config.runs=1000000000', 'runs=1000000000 is invalid', 'of magnitude < 2^20'),
    ('--config.noise.distribution=gauss', "noise.distribution='gauss' is invalid", 'discrete_beta'),
    ('--config.noise.clean_backward=True', 'unknown config field config.noise.clean_backward',
     'config.noise.backward_weights?'),  # among the suggestions: the field it was renamed to
    ('--config.noise.backward_weights=exact', "noise.backward_weights='exact' is invalid", "('noisy', 'clean')"),
    ('--config.incremental.normalize_base_prototypes=True',
     'unknown config field config.incremental.normalize_base_prototypes', 'prototype_norm'),
    ('--config.incremental.prototype_norm=unit', "incremental.prototype_norm='unit' is invalid",
     "('raw', 'unit_base', 'unit_all')"),
]


def one_error_line(capsys) -> str:
  """The one line run.py printed to stderr."""
  lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith('error: '), lines
  return lines[0]


@pytest.mark.parametrize('override,what,allowed', CASES)
def test_bad_override_is_one_clear_line(tmp_path, monkeypatch, capsys, override, what, allowed):
  """run.py's flags parsed and acted on in this process (conftest.run_py); the process itself:
  test_a_bad_override_ends_the_process_with_exit_code_2."""
  workdir = tmp_path / 'w'
  assert run_py(['run.py', '--config', 'configs/cifar100.py:smoke', override, '--workdir', str(workdir)],
                monkeypatch) == 2
  line = one_error_line(capsys)
  assert what in line and allowed in line, line
  assert not workdir.exists()


@pytest.mark.parametrize('override', ['--config.noise.bond=0.1', '--config.noise.M=-1'],
                         ids=['refused by the parser', 'refused by the checks'])
def test_a_bad_override_ends_the_process_with_exit_code_2(tmp_path, override):
  """python run.py itself: exit code 2, one line on stderr, no traceback (absl's app.run around it)."""
  r = subprocess.run([sys.executable, 'run.py', '--config', 'configs/cifar100.py:smoke', override,
                      '--workdir', str(tmp_path / 'w')], capture_output=True, text=True, cwd=REPO, timeout=300)
  lines = [line for line in r.stderr.splitlines() if line.strip()]
  assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr
  field = override.split('=')[0][len('--config.'):]
  assert len(lines) == 1 and lines[0].startswith('error: ') and field in lines[0], lines


def test_run_py_takes_the_flags_its_libraries_define(monkeypatch, capsys):
  """A flag nobody defines is one line, exit code 2 (run.py's flags parsed in this process); a flag that
  f2m_jax.run.cli's imports define (orbax's, on absl's global FLAGS, which only the real run.py reads) is taken."""
  assert run_py(['run.py', '--config', 'configs/cifar100.py:smoke', '--dry-run', '--nosuchflag=1'], monkeypatch) == 2
  err = capsys.readouterr().err
  assert err.strip() == "error: Unknown command line flag 'nosuchflag'", err[-2000:]
  from absl import flags  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint  # pylint: disable=g-import-not-at-top,unused-import  (defines its flags)
  if 'experimental_orbax_use_distributed_barrier' not in flags.FLAGS:
    pytest.skip('this orbax defines no --experimental_orbax_use_distributed_barrier')
  r = subprocess.run([sys.executable, 'run.py', '--config', 'configs/cifar100.py:smoke', '--dry-run',
                      '--experimental_orbax_use_distributed_barrier=false'], capture_output=True, text=True, cwd=REPO,
                     timeout=300)
  assert r.returncode == 0 and r.stdout.strip().endswith('dry run: nothing was written'), r.stderr[-2000:]


def test_good_overrides_pass_the_check(tmp_path, monkeypatch, capsys):
  """Overrides of every kind parse; the run then stops at its first check of the workdir (eval of a
  folder that holds no run), so nothing trains."""
  code = run_py(['run.py', '--config', 'configs/cifar100.py:smoke', '--config.base.milestones=(50,)',
                 '--config.noise.M', '3', '--config.noise.enabled=False', '--config.method=baseline',
                 '--workdir', str(tmp_path / 'w'), '--mode', 'eval'], monkeypatch)
  err = capsys.readouterr().err
  assert code == 2 and err.startswith('error: nothing to evaluate'), err


@pytest.mark.parametrize('spec,what', [
    ('configs/cifar10.py', 'there is no file configs/cifar10.py; did you mean configs/cifar100.py'),
    ('configs/cifar100.py:smok', "config argument 'smok' is not one of ['smoke', 'trainsplit', 'cpu']"),
])
def test_bad_config_argument_is_one_clear_line(tmp_path, monkeypatch, capsys, spec, what):
  workdir = tmp_path / 'w'
  assert run_py(['run.py', '--config', spec, '--workdir', str(workdir)], monkeypatch) == 2
  line = one_error_line(capsys)
  assert line.startswith(f'error: flag --config={spec}: ') and what in line, line  # absl's own words
  assert not workdir.exists()


@pytest.mark.parametrize('spec,what', [
    ('configs/mini.py', 'miniimagenet/images/'),
    ('configs/cub200.py', 'CUB_200_2011.tgz'),
    ('configs/cifar100.py:trainsplit', 'python -m f2m_jax.data.make_trainsplit'),
])
def test_no_data_folder_says_what_to_put_there(tmp_path, monkeypatch, capsys, spec, what):
  """Without F2M_DATA_DIR the first message already says what the folder must hold and how to get it."""
  workdir = tmp_path / 'w'
  monkeypatch.delenv('F2M_DATA_DIR', raising=False)
  monkeypatch.setenv('F2M_CACHE_DIR', str(tmp_path / 'cache'))
  code = run_py(['run.py', '--config', spec, '--workdir', str(workdir)], monkeypatch)
  err = capsys.readouterr().err
  assert code == 2 and 'Traceback' not in err, err
  assert err.startswith('error: ') and 'needs a data folder: set F2M_DATA_DIR' in err
  assert 'How to obtain it' in err and what in err
  assert not workdir.exists()


def test_a_dry_run_prints_the_effective_config_and_writes_nothing(tmp_path, monkeypatch, capsys):
  from f2m_jax.run import dry_run  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(dry_run, 'step_line', lambda *args: 'base training: not timed here')
  code = run_py(['run.py', '--config', 'configs/cifar100.py:smoke', '--dry-run', '--config.method=baseline',
                 '--config.eval.normalize_prototypes=True', '--workdir', str(tmp_path / 'w')], monkeypatch)
  out, err = capsys.readouterr()
  assert code == 0, err
  printed, _, notes = out.partition('set when the run starts')
  config = json.loads(printed)
  assert len(printed.splitlines()) == len(config) + 2  # a line a section (was ~180 lines)
  assert config['method'] == 'baseline' and config['noise']['enabled'] is False
  assert config['eval']['normalize_prototypes'] is True  # the command line wins over the presets
  assert "noise.draw_map: 'auto' -> 'unroll'" in notes and "noise.enabled: True -> False" in notes
  assert 'eval.normalize_prototypes' not in notes and notes.strip().endswith('dry run: nothing was written')
  assert not (tmp_path / 'w').exists()


@pytest.mark.parametrize('mode,cached', [('dry_run', False), ('bench', False),
                                         ('train', True), ('eval', True), ('flatness', True)])
def test_only_the_modes_that_write_keep_compiled_programs(monkeypatch, mode, cached):
  """A dry run says it wrote nothing, and --mode bench times compiles: neither fills the cache folder."""
  calls = []
  monkeypatch.setattr(cli, 'enable_compilation_cache', calls.append)
  monkeypatch.setattr(cli, 'dispatch', lambda *args: None)
  assert cli.run_mode({}, None, mode, None, None, None) == 0 and calls == ([{}] if cached else [])


# ----------------------------------------------------------------------------- a workdir is enough

def test_no_config_and_a_workdir_without_a_run_is_one_line(tmp_path, monkeypatch, capsys):
  """Run.py's flags and main (in this process): before, a traceback (IndexError)."""
  assert run_py(['run.py', '--workdir', str(tmp_path), '--mode', 'eval'], monkeypatch) == 2
  assert capsys.readouterr() == ('', f'error: {cli.usage_problem(["run.py"], None, str(tmp_path), False)}\n')


@pytest.mark.parametrize('argv,config,workdir,dry_run,problem', [
    (['run.py'], None, None, False, '--config is required'),
    (['run.py'], None, 'w', False, '(w holds no config.json to read instead)'),
    (['run.py'], {}, None, False, '--workdir is required (except with --dry-run)'),
    (['run.py'], {}, None, True, None),
    (['run.py', 'extra'], {}, 'w', False, "unexpected arguments: ['extra']"),
    (['run.py'], {}, 'w', False, None),
])
def test_what_the_command_line_lacks(argv, config, workdir, dry_run, problem):
  found = cli.usage_problem(argv, config, workdir, dry_run)
  assert found == problem if problem is None else problem in found


def test_a_saved_config_is_a_config_as_its_run_had_it(tmp_path, monkeypatch):
  """W/config.json as --config (or --workdir W alone, however given): its values, overridable with
  --config.FIELD, and no preset replaces those its command line set (the Baseline with PN stays with PN)."""
  from configs import cifar100  # pylint: disable=g-import-not-at-top
  config = cifar100.get_config('smoke')
  config.method, config.eval.normalize_prototypes = 'baseline', True
  resolved = pipeline.resolve(config, {'eval.normalize_prototypes': True})
  workdir = str(tmp_path / 'w')
  workdir_lib.prepare(workdir, resolved.to_dict()).close()
  path = os.path.join(workdir, 'config.json')
  seen = {}
  monkeypatch.setattr(cli, 'main', lambda config, workdir, mode, checkpoint, origin, dry_run: seen.update(
      config=config, origin=origin) or 0)
  for given in (['--workdir', workdir], [f'--workdir={workdir}']):
    assert run_py(['run.py', *given, '--mode', 'eval', '--config.base.milestones=(50,)'], monkeypatch) == 0
    assert seen['origin'] == {'config': path, 'changes': {'eval.normalize_prototypes': True, 'base.milestones': (50,)}}
  again = pipeline.effective(seen['config'], seen['origin']['changes'])
  with open(path) as f:
    assert workdir_lib.config_differences(json.load(f), again.to_dict()) == ['base.milestones']
  assert run_py(['run.py', '--config', path, '--workdir', str(tmp_path / 'rerun')], monkeypatch) == 0
  with open(path) as f:
    assert workdir_lib.config_differences(json.load(f), seen['config'].to_dict()) == []
  assert run_py(['run.py', '--config', 'configs/cifar100.py:smoke', '--workdir', workdir], monkeypatch) == 0
  assert seen['origin'] == {'config': 'configs/cifar100.py:smoke', 'changes': {}}  # a --config given wins


@pytest.mark.slow
def test_a_dry_run_times_a_step_of_a_sweeps_members(capsys):
  """A step of the sweep's two members timed, shown while it works (stderr); the rest: test_folder.py."""
  from configs import cifar100  # pylint: disable=g-import-not-at-top
  config = cifar100.get_config('smoke')
  config.method, config.members.seeds = 'baseline', (0, 1)  # the Baseline's step compiles fastest
  assert cli.main(config, None, 'train', dry_run=True) == 0
  out, err = capsys.readouterr()
  line = out.splitlines()[-2]
  assert line.startswith('base training: about ') and 'then base.steps=100 of ' in line, line
  assert line.endswith(' s (a step of the 2 members timed here, the median of 2 after 1)')
  assert 'bench: compiling base step' in err and 'bench: round 3 of 3' in err


def test_every_experiments_script_imports_the_package_as_it_is():
  """experiments/*.py load (base_test_curve.py imported pipeline from f2m_jax after it moved to run/)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  for path in sorted((REPO / 'experiments').glob('*.py')):
    spec = importlib.util.spec_from_file_location(f'experiments_{path.stem}', path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
