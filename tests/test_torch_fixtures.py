"""The JAX code against what the authors' PyTorch code computes, step by step and session by session.

The fixtures come from the PyTorch transcription in tests/torch_reference/ (`python
tests/torch_reference/make_fixtures.py` rewrites them where torch is installed); these tests need no
torch. The JAX side is built from configs/cifar100.py, the authors' values, with only what the
fixture scales changed (a width-3 net on 16 px images, the noise bound, the base milestone), and the
noise set it derives from its own network; the transcription runs with the authors' values, and
`test_the_cifar_config_holds_the_authors_values` checks the two agree. Same weights, same batches,
same explicit noise, same augmented images:
  - float64 on both sides (tests/fixtures/torch_f2m_f64.npz; JAX with 64-bit enabled), under both of
    PyTorch's backward behaviours ('noisy': their code on PyTorch <= 1.9, the default; 'clean': on
    >= 1.10): one base step's loss, every gradient and the BN statistics, and every parameter and BN
    statistic after three steps whose third runs past the learning-rate milestone, to 1e-9 of each
    tensor's largest entry (the two sides agree to about 1e-13: four orders of magnitude of margin
    on any CPU). Then two runs of three incremental sessions through NCMRunner: the base prototypes,
    six full-batch augmented steps per session from a fresh optimizer, rounded and clamped to
    phi* +- b, the network carried to the run's next session, the novel prototypes recomputed, NCM
    with PN: the fine-tuned weights, the prototypes to 1e-9 and the accuracies exactly. And a session
    at a bound where the doubled-step retry fires.
  - float32, the precision that runs (torch_f2m.npz): one base step to a tolerance derived from the
    computation itself (`rounding_tolerance`); the sessions with every weight equal except entries
    that came within float error of a rounding boundary. After three steps at lr 0.1 float32 results
    are ill-conditioned (a one-ulp change of the initial weights moved a BN bias by 2% of its
    largest entry), so the three-step equality is held in float64 only.
  - the DiscreteBeta sampler: level frequencies of one-element draws (chi-square against the exact
    probabilities and the transcription's counts), and of whole-layer draws, whose frequencies vary
    from draw to draw as they must with one (alpha, beta) per layer and draw; the TaskSampler epoch.
"""
from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from scipy import stats

from configs import cifar100
from f2m_jax import base as base_lib
from f2m_jax import evaluation
from f2m_jax import incremental
from f2m_jax import noise as noise_lib
from f2m_jax import objectives, optim
from f2m_jax import trees
from f2m_jax.data import augment, protocol
from f2m_jax.data import cifar100 as cifar100_data
from f2m_jax.data.types import Benchmark, Split
from f2m_jax.experiment import Experiment
from f2m_jax.methods import common, ncm
from f2m_jax.run import pipeline

FIXTURES = pathlib.Path(__file__).resolve().parent / 'fixtures'
BACKWARDS = ('noisy', 'clean')
SESSIONS = (2, 3, 4)
FLOAT64_TOLERANCE = 1e-9  # relative to each tensor's largest entry; float64 results agree to ~1e-13
UNIT_ROUNDOFF = 2.0 ** -24  # float32's
# How far beyond the computation's own rounding sensitivity (`rounding_spread`) a correct float32
# implementation may land: the spread perturbs the inputs once, by one ulp; an implementation that
# sums in another order rounds at every operation, a few times more.
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
  return trees.unflatten({tuple(k[n:].split('/')): jnp.asarray(v) for k, v in fx.items()
                              if k.startswith(prefix + '/')})


def flat(fx, prefix) -> dict:
  return trees.flatten(tree(fx, prefix))


