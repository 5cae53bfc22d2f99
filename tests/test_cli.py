"""Bad --config overrides through run.py as a user types them: one line naming the field, the value
and what is allowed, exit code 2, no traceback, no workdir left behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

CASES = [
    ('--config.nosuchkey=1', 'unknown config field config.nosuchkey', 'config.noise'),
    ('--config.noise.nosuch=1', 'unknown config field config.noise.nosuch', 'bound'),
    ('--config.noise.bond=0.1', 'unknown config field config.noise.bond', 'did you mean config.noise.bound'),
    ('--config.noize.bound=1', 'config.noize does not exist', 'config.noise'),
    ('--config.base.milestones=a', "base.milestones=('a',) is invalid", 'a tuple of step numbers such as (15000,)'),
    ('--config.base.steps=abc', "config.base.steps='abc' is invalid", 'invalid literal for int()'),
    ('--config.noise.enabled=maybe', "config.noise.enabled='maybe' is invalid", 'Non-boolean argument'),
    ('--config.noise.M=-1', 'noise.M=-1 is invalid', 'must be >= 1'),
    ('--config.noise.distribution=gauss', "noise.distribution='gauss' is invalid", 'discrete_beta'),
    ('--config.noise.clean_backward=True', 'config.noise.clean_backward was renamed',
     "--config.noise.backward_weights='clean' (the old True)"),
    ('--config.noise.backward_weights=exact', "noise.backward_weights='exact' is invalid", "('noisy', 'clean')"),
    ('--config.noise.pf_classes=batch', 'unknown config field config.noise.pf_classes', 'config.noise.'),
    ('--config.incremental.normalize_base_prototypes=True', 'config.incremental.normalize_base_prototypes was renamed',
     "--config.incremental.prototype_norm='unit_base' (the old True)"),
    ('--config.incremental.prototype_norm=unit', "incremental.prototype_norm='unit' is invalid",
     "('raw', 'unit_base', 'unit_all')"),
]


@pytest.mark.parametrize('override,what,allowed', CASES)
def test_bad_override_is_one_clear_line(tmp_path, override, what, allowed):
  workdir = tmp_path / 'w'
  r = subprocess.run([sys.executable, 'run.py', '--config', 'configs/cifar100.py:smoke', override,
                      '--workdir', str(workdir)], capture_output=True, text=True, cwd=REPO, timeout=300)
  lines = [line for line in r.stderr.splitlines() if line.strip()]
  assert r.returncode == 2, r.stderr
  assert 'Traceback' not in r.stderr
  assert len(lines) == 1 and lines[0].startswith('error: '), lines
  assert what in lines[0] and allowed in lines[0], lines[0]
  assert not workdir.exists()


def test_the_command_line_is_checked_before_jax_is_imported():
  """run.py parses and checks its flags with f2m_jax.command_line, which imports no JAX, flax or
  TensorFlow: a typo is answered at once, not after seconds of imports."""
  r = subprocess.run([sys.executable, '-c', 'import sys, run; print(sorted(m for m in sys.modules if m.split(".")[0] '
                      'in ("jax", "jaxlib", "flax", "optax", "orbax", "tensorflow", "tensorflow_datasets")))'],
                     capture_output=True, text=True, cwd=REPO, timeout=300)
  assert r.returncode == 0 and r.stdout.strip() == '[]', (r.stdout[-2000:], r.stderr[-2000:])


def test_run_py_takes_the_flags_its_libraries_define():
  """A flag that f2m_jax.cli's imports define (orbax's) is taken as before run.py checked its command
  line without JAX; a flag nobody defines is still one line."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint  # pylint: disable=g-import-not-at-top,unused-import  (defines its flags)
  if 'experimental_orbax_use_distributed_barrier' not in flags.FLAGS:
    pytest.skip('this orbax defines no --experimental_orbax_use_distributed_barrier')
  r = subprocess.run([sys.executable, 'run.py', '--config', 'configs/cifar100.py:smoke', '--dry-run',
                      '--experimental_orbax_use_distributed_barrier=false'], capture_output=True, text=True, cwd=REPO,
                     timeout=300)
  assert r.returncode == 0 and r.stdout.strip().endswith('dry run: nothing was written'), r.stderr[-2000:]
  r = subprocess.run([sys.executable, 'run.py', '--config', 'configs/cifar100.py:smoke', '--dry-run', '--nosuchflag=1'],
                     capture_output=True, text=True, cwd=REPO, timeout=300)
  assert r.returncode == 2 and r.stderr.strip() == "error: Unknown command line flag 'nosuchflag'", r.stderr[-2000:]


