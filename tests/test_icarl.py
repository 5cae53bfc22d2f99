"""iCaRL (f2m_jax/methods/icarl.py): its parts against hand-made cases and a transcription of the
authors' loops, then the method end to end through the pipeline on a tiny synthetic protocol,
resumed after an interruption to the same results."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import resumed_after_interruption, tiny_method_run, tiny_protocol, without_provenance
from f2m_jax import optim
from f2m_jax.data import protocol
from f2m_jax.methods import icarl


def authors_herding(features: np.ndarray, prototype: np.ndarray, m: int) -> list:
  """Their _save_img_buffer's loop for one class, transcribed (torch ops as numpy): the running
  'fake prototype' 1/(k+1) x + k/(k+1) mean(chosen), scored by the mean squared difference."""
  chosen = []
  for k in range(m):
    left = [i for i in range(len(features)) if i not in chosen]
    if chosen:
      fake = 1.0 / (k + 1.0) * features[left] + float(k) / (k + 1.0) * features[chosen].mean(axis=0)
    else:
      fake = features[left]
    chosen.append(left[int(np.argmin(((prototype[None] - fake) ** 2).mean(axis=1)))])
  return chosen


def test_herding_hand_made_case():
  features = np.array([[0.0], [10.0], [4.0], [6.0], [5.5]])
  # the mean 5.1 is nearest 5.5; then 4 (mean 4.75) beats 6 (5.75) and 0 (2.75); then 6 (5.17)
  np.testing.assert_array_equal(icarl.herding(features, np.array([5.1]), 3), [4, 2, 3])
  # equal candidates: the first wins (torch.argmin)
  np.testing.assert_array_equal(icarl.herding(np.array([[4.0], [6.0]]), np.array([5.0]), 1), [0])
  with pytest.raises(ValueError, match='icarl.memory=3 exceeds the 2 images'):
    icarl.herding(np.zeros((2, 4)), np.zeros(4), 3)


def test_herding_equals_the_authors_loop():
  rng = np.random.default_rng(0)
  for _ in range(20):
    features = rng.normal(size=(30, 16))
    mean = features.mean(axis=0)
    assert icarl.herding(features, mean, 5).tolist() == authors_herding(features, mean, 5)


def test_distillation_targets_and_loss():
  labels = jnp.array([0, 3, 4])
  former = jnp.array([[2.0, -1.0, 0.5, 9.0, 9.0, 9.0]] * 3)
  targets = icarl.distillation_targets(labels, former, 3, 6)
  sig = 1 / (1 + np.exp(-np.array([2.0, -1.0, 0.5])))
  want = np.array([[*sig, 0, 0, 0], [*sig, 1, 0, 0], [*sig, 0, 1, 0]])
  np.testing.assert_allclose(targets, want, rtol=1e-6)
  # BCEWithLogitsLoss (mean) over the first 5 columns; column 6 (unseen) is left out
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(3, 6)), jnp.float32)
  x, y = np.asarray(logits)[:, :5], want[:, :5]
  naive = np.mean(np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x))))
  np.testing.assert_allclose(icarl.masked_sigmoid_cross_entropy(logits, targets, 5), naive, rtol=1e-5)


def test_learning_rate_steps_at_milestone_epochs():
  rates = [optim.rate_at(s, 0.1, (2 * 2, 3 * 2), 0.1) for s in range(8)]  # epochs of 2 steps
  np.testing.assert_allclose(rates, [0.1] * 4 + [0.01] * 2 + [0.001] * 2)


def test_new_columns_initialise_only_the_new_classes():
  params = {'fc': {'kernel': np.ones((64, 10), np.float32), 'bias': np.ones((10,), np.float32)}, 'conv': 1}
  out = icarl.new_columns(jax.random.key(0), params, 6, 8)
  kernel, bias = np.asarray(out['fc']['kernel']), np.asarray(out['fc']['bias'])
  np.testing.assert_array_equal(kernel[:, :6], 1.0)
  np.testing.assert_array_equal(kernel[:, 8:], 1.0)
  np.testing.assert_array_equal(bias, [1] * 6 + [0, 0] + [1, 1])
  assert out['conv'] == 1
  wide = {'fc': {'kernel': np.zeros((64, 4000), np.float32), 'bias': np.zeros(4000, np.float32)}}
  big = icarl.new_columns(jax.random.key(1), wide, 0, 4000)
  assert abs(np.std(big['fc']['kernel']) / np.sqrt(2 / 64) - 1) < 0.02  # kaiming_normal_, fan_out = 64


def tiny():
  return tiny_protocol('icarl', epochs=3, milestones=(2,), batch_size=8)


@pytest.fixture(scope='module')
def icarl_run(tmp_path_factory):
  return tiny_method_run(tmp_path_factory, tiny)


@pytest.mark.slow
def test_icarl_end_to_end(icarl_run):
  exp, ck = icarl_run.exp, icarl_run.ckpts
  bench = exp.bench
  runner = icarl.ICaRLRunner(exp, icarl_run.first)
  for run in range(2):
    shots = [protocol.session_shots(bench, 'draws', run, t, 5, 0) for t in (2, 3)]
    saved = ck.restore_session(run, 3, {**runner.template(3), 'exemplars': np.concatenate(shots),
                                        'accuracy': np.zeros(4)})
    memory = saved['memory']
    # two exemplars per class: the base ones from the base training images, each session's from its
    # shots (herding picks 2 of the 5 after the session)
    assert np.bincount(bench.train.labels[memory], minlength=10).tolist() == [2] * 10
    assert set(memory[:12]) <= set(bench.base_train)
    assert set(memory[12:16]) <= set(shots[0]) and set(memory[16:]) <= set(shots[1])
    np.testing.assert_array_equal(memory[:12], runner.base_memory)
    assert saved['prototypes'].shape == (10, 32) and np.isfinite(saved['params']['fc']['kernel']).all()


@pytest.mark.slow
def test_icarl_resumes_to_the_same_results(icarl_run, tmp_path):
  again = resumed_after_interruption(tiny, str(tmp_path / 'w'), 1, 2)
  assert without_provenance(again) == without_provenance(icarl_run.results)
