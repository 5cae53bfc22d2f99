"""The JAX code against what the authors' PyTorch code computes, step by step.

The fixtures come from the PyTorch transcription in tests/torch_reference/ (`python
tests/torch_reference/make_fixtures.py` rewrites them where torch is installed); these tests need no
torch. Same weights, same batches, same explicit noise, under both of PyTorch's backward behaviours
('clean': their code on PyTorch >= 1.10, 'noisy': on <= 1.9, the exact gradient):
  - float64 on both sides (tests/fixtures/torch_f2m_f64.npz; JAX with 64-bit enabled): one base
    step's loss, every gradient and the BN statistics, and every parameter and BN statistic after
    three steps, to 1e-9 of each tensor's largest entry. Float64 results agree to about 1e-13, so the
    margin is four orders of magnitude on any CPU.
  - float32, the precision that runs (torch_f2m.npz): one base step's loss and every gradient, to a
    tolerance derived from the computation itself (`rounding_tolerance`). After three steps at
    lr 0.1 float32 results are ill-conditioned (a one-ulp change of the initial weights moved a BN
    bias by 2% of its largest entry here), so the three-step equality is held in float64 only.
  - three rounded and clamped fine-tuning steps: equal except entries that came within float error
    of a rounding boundary (counted);
  - the DiscreteBeta sampler's level frequencies (chi-square against the exact probabilities and
    against the transcription's counts) and the TaskSampler epoch structure.
"""
from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from f2m_jax import base as base_lib
from f2m_jax import incremental
from f2m_jax import noise as noise_lib
from f2m_jax import objectives
from f2m_jax.data import augment, protocol
from f2m_jax.models import build_model, split_block

FIXTURES = pathlib.Path(__file__).resolve().parent / 'fixtures'
MEAN = (0.5071, 0.4866, 0.4409)
STD = (0.2009, 0.1984, 0.2023)
BACKWARDS = ('clean', 'noisy')
FLOAT64_TOLERANCE = 1e-9  # relative to each tensor's largest entry; float64 results agree to ~1e-13
UNIT_ROUNDOFF = 2.0 ** -24  # float32's
# How far beyond the computation's own rounding sensitivity (`rounding_spread`) a correct float32
# implementation may land: the spread perturbs the inputs once, by one unit roundoff; an implementation
# that sums in another order rounds at every operation, a few times more.
ROUNDING_FACTOR = 16


def load(name):
  with np.load(FIXTURES / name) as d:
    return {k: d[k] for k in d.files}


@pytest.fixture(scope='module')
def fx():
  return load('torch_f2m.npz')


@pytest.fixture(scope='module')
def fx64():
  return load('torch_f2m_f64.npz')


@pytest.fixture
def x64():
  with jax.enable_x64(True):
    yield


def dtype_of(fx):
  return np.dtype(str(fx['meta/dtype']))


def tree(fx, prefix):
  """The fixture entries under `prefix` as a nested dict (paths split on '/')."""
  n = len(prefix) + 1
  return noise_lib.unflatten({tuple(k[n:].split('/')): jnp.asarray(v) for k, v in fx.items()
                              if k.startswith(prefix + '/')})


def noise_paths(fx):
  return tuple(tuple(p.split('/')) for p in fx['base/noise_names'])


def eps_of(fx, step):
  """The step's M draws {path: [M, ...]}: level index i stands for (i - 2) / 4 * bound_value."""
  dtype = dtype_of(fx)
  b = dtype.type(fx['meta/bound_value']) / dtype.type(2)  # our half-width b
  levels = np.asarray(noise_lib.GRID_LEVELS, dtype)
  return {p: jnp.stack([jnp.asarray(levels[fx[f'base/step{step}/noise{j}/' + '/'.join(p)]] * b)
                        for j in range(int(fx['meta/M']))]) for p in noise_paths(fx)}


def setup(fx, backward='clean', draw_map='unroll'):
  params = tree(fx, 'base/init/params')
  width = params['conv1']['kernel'].shape[-1]
  model = build_model('resnet20', params['fc']['kernel'].shape[-1], width, dtype=dtype_of(fx),
                      clean_backward=backward == 'clean')
  paths = noise_paths(fx)
  objective = base_lib.BaseObjective(
      model=model, noise_paths=paths, split=split_block(model, paths), num_draws=int(fx['meta/M']),
      bound=float(fx['meta/bound_value']) / 2, distribution='discrete_beta', pf_weight=1.0, std_weight=2.0,
      shared_trunk=True, draw_map=draw_map, pf_gradient=False, bn_updates='all_passes')
  tx = base_lib.make_optimizer(float(fx['meta/lr']), 0.9, 5e-4, (), 0.1)
  state = base_lib.TrainState(jnp.zeros((), jnp.int32), params, tree(fx, 'base/init/batch_stats'), tx.init(params))
  return objective, tx, state


