"""F2M-V (configs/f2m_v.py): the dataset config with exactly its validated choices changed, and a run
of it that learns."""
import importlib

import pytest

from configs import f2m_v
from conftest import far_above_chance
from f2m_jax import pipeline, workdir


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


def test_unknown_dataset_is_refused():
  with pytest.raises(ValueError, match="'imagenet' is not one of"):
    f2m_v.get_config('imagenet')


@pytest.mark.slow
def test_variant_smoke_run_learns(tmp_path):
  config = f2m_v.get_config('cifar100:smoke')
  results = pipeline.run(config, str(tmp_path))
  first, last = results['sessions'][0], results['sessions'][-1]
  assert far_above_chance(first['acc']['mean'], 20 * 20, 20)  # 20 classes x 20 test images
  assert far_above_chance(last['acc']['mean'], 36 * 20, 36)
  assert results['provenance']['config']['incremental']['finetune'] is False
