"""Rebalance (LUCIR, Hou et al. 2019) as the F2M authors re-implemented and configured it
(docs/method.md, 'The compared methods'): a cosine classifier, then the whole network trained on a
memory and the shots with LUCIR's cross-entropy, less-forget and inter-class separation terms, old
columns frozen."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from f2m_jax.evaluator import seen_accuracies
from f2m_jax.methods import Method, common, icarl
from f2m_jax.models import cosine_scores, uniform_columns
from f2m_jax.validation import need


# The Baseline's base session (plain CE, shuffled batches) with LUCIR's cosine classifier.
PRESETS = {**common.BASELINE_PRESETS, 'model.head': 'cosine'}


CLASSIFIERS = ('cosine', 'nearest_mean')


def validate_rebalance(config):
  r = config.rebalance
  common.need_least(config, 'rebalance', memory=1, epochs=1, batch_size=1, K=1, margin=0,
                    lambda_base=0, weight=0, color_jitter=0)
  need(r.exemplars in icarl.EXEMPLARS, 'rebalance.exemplars', r.exemplars,
       f'allowed: {icarl.EXEMPLARS}')
  need(r.classifier in CLASSIFIERS, 'rebalance.classifier', r.classifier, f'allowed: {CLASSIFIERS}')
  need(config.model.head == 'cosine', 'model.head', config.model.head,
       "method=rebalance needs 'cosine' (LUCIR's classifier)")


def adaptive_weight(lambda_base, num_old, num_novel):
  """LUCIR's less-forget weight lambda_base * sqrt(|old classes| / |new classes|) (their
  LessForget's `cur_lambda`)."""
  return lambda_base * jnp.sqrt(num_old / num_novel)


def less_forget(former_features, features, weight):
  """weight * PyTorch's CosineEmbeddingLoss with target 1: the mean over the batch of
  1 - cos(f_prev, f), with its 1e-12 added to each squared norm."""
  squared = lambda v: jnp.sum(v ** 2, axis=-1) + 1e-12
  dot = jnp.sum(former_features * features, axis=-1)
  return weight * jnp.mean(1.0 - dot / jnp.sqrt(squared(former_features) * squared(features)))


def inter_class_separation(cos, labels, num_old, num_seen, k, margin,
                           weight):
  """LUCIR's margin ranking loss: each old-class image's ground-truth cosine against the k highest
  new-class cosines, weight * mean of max(0, margin - (gt - novel)); 0 without an old-class
  image."""
  columns = jnp.arange(cos.shape[-1])
  novel = jnp.where((columns >= num_old) & (columns < num_seen), cos, -1e4)  # cosines are >= -1
  top = jax.lax.top_k(novel, k)[0]
  gt = jnp.take_along_axis(cos, labels[:, None], axis=1)
  old = (labels < num_old).astype(cos.dtype)[:, None]
  hinge = jnp.maximum(0.0, margin - (gt - top)) * old
  return weight * jnp.sum(hinge) / jnp.maximum(k * jnp.sum(old), 1.0)


@jax.jit
def cosine_classifier_scores(embedding, kernel, sigma, num_seen):
  """The scores the authors' Rebalance test ranks (`test_type: CNN`): sigma * cos(f(x), w_c) for the
  seen classes' columns, -inf for the rest (whose zero columns would score 0). The prediction is
  their argmax."""
  scores = sigma * cosine_scores(embedding, kernel)
  return jnp.where(jnp.arange(kernel.shape[-1]) < num_seen, scores, -jnp.inf)


def masked_cross_entropy(logits, labels, num_seen):
  """Softmax cross-entropy (batch mean) over the first `num_seen` columns only."""
  logits = jnp.where(jnp.arange(logits.shape[-1]) < num_seen, logits, -1e9)
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


def frozen_columns(updates, num_old, num_seen):
  """updates with the classifier's columns outside [num_old, num_seen) zeroed: the old classes'
  columns stay as they were, and so do the unseen ones."""
  kernel = updates['fc']['kernel']
  columns = jnp.arange(kernel.shape[-1])
  kernel = jnp.where((columns >= num_old) & (columns < num_seen), kernel, 0.0)
  return {**updates, 'fc': {**updates['fc'], 'kernel': kernel}}


class RebalanceRunner(icarl.ICaRLRunner):
  """iCaRL's runner (memory, herding, NCM, checkpoints) with LUCIR's step and classifier columns."""
  section = 'rebalance'
  draw = staticmethod(uniform_columns)  # the new columns as the authors' new cosine-classifier rows

  def __init__(self, exp, first, *args):
    way = min(len(c) for c in exp.bench.session_classes[1:])
    if exp.config.rebalance.K > way:
      raise ValueError(f'rebalance.K={exp.config.rebalance.K} exceeds the {way} new classes of a '
                       'session')
    super().__init__(exp, first, *args)

  def loss(self, params, x, labels, batch_stats, former, num_old, num_seen):
    """(LUCIR's loss of one batch: cross-entropy + less-forget + separation, the new BN statistics):
    BN in train mode, the previous network's (`former`) features in eval mode."""
    c, former_features = self.cfg, self.network.apply(former, x, train=False)[0]
    (features, _), new = self.network.apply({'params': params, 'batch_stats': batch_stats}, x,
                                            train=True, mutable=['batch_stats'])
    cos = cosine_scores(features, params['fc']['kernel'])
    value = (masked_cross_entropy(params['fc']['sigma'] * cos, labels, num_seen)
             + less_forget(former_features, features,
                           adaptive_weight(c.lambda_base, num_old, num_seen - num_old))
             + inter_class_separation(cos, labels, num_old, num_seen, c.K, c.margin, c.weight))
    return value, new['batch_stats']

  def edit_updates(self, updates, batch_stats, former, num_old, num_seen):
    return frozen_columns(updates, num_old, num_seen)

  def accuracies(self, state, session):
    if self.cfg.classifier == 'nearest_mean':
      return super().accuracies(state, session)
    bench, fc = self.exp.bench, state['params']['fc']

    def predict(idx):
      emb = self.embed(common.network_of(state), bench.test.images[idx])
      return np.argmax(cosine_classifier_scores(emb, fc['kernel'], fc['sigma'],
                                                bench.num_seen_classes(session)), -1)

    return seen_accuracies(self.exp, session, predict)

  def norms(self, state):
    return super().norms(state) if self.cfg.classifier == 'nearest_mean' else None


REBALANCE = Method('rebalance', PRESETS, common.base_model, RebalanceRunner,
                   "LUCIR's cosine classifier base; whole network on memory + shots with "
                   "less-forget and margin-ranking losses, old columns frozen; the cosine "
                   "classifier's argmax",
                   section='rebalance', validate=validate_rebalance)
