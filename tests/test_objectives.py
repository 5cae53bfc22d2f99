"""Paper equations on hand-made numbers: PF (Eq. 4), Eq. 3 and the base loss's terms, metric loss (Eq. 5), NCM, PN, PD/AVG/CI."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from f2m_jax import base, evaluation, objectives, stats


def naive_prototype_fixing(clean, noisy, labels, num_classes):
  """Eq. 4's PF term in float64 numpy as the authors' code estimates it, one class at a time: the
  squared distance between a class's mean clean and mean noisy embedding, averaged over the classes
  present in the batch."""
  distances = [np.sum((clean[labels == c].mean(0) - noisy[labels == c].mean(0)) ** 2)
               for c in range(num_classes) if np.any(labels == c)]
  return sum(distances) / len(distances)


def test_prototype_fixing_is_the_mean_over_the_batch_classes_float64():
  """PF is the mean over the classes present in the batch: classes absent from it add nothing and do
  not count, with every class present or only some; it carries a gradient (the original's did not).
  class_means gives an absent class a zero mean and count 0."""
  rng = np.random.default_rng(0)
  num_classes = 6
  clean = rng.normal(size=(9, 5))
  noisy = clean + rng.normal(scale=0.1, size=clean.shape)
  absent = np.array([0, 0, 0, 2, 2, 3, 3, 3, 3])  # classes 1, 4, 5 absent
  every = np.array([0, 1, 2, 3, 4, 5, 0, 2, 5])
  with jax.enable_x64(True):
    pf = lambda labels: objectives.prototype_fixing(jnp.asarray(clean), jnp.asarray(noisy), jnp.asarray(labels),
                                                    num_classes)
    assert pf(absent).dtype == jnp.float64
    means, counts = map(np.asarray, objectives.class_means(jnp.asarray(clean), jnp.asarray(absent), num_classes))
    np.testing.assert_array_equal(counts, [3, 0, 2, 4, 0, 0])
    np.testing.assert_allclose(means[[0, 2, 3]], [clean[absent == c].mean(0) for c in (0, 2, 3)], rtol=1e-12)
    assert not means[[1, 4, 5]].any()
    for labels in (absent, every):
      np.testing.assert_allclose(float(pf(labels)), naive_prototype_fixing(clean, noisy, labels, num_classes),
                                 rtol=1e-12)
    grad = jax.grad(lambda n: objectives.prototype_fixing(jnp.asarray(clean), n, jnp.asarray(absent),
                                                          num_classes))(jnp.asarray(noisy))
    assert float(jnp.abs(grad).sum()) > 0


def test_loss_terms_and_what_the_step_minimises_float64():
  """Eq. 3 as run (base.loss_terms): mean_j L_j + gamma std_j(L_j), L_j = CE_j + lambda PF_j (std of
  {1 + 1, 3 + 2} = 3 / sqrt(2)); with M = 1 no std term; without noise the clean CE. What the step minimises (base.minimised) leaves out
  PF's mean where PF has no gradient, and has the step's gradient: F2M-V's (no std term) is its mean
  CE; with the authors' std term PF still acts, through the std."""
  from conftest import noise_view
  from configs import f2m_v
  out = {'ce': jnp.array([1.0, 3.0]), 'pf': jnp.array([1.0, 2.0]), 'ce_clean': jnp.array(5.0)}
  total = lambda terms: float(sum(terms.values()))
  authors, variant = noise_view(), noise_view(**{f.split('.')[1]: v for f, v in f2m_v.CHOICES.items() if 'noise.' in f})
  assert variant.std_weight == 0 and not variant.pf_gradient and variant.prototype_fixing
  assert total(base.loss_terms(out, variant)) == pytest.approx(2.0 + 1.5)
  assert total(base.loss_terms(out, authors)) == pytest.approx(3.5 + 3 * np.sqrt(2))
  assert total(base.loss_terms(out, noise_view(clean_ce_weight=0.5))) == pytest.approx(3.5 + 3 * np.sqrt(2) + 2.5)
  assert total(base.loss_terms({k: v[:1] for k, v in out.items() if k != 'ce_clean'}, authors)) == pytest.approx(2.0)
  assert base.loss_terms({'ce_clean': out['ce_clean']}, authors) == {'ce': out['ce_clean']}
  assert float(base.minimised(base.loss_terms(out, variant), variant)) == 2.0
  assert float(base.minimised(base.loss_terms(out, authors), authors)) == pytest.approx(2.0 + 3 * np.sqrt(2))
  with_gradient = noise_view(pf_gradient=True)
  assert float(base.minimised(base.loss_terms(out, with_gradient), with_gradient)) == pytest.approx(
      3.5 + 3 * np.sqrt(2))
  with jax.enable_x64(True):
    x = {k: jnp.asarray(v, jnp.float64) for k, v in out.items()}
    for noise in (variant, authors):
      def objective(ce, pick):
        terms = base.loss_terms({**x, 'ce': ce, 'pf': jax.lax.stop_gradient(x['pf'])}, noise)
        return pick(terms, noise)
      grad = lambda pick: np.asarray(jax.grad(objective)(x['ce'], pick))
      np.testing.assert_array_equal(grad(base.minimised), grad(lambda terms, _: sum(terms.values())))


def test_std_term_gradient_at_equal_losses_is_pytorchs():
  """Where the M losses are equal (b = 0) the std is 0: PyTorch's std backward gives 0 there (its
  g / (2 std) masked where std = 0), so Eq. 3's gradient is the mean's alone, not inf * 0 = NaN; elsewhere
  it is d std / dx = (x - mean) / ((n - 1) std)."""
  with jax.enable_x64(True):
    grad = jax.jit(jax.grad(lambda x: jnp.mean(x) + 2.0 * objectives.unbiased_std(x)))
    for x in ([1.0, 1.0], [0.25, 0.25, 0.25]):
      x = jnp.asarray(x, jnp.float64)
      np.testing.assert_array_equal(np.asarray(grad(x)), np.full(len(x), 1.0 / len(x)))
    x = jnp.asarray([1.0, 3.0, 8.0], jnp.float64)
    want = 1.0 / 3 + 2.0 * (x - x.mean()) / (2 * np.std(np.asarray(x), ddof=1))
    np.testing.assert_allclose(np.asarray(grad(x)), want, rtol=1e-13)


def test_metric_loss_uses_batch_means_for_present_classes():
  emb = jnp.array([[1., 0.], [3., 0.]])
  labels = jnp.array([1, 1])
  stored = jnp.array([[0., 0.], [100., 100.]])  # row 1 must be replaced by the batch mean (2, 0)
  squared = jnp.array([[1., 1.], [9., 1.]])  # squared distances to (0,0) and (2,0)
  for distance, logits, rtol in (('squared_euclidean', -squared, 1e-6), ('euclidean', -jnp.sqrt(squared), 1e-5)):
    want = objectives.cross_entropy(logits, labels)
    np.testing.assert_allclose(objectives.metric_loss(emb, labels, stored, distance), want, rtol=rtol)


def test_metric_loss_ignores_padding_rows_and_classes():
  metric_loss = jax.jit(objectives.metric_loss, static_argnums=(3, 4))  # one program, not op by op
  rng = np.random.default_rng(0)
  emb, stored = jnp.asarray(rng.normal(size=(6, 4))), jnp.asarray(rng.normal(size=(5, 4)))
  labels = jnp.array([3, 3, 4, 4, 1, 3])
  loss = metric_loss(emb, labels, stored, 'squared_euclidean')
  padded_emb = jnp.concatenate([emb, jnp.asarray(rng.normal(size=(3, 4)))])  # padding rows: any values
  padded_labels = jnp.concatenate([labels, -jnp.ones(3, labels.dtype)])
  padded_stored = jnp.concatenate([stored, jnp.asarray(rng.normal(size=(2, 4)))])  # two unseen classes
  padded = metric_loss(padded_emb, padded_labels, padded_stored, 'squared_euclidean', num_seen=5)
  np.testing.assert_allclose(padded, loss, rtol=1e-6)
  g = jax.grad(lambda e: metric_loss(e, padded_labels, padded_stored, 'squared_euclidean', 5))(padded_emb)
  np.testing.assert_allclose(g[:6], jax.grad(lambda e: metric_loss(e, labels, stored, 'squared_euclidean'))(emb),
                             rtol=1e-5)
  np.testing.assert_array_equal(g[6:], 0.0)
  # without num_seen the extra rows are classes: the loss changes (the test above can fail)
  assert abs(float(metric_loss(padded_emb, padded_labels, padded_stored, 'squared_euclidean'))
             - float(loss)) > 1e-4


def test_ncm_with_and_without_prototype_normalisation():
  protos = np.array([[10., 0.], [0., 1.]])
  emb = np.array([[1., 1.2], [6., 0.]])
  labels = np.array([1, 0])
  # raw: (1,1.2) is nearest to (0,1); normalised (1,0),(0,1): argmax dot -> class 1 too
  raw = evaluation.ncm_accuracies(emb, labels, protos, num_base=1, normalize=False)
  assert raw['acc'] == 100.0
  emb2 = np.array([[3., 2.5]])  # raw: nearest (0,1) (d=9+2.25) vs (10,0) (49+6.25); normalised: cosine -> class 0
  assert evaluation.ncm_accuracies(emb2, np.array([0]), protos, 1, normalize=False)['acc'] == 0.0
  assert evaluation.ncm_accuracies(emb2, np.array([0]), protos, 1, normalize=True)['acc'] == 100.0
  np.testing.assert_allclose(np.linalg.norm(objectives.normalize_prototypes(jnp.asarray(protos)), axis=1), 1.0)


@pytest.mark.parametrize('normalize', [False, True])
def test_padded_ncm_equals_unpadded_and_compiles_once(normalize):
  """Padded to the benchmark's (test images, classes), every session's NCM gives the predictions of
  its own shapes (padded classes never win, even where real distances are large) in one program."""
  rng = np.random.default_rng(0)
  protos = rng.normal(size=(12, 8)).astype(np.float32) * 5
  emb = rng.normal(size=(300, 8)).astype(np.float32) * 0.1  # nearer the zero padding than any class
  labels = rng.integers(0, 12, 300)
  sessions = []
  for rows, classes in ((100, 6), (200, 9), (300, 12)):
    mine = labels[:rows] < classes
    sessions.append((emb[:rows][mine], labels[:rows][mine], protos[:classes], 4, normalize))
  before = evaluation.ncm_predict_padded._cache_size()
  padded = [evaluation.ncm_accuracies(*args, pad_to=(300, 12)) for args in sessions]
  assert evaluation.ncm_predict_padded._cache_size() - before <= 1  # unpadded, each session compiles anew
  assert padded == [evaluation.ncm_accuracies(*args) for args in sessions]
  assert all(0 < p['acc'] < 100 for p in padded)


def test_breakdown_pd_avg_ci():
  acc = evaluation.ncm_accuracies(np.array([[0., 1.], [1., 0.], [1., 0.]]), np.array([0, 1, 0]),
                                  np.array([[1., 0.], [0., 1.]]), num_base=1, normalize=False)
  # image 0 (class 0) -> class 1 wrong; image 1 (class 1) -> class 0 wrong; image 2 right
  assert acc['acc'] == pytest.approx(100 / 3)
  assert acc['acc_base'] == pytest.approx(50.0) and acc['acc_novel'] == 0.0 and acc['hm'] == 0.0
  s = stats.summarize([50.0, 60.0])
  assert s['mean'] == 55.0 and s['ci95'] == pytest.approx(1.96 * 5.0 / np.sqrt(2))
  per_run = [[{'acc': 70.0, 'acc_base': 70.0, 'acc_novel': None, 'hm': None},
              {'acc': 50.0, 'acc_base': 55.0, 'acc_novel': 30.0, 'hm': 2 * 55 * 30 / 85}],
             [{'acc': 70.0, 'acc_base': 70.0, 'acc_novel': None, 'hm': None},
              {'acc': 40.0, 'acc_base': 45.0, 'acc_novel': 20.0, 'hm': 2 * 45 * 20 / 65}]]
  r = stats.build_results('d', 'f2m', 'draws', [60, 65], per_run)
  assert r['pd']['mean'] == pytest.approx(25.0) and r['pd']['ci95'] == pytest.approx(1.96 * 5 / np.sqrt(2))
  assert r['avg']['mean'] == pytest.approx(57.5)
  assert r['sessions'][0]['acc_novel'] is None and r['sessions'][1]['acc_novel']['mean'] == 25.0


def test_the_accuracy_matrix_is_the_accuracy_on_each_sessions_classes():
  """acc_sessions: the accuracy on the test images of each session's classes (classes 0-1 came in
  session 1, 2 in session 2, 3-4 in session 3); build_results turns them into the accuracy matrix
  (rows: session of origin, columns: after session j) and changes no other key."""
  labels = np.array([0, 0, 1, 1, 2, 2, 3, 4, 4, 4])
  pred = np.array([0, 1, 1, 1, 0, 2, 3, 4, 0, 0])
  acc = evaluation.accuracies_from_predictions(pred, labels, num_base=2, session_ends=(2, 3, 5))
  np.testing.assert_allclose(acc['acc_sessions'], [75.0, 50.0, 50.0])
  assert acc['acc'] == pytest.approx(60.0) and acc['acc_base'] == pytest.approx(75.0)
  assert 'acc_sessions' not in evaluation.accuracies_from_predictions(pred, labels, num_base=2)
  plain = lambda base, s2: {'acc': base, 'acc_base': base, 'acc_novel': None if s2 is None else s2, 'hm': None}
  per_run = [[{**plain(80.0, None), 'acc_sessions': [80.0]}, {**plain(70.0, 40.0), 'acc_sessions': [70.0, 40.0]}],
             [{**plain(60.0, None), 'acc_sessions': [60.0]}, {**plain(50.0, 20.0), 'acc_sessions': [50.0, 20.0]}]]
  with_matrix = stats.build_results('d', 'f2m', 'draws', [2, 3], per_run)
  without = stats.build_results('d', 'f2m', 'draws', [2, 3],
                                     [[{k: v for k, v in s.items() if k != 'acc_sessions'} for s in r] for r in per_run])
  matrix = with_matrix.pop('accuracy_matrix')
  assert with_matrix == without
  assert matrix['mean'] == [[70.0, 60.0], [None, 30.0]]
  assert matrix['ci95'][0][1] == pytest.approx(1.96 * 10 / np.sqrt(2)) and matrix['ci95'][1][0] is None
  assert matrix['runs'] == [[[80.0, 70.0], [None, 40.0]], [[60.0, 50.0], [None, 20.0]]]