def benchmark(fx) -> Benchmark:
  """The fixture's images as a Benchmark: train = the base images then the shot pool, 6 base classes
  and sessions of 2 classes, 16 px, CIFAR's normalisation and augmentation."""
  base, pool = fx['sessions/base_images'], fx['sessions/pool_images']
  labels = np.concatenate([fx['sessions/base_labels'], fx['sessions/pool_labels']]).astype(np.int32)
  classes = int(labels.max()) + 1
  base_classes = len(np.unique(fx['sessions/base_labels']))
  way = 2
  session_classes = (tuple(range(base_classes)),) + tuple(
      tuple(range(c, c + way)) for c in range(base_classes, classes, way))
  return Benchmark(name='fixture', train=Split(np.concatenate([base, pool]), labels),
                   test=Split(fx['sessions/test_images'], fx['sessions/test_labels'].astype(np.int32)),
                   base_train=np.arange(len(base)), session_classes=session_classes,
                   shot_pool=np.arange(len(base), len(labels)), topic_shots=None, image_size=base.shape[1],
                   mean=cifar100_data.MEAN, std=cifar100_data.STD, augment='crop_flip')


def experiment(fx, backward='noisy', bound=None) -> Experiment:
  """configs/cifar100.py with only what the fixture scales changed; the network in the fixture's dtype."""
  config = cifar100.get_config()
  config.model.width = int(fx['base/init/params/conv1/kernel'].shape[-1])
  config.noise.bound = float(fx['meta/bound_value']) / 2 if bound is None else bound
  config.base.milestones = (int(fx['meta/milestone']),)
  config.noise.backward_weights = backward
  exp = Experiment.create(pipeline.resolve(config, reads_data=False), benchmark(fx))
  return dataclasses.replace(exp, model=exp.model.clone(dtype=dtype_of(fx).type))


def eps_of(fx, step):
  """The step's M draws {path: [M, ...]}: level index i stands for (i - 2) / 4 * bound_value."""
  dtype = dtype_of(fx)
  b = dtype.type(fx['meta/bound_value']) / dtype.type(2)  # our half-width b
  levels = np.asarray(noise_lib.GRID_LEVELS, dtype)
  return {p: jnp.stack([jnp.asarray(levels[fx[f'base/step{step}/noise{j}/' + '/'.join(p)]] * b)
                        for j in range(int(fx['meta/M']))]) for p in noise_paths(fx)}


def noise_paths(fx):
  return tuple(tuple(p.split('/')) for p in fx['base/noise_names'])


def inputs(images, fx=None):
  """Network inputs of uint8 images: in float32 through the code that runs (augment.normalize); in
  float64 the same formula as the transcription's ToTensor + Normalize."""
  mean, std = cifar100_data.MEAN, cifar100_data.STD
  if fx is None or dtype_of(fx) == np.float32:
    return augment.normalize(jnp.asarray(images), mean, std)
  return jnp.asarray((images.astype(np.float64) / 255.0 - np.asarray(mean)) / np.asarray(std))


def relative_errors(actual, expected) -> dict:
  """{path: max |a - e| / max |e|} over the leaves of two trees with the same paths."""
  flat_a, flat_e = trees.flatten(actual), trees.flatten(expected)
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


# ----------------------------------------------------------------------------- configuration

def test_the_cifar_config_holds_the_authors_values(fx64):
  """The values the transcription ran with (their CIFAR-100 YAMLs) are configs/cifar100.py's: a
  changed default would make every test below compare something else, so it fails here by name."""
  c, a = cifar100.get_config(), {k[len('authors/'):]: float(v) for k, v in fx64.items() if k.startswith('authors/')}
  ours = {'base_lr': c.base.lr, 'momentum': c.base.momentum, 'weight_decay': c.base.weight_decay,
          'lr_gamma': c.base.lr_gamma, 'M': c.noise.M, 'std_weight': c.noise.std_weight,
          'pf_weight': c.noise.pf_weight, 'inc_lr': c.incremental.lr, 'inc_steps': c.incremental.steps,
          'num_layers': c.noise.num_layers, 'bound_value': 2 * c.noise.bound}
  assert ours == pytest.approx(a), {k: (ours[k], a[k]) for k in a if ours[k] != pytest.approx(a[k])}
  assert (c.incremental.momentum, c.incremental.weight_decay) == (c.base.momentum, c.base.weight_decay)
  assert (c.noise.distribution, c.noise.bn_updates, c.noise.pf_gradient, c.incremental.round_steps,
          c.incremental.clamp, c.incremental.distance, c.incremental.trainable, c.eval.normalize_prototypes) == (
              'discrete_beta', 'all_passes', False, True, True, 'squared_euclidean', 'noise_set', True)


