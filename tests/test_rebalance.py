"""Rebalance / LUCIR (f2m_jax/methods/rebalance.py): the cosine classifier, the less-forget and
inter-class separation terms against transcriptions of the authors' PyTorch losses (numpy for torch),
then the method end to end on a tiny synthetic protocol: the old classes' columns stay frozen."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import init_variables, tiny_method_run, tiny_protocol
from f2m_jax import experiment as experiment_lib
from f2m_jax.methods import rebalance
from f2m_jax.models import build_model, uniform_columns
from f2m_jax.run import pipeline
from f2m_jax.stats import KEYS as ACCURACY_KEYS


def test_cosine_classifier_logits_and_init():
  model = build_model('resnet20', 5, 4, head='cosine')
  x = jax.random.normal(jax.random.key(0), (3, 16, 16, 3))
  variables = init_variables(model, 16, jax.random.key(1))
  fc = variables['params']['fc']
  assert set(fc) == {'kernel', 'sigma'} and float(fc['sigma']) == 1.0
  params = {**variables['params'], 'fc': {'kernel': fc['kernel'], 'sigma': jnp.float32(3.0)}}
  embedding, logits = jax.jit(lambda v: model.apply(v, x, train=False))({**variables, 'params': params})
  e, w = np.asarray(embedding, np.float64), np.asarray(fc['kernel'], np.float64)
  want = 3.0 * (e / np.linalg.norm(e, axis=1, keepdims=True)) @ (w / np.linalg.norm(w, axis=0, keepdims=True))
  np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-6)
  wide = np.asarray(uniform_columns(jax.random.key(2), (64, 5000)))
  assert np.abs(wide).max() <= 1 / 8 and abs(wide.std() / (1 / 8 / np.sqrt(3)) - 1) < 0.01  # U(-1/sqrt(64), ..)


def test_less_forget_is_the_authors_cosine_embedding_loss():
  rng = np.random.default_rng(0)
  former, current = rng.normal(size=(6, 10)), rng.normal(size=(6, 10))
  # torch.nn.CosineEmbeddingLoss()(former, current, ones): mean(1 - cos), eps 1e-12 on squared norms
  cos = (former * current).sum(1) / np.sqrt(((former ** 2).sum(1) + 1e-12) * ((current ** 2).sum(1) + 1e-12))
  weight = rebalance.adaptive_weight(5.0, 60, 5)
  np.testing.assert_allclose(weight, 5.0 * np.sqrt(12.0), rtol=1e-6)
  np.testing.assert_allclose(rebalance.less_forget(jnp.asarray(former, jnp.float32), jnp.asarray(current, jnp.float32),
                                                   weight), weight * np.mean(1 - cos), rtol=1e-5)
  same = jnp.asarray(former, jnp.float32)
  assert abs(float(rebalance.less_forget(same, 2 * same, 1.0))) < 1e-6  # the norm does not matter


def authors_separation(scores: np.ndarray, labels: np.ndarray, num_old: int, k: int, margin: float,
                       weight: float) -> float:
  """Their InterClassSeparation.forward, transcribed: every column from num_old on is a new class."""
  gt = scores[np.arange(len(labels)), labels]
  top = -np.sort(-scores[:, num_old:], axis=1)[:, :k]
  hard = labels < num_old
  if not hard.any():
    return 0.0
  pairs = np.repeat(gt[hard][:, None], k, axis=1).reshape(-1), top[hard].reshape(-1)
  return weight * np.mean(np.maximum(0.0, -(pairs[0] - pairs[1]) + margin))  # MarginRankingLoss, y = 1


def test_inter_class_separation_equals_the_authors():
  rng = np.random.default_rng(1)
  scores = rng.uniform(-1, 1, size=(8, 9))
  labels = np.array([0, 5, 2, 6, 7, 1, 3, 4])
  for num_old, k in ((5, 2), (6, 3), (7, 1)):
    want = authors_separation(scores, labels, num_old, k, 0.5, 1.5)
    got = rebalance.inter_class_separation(jnp.asarray(scores, jnp.float32), jnp.asarray(labels), num_old, 9,
                                           k, 0.5, 1.5)
    np.testing.assert_allclose(got, want, rtol=1e-5)
  # columns past num_seen (classes not seen yet) are no candidates: the same as cutting them off
  padded = np.concatenate([scores, np.full((8, 3), 0.99)], axis=1)
  got = rebalance.inter_class_separation(jnp.asarray(padded, jnp.float32), jnp.asarray(labels), 5, 9, 2, 0.5, 1.0)
  np.testing.assert_allclose(got, authors_separation(scores, labels, 5, 2, 0.5, 1.0), rtol=1e-5)
  # no image of an old class: 0
  assert float(rebalance.inter_class_separation(jnp.asarray(scores, jnp.float32), jnp.asarray(labels), 0, 9,
                                                2, 0.5, 1.0)) == 0.0


def test_masked_cross_entropy_ignores_unseen_columns():
  logits = jnp.asarray(np.random.default_rng(2).normal(size=(4, 7)), jnp.float32)
  labels = jnp.array([0, 1, 4, 2])
  cut = np.asarray(logits)[:, :5]
  want = np.mean(np.log(np.exp(cut).sum(1)) - cut[np.arange(4), np.asarray(labels)])
  np.testing.assert_allclose(rebalance.masked_cross_entropy(logits, labels, 5), want, rtol=1e-5)


def test_cosine_classifier_test_float64():
  """The authors' Rebalance test (`test_type: CNN`): the argmax of sigma * cos(f(x), w_c) over the
  seen classes, in float64 against numpy; the zero columns of classes not seen yet never win, also
  where every seen cosine is negative (a plain argmax would pick them: they score 0)."""
  rng = np.random.default_rng(4)
  emb = rng.normal(size=(7, 6))
  kernel = np.concatenate([rng.normal(size=(6, 5)), np.zeros((6, 3))], axis=1)  # 5 seen, 3 unseen columns
  kernel[:, 0] = -emb[0] + 0.01 * rng.normal(size=6)  # image 0: every seen cosine negative
  kernel[:, 1:5] = np.abs(kernel[:, 1:5]) * -np.sign(emb[0])[:, None]
  sigma = 4.5
  unit = lambda a, axis: a / np.linalg.norm(a, axis=axis, keepdims=True)
  want = sigma * unit(emb, 1) @ unit(kernel[:, :5], 0)
  assert np.all(want[0] < 0)
  with jax.enable_x64(True):
    scores = np.asarray(jax.jit(rebalance.cosine_classifier_scores)(jnp.asarray(emb), jnp.asarray(kernel),
                                                                      jnp.float64(sigma), 5))
  assert scores.dtype == np.float64
  np.testing.assert_allclose(scores[:, :5], want, rtol=1e-12, atol=1e-14)
  assert np.all(scores[:, 5:] == -np.inf)
  np.testing.assert_array_equal(scores.argmax(1), want.argmax(1))
  assert np.argmax(sigma * unit(emb, 1)[:1] @ np.concatenate([unit(kernel[:, :5], 0), kernel[:, 5:]], 1)) >= 5


def test_rebalance_defaults_are_the_authors():
  """method=rebalance as the authors' NCM configs run it (incremental_res18_<dataset>_NCM_5shots_SGD.yml,
  the loss block their Rebalance_model.py reads): lambda_base 4 (miniImageNet 3, CUB 5), K 2, weight 1,
  margin 0.5; 2 exemplars per class drawn at random; 90 epochs of batch 120, lr 0.1 (1e-2 on
  miniImageNet and CUB) x 0.1 after epochs 50 and 70; the cosine classifier's test; colour jitter (0.4)
  in the sessions on miniImageNet only."""
  from configs import cifar100, cub200, mini
  config = cifar100.get_config()
  config.method = 'rebalance'
  config = pipeline.resolve(config, reads_data=False)
  assert config.model.head == 'cosine' and config.base.sampler == 'shuffle' and not config.noise.enabled
  assert dict(config.rebalance) == dict(memory=2, exemplars='random', epochs=90, batch_size=120, lr=0.1,
                                        milestones=(50, 70), lr_gamma=0.1, momentum=0.9, weight_decay=5e-4,
                                        lambda_base=4.0, K=2, margin=0.5, weight=1.0, classifier='cosine',
                                        color_jitter=0.0)
  mini_r, cub_r = mini.get_config().rebalance, cub200.get_config().rebalance
  assert (mini_r.lambda_base, mini_r.lr, mini_r.color_jitter) == (3.0, 1e-2, 0.4)
  assert (cub_r.lambda_base, cub_r.lr, cub_r.color_jitter) == (5.0, 1e-2, 0.0)


def tiny():
  """Rebalance's own base session (cosine classifier) learns more slowly than the linear one: 80 base
  steps instead of 40, for a session 1 clearly above chance."""
  config = tiny_protocol('rebalance', epochs=3, milestones=(2,), batch_size=8)
  config.base.update(steps=80, milestones=(60,))
  return config


@pytest.fixture(scope='module')
def rebalance_run(tmp_path_factory):
  return tiny_method_run(tmp_path_factory, tiny)


@pytest.mark.slow
def test_rebalance_end_to_end_keeps_old_columns(rebalance_run):
  from f2m_jax.data import protocol
  exp, ck, first = rebalance_run.exp, rebalance_run.ckpts, rebalance_run.first
  assert exp.config.model.head == 'cosine'
  runner = rebalance.RebalanceRunner(exp, first)
  memories = []
  for run in range(2):
    shots = [protocol.session_shots(exp.bench, 'draws', run, t, 5, 0) for t in (2, 3)]
    saved = [ck.run(run).restore({**runner.template(t), 'exemplars': np.concatenate(shots[:t - 1]),
                                  'accuracy': np.zeros(len(ACCURACY_KEYS))}, t) for t in (2, 3)]
    kernels = [np.asarray(first['params']['fc']['kernel'])] + [s['params']['fc']['kernel'] for s in saved]
    np.testing.assert_array_equal(kernels[1][:, :6], kernels[0])  # the base columns, frozen in session 2
    np.testing.assert_array_equal(kernels[2][:, :8], kernels[1][:, :8])  # and session 2's in session 3
    assert not np.array_equal(kernels[2][:, 8:], 0) and np.all(kernels[1][:, 8:] == 0)  # unseen: still zero
    assert saved[1]['params']['fc']['sigma'] != first['params']['fc']['sigma']  # the scale is trained
    assert np.bincount(exp.bench.train.labels[saved[1]['memory']], minlength=10).tolist() == [2] * 10
    memories.append(saved[1]['memory'])
  assert set(memories[0][:12]) <= set(exp.bench.base_train)
  assert not np.array_equal(memories[0][:12], memories[1][:12])  # drawn at random, each run its own
  assert 'prototype_norms' not in rebalance_run.results  # classified by the cosine classifier, not by means


def test_k_larger_than_a_session_is_refused():
  from f2m_jax.data import sources
  config = tiny()
  config.rebalance.K = 3  # sessions of 2 new classes
  config = pipeline.resolve(config)
  exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
  with pytest.raises(ValueError, match='rebalance.K=3 exceeds the 2 new classes'):
    rebalance.RebalanceRunner(exp, first=None)


def test_zero_columns_have_finite_gradients():
  """A class not seen yet has an all-zero column, left out of the loss: its gradient is 0, not NaN
  (the gradient of a norm at 0 is)."""
  from f2m_jax.models import cosine_scores
  kernel = jnp.zeros((4, 3)).at[:, 0].set(jnp.arange(1.0, 5.0))
  grad = jax.grad(lambda w: jnp.sum(cosine_scores(jnp.ones((2, 4)), w)[:, 0]))(kernel)
  assert np.isfinite(np.asarray(grad)).all() and np.all(np.asarray(grad)[:, 1:] == 0)
