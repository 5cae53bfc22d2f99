"""iCaRL (f2m_jax/methods/icarl.py): its parts against hand-made cases and a transcription of the
authors' loops, then the method end to end through the pipeline on a tiny synthetic protocol,
resumed after an interruption to the same results."""
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


def test_random_exemplars_draw_per_class():
  """The authors' `random: true` memory (their sample_data_index): per class, the first m of a random
  permutation of its images; all of a class that has fewer; a function of the generator's seed."""
  labels = np.array([0, 1, 0, 1, 2, 0, 1, 0, 2])
  pool = np.arange(100, 109)
  draw = lambda seed: icarl.random_exemplars(labels, pool, [0, 1, 2], 2, np.random.default_rng(seed))
  for seed in range(20):
    got = draw(seed)
    assert got.tolist() == draw(seed).tolist()
    order = np.random.default_rng(seed)  # the same permutations, class after class
    want = [pool[labels == c][order.permutation(int(np.sum(labels == c)))[:2]] for c in (0, 1, 2)]
    assert got.tolist() == np.concatenate(want).tolist()
    assert len(set(got[:2])) == 2 and set(got[:2]) <= {100, 102, 105, 107} and set(got[4:]) == {104, 108}
  assert len({tuple(draw(seed)) for seed in range(20)}) > 1
  assert icarl.random_exemplars(labels, pool, [2], 5, np.random.default_rng(0)).tolist() in ([104, 108], [108, 104])


def test_icarl_classifier_is_bias_free_with_fan_out_init_float64():
  """iCaRL's own base classifier (model.head='linear_no_bias', their cf_matrix): logits = embedding @ W
  with no bias, in float64 against numpy; W drawn N(0, 2 / embedding) (kaiming_normal_, fan_out)."""
  from conftest import init_variables
  from f2m_jax.models import build_model
  from f2m_jax.models.resnet import fan_out_init
  with jax.enable_x64(True):
    model = build_model('resnet20', 6, 4, dtype=jnp.float64, head='linear_no_bias')
    variables = init_variables(model, 16, jax.random.key(1))
    assert set(variables['params']['fc']) == {'kernel'}
    x = jax.random.normal(jax.random.key(0), (5, 16, 16, 3), jnp.float64)
    embedding, logits = jax.jit(lambda v: model.apply(v, x, train=False))(variables)
    assert logits.dtype == jnp.float64
    want = np.asarray(embedding, np.float64) @ np.asarray(variables['params']['fc']['kernel'], np.float64)
    np.testing.assert_allclose(np.asarray(logits), want, rtol=1e-12, atol=1e-14)
  wide = np.asarray(fan_out_init(jax.random.key(2), (64, 5000)))
  assert abs(wide.std() / np.sqrt(2 / 64) - 1) < 0.01 and abs(wide.mean()) < 0.01 * np.sqrt(2 / 64)


def test_colour_jitter_by_hand_float64():
  """augment.jitter_image, torchvision's ColorJitter with its draws given, in float64 against a hand
  computation on a 1x2 image; color_jitter's brightness factors (a grey image: contrast and saturation
  leave it as it is) uniform over [0.6, 1.4] at strength 0.4."""
  from f2m_jax.data import augment
  with jax.enable_x64(True):
    image = jnp.array([[[100.0, 50.0, 200.0], [250.0, 0.0, 10.0]]])
    # saturation 1.4 (pixel greys 82.05, 75.89): 1.4 x - 0.4 grey -> (107.18, 37.18, 247.18), (255, 0, 0)
    # after the clip; brightness 1.2: (128.616, 44.616, 255), (255, 0, 0); contrast 0.5 with the mean
    # grey (93.715776 + 76.245) / 2 = 84.980388: 0.5 x + 42.490194
    out = jax.jit(augment.jitter_image)(image, jnp.array([1.2, 0.5, 1.4]), jnp.array([2, 0, 1]))
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(out, [[[106.798194, 64.798194, 169.990194], [169.990194, 42.490194, 42.490194]]],
                               rtol=1e-12)
    grey = jnp.full((512, 2, 2, 3), 100.0)
    jittered = jax.jit(augment.color_jitter, static_argnums=2)(jax.random.key(0), grey, 0.4)
    factors = np.asarray(jittered)[:, 0, 0, 0] / 100
    assert 0.6 <= factors.min() < 0.62 and 1.38 < factors.max() <= 1.4 and abs(factors.mean() - 1) < 0.03


def test_icarl_defaults_are_the_authors():
  """method=icarl as the authors' configs run it: its own base (plain CE, shuffled batches, the
  bias-free classifier; FSIL_train_res18_cifar_ICaRL_SGD_01.yml), their session settings
  (incremental_res18_<dataset>_iCaRL*.yml): 2 exemplars per class by herding (random on CUB), 90
  epochs of batch 120, lr 0.1 (1e-2 on miniImageNet and CUB) x 0.1 after epochs 50 and 70; colour jitter
  (0.4) in the sessions on miniImageNet only."""
  from configs import cifar100, cub200, mini
  from f2m_jax.run import pipeline
  config = cifar100.get_config()
  config.method = 'icarl'
  config = pipeline.resolve(config, reads_data=False)
  assert config.model.head == 'linear_no_bias' and config.base.sampler == 'shuffle' and not config.noise.enabled
  assert not config.incremental.finetune and not config.eval.normalize_prototypes
  assert dict(config.icarl) == dict(memory=2, exemplars='herding', epochs=90, batch_size=120, lr=0.1,
                                    milestones=(50, 70), lr_gamma=0.1, momentum=0.9, weight_decay=5e-4,
                                    color_jitter=0.0)
  assert (mini.get_config().icarl.lr, mini.get_config().icarl.exemplars, mini.get_config().icarl.color_jitter) == (
      1e-2, 'herding', 0.4)
  cub = cub200.get_config().icarl
  assert (cub.lr, cub.exemplars, cub.color_jitter) == (1e-2, 'random', 0.0)


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
    saved = ck.run(run).restore({**runner.template(3), 'exemplars': np.concatenate(shots),
                                 'accuracy': np.zeros(4)}, 3)
    memory = saved['memory']
    # two exemplars per class: the base ones from the base training images, each session's from its
    # shots (herding picks 2 of the 5 after the session)
    assert np.bincount(bench.train.labels[memory], minlength=10).tolist() == [2] * 10
    assert set(memory[:12]) <= set(bench.base_train)
    assert set(memory[12:16]) <= set(shots[0]) and set(memory[16:]) <= set(shots[1])
    np.testing.assert_array_equal(memory[:12], runner.base_memory)
    assert saved['prototypes'].shape == (10, 32) and np.isfinite(saved['params']['fc']['kernel']).all()
  assert set(icarl_run.first['params']['fc']) == {'kernel'}  # its own base: the bias-free classifier


@pytest.mark.slow
def test_icarl_resumes_to_the_same_results(icarl_run, tmp_path):
  again = resumed_after_interruption(tiny, str(tmp_path / 'w'), 1, 2)
  assert without_provenance(again) == without_provenance(icarl_run.results)
