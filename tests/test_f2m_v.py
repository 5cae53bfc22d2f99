"""F2M-V (configs/f2m_v.py): the dataset config with exactly its validated choices changed, and a run
of it that learns."""
import importlib

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import f2m_v
from conftest import far_above_chance, init_variables
from f2m_jax import base as base_lib
from f2m_jax import noise as noise_lib
from f2m_jax.models import noise_set_paths, resnet20
from f2m_jax.run import pipeline, workdir


@pytest.mark.parametrize('arg', ['cifar100', 'cifar100:trainsplit', 'cifar100:smoke', 'mini', 'mini:smoke',
                                 'cub200', 'cub200:smoke'])
def test_variant_changes_only_its_choices(arg):
  dataset, _, dataset_arg = arg.partition(':')
  plain = workdir.flat_items(importlib.import_module(f'configs.{dataset}').get_config(dataset_arg).to_dict())
  variant = workdir.flat_items(f2m_v.get_config(arg).to_dict())
  assert set(plain) == set(variant)
  changed = {k for k in plain if plain[k] != variant[k]}
  assert changed <= set(f2m_v.CHOICES)
  assert all(variant[k] == v for k, v in f2m_v.CHOICES.items())
  assert variant['method'] == 'f2m' and variant['noise.enabled'] and variant['noise.prototype_fixing']


@pytest.mark.slow
def test_pf_does_nothing_in_the_variants_base_training():
  """With the variant's noise fields (PF without gradient, no std term) the base step's gradient is
  the same with PF on and off: PF only adds a constant to the loss. With the authors' std term
  (gamma = 2) PF changes the gradient, through the std's values."""
  n = f2m_v.get_config('cifar100:smoke').noise
  assert n.prototype_fixing and not n.pf_gradient and n.std_weight == 0
  model = resnet20(4, width=4)
  variables = init_variables(model, 16)
  paths = tuple(noise_set_paths(model, n.num_layers))
  x = jax.random.normal(jax.random.key(1), (12, 16, 16, 3))
  y = jnp.arange(12) % 4
  bound = 0.05  # ten times the smoke config's b, so that PF's values are far from zero
  eps = noise_lib.sample_noise(jax.random.key(2), variables['params'], paths, n.M, bound, n.distribution)

  def steps(std_weight):
    """fn(lambda) -> (loss, PF, grads), jitted: lambda is an argument, so PF on and off share a program."""
    def step(pf_weight):
      noise = ml_collections.ConfigDict({**n, 'pf_weight': pf_weight, 'std_weight': std_weight, 'draw_map': 'unroll'})
      (loss, (_, metrics)), grads = jax.value_and_grad(base_lib.base_loss, has_aux=True)(
          variables['params'], variables['batch_stats'], x, y, eps, model, noise)
      return loss, metrics['pf'], grads
    return jax.jit(step)

  variant = steps(n.std_weight)
  (loss_pf, pf, with_pf), (loss_none, _, without) = variant(n.pf_weight), variant(0.0)
  loss_pf, pf, loss_none = float(loss_pf), float(pf), float(loss_none)
  assert pf > 1e-4  # PF's value is in the loss: the two losses differ by it, up to float32 rounding at the loss's size
  assert abs((loss_pf - loss_none) - n.pf_weight * pf) <= 4 * np.finfo(np.float32).eps * loss_pf
  chex.assert_trees_all_close(with_pf, without, rtol=0, atol=0)
  authors = steps(2.0)
  (_, _, authors_pf), (_, _, authors_none) = authors(n.pf_weight), authors(0.0)
  differences = jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max() / (jnp.abs(b).max() + 1e-30)),
                                       authors_pf, authors_none)
  assert max(jax.tree_util.tree_leaves(differences)) > 1e-3


def test_unknown_dataset_is_refused():
  with pytest.raises(ValueError, match="'imagenet' is not one of"):
    f2m_v.get_config('imagenet')


@pytest.mark.slow
def test_variant_smoke_run_learns(tmp_path):
  config = f2m_v.get_config('cifar100:smoke')
  config.data.synthetic.num_sessions = 3
  results = pipeline.run(config, str(tmp_path))
  first, last = results['sessions'][0], results['sessions'][-1]
  assert far_above_chance(first['acc']['mean'], 20 * 20, 20)  # 20 classes x 20 test images
  assert last['num_classes'] == 24 and far_above_chance(last['acc']['mean'], 24 * 20, 24)
  assert results['provenance']['config']['incremental']['finetune'] is False
