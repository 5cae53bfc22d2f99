"""The train state's init as one jitted program (`Experiment.init_program`) gives the same bits as
flax's own initializers run op by op, as every earlier version of this package initialised: jitting
the init changes when it compiles, not any run's initial weights (a changed last bit would change
every run's numbers)."""
from __future__ import annotations

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_protocol
from f2m_jax import experiment as experiment_lib, optim
from f2m_jax.data import sources
from f2m_jax.models import build_model, resnet


def _stock_init(monkeypatch, network, key, size):
  """`network`'s variables from flax's stock initializers (the previous definition of conv_init
  and fc_init), op by op."""
  with monkeypatch.context() as m:
    m.setattr(resnet, 'conv_init', nn.initializers.variance_scaling(2.0, 'fan_out', 'normal'))
    m.setattr(resnet, 'fc_init', nn.initializers.normal(1e-3))
    return network.init(key, jnp.zeros((1, size, size, 3), jnp.float32), train=False)


@pytest.mark.parametrize('arch,head', [('resnet20', 'linear'), pytest.param('resnet18', 'linear', marks=pytest.mark.slow),
                                       ('resnet20', 'cosine')])
def test_jitted_init_equals_flax_initializers_op_by_op(monkeypatch, arch, head):
  network = build_model(arch, 12, 8, jnp.float32, head=head)
  key, size = jax.random.key(3), 32
  stock = _stock_init(monkeypatch, network, key, size)
  init = lambda: network.init(key, jnp.zeros((1, size, size, 3), jnp.float32), train=False)
  chex.assert_trees_all_equal(init(), stock)  # op by op, the project's initializers
  chex.assert_trees_all_equal(jax.jit(init)(), stock)  # jitted: the same bits, not only close


def test_experiment_init_state_is_one_program_shared_by_a_sweep(monkeypatch):
  config = tiny_protocol('f2m')
  exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
  state = exp.init_state()
  stock = _stock_init(monkeypatch, exp.model, exp.key(1), exp.bench.image_size)
  chex.assert_trees_all_equal({'params': state.params, 'batch_stats': state.batch_stats}, stock)
  assert int(state.step) == 0
  chex.assert_trees_all_equal(state.opt_state, optim.sgd(*exp.optimizer_settings()).init(stock['params']))
  # Another seed (a sweep's next member) reuses the compiled program, with its own weights.
  config.seed += 1
  other = experiment_lib.Experiment.create(config, exp.bench)
  assert other.init_program() is exp.init_program()
  assert not np.array_equal(other.init_state().params['conv1']['kernel'], state.params['conv1']['kernel'])