def test_the_noise_set_is_derived_alike(fx64):
  """Each side picks the noise set from its own network: theirs by parameter names (ending in
  `weight`, containing `conv`, not `shortcut`, the last 4 in registration order), ours from the
  network's structure (models.noise_set_paths)."""
  assert experiment(fx64).noise_paths == noise_paths(fx64)


# ----------------------------------------------------------------------------- base session

def base_step_outputs(fx, backward, draw_map='unroll'):
  """(jitted fn(params) -> (loss, grads, new BN statistics) of step 1, the initial params)."""
  exp = experiment(fx, backward)
  noise = ml_collections.FrozenConfigDict({**exp.loss, 'draw_map': draw_map})
  params, stats_ = tree(fx, 'base/init/params'), tree(fx, 'base/init/batch_stats')
  x, y = inputs(fx['base/step0/images'], fx), jnp.asarray(fx['base/step0/labels'])
  grad_fn = jax.value_and_grad(base_lib.base_loss, has_aux=True)

  @jax.jit
  def fn(params):
    (loss, (new_stats, _)), grads = grad_fn(params, stats_, x, y, eps_of(fx, 0), exp.model, noise)
    return {'loss': loss, 'grads': grads, 'batch_stats': new_stats}

  return fn, params


# Each backward once and each way of mapping the draws once (tests/test_objective_equivalence.py
# compares the two maps directly): every case is a compile of its own, so the grid is not crossed.
@pytest.mark.parametrize('backward,draw_map', [('noisy', 'vmap'), ('clean', 'unroll')])
def test_one_base_step_float64(fx64, x64, backward, draw_map):
  fn, params = base_step_outputs(fx64, backward, draw_map)
  out = fn(params)
  np.testing.assert_allclose(float(out['loss']), float(fx64[f'base/{backward}/step0/loss']), rtol=FLOAT64_TOLERANCE)
  assert_close(out['grads'], tree(fx64, f'base/{backward}/step0/grads'), FLOAT64_TOLERANCE, 'gradient')
  assert_close(out['batch_stats'], tree(fx64, f'base/{backward}/step0/batch_stats'), FLOAT64_TOLERANCE,
               'BN statistics after step 1')


