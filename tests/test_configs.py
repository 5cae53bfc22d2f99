"""Config files import ml_collections and the standard library only, and a method's presets never
replace a field the user changed on the command line (the `changes` run.py records)."""
import json
import pathlib
import subprocess
import sys

import jax
import pytest

from configs import cifar100, common
from conftest import Interrupt, run_py
from f2m_jax import registry
from f2m_jax.run import pipeline

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG_MODULES = sorted(p.stem for p in (REPO / 'configs').glob('*.py') if p.stem != '__init__')


@pytest.mark.parametrize('module', CONFIG_MODULES)
def test_loading_a_config_imports_no_jax_and_no_method(module):
  code = (f'import sys, configs.{module} as m\n'
          f'getattr(m, "get_config", lambda: None)()\n'
          'bad = {n.split(".")[0] for n in sys.modules} & {"jax", "jaxlib", "flax", "optax",\n'
          '                                                   "f2m_jax"}\n'
          'assert not bad, bad')
  r = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, timeout=120)
  assert r.returncode == 0, r.stderr


def test_the_config_holds_every_method_section():
  sections, config = registry.method_sections(), cifar100.get_config()
  assert all(registry.get(method).section == section for section, method in sections.items())
  assert {section: dict(config[section]) for section in sections} == common.METHOD_SECTIONS


def test_presets_apply_to_the_fields_the_user_did_not_set():
  config = cifar100.get_config('smoke')
  config.method = 'baseline'
  config.eval.normalize_prototypes = True  # set in Python, not named: the Baseline's preset wins
  r = pipeline.resolve(config)
  assert (r.noise.enabled, r.eval.normalize_prototypes, r.base.sampler) == (False, False, 'shuffle')
  config.base.sampler = 'task_epochs'
  changes = {'method': 'baseline', 'eval.normalize_prototypes': True, 'base.sampler': 'task_epochs'}
  r = pipeline.resolve(config, changes)
  assert r.eval.normalize_prototypes and r.base.sampler == 'task_epochs'
  assert not r.noise.enabled and not r.incremental.finetune and not r.incremental.round_steps
  assert pipeline.resolve(r, changes).to_dict() == r.to_dict()  # twice (member sweeps): no change


def test_a_user_value_a_method_cannot_run_stops_naming_the_field():
  config = cifar100.get_config('smoke')
  config.method = 'rebalance'
  assert pipeline.resolve(config).model.head == 'cosine'
  config.model.head = 'linear'
  with pytest.raises(ValueError,
                     match="model.head='linear' is invalid: method=rebalance needs 'cosine'"):
    pipeline.resolve(config, {'model.head': 'linear'})


def test_command_line_overrides_survive_the_baseline(tmp_path, monkeypatch, capsys):
  """Through run.py's flags and main (conftest.run_py), stopped where the run would compute: the
  effective config.json, and the origin it hands the run (its results record it) names the fields
  changed on the command line. Before, in that workdir (issue 82): a crash after the workdir was
  written (staged where the run computes, as 6f2b875's seed 2^63 crashed making its key) leaves the
  workdir to the corrected command, which says so (6f2b875 refused it as 'a different config')."""
  seen, workdir = {}, tmp_path / 'w'
  args = ['run.py', '--config', 'configs/cifar100.py:smoke', '--workdir', str(workdir)]
  with monkeypatch.context() as patch, pytest.raises(OverflowError):
    patch.setattr(pipeline, 'compute', lambda *_: jax.random.key(2 ** 63))  # 6f2b875's crash
    run_py(args, monkeypatch)

  def stop(*args):  # pipeline.compute(exp, record, workdir, mode, base_source, hook, origin,
    seen['origin'] = args[6]  # writes)
    raise Interrupt

  monkeypatch.setattr(pipeline, 'compute', stop)
  with pytest.raises(Interrupt):
    run_py([*args, '--config.method=baseline', '--config.eval.normalize_prototypes=True',
            '--config.base.sampler', 'task_epochs', '--config.base.steps=2', '--config.runs=1',
            '--config.base.milestones=()', '--config.data.synthetic.num_sessions=2'], monkeypatch)
  assert f'{workdir}/config.json replaced: its run stopped before it' in capsys.readouterr().out
  saved = json.loads((workdir / 'config.json').read_text())
  assert saved['method'] == 'baseline' and not saved['noise']['enabled']
  assert not saved['incremental']['finetune'] and 'set_by_user' not in saved
  assert saved['eval']['normalize_prototypes'] and saved['base']['sampler'] == 'task_epochs'
  assert seen['origin']['config'] == 'configs/cifar100.py:smoke'
  assert sorted(seen['origin']['changes']) == [
      'base.milestones', 'base.sampler', 'base.steps', 'data.synthetic.num_sessions',
      'eval.normalize_prototypes', 'method', 'runs']


CPU_BUDGET = dict(steps=1000, milestones=(700,), batch_size=64, shots=4, lr=0.05)