def test_good_overrides_pass_the_check(tmp_path):
  """Overrides of every kind parse; the run then stops at its first check of the workdir (eval of a
  folder that holds no run), so nothing trains."""
  r = subprocess.run([sys.executable, 'run.py', '--config', 'configs/cifar100.py:smoke', '--config.base.milestones=(50,)',
                      '--config.noise.M', '3', '--config.noise.enabled=False', '--config.method=baseline',
                      '--workdir', str(tmp_path / 'w'), '--mode', 'eval'], capture_output=True, text=True, cwd=REPO,
                     timeout=300)
  assert r.returncode == 2 and r.stderr.startswith('error: nothing to evaluate'), r.stderr


@pytest.mark.parametrize('spec,what', [
    ('configs/cifar10.py', 'there is no file configs/cifar10.py; did you mean configs/cifar100.py?'),
    ('configs/cifar100.py:smok', "config argument 'smok' is not one of ['smoke', 'trainsplit']"),
])
def test_bad_config_argument_is_one_clear_line(tmp_path, spec, what):
  workdir = tmp_path / 'w'
  r = subprocess.run([sys.executable, 'run.py', '--config', spec, '--workdir', str(workdir)], capture_output=True,
                     text=True, cwd=REPO, timeout=300)
  lines = [line for line in r.stderr.splitlines() if line.strip()]
  assert r.returncode == 2, r.stderr
  assert len(lines) == 1 and lines[0] == f'error: --config {spec}: ' + lines[0].split(': ', 2)[2], lines
  assert what in lines[0]
  assert not workdir.exists()


@pytest.mark.parametrize('spec,what', [
    ('configs/mini.py', 'miniimagenet/images/'),
    ('configs/cub200.py', 'CUB_200_2011.tgz'),
    ('configs/cifar100.py:trainsplit', 'python -m f2m_jax.data.make_trainsplit'),
])
def test_no_data_folder_says_what_to_put_there(tmp_path, spec, what):
  """Without F2M_DATA_DIR the first message already says what the folder must hold and how to get it."""
  workdir = tmp_path / 'w'
  env = {k: v for k, v in os.environ.items() if k != 'F2M_DATA_DIR'}
  r = subprocess.run([sys.executable, 'run.py', '--config', spec, '--workdir', str(workdir)], capture_output=True,
                     text=True, cwd=REPO, timeout=300, env={**env, 'F2M_CACHE_DIR': str(tmp_path / 'cache')})
  assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr
  assert r.stderr.startswith('error: ') and 'needs a data folder: set F2M_DATA_DIR' in r.stderr
  assert 'How to obtain it' in r.stderr and what in r.stderr
  assert not workdir.exists()


def test_a_dry_run_prints_the_effective_config_and_writes_nothing(tmp_path):
  r = subprocess.run([sys.executable, 'run.py', '--config', 'configs/cifar100.py:smoke', '--dry-run',
                      '--config.method=baseline', '--config.eval.normalize_prototypes=True',
                      '--workdir', str(tmp_path / 'w')], capture_output=True, text=True, cwd=REPO, timeout=300)
  assert r.returncode == 0, r.stderr
  printed, _, notes = r.stdout.partition('set when the run starts')
  config = json.loads(printed)
  assert config['method'] == 'baseline' and config['noise']['enabled'] is False
  assert config['eval']['normalize_prototypes'] is True  # the command line wins over the presets
  assert "noise.draw_map: 'auto' -> 'unroll'" in notes and "noise.enabled: True -> False" in notes
  assert 'eval.normalize_prototypes' not in notes and notes.strip().endswith('dry run: nothing was written')
  assert not (tmp_path / 'w').exists()
