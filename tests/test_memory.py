"""The memory estimate (f2m_jax/memory.py) on a table of configs against fixed machines: what fits,
what may not (a warning), what cannot (refused before anything is written, naming the field)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import cifar100, cub200, mini
from f2m_jax import memory
from f2m_jax import pipeline
from f2m_jax.models import build_model

GIB = 2 ** 30
CPU = dict(host=24 * GIB, device=None)  # this project's CPU machines: the devices are the host's memory
H200 = dict(host=128 * GIB, device=139 * GIB)


def config(name: str, **fields):
  c = {'smoke': lambda: cifar100.get_config('smoke'), 'cifar100': cifar100.get_config, 'mini': mini.get_config,
       'cub200': cub200.get_config}[name]()
  c.model.pretrained = ''
  for field, value in fields.items():
    section, _, leaf = field.rpartition('.')
    node = c
    for part in section.split('.'):
      node = node[part]
    node[leaf] = value
  return pipeline.resolve(c, reads_data=False)


@pytest.mark.parametrize('name, fields, machine, kind, field', [
    ('smoke', {}, CPU, 'fits', ''),
    ('cifar100', {}, CPU, 'fits', ''),
    ('cifar100', {'members.seeds': (0, 1, 2, 3, 4)}, H200, 'fits', ''),
    ('mini', {}, CPU, 'fits', ''),
    ('cub200', {}, CPU, 'warn', 'base.batch_size'),  # 21 GiB of activations: XLA may keep far fewer
    ('cub200', {}, H200, 'fits', ''),
    ('smoke', {'noise.M': 100000}, CPU, 'refuse', 'noise.M'),
    ('smoke', {'noise.M': 100000}, H200, 'refuse', 'noise.M'),
    ('smoke', {'data.synthetic.train_per_class': 1000000}, CPU, 'refuse', 'data.synthetic.train_per_class'),
    ('smoke', {'data.synthetic.train_per_class': 1000000}, H200, 'refuse', 'data.synthetic.train_per_class'),
    ('smoke', {'eval.batch_size': 100000000}, CPU, 'refuse', 'eval.batch_size'),
    ('smoke', {'eval.batch_size': 100000000}, H200, 'refuse', 'eval.batch_size'),
    ('smoke', {'model.width': 4096}, CPU, 'refuse', 'model.width'),
])
def test_the_estimate_on_a_table_of_configs(name, fields, machine, kind, field):
  got = memory.verdict(memory.estimate(config(name, **fields)), **machine)
  assert got[:2] == (kind, field), got
  if kind != 'fits':
    assert got[2].startswith('the run needs about ') and ' is available' in got[2]


def test_refused_in_one_line_naming_the_field_the_estimate_and_the_memory(monkeypatch):
  monkeypatch.setattr(memory, 'available', lambda: (24 * GIB, None))
  with pytest.raises(ValueError) as e:
    memory.check(config('smoke', **{'eval.batch_size': 100000000}))
  assert str(e.value) == ('eval.batch_size=100000000 is invalid: the run needs about 9.5 TiB on this machine '
                          '(eval batch: 9.4 TiB), and 24.0 GiB is available (the estimate: f2m_jax/memory.py)')
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('arch, width, size', [('resnet20', 0, 32), ('resnet20', 8, 16), ('resnet18', 0, 84)])
def test_the_parameter_count_is_the_networks(arch, width, size):
  model = build_model(arch, 10, width or None)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, size, size, 3)), train=False))
  assert memory.network_size(model, size)[0] == sum(np.prod(s.shape) for s in jax.tree_util.tree_leaves(shapes['params']))
