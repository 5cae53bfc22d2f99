"""FSLL (f2m_jax/methods/fsll.py): its parts against transcriptions of the authors' losses and
hand-made cases, then the method end to end on a tiny synthetic protocol, resumed to the same results."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from conftest import resumed_after_interruption, tiny_method_run, tiny_protocol, without_provenance
from f2m_jax import trees
from f2m_jax.data import protocol
from f2m_jax.methods import fsll


def authors_triplet(emb: np.ndarray, labels: np.ndarray, num_instances: int, margin: float = 0.0) -> float:
  """Their TripletLossNoHardMining.forward, transcribed (torch ops as numpy)."""
  n = len(emb)
  sq = (emb ** 2).sum(axis=1, keepdims=True)
  dist = np.sqrt(np.clip(sq + sq.T - 2 * emb @ emb.T, 1e-12, None))
  mask = labels[None, :] == labels[:, None]
  ap, an = [], []
  for i in range(n):
    for j in range(num_instances - 1):
      ap.append(dist[i][mask[i]][j + 1])
      an.append(dist[i][~mask[i]][j + 1])
  return float(np.mean(np.maximum(0.0, -(np.array(an) - np.array(ap)) + margin)))


def test_triplet_equals_the_authors_loop():
  rng = np.random.default_rng(0)
  labels = np.repeat(np.arange(5), 5)  # the TaskSampler's class-contiguous batch
  for order in (np.arange(25), rng.permutation(25)):  # and any order
    for margin in (0.0, 0.3):
      emb = rng.normal(size=(25, 8)).astype(np.float32)
      got = fsll.triplet_no_hard_mining(jnp.asarray(emb[order]), jnp.asarray(labels[order]), 5, margin)
      np.testing.assert_allclose(got, authors_triplet(emb[order].astype(np.float64), labels[order], 5, margin),
                                 rtol=1e-4)


def test_prototype_loss_equals_the_naive_formula():
  rng = np.random.default_rng(1)
  emb, base = rng.normal(size=(10, 6)), rng.normal(size=(4, 6))
  means = emb.reshape(2, 5, 6).mean(axis=1)
  cands = np.concatenate([means, base])
  cos = (emb / np.linalg.norm(emb, axis=1, keepdims=True)) @ (cands / np.linalg.norm(cands, axis=1, keepdims=True)).T
  logits = -2.0 * (1 - cos)
  logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  naive = -np.mean(logp[np.arange(10), np.repeat([0, 1], 5)])
  got = fsll.prototype_loss(jnp.asarray(emb, jnp.float32), jnp.asarray(base, jnp.float32), 2, 5, omega=2.0)
  np.testing.assert_allclose(got, naive, rtol=1e-5)


def test_fsll_settings_per_dataset_are_the_authors():
  """Their FSLL session configs: threshold 0.4, 0.16, 0.15 and colour jitter (0.4) on miniImageNet only;
  a negative jitter is refused naming the field."""
  from configs import cifar100, cub200, mini
  configs = [m.get_config() for m in (cifar100, mini, cub200)]
  assert [(c.fsll.threshold, c.fsll.color_jitter) for c in configs] == [(0.4, 0.0), (0.16, 0.4), (0.15, 0.0)]
  configs[0].fsll.color_jitter = -0.1
  with pytest.raises(ValueError, match='fsll.color_jitter=-0.1 is invalid'):
    fsll.validate_fsll(configs[0])


def test_selected_paths_by_largest_magnitude():
  params = {'conv1': {'kernel': np.array([0.1, -0.39])}, 'bn1': {'scale': np.array([1.0, 0.2])},
            'layer1_0': {'conv1': {'kernel': np.array([-0.5])}}, 'fc': {'kernel': np.array([0.01])}}
  assert fsll.selected_paths(params, 0.4) == (('conv1', 'kernel'),)
  assert set(fsll.selected_paths(params, 1.0)) == {('conv1', 'kernel'), ('bn1', 'scale'),
                                                   ('layer1_0', 'conv1', 'kernel')}


@pytest.mark.parametrize('with_gradient', [False, True])
def test_drift_has_a_gradient_only_when_asked(with_gradient):
  cfg = ml_collections.ConfigDict(dict(margin=0.0, pn_weight=1.0, omega=1.0, reg_weight=5.0,
                                       reg_gradient=with_gradient))
  rng = np.random.default_rng(2)
  emb, base = jnp.asarray(rng.normal(size=(10, 4)), jnp.float32), jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
  labels = jnp.repeat(jnp.arange(2), 5)
  former = {('a',): jnp.zeros(3), ('b',): jnp.zeros(2)}
  trainable = {('a',): jnp.array([1.0, -2.0, 0.5]), ('b',): jnp.array([0.25, 0.0])}
  loss, grads = jax.value_and_grad(lambda t: fsll.session_loss(emb, labels, base, t, former, 2, 5, cfg))(trainable)
  rest = fsll.triplet_no_hard_mining(emb, labels, 5, 0.0) + fsll.prototype_loss(emb, base, 2, 5, 1.0)
  np.testing.assert_allclose(loss, rest + 5.0 * (3.5 + 0.25) / 2, rtol=1e-5)  # the value counts either way
  want = 5.0 / 2 * np.sign(np.asarray(trainable[('a',)])) if with_gradient else np.zeros(3)
  np.testing.assert_allclose(grads[('a',)], want, atol=1e-6)


def tiny():
  return tiny_protocol('fsll', epochs=3, threshold=0.3)


@pytest.fixture(scope='module')
def fsll_run(tmp_path_factory):
  return tiny_method_run(tmp_path_factory, tiny)


@pytest.mark.slow
def test_fsll_end_to_end_changes_only_the_selected_tensors(fsll_run):
  exp, ck, base = fsll_run.exp, fsll_run.ckpts, fsll_run.first
  runner = fsll.FSLLRunner(exp, base)
  shots = protocol.session_shots(exp.bench, 'draws', 0, 2, 5, 0)
  saved = ck.run(0).restore({**runner.template(2), 'exemplars': shots, 'accuracy': np.zeros(4)}, 2)
  chosen = set(fsll.selected_paths(base['params'], 0.3))
  assert chosen and len(chosen) < len(trees.flatten(base['params']))
  before, after = trees.flatten(base['params']), trees.flatten(saved['params'])
  for path in before:
    assert np.array_equal(before[path], after[path]) != (path in chosen), path
  np.testing.assert_array_equal(saved['prototypes'][:6], base['prototypes'])  # base prototypes kept


@pytest.mark.slow
def test_fsll_resumes_to_the_same_results(fsll_run, tmp_path):
  again = resumed_after_interruption(tiny, str(tmp_path / 'w'), 0, 3)
  assert without_provenance(again) == without_provenance(fsll_run.results)