def inputs(images, fx=None):
  """Network inputs of uint8 images: in float32 through the code that runs (augment.normalize); in
  float64 the same formula as the transcription's ToTensor + Normalize."""
  if fx is None or dtype_of(fx) == np.float32:
    return augment.normalize(jnp.asarray(images), MEAN, STD)
  return jnp.asarray((images.astype(np.float64) / 255.0 - np.asarray(MEAN)) / np.asarray(STD))


def relative_errors(actual, expected) -> dict:
  """{path: max |a - e| / max |e|} over the leaves of two trees with the same paths."""
  flat_a, flat_e = noise_lib.flatten(actual), noise_lib.flatten(expected)
  assert flat_a.keys() == flat_e.keys()
  return {path: float(np.abs(np.asarray(flat_a[path], np.float64) - np.asarray(e, np.float64)).max()
                      / max(np.abs(np.asarray(e, np.float64)).max(), 1e-30)) for path, e in flat_e.items()}


def assert_close(actual, expected, tol, what):
  """Every leaf to `tol` relative to the leaf's largest magnitude; returns the worst relative error."""
  errors = relative_errors(actual, expected)
  for path, err in errors.items():
    assert err <= tol, f'{what} {"/".join(path)}: relative error {err:.2e} > {tol:.0e}'
  return max(errors.values())


def rounding_spread(fn, params, draws: int = 4) -> float:
  """How far fn(params)'s outputs (a tree) move, relative to each leaf's largest entry, when every
  parameter moves by one ulp up or down (random directions): the largest of `draws` such
  perturbations. This is the computation's own sensitivity to float32 rounding, measured on the
  machine that runs the test."""
  reference = fn(params)
  rng = np.random.default_rng(0)
  worst = 0.0
  for _ in range(draws):
    nudged = jax.tree_util.tree_map(
        lambda v: np.nextafter(np.asarray(v), np.where(rng.random(v.shape) < 0.5, -np.inf, np.inf).astype(v.dtype)),
        params)
    worst = max(worst, max(relative_errors(fn(nudged), reference).values()))
  return worst


def base_step_outputs(fx, backward, draw_map='unroll'):
  """(jitted fn(params) -> (loss, grads, new BN statistics) of step 1, the initial params)."""
  objective, _, state = setup(fx, backward, draw_map)
  x, y = inputs(fx['base/step0/images'], fx), jnp.asarray(fx['base/step0/labels'])
  grad_fn = jax.value_and_grad(base_lib.base_loss, has_aux=True)

  @jax.jit
  def fn(params):
    (loss, (new_stats, _)), grads = grad_fn(params, state.batch_stats, x, y, eps_of(fx, 0), objective)
    return {'loss': loss, 'grads': grads, 'batch_stats': new_stats}

  return fn, state.params


@pytest.mark.parametrize('draw_map', ['unroll', 'vmap'])
@pytest.mark.parametrize('backward', BACKWARDS)
def test_one_base_step_float64(fx64, x64, backward, draw_map):
  fn, params = base_step_outputs(fx64, backward, draw_map)
  out = fn(params)
  np.testing.assert_allclose(float(out['loss']), float(fx64[f'base/{backward}/step0/loss']), rtol=FLOAT64_TOLERANCE)
  assert_close(out['grads'], tree(fx64, f'base/{backward}/step0/grads'), FLOAT64_TOLERANCE, 'gradient')
  assert_close(out['batch_stats'], tree(fx64, f'base/{backward}/step0/batch_stats'), FLOAT64_TOLERANCE,
               'BN statistics after step 1')


@pytest.mark.parametrize('backward', BACKWARDS)
def test_three_base_steps_float64(fx64, x64, backward):
  objective, tx, state = setup(fx64, backward)
  step = jax.jit(lambda s, x, y, e: base_lib.apply_step(s, x, y, e, objective, tx))
  for t in range(3):
    state, metrics = step(state, inputs(fx64[f'base/step{t}/images'], fx64), jnp.asarray(fx64[f'base/step{t}/labels']),
                          eps_of(fx64, t))
    assert bool(metrics['finite'])
  assert_close(state.params, tree(fx64, f'base/{backward}/step2/params'), FLOAT64_TOLERANCE, 'params after 3 steps')
  assert_close(state.batch_stats, tree(fx64, f'base/{backward}/step2/batch_stats'), FLOAT64_TOLERANCE,
               'BN statistics after 3 steps')