@pytest.mark.slow
@pytest.mark.parametrize('backward', BACKWARDS)
def test_three_base_steps_across_the_milestone_float64(fx64, x64, backward):
  """Steps 1 and 2 at lr 0.1, step 3 at 0.1 x 0.01 (the milestone), with the optimizer built from the
  config (Experiment.optimizer_settings) as a run builds it."""
  exp = experiment(fx64, backward)
  tx = optim.sgd(*exp.optimizer_settings())
  params = tree(fx64, 'base/init/params')
  state = base_lib.TrainState(jnp.zeros((), jnp.int32), params, tree(fx64, 'base/init/batch_stats'), tx.init(params))
  step = jax.jit(lambda s, x, y, e: base_lib.train_step(s, x, y, e, exp.model, exp.loss, tx))
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
  rounding sensitivity (about 6e-6 of a tensor's largest entry, where the two agree to 5e-6)."""
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
  clean, noisy = (tree(fx64, f'base/{b}/step0/grads') for b in ('clean', 'noisy'))
  errors = relative_errors(clean, noisy)
  assert errors[('conv1', 'kernel')] > 1e-3 and errors[('layer3_1', 'conv1', 'kernel')] > 1e-3
  assert float(fx64['base/clean/step0/loss']) == float(fx64['base/noisy/step0/loss'])


# ----------------------------------------------------------------------------- incremental sessions

class FedFinetune:
  """NCMRunner's fine-tuning with the augmentation taken from the fixture: `finetune(params, batch_stats,
  anchor, images, labels, stored, num_seen, key)` runs incremental.finetune_session, step i on the fixture's
  augmented images of step i under `prefix` (the key, which draws our own augmentation, is unused)."""

  def __init__(self, fx, settings):
    self.fx, self.settings, self.prefix = fx, settings, None
    paths = settings.trainable_paths

    @jax.jit
    def run(params, batch_stats, anchor, steps_images, labels, stored, num_seen):
      tree_ = trees.flatten(params)
      trainable = {p: tree_[p] for p in paths}
      frozen = {p: v for p, v in tree_.items() if p not in set(paths)}
      trainable, losses = incremental.finetune_session(
          trainable, frozen, batch_stats, anchor, lambda i: steps_images[i], labels, stored, num_seen, settings)
      return trees.unflatten({**frozen, **trainable}), losses

    self.run = run

  def __call__(self, params, batch_stats, anchor, images, labels, stored, num_seen, key):
    del images, key  # the fixture's augmented views of the same images, in the same order
    # The session as NCMRunner padded it to the last session's size, so one program serves every
    # session: the fixture's views of the session's own images, then zero images in the padded rows
    # (label -1), which the loss must ignore.
    rows = len(labels)
    steps = jnp.stack([inputs(self.fx[f'{self.prefix}/step{k}/images'], self.fx)
                       for k in range(self.settings.steps)])
    steps = jnp.pad(steps, ((0, 0), (0, rows - steps.shape[1]), (0, 0), (0, 0), (0, 0)))
    return self.run(params, batch_stats, anchor, steps, labels, stored, num_seen)


def session_runner(fx, bound):
  """NCMRunner on phi* (the base model of the noisy backward after 3 steps) with the fixture's
  augmentation fed to its fine-tuning; and the base prototypes it computed."""
  exp = experiment(fx, bound=bound)
  variables = {'params': tree(fx, 'base/noisy/step2/params'), 'batch_stats': tree(fx, 'base/noisy/step2/batch_stats')}
  variables = jax.tree_util.tree_map(np.asarray, variables)
  prototypes = common.base_prototypes(exp, variables)
  runner = ncm.NCMRunner(exp, {**variables, 'prototypes': prototypes})
  runner.finetune = FedFinetune(fx, ncm.session_settings(exp, runner.paths))
  return exp, runner, prototypes


def torch_accuracies(fx, exp, key: str, session: int) -> dict:
  labels = exp.bench.test.labels[protocol.test_indices(exp.bench, session)]
  return evaluation.accuracies_from_predictions(fx[key], labels, exp.bench.num_base_classes,
                                                evaluation.session_ends(exp.bench, session))


def compare_session(fx, runner, state, prefix, exact: bool) -> tuple:
  """(entries differing, entries near a rounding boundary, entries) of the run's noise set after a
  session against the fixture: float64 (`exact`) to FLOAT64_TOLERANCE everywhere; float32 equal up to
  float rounding except entries that came within float error of a rounding boundary."""
  got, want = trees.flatten(state[0]), flat(fx, f'{prefix}/params')
  differ = near = total = 0
  for path in runner.paths:
    g, w = np.asarray(got[path], np.float64), np.asarray(want[path], np.float64)
    scale = np.abs(w).max()
    off = np.abs(g - w) > (FLOAT64_TOLERANCE if exact else 1e-5) * scale
    boundary = fx[f'{prefix}/near_boundary/' + '/'.join(path)]
    if exact:
      assert not off.any(), f'{prefix} {path}: {int(off.sum())} entries differ'
    else:
      assert not np.any(off & ~boundary), f'{prefix} {path}: entries differ away from a rounding boundary'
    differ, near, total = differ + int(off.sum()), near + int(boundary.sum()), total + off.size
  return differ, near, total


@pytest.mark.slow
@pytest.mark.parametrize('precision', ['float64', 'float32'])
def test_two_runs_of_three_sessions(fx, fx64, precision):
  """Their incremental procedure against NCMRunner, run by run and session by session: base
  prototypes, six full-batch augmented steps from a fresh optimizer, rounded and clamped to the box
  around phi* (not around the previous session), the network carried to the run's next session,
  the novel prototypes recomputed from all shots seen so far, NCM with PN."""
  fx = fx64 if precision == 'float64' else fx
  exact = precision == 'float64'
  with jax.enable_x64(exact):
    bound = float(fx['sessions/bound_value']) / 2
    exp, runner, base_protos = session_runner(fx, bound)
    tol = FLOAT64_TOLERANCE if exact else 1e-5
    np.testing.assert_allclose(base_protos, fx['sessions/base_prototypes'], rtol=0,
                               atol=tol * np.abs(fx['sessions/base_prototypes']).max())
    assert runner.first_accuracies() == torch_accuracies(fx, exp, 'sessions/session1/predictions', 1)
    offset = len(exp.bench.base_train)  # the pool's images follow the base images in train
    anchor = trees.flatten(tree(fx, 'base/noisy/step2/params'))
    counts = np.zeros(3, int)
    for run in range(2):
      state = runner.start()
      for session in SESSIONS:
        prefix = f'sessions/run{run}/session{session}'
        runner.finetune.prefix = prefix
        state, info = runner.update(state, run, session, offset + fx[f'{prefix}/shots'].astype(np.int64))
        np.testing.assert_allclose(info['losses'], fx[f'{prefix}/losses'], rtol=tol)
        counts += compare_session(fx, runner, state, prefix, exact)
        moved = {p: np.abs(np.asarray(trees.flatten(state[0])[p]) - np.asarray(anchor[p])) for p in runner.paths}
        for p, m in moved.items():  # inside the box around phi*, up to the rounding of phi* +- b
          assert m.max() <= bound + 2 * np.spacing(np.abs(np.asarray(anchor[p])).max()), p
        np.testing.assert_allclose(state[1], fx[f'{prefix}/prototypes'], rtol=0,
                                   atol=tol * np.abs(fx[f'{prefix}/prototypes']).max())
        assert runner.accuracies(state, session) == torch_accuracies(fx, exp, f'{prefix}/predictions', session)
    # The fixture exercises the rounding and the clamp: some entries at the wall of the box.
    at_wall = np.mean([np.mean(np.isclose(m, bound, rtol=1e-4)) for m in moved.values()])
    assert at_wall > 0.01, at_wall
  print(f'{precision}: {counts[0]} of {counts[2]} entry-sessions differ, '
        f'all among the {counts[1]} near a rounding boundary')


@pytest.mark.slow
@pytest.mark.parametrize('retry', [True, False])
def test_the_doubled_step_retry(fx64, x64, retry, monkeypatch):
  """A session at a bound where whole tensors round to zero and their doubled step is taken instead
  (the fixture records where). Without the retry the same session ends elsewhere, so the equality
  with it is the retry's."""
  fx = fx64
  assert fx['retry/retried'].any()
  if not retry:
    monkeypatch.setattr(incremental, 'round_gradient',
                        lambda g, lr, quantum: jnp.round(lr * g / quantum) * quantum / lr)
  exp, runner, _ = session_runner(fx, float(fx['retry/bound_value']) / 2)
  runner.finetune.prefix = 'retry'
  state, _ = runner.update(runner.start(), 0, 2, len(exp.bench.base_train) + fx['retry/shots'].astype(np.int64))
  errors = relative_errors(trees.unflatten({p: trees.flatten(state[0])[p] for p in runner.paths}),
                           tree(fx, 'retry/params'))
  if retry:
    assert max(errors.values()) <= FLOAT64_TOLERANCE, errors
  else:
    assert max(errors.values()) > 1e-3, errors


# ----------------------------------------------------------------------------- samplers

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


def test_one_alpha_beta_pair_per_layer_and_draw(fx):
  """300 draws of a 1,000-element layer. With one (alpha, beta) per layer and draw, as theirs, a
  draw's share of the level +b ranges over the 49 pairs' probabilities (a spread of about 0.3); with
  a pair per element every draw would hold about 0.42 +- 0.016. Ours and the transcription's shares
  come from one distribution (two-sample Kolmogorov-Smirnov) and spread as per layer."""
  n, size = 300, 1000
  eps = noise_lib.sample_noise(jax.random.key(11), {'w': jnp.zeros((size,))}, [('w',)], n, 0.2, 'discrete_beta')
  idx = np.rint(np.asarray(eps[('w',)]) / 0.1).astype(int) + 2
  ours = (idx == 4).mean(axis=1)
  counts = fx['sampler/layer_level_counts']
  theirs = counts[:, 4] / counts.sum(axis=1)
  p = noise_lib.level_probabilities('discrete_beta')[4]
  per_element_std = np.sqrt(p * (1 - p) / size)
  for shares in (ours, theirs):
    assert shares.std() > 10 * per_element_std, shares.std()
  assert stats.ks_2samp(ours, theirs).pvalue > 1e-3


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
