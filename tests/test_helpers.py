"""The small shared helpers: padding to a fixed shape, parameter trees as flat dicts, the SGD; the intervals
over seeds and draws; what the shot draws record."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

from f2m_jax import optim
from f2m_jax import padding
from f2m_jax import stats
from f2m_jax import trees
from f2m_jax.data import protocol
from f2m_jax.data import synthetic


def test_round_up():
  assert [padding.round_up(n, 4) for n in (0, 1, 4, 5)] == [0, 4, 4, 8]


def test_pad_rows_on_the_host_and_on_a_device():
  x = np.arange(6, dtype=np.int32).reshape(3, 2)
  padded = padding.pad_rows(x, 5, -1)
  assert isinstance(padded, np.ndarray) and padded.dtype == np.int32
  np.testing.assert_array_equal(padded, [[0, 1], [2, 3], [4, 5], [-1, -1], [-1, -1]])
  assert padding.pad_rows(x, 2) is x  # already as long: unchanged
  columns = padding.pad_rows(x, 4, axis=1)
  np.testing.assert_array_equal(columns, [[0, 1, 0, 0], [2, 3, 0, 0], [4, 5, 0, 0]])
  on_device = padding.pad_rows(jnp.ones((2,)), 3)
  assert isinstance(on_device, jax.Array)
  np.testing.assert_array_equal(on_device, [1.0, 1.0, 0.0])


def test_repeat_last_fills_with_copies_of_the_last_row():
  np.testing.assert_array_equal(padding.repeat_last(np.array([3, 7]), 4), [3, 7, 7, 7])
  keys = padding.repeat_last(jnp.stack([jax.random.key(0), jax.random.key(1)]), 3)
  np.testing.assert_array_equal(jax.random.key_data(keys[2]), jax.random.key_data(jax.random.key(1)))


def test_split_and_overlay():
  tree = {'a': {'w': np.ones(2)}, 'b': {'w': np.zeros(3), 'v': np.full(1, 2.0)}}
  selected, rest = trees.split(tree, [('b', 'w')])
  assert list(selected) == [('b', 'w')] and sorted(rest) == [('a', 'w'), ('b', 'v')]
  chex.assert_trees_all_equal(trees.unflatten({**rest, **selected}), tree)
  changed = trees.overlay(tree, {'b': {'w': np.full(3, 5.0)}})
  chex.assert_trees_all_equal(changed, {**tree, 'b': {'w': np.full(3, 5.0), 'v': np.full(1, 2.0)}})
  chex.assert_trees_all_equal(trees.overlay(tree, {('a', 'w'): np.zeros(2)})['a'], {'w': np.zeros(2)})
  with pytest.raises(KeyError, match="'c'"):
    trees.split(tree, [('c',)])


def test_sgd_is_pytorchs_with_its_milestones():
  """Two steps of lr 0.1, momentum 0.9, weight decay 0.5 on loss = sum(p): the rate x 0.1 from step 1."""
  tx = optim.sgd(0.1, 0.9, 0.5, milestones=(1,), gamma=0.1)
  p = jnp.array([1.0])
  state = tx.init(p)
  g1 = 1 + 0.5 * 1.0  # the gradient plus the decay
  u, state = tx.update(jnp.ones(1), state, p)
  p1 = p + u
  np.testing.assert_allclose(p1, 1.0 - 0.1 * g1, rtol=1e-6)
  u, state = tx.update(jnp.ones(1), state, p1)
  g2 = 1 + 0.5 * float(p1[0])
  np.testing.assert_allclose(p1 + u, float(p1[0]) - 0.01 * (0.9 * g1 + g2), rtol=1e-6)
  at_rate = optim.sgd_at_rate(0.9, 0.5)  # the same steps, the rate set by the caller at each step
  state = at_rate.init(p)
  u, state = at_rate.update(jnp.ones(1), optim.set_rate(state, np.float32(0.1)), p)
  np.testing.assert_array_equal(p + u, p1)
  u, state = at_rate.update(jnp.ones(1), optim.set_rate(state, np.float32(optim.rate_at(1, 0.1, (1,), 0.1))), p1)
  np.testing.assert_allclose(p1 + u, float(p1[0]) - 0.01 * (0.9 * g1 + g2), rtol=1e-6)


@pytest.mark.parametrize('values', [[50.0, 52.5], [40.0, 41.0, 45.5], [30.0, 31.25, 29.5, 33.0, 30.5]])
def test_the_interval_over_seeds_is_students_t(values):
  """t(0.975, S-1) * std(ddof=1) / sqrt(S) at S = 2, 3, 5, against the definition computed by hand in float64
  (the quantiles checked against a printed table); over draws the authors' 1.96 * std(ddof=0) / sqrt(R)."""
  s = len(values)
  mean = math.fsum(values) / s
  sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (s - 1))
  quantile = scipy_stats.t.ppf(0.975, s - 1)
  assert round(quantile, 3) == {2: 12.706, 3: 4.303, 5: 2.776}[s]
  want = quantile * sd / math.sqrt(s)
  assert stats.t_interval(values) == pytest.approx(want, rel=1e-13, abs=0)
  assert stats.summarize(values, 'seeds') == {'mean': pytest.approx(mean, rel=1e-15), 'runs': values,
                                              'ci95': pytest.approx(want, rel=1e-13, abs=0)}
  population = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / s)
  assert stats.summarize(values)['ci95'] == pytest.approx(1.96 * population / math.sqrt(s), rel=1e-13)
  assert stats.summarize(values[:1], 'seeds')['ci95'] is None and stats.t_interval(values[:1]) is None


def test_shot_draws_say_when_every_run_trains_on_the_same_images():
  """A shot pool of data.shots images a class: every run draws the same shots (no interval over the runs);
  a larger pool: the runs differ, and the digest follows the seed."""
  sizes = dict(num_base=4, way=2, num_sessions=3, test_per_class=1, image_size=4)
  same = protocol.shot_draws(synthetic.make_synthetic(train_per_class=5, **sizes), 'draws', 5, seed=0, runs=3)
  bench = synthetic.make_synthetic(train_per_class=8, **sizes)
  drawn = protocol.shot_draws(bench, 'draws', 5, seed=0, runs=3)
  assert same['same'] and not drawn['same'] and not protocol.shot_draws(bench, 'draws', 5, 0, runs=1)['same']
  assert drawn == protocol.shot_draws(bench, 'draws', 5, seed=0, runs=3)
  assert drawn['digest'] != protocol.shot_draws(bench, 'draws', 5, seed=1, runs=3)['digest']