@pytest.mark.parametrize('backward', BACKWARDS)
def test_one_base_step_float32(fx, backward):
  """The float32 step that runs, against PyTorch's float32, to ROUNDING_FACTOR times the step's own
  rounding sensitivity (about 6e-6 of a tensor's largest entry here, where the two agree to 5e-6)."""
  fn, params = base_step_outputs(fx, backward)
  tol = ROUNDING_FACTOR * max(rounding_spread(fn, params), UNIT_ROUNDOFF)
  out = fn(params)
  expected = {'loss': jnp.asarray(fx[f'base/{backward}/step0/loss']), 'grads': tree(fx, f'base/{backward}/step0/grads'),
              'batch_stats': tree(fx, f'base/{backward}/step0/batch_stats')}
  worst = assert_close(out, expected, tol, f'float32 step ({backward} backward)')
  print(f'float32 {backward}: worst relative error {worst:.1e}, tolerance {tol:.1e}')


def test_the_two_backwards_differ(fx64, x64):
  """The clean-weight and the noisy-weight backward give different gradients before and inside the
  noised suffix (so neither test above passes by the other's accident), and the same loss."""
  clean, noisy = (tree(fx64, f'base/{b}/step0/grads') for b in BACKWARDS)
  errors = relative_errors(clean, noisy)
  assert errors[('conv1', 'kernel')] > 1e-3 and errors[('layer3_1', 'conv1', 'kernel')] > 1e-3
  assert float(fx64['base/clean/step0/loss']) == float(fx64['base/noisy/step0/loss'])


def test_three_rounded_clamped_finetuning_steps(fx):
  params, stats_ = tree(fx, 'base/clean/step2/params'), tree(fx, 'base/clean/step2/batch_stats')
  model = build_model('resnet20', params['fc']['kernel'].shape[-1], params['conv1']['kernel'].shape[-1])
  paths = noise_paths(fx)
  lr, bound = float(fx['inc/lr']), float(fx['inc/bound_value']) / 2
  settings = incremental.SessionSettings(
      model=model, trainable_paths=paths, steps=3, lr=lr, momentum=0.9, weight_decay=5e-4, bound=bound,
      clamp=True, distance='squared_euclidean', augment='none', image_size=16, mean=MEAN, std=STD,
      round_steps=True)
  tx = incremental.session_optimizer(settings)
  flat = noise_lib.flatten(params)
  trainable = {p: flat[p] for p in paths}
  frozen = {p: v for p, v in flat.items() if p not in trainable}
  anchor = dict(trainable)
  base_protos = jnp.asarray(fx['inc/base_prototypes'])
  num_base = base_protos.shape[0]
  labels = jnp.asarray(np.repeat(np.arange(num_base, num_base + 2), 5))
  stored = jnp.concatenate([base_protos, jnp.zeros((2, base_protos.shape[1]))])
  step = jax.jit(lambda tr, o, x: incremental.session_step(tr, o, frozen, stats_, anchor, x, labels, stored,
                                                           jnp.int32(num_base + 2), settings, tx))
  opt_state, losses = tx.init(trainable), []
  for t in range(3):
    trainable, opt_state, loss = step(trainable, opt_state, inputs(fx[f'inc/step{t}/images']))
    losses.append(float(loss))
  np.testing.assert_allclose(losses, fx['inc/losses'], rtol=1e-5)
  mismatched = near = total = 0
  for p in paths:
    key = '/'.join(p)
    want, got = fx[f'inc/final/{key}'], np.asarray(trainable[p])
    assert np.all(np.abs(got - np.asarray(anchor[p])) <= bound + 1e-7), f'{key} left the box'  # + ulps of the weights
    differ = ~np.isclose(got, want, rtol=0, atol=1e-7)
    mismatched += int(differ.sum())
    near += int(fx[f'inc/near_boundary/{key}'].sum())
    total += got.size
    assert not np.any(differ & ~fx[f'inc/near_boundary/{key}']), (
        f'{key}: {int((differ & ~fx[f"inc/near_boundary/{key}"]).sum())} entries differ away from a rounding boundary')
  print(f'fine-tuning: {mismatched} of {total} entries differ, all among the {near} near a rounding boundary')
  # The fixture exercises the rounding: some entries moved by whole quanta, most not at all.
  moved = np.concatenate([np.abs(np.asarray(trainable[p] - anchor[p])).ravel() for p in paths])
  assert 0.02 < np.mean(moved > bound / 4) < 0.9