@pytest.mark.parametrize('spec, arch, width, size, sampler, std', [
    ('cifar100.py:cpu', 'resnet20', 0, 32, 'task_epochs', 2.0),
    ('mini.py:cpu', 'resnet18', 16, 32, 'task_epochs', 2.0),
    ('cub200.py:cpu', 'resnet18', 16, 32, 'task_epochs', 2.0),
    ('folder.py:cpu', 'resnet18', 16, 32, 'task_epochs', 2.0),
    ('f2m_v.py:folder:cpu', 'resnet18', 16, 32, 'shuffle', 0.0),
    ('f2m_v.py:mini:cpu', 'resnet18', 16, 32, 'shuffle', 0.0),
    ('f2m_v.py:cub200:cpu', 'resnet18', 16, 32, 'shuffle', 0.0),
    ('f2m_v.py:cifar100:cpu', 'resnet20', 0, 32, 'shuffle', 0.0),
])
def test_every_dataset_config_has_a_cpu_budget_and_f2m_v(spec, arch, width, size, sampler, std):
  """`:cpu` sets a budget's fields together (steps, milestones, batch, the sampler's shots, lr,
  width, image size), and F2M-V takes every dataset config with its argument (0739cee refused
  configs/f2m_v.py:folder and had no :cpu)."""
  from f2m_jax.run import cli  # pylint: disable=g-import-not-at-top
  config = cli.load_config(f'configs/{spec}')
  if 'folder' in config.data:
    config.data.folder.update(train='mine/train', num_base=60, way=5)
  r = pipeline.resolve(config, reads_data=False)
  assert {k: r.base[k] for k in CPU_BUDGET} == CPU_BUDGET and r.base.ways == 16 and r.runs == 5
  assert (r.model.arch, r.model.width, r.data.get('image_size', 32), r.base.sampler,
          r.noise.std_weight) == (arch, width, size, sampler, std)
  assert r.model.pretrained == ''  # CUB's ImageNet weights fit no width-16 network


def test_f2m_v_takes_a_folder_with_its_fields():
  from configs import f2m_v, folder  # pylint: disable=g-import-not-at-top
  mine = f2m_v.get_config('folder')
  plain = folder.get_config()
  f2m_v.apply(plain)
  assert mine.to_dict() == plain.to_dict() and 'folder' in mine.data


@pytest.mark.parametrize('field, value, message', [
    ('base.lr_gamma', -1.0, 'base.lr_gamma=-1.0 is invalid: must be > 0'),  # issue 73
    ('base.lr_gamma', float('nan'), 'base.lr_gamma=nan is invalid: must be > 0'),
    ('icarl.lr_gamma', 0.0, 'icarl.lr_gamma=0.0 is invalid: must be > 0'),
    ('data.synthetic.image_size', -1, 'data.synthetic.image_size=-1 is invalid: must be >= 8'),
    ('data.synthetic.num_base', 0, 'data.synthetic.num_base=0 is invalid: must be >= 1'),
    ('data.synthetic.seed', -1, 'data.synthetic.seed=-1 is invalid: must be >= 0'),
    ('seed', -1, 'seed=-1 is invalid: must be >= 0'),  # issue 82 (and tests/test_cli.py):
    ('base.lr', float('inf'), 'base.lr=inf is invalid: must be finite, of magnitude < 2^31'),
    ('base.classifier_lr', float('nan'), 'base.classifier_lr=nan is invalid: must be finite'),
    ('noise.std_weight', float('inf'), 'noise.std_weight=inf is invalid: must be finite'),
    ('seed', 2 ** 32, 'seed=4294967296 is invalid: must be finite, of magnitude < 2^32'),
    ('base.milestones', (2 ** 31,), 'base.milestones=(2147483648,) is invalid: must be finite, '),
    ('flatness.num_draws', 0, 'flatness.num_draws=0 is invalid: must be >= 1'),
    ('bench.iters', 0, 'bench.iters=0 is invalid: must be >= 1'),
    ('bench.dtypes', ('float16',), "bench={'M_list': (1, 2), "),
    ('fsll.margin', -0.1, 'fsll.margin=-0.1 is invalid: must be >= 0'),  # < 0 would be maximised
    ('fsll.pn_weight', -1.0, 'fsll.pn_weight=-1.0 is invalid: must be >= 0'),
    ('fsll.reg_weight', -5.0, 'fsll.reg_weight=-5.0 is invalid: must be >= 0'),
    ('fsll.omega', 0.0, "fsll.omega=0.0 is invalid: must be > 0 (the prototype logits' scale)"),
])
def test_every_field_is_checked_before_anything_is_written(field, value, message):
  """Values that d41b789 (issue 82: 6f2b875) let through its checks, to fail after config.json was
  written (or in numpy, naming no field): refused by `pipeline.resolve`, which comes before any
  write (tests/test_faults.py)."""
  config = cifar100.get_config('smoke')
  *sections, leaf = field.split('.')
  node = config
  for part in sections:
    node = node[part]
  node[leaf] = value
  if sections and sections[0] in common.METHOD_SECTIONS:
    config.method = sections[0]
  with pytest.raises(ValueError) as e:
    pipeline.resolve(config, reads_data=False)
  assert str(e.value).startswith(message), str(e.value)
