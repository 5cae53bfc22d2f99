"""The memory check (f2m_jax/run/memory.py) against machines of chosen sizes: a run whose estimate exceeds the
total memory is refused naming the field, one that exceeds what is free now is warned about, and
memory_check=False skips both; an allocation failure during a run is one line naming the field to lower."""
import jax.numpy as jnp
import numpy as np
import pytest

from configs import cifar100, cub200, mini
from f2m_jax.models import build_model
from f2m_jax.run import backend
from f2m_jax.run import cli
from f2m_jax.run import memory
from f2m_jax.run import pipeline

GIB = 2 ** 30


def config(name: str = 'smoke', **fields):
  c = {'smoke': lambda: cifar100.get_config('smoke'), 'cifar100': lambda: cifar100.get_config('trainsplit'),
       'mini': mini.get_config, 'cub200': cub200.get_config}[name]()
  c.model.pretrained = ''
  for field, value in fields.items():
    *sections, leaf = field.split('.')
    node = c
    for part in sections:
      node = node[part]
    node[leaf] = value
  return pipeline.effective(c)


def test_the_network_size_is_counted_from_the_model():
  """ResNet-20 at 32 px with 100 classes, by hand: the convolutions' outputs are 16 + 3 x 2 x 16 channels
  at 32 x 32 (the stem, stage 1), 3 x 2 x 32 and a 1x1 shortcut's 32 at 16 x 16, 3 x 2 x 64 and a
  shortcut's 64 at 8 x 8; the parameters their kernels', BatchNorm's scale and bias, the classifier's."""
  values = 32 * 32 * (16 + 6 * 16) + 16 * 16 * 7 * 32 + 8 * 8 * 7 * 64
  kernels = (27 * 16 + 6 * 9 * 16 * 16 + 9 * 16 * 32 + 5 * 9 * 32 * 32 + 16 * 32 + 9 * 32 * 64 + 5 * 9 * 64 * 64
             + 32 * 64)
  params = kernels + 2 * (16 + 6 * 16 + 7 * 32 + 7 * 64) + 65 * 100
  assert memory.network_size(build_model('resnet20', 100), 32) == (params, values)


def estimated(c) -> int:
  """What `c` needs: the parts held throughout and the largest phase."""
  return memory.verdict(memory.estimate(c), 0, 0)[2]


@pytest.mark.parametrize('total, free, kind', [(-1, -1, 'refuse'), (+1, -1, 'warn'), (+1, +1, 'fits')])
def test_refused_over_the_total_warned_over_what_is_free(monkeypatch, capsys, total, free, kind):
  c = config(**{'eval.batch_size': 20000})
  need = estimated(c)
  monkeypatch.setattr(backend, 'available_memory', lambda: (need + total, need + free, None))
  memory._warn.cache_clear()
  said = f'the run needs about {need / GIB:.2f} GiB (evaluation: '
  if kind == 'refuse':
    with pytest.raises(ValueError) as e:
      memory.check(c)
    assert str(e.value).startswith(f'eval.batch_size=20000 is invalid: {said}') and '\n' not in str(e.value)
    assert str(e.value).endswith(f'more than the {(need - 1) / GIB:.2f} GiB this machine has '
                                 '(--config.memory_check=False skips this check)')
  else:
    memory.check(c)
  err = capsys.readouterr().err.splitlines()
  assert len(err) == (kind == 'warn')
  assert all(line.startswith(f'warning: eval.batch_size=20000 may not fit in memory: {said}') for line in err)


def test_memory_check_false_skips_the_check(monkeypatch, capsys):
  monkeypatch.setattr(backend, 'available_memory', lambda: (1, 1, None))
  with pytest.raises(ValueError, match='base.batch_size=80 is invalid: the run needs about '):
    memory.check(config())
  memory.check(config(memory_check=False))
  assert capsys.readouterr().err == ''


@pytest.mark.parametrize('name, fields, kind, field', [
    ('smoke', {}, 'fits', None),
    ('cifar100', {}, 'fits', None),
    ('mini', {}, 'fits', None),
    ('cub200', {}, 'fits', None),
    ('smoke', {'eval.batch_size': 709070}, 'refuse', 'eval.batch_size'),  # issue 73: an out-of-memory traceback
    ('smoke', {'eval.batch_size': 354535}, 'warn', 'eval.batch_size'),  # SIGABRT there, on a loaded machine
    ('smoke', {'data.synthetic.train_per_class': 22000}, 'warn', 'data.synthetic.train_per_class'),  # 15.9 GiB+
    ('smoke', {'noise.M': 100000}, 'refuse', 'noise.M'),
    ('smoke', {'model.width': 4096}, 'refuse', 'model.width'),
])
def test_this_projects_machine(name, fields, kind, field):
  """24 GiB, 18 of them free (other processes running); the issue's three sizes that ran out of memory."""
  got = memory.verdict(memory.estimate(config(name, **fields)), 24 * GIB, 18 * GIB)
  assert (got[0], got[1] and got[1][1]) == (kind, field), got


def test_a_gpu_checks_its_devices_parts_against_each_devices_memory():
  parts = memory.estimate(config(**{'eval.batch_size': 100000}))
  device = memory.verdict([p for p in parts if p[3]], 0, 0)[2]
  assert memory.verdict(parts, 10 ** 15, 10 ** 15, device + 1)[0] == 'fits'
  kind, part, need, limit = memory.verdict(parts, 10 ** 15, 10 ** 15, device - 1)
  assert (kind, part[1], need, limit) == ('refuse', 'eval.batch_size', device, device - 1)


@pytest.mark.parametrize('fail', [lambda: jnp.zeros(10 ** 14, jnp.uint8).block_until_ready(),
                                  lambda: np.ones(10 ** 15, np.uint8)], ids=['XLA', 'numpy'])
def test_an_allocation_failure_is_one_line_naming_the_field_to_lower(monkeypatch, capsys, fail):
  """Exit code 3, as the other faults found once the run has started; the field is the estimate's
  largest part's."""
  def run(*args, **kwargs):
    del args, kwargs
    fail()

  monkeypatch.setattr(pipeline, 'run', run)
  c = cifar100.get_config('smoke')
  c.eval.batch_size = 100000
  assert cli.run_mode(c, '/nonexistent', 'train', None, {'changes': {}}, None) == 3
  lines = capsys.readouterr().err.splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: out of memory (')
  assert 'lower eval.batch_size=100000, the largest part of the memory estimate (evaluation: ' in lines[0]
