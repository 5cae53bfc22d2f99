"""Noise set, bounded samplers and the b = 0 limit of the base objective."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import init_variables, noise_view
from f2m_jax import base as base_lib
from f2m_jax import noise as noise_lib
from f2m_jax import objectives
from f2m_jax import trees
from f2m_jax.models import noise_set_paths, resnet18, resnet20, split_block


_loss = jax.jit(base_lib.base_loss, static_argnums=(5, 6))  # one program per network and noise, shared by the tests


@pytest.fixture(scope='module')
def net():
  model = resnet20(10, width=4)
  x = jax.random.normal(jax.random.key(2), (12, 16, 16, 3))
  return model, init_variables(model, 16), x, jnp.arange(12) % 4


def test_noise_set_is_last_k_3x3_convs():
  model = resnet20(10)
  assert noise_set_paths(model, 4) == [('layer3_1', 'conv1', 'kernel'), ('layer3_1', 'conv2', 'kernel'),
                                       ('layer3_2', 'conv1', 'kernel'), ('layer3_2', 'conv2', 'kernel')]
  assert split_block(model, noise_set_paths(model, 4)) == 7
  r18 = resnet18(10)
  paths = noise_set_paths(r18, 8)
  assert [p[0] for p in paths] == ['layer3_0'] * 2 + ['layer3_1'] * 2 + ['layer4_0'] * 2 + ['layer4_1'] * 2
  assert all('downsample' not in p[1] for p in paths)
  with pytest.raises(ValueError, match='num_layers'):
    noise_set_paths(model, 0)


def test_beta_grid_is_a_binned_beta_draw_with_one_pair_per_layer_and_draw():
  """The Beta grids draw each element's fifth of [0, 1] by inverting the fifths' Beta CDF: per
  (alpha, beta) pair that is the law of a binned Beta draw (against jax.random.beta's own samples,
  what the sampler drew before), and all elements of one layer in one draw share one pair."""
  from scipy import stats
  cdfs = noise_lib.fifth_cdfs()
  assert cdfs.shape == (7, 7, 4) and (np.diff(cdfs, axis=-1) >= 0).all()
  n = 20000
  for i, j in [(0, 6), (3, 3), (6, 0), (1, 4)]:
    u = np.asarray(jax.random.beta(jax.random.key(7 * i + j), noise_lib.BETA_SHAPES[i], noise_lib.BETA_SHAPES[j], (n,)))
    binned = np.bincount(np.sum(u[:, None] > np.asarray(noise_lib.FIFTHS), axis=1), minlength=5)
    probs = np.diff(cdfs[i, j].astype(np.float64), prepend=0, append=1)
    keep = probs * n > 5  # chi-square needs expected counts; the rest must be (nearly) empty
    assert stats.chisquare(binned[keep], probs[keep] * n * binned[keep].sum() / (probs[keep] * n).sum()).pvalue > 1e-4
    assert binned[~keep].sum() <= 10
  # 'grid' maps fifth k to level k: each draw's level frequencies are one pair's, within 5 standard
  # errors, and not the average over the pairs
  eps = noise_lib.sample_noise(jax.random.key(3), {'w': jnp.zeros((n,))}, [('w',)], 6, 1.0, 'grid')
  pairs = np.diff(cdfs.reshape(49, 4).astype(np.float64), prepend=0, append=1, axis=-1)
  best = []
  for e in np.asarray(eps[('w',)]):
    freq = np.bincount(np.rint(2 * e).astype(int) + 2, minlength=5) / n
    gaps = np.abs(freq[None] - pairs).max(axis=1)
    assert gaps.min() < 5 * 0.5 / np.sqrt(n)
    best.append(int(gaps.argmin()))
  assert len(set(best)) > 1


@pytest.mark.parametrize('distribution', ['discrete_beta', 'grid', 'uniform'])
def test_noise_bounded_and_only_on_masked_leaves(net, distribution):
  model, variables, x, _ = net
  paths = noise_set_paths(model, 4)
  b = 0.01
  eps = noise_lib.sample_noise(jax.random.key(1), variables['params'], paths, 3, b, distribution)
  assert set(eps) == set(paths)
  flat = trees.flatten(variables['params'])
  for p, e in eps.items():
    assert e.shape == (3,) + flat[p].shape
    assert float(jnp.max(jnp.abs(e))) <= b
    assert float(jnp.std(e)) > b / 10  # really random, not all zeros
  if distribution != 'uniform':
    levels = set(np.unique(np.round(np.concatenate([np.ravel(e) for e in eps.values()]) / b, 6)).tolist())
    if distribution == 'grid':
      assert levels == {-1.0, -0.5, 0.0, 0.5, 1.0}  # every level occurs
    else:
      assert levels == {-1.0, 0.0, 0.5, 1.0}  # the original's relabelling never produces -b/2
  # params + eps adds each draw to its leaf of the noise set and nothing else; the 'noise' collection
  # (the clean-weights backward's way in) computes the same forward pass.
  draw = {p: e[0] for p, e in eps.items()}
  perturbed = base_lib.perturb(variables['params'], draw)
  for p, v in trees.flatten(perturbed).items():
    np.testing.assert_array_equal(v, flat[p] + draw[p] if p in draw else flat[p])
  apply = jax.jit(lambda v: model.apply(v, x, train=False))  # one program a variables structure, not op by op
  explicit, _ = apply({**variables, 'params': perturbed})
  with_noise, _ = apply({**variables, 'noise': trees.unflatten(draw)})
  clean, _ = apply(variables)
  np.testing.assert_array_equal(with_noise, explicit)
  assert float(jnp.abs(with_noise - clean).max()) > 1e-4


@pytest.mark.slow
def test_zero_bound_equals_plain_cross_entropy_and_trains(net):
  model, variables, x, y = net
  eps = noise_lib.sample_noise(jax.random.key(3), variables['params'], noise_set_paths(model, 4), 2, 0.0)
  (_, logits), _ = jax.jit(lambda v: model.apply(v, x, train=True, mutable=['batch_stats']))(variables)
  # (the naive form, shared_trunk=False, equals this one at any draw: test_objective_equivalence.py)
  noise = noise_view(M=2, distribution='uniform', pf_weight=1.0, std_weight=0.0)
  loss, (_, metrics) = _loss(variables['params'], variables['batch_stats'], x, y, eps, model, noise)
  np.testing.assert_allclose(loss, objectives.cross_entropy(logits, y), rtol=1e-5)
  assert float(metrics['pf']) < 1e-10  # zero up to float rounding between the clean and noisy passes
  # with the std term (gamma = 2, the default): the M equal losses have std 0, and the step is finite
  noise = noise_view(M=2, distribution='uniform', pf_weight=1.0, std_weight=2.0, shared_trunk=True)
  grads = jax.jit(jax.grad(lambda p: base_lib.base_loss(p, variables['batch_stats'], x, y, eps, model, noise)[0]))(
      variables['params'])
  assert all(bool(jnp.isfinite(g).all()) for g in jax.tree_util.tree_leaves(grads))


def test_pf_reaches_the_objective(net):
  """PF's value is part of the loss: with gamma 0, L = mean_j (CE_j + PF_j) and PF > 0 under noise."""
  model, variables, x, y = net
  eps = noise_lib.sample_noise(jax.random.key(3), variables['params'], noise_set_paths(model, 4), 2, 0.05, 'uniform')
  noise = noise_view(M=2, distribution='uniform', pf_weight=1.0, std_weight=0.0)
  loss, (_, metrics) = _loss(variables['params'], variables['batch_stats'], x, y, eps, model, noise)
  loss, ce, pf = float(loss), float(metrics['ce']), float(metrics['pf'])
  assert pf > 0
  f32 = float(np.finfo(np.float32).eps)  # up to a few roundings at the loss's magnitude
  np.testing.assert_allclose(loss - ce, pf, rtol=0, atol=8 * f32 * loss)
  # noise.prototype_fixing=False (the ablation) takes it out: L = mean_j CE_j
  off = noise_view(M=2, distribution='uniform', pf_weight=1.0, std_weight=0.0, prototype_fixing=False)
  loss, (_, metrics) = _loss(variables['params'], variables['batch_stats'], x, y, eps, model, off)
  assert float(loss) == float(metrics['ce']) and float(metrics['pf']) == pf