def test_discrete_beta_level_frequencies(fx):
  """20,000 one-element draws (each with its own alpha and beta): chi-square against the exact level
  probabilities of the relabelled bins (docs/method.md, 'Bounded noise': 0.26, 0, 0.166, 0.157, 0.417)
  and against the PyTorch transcription's counts. -b/2 never occurs."""
  n = 20000
  eps = noise_lib.sample_noise(jax.random.key(7), {'w': jnp.zeros((1,))}, [('w',)], n, 0.005, 'discrete_beta')
  idx = np.rint(np.asarray(eps[('w',)]).ravel() / 0.0025).astype(int) + 2
  ours, theirs = np.bincount(idx, minlength=5), fx['sampler/level_counts']
  probs = noise_lib.level_probabilities('discrete_beta')
  np.testing.assert_allclose(probs, [0.26, 0.0, 0.166, 0.157, 0.417], atol=2e-3)
  assert ours[1] == 0 and theirs[1] == 0
  keep = [0, 2, 3, 4]
  for counts in (ours, theirs):
    assert stats.chisquare(counts[keep], probs[keep] * counts.sum()).pvalue > 1e-3
  assert stats.chi2_contingency(np.stack([ours[keep], theirs[keep]]))[1] > 1e-3
  assert np.asarray(eps[('w',)]).mean() == pytest.approx(0.005 * float(probs @ np.asarray(noise_lib.GRID_LEVELS)),
                                                         abs=2e-4)


def test_task_sampler_epoch_structure(fx):
  """Our task_epochs batches have the transcription's epoch structure: 60 classes x 16 images ->
  3 batches of 256 = 16 classes x 16 contiguous images, no class twice in an epoch, no image twice
  within a class, the remaining 12 classes dropped."""
  labels = np.repeat(np.arange(60), 20)
  pool = np.arange(len(labels))
  per_epoch = protocol.task_epoch_batches(60, 16, 256)
  epoch = protocol.task_epoch(labels, pool, 16, seed=0, epoch=0)
  ours = [epoch[b * 256:(b + 1) * 256] for b in range(per_epoch)]

  def signature(batches):
    blocks = [labels[b].reshape(-1, 16) for b in batches]
    return {'batches': len(batches), 'sizes': [len(b) for b in batches],
            'contiguous': all((blk == blk[:, :1]).all() for blk in blocks),
            'classes_per_batch': [len(np.unique(blk[:, 0])) for blk in blocks],
            'distinct_classes': len(np.unique(np.concatenate([blk[:, 0] for blk in blocks]))),
            'distinct_images': len(np.unique(np.concatenate(batches)))}

  theirs = list(fx['sampler/epoch_indices'].astype(np.int64))
  assert signature(ours) == signature(theirs) == {
      'batches': 3, 'sizes': [256] * 3, 'contiguous': True, 'classes_per_batch': [16] * 3,
      'distinct_classes': 48, 'distinct_images': 768}
  np.testing.assert_array_equal(fx['sampler/epoch_labels'], labels[np.asarray(theirs)])
  # a function of (seed, epoch): reproducible, and the next epoch is another draw
  np.testing.assert_array_equal(epoch, protocol.task_epoch(labels, pool, 16, seed=0, epoch=0))
  assert not np.array_equal(epoch, protocol.task_epoch(labels, pool, 16, seed=0, epoch=1))


def test_std_term_is_differentiated_as_torch_std(fx):
  """On two nearly equal losses PyTorch's std gradient keeps the rounding of x - mean (its entries
  do not sum to zero); ours is the same to the bit, where plain autodiff of jnp.std is not."""
  x = jnp.asarray(fx['std/x'])
  ours = np.asarray(jax.grad(objectives.unbiased_std)(x))
  np.testing.assert_array_equal(ours, fx['std/grad'])
  assert ours.sum() != 0.0
  assert not np.array_equal(np.asarray(jax.grad(lambda v: jnp.std(v, ddof=1))(x)), fx['std/grad'])
