"""iCaRL as the F2M authors re-implemented it (docs/method.md, 'The compared methods'): its own base
network, then the whole network trained on a memory of exemplars and the shots with sigmoid distillation,
classified by the nearest mean of exemplars. The classifier is kept at the size of the last session
(unseen columns zero and out of the loss), so one compiled step serves every session."""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from f2m_jax import evaluation
from f2m_jax import optim
from f2m_jax import padding
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.methods import Method, common
from f2m_jax.validation import need


EXEMPLARS = ('herding', 'random')
# The heads whose logits iCaRL's distillation reads: its own, and the Baseline's (--checkpoint).
HEADS = ('linear_no_bias', 'linear')


def validate_icarl(config) -> None:
  c = config.icarl
  need(c.memory >= 1 and c.epochs >= 1 and c.batch_size >= 1 and c.lr > 0 and c.color_jitter >= 0, 'icarl',
       dict(c), 'needs memory, epochs, batch_size >= 1, lr > 0 and color_jitter >= 0')
  need(c.exemplars in EXEMPLARS, 'icarl.exemplars', c.exemplars, f'allowed: {EXEMPLARS}')
  need(config.model.head in HEADS, 'model.head', config.model.head, f'method=icarl needs one of {HEADS}')


def herding(features: np.ndarray, mean: np.ndarray, m: int) -> np.ndarray:
  """iCaRL's exemplar selection (Rebuffi et al. 2017, Alg. 4) as the authors run it: m times, the
  not yet chosen row whose addition brings the chosen rows' mean closest (mean squared difference)
  to `mean`; the first of equal candidates. Returns the chosen row numbers in order."""
  if m > len(features):
    raise ValueError(f'icarl.memory={m} exceeds the {len(features)} images of a class')
  features = np.asarray(features, np.float64)
  chosen = []
  total = np.zeros(features.shape[1], np.float64)
  for k in range(m):
    left = np.array([i for i in range(len(features)) if i not in chosen])
    candidate_means = (features[left] + total) / (k + 1)
    chosen.append(int(left[np.argmin(np.mean((mean - candidate_means) ** 2, axis=1))]))
    total += features[chosen[-1]]
  return np.asarray(chosen, np.int64)


def random_exemplars(labels: np.ndarray, pool: np.ndarray, classes: Sequence[int], m: int,
                     rng: np.random.Generator) -> np.ndarray:
  """The authors' `random: true` memory: for each class in turn, the first `m` of a random permutation of
  its images in `pool` (all where it has fewer). `labels` are those of `pool`."""
  picks = []
  for c in classes:
    members = pool[labels == c]
    picks.append(members[rng.permutation(len(members))[:m]])
  return np.concatenate(picks)


def distillation_targets(labels: jax.Array, former_logits: jax.Array, num_old, num_classes: int) -> jax.Array:
  """iCaRL's targets: one-hot over `num_classes` columns, the first `num_old` of which are replaced
  by the previous network's sigmoid outputs (its knowledge of the old classes)."""
  onehot = jax.nn.one_hot(labels, num_classes)
  return jnp.where(jnp.arange(num_classes) < num_old, jax.nn.sigmoid(former_logits), onehot)


def masked_sigmoid_cross_entropy(logits: jax.Array, targets: jax.Array, num_seen) -> jax.Array:
  """PyTorch's BCEWithLogitsLoss (mean) over the first `num_seen` columns only."""
  mask = (jnp.arange(logits.shape[-1]) < num_seen).astype(logits.dtype)
  per_entry = optax.sigmoid_binary_cross_entropy(logits, targets)
  return jnp.sum(per_entry * mask) / (logits.shape[0] * jnp.sum(mask))


def new_columns(key, params: dict, start: int, stop: int) -> dict:
  """params with classifier columns [start, stop) initialised as the authors' new columns, N(0, 2 /
  embedding) (kaiming_normal_ fan_out), and their bias, where the head has one, 0."""
  kernel = params['fc']['kernel']
  dim = kernel.shape[0]
  fresh = jnp.sqrt(2.0 / dim) * jax.random.normal(key, (dim, stop - start), kernel.dtype)
  fc = {'kernel': jnp.asarray(kernel).at[:, start:stop].set(fresh)}
  if 'bias' in params['fc']:
    fc['bias'] = jnp.asarray(params['fc']['bias']).at[start:stop].set(0.0)
  return {**params, 'fc': fc}


def pad_classifier(params: dict, num_classes: int) -> dict:
  """params with the classifier widened to `num_classes` zero columns (kernel, and bias if any)."""
  fc = dict(params['fc'])
  fc['kernel'] = padding.pad_rows(np.asarray(fc['kernel']), num_classes, axis=1)
  if 'bias' in fc:
    fc['bias'] = padding.pad_rows(np.asarray(fc['bias']), num_classes)
  return {**params, 'fc': fc}


class ICaRLRunner(common.Runner):
  """State of a run: {'params', 'batch_stats'} (classifier padded to every class), 'memory' (exemplar
  indices of the classes learned before, in class order) and 'prototypes' (one per seen class)."""
  section = 'icarl'
  keys = ('params', 'batch_stats', 'memory', 'prototypes')
  new_columns = staticmethod(new_columns)
  edit_updates = None  # `common.sgd_step`'s (Rebalance freezes columns)

  def __init__(self, exp, first: dict, ckpts=None, source=None, log=None):
    cfg, bench = exp.config[self.section], exp.bench
    self.exp, self.cfg = exp, cfg
    self.network = exp.network(bench.num_seen_classes(bench.num_sessions))
    self.first = {'params': pad_classifier(first['params'], self.network.num_classes),
                  'batch_stats': first['batch_stats'], 'prototypes': np.asarray(first['prototypes'])}
    self.embed = evaluation.make_embed(self.network, bench.mean, bench.std, exp.config.eval.batch_size)
    self.tx = optim.sgd_at_rate(cfg.momentum, cfg.weight_decay)  # the rate: set before each step
    self.step = common.sgd_step(self.loss, self.tx, bench, cfg.color_jitter, self.edit_updates)
    counts = np.bincount(bench.train.labels[bench.base_train], minlength=bench.num_base_classes)
    self.base_memory_size = int(np.minimum(counts[np.asarray(bench.session_classes[0])], cfg.memory).sum())
    self.base_memory = None  # herding's base memory: the same for every run, chosen once
    if cfg.exemplars == 'herding':
      variables = {'params': self.first['params'], 'batch_stats': self.first['batch_stats']}
      self.base_memory = self.select(variables, bench.base_train, bench.session_classes[0],
                                     self.first['prototypes'], 0, 1)

  def loss(self, params, x, labels, batch_stats, former, num_old, num_seen):
    """(the loss, new BN statistics): sigmoid cross-entropy against `distillation_targets` of the logits of
    the previous network (`former`, BN in eval mode); BN in train mode."""
    former_logits = self.network.apply(former, x, train=False)[1]
    targets = distillation_targets(labels, former_logits, num_old, former_logits.shape[-1])
    (_, logits), new = self.network.apply({'params': params, 'batch_stats': batch_stats}, x, train=True,
                                          mutable=['batch_stats'])
    return masked_sigmoid_cross_entropy(logits, targets, num_seen), new['batch_stats']

  def select(self, variables, pool: np.ndarray, classes: Sequence[int], means: np.ndarray, run: int,
             session: int) -> np.ndarray:
    """`memory` exemplars of each class among `pool` after session `session` of run `run`: by herding
    towards its mean under `variables`, or at random (a function of the seed, run and session)."""
    labels = self.exp.bench.train.labels[pool]
    if self.cfg.exemplars == 'random':
      rng = np.random.default_rng([self.exp.config.seed, 8, run, session])
      return random_exemplars(labels, pool, classes, self.cfg.memory, rng)
    emb = self.embed(variables, self.exp.train_view(pool))
    picks = []
    for c, mean in zip(classes, means):
      members = np.flatnonzero(labels == c)
      picks.append(pool[members[herding(emb[members], mean, min(self.cfg.memory, len(members)))]])
    return np.concatenate(picks)

  def start(self):
    return {**self.first, 'memory': self.base_memory}

  def update(self, state, run: int, session: int, exemplars: np.ndarray):
    exp, bench, cfg = self.exp, self.exp.bench, self.cfg
    num_old, num_seen = bench.num_seen_classes(session - 1), bench.num_seen_classes(session)
    classes = bench.session_classes[session - 1]
    shots = exemplars[np.isin(bench.train.labels[exemplars], classes)]
    memory = state['memory']
    if memory is None:  # random exemplars: each run draws its own base memory, as theirs
      memory = self.select(None, bench.base_train, bench.session_classes[0], None, run, 1)
    pool = np.concatenate([memory, shots])
    if cfg.batch_size > len(pool):
      raise ValueError(f'{self.section}.batch_size={cfg.batch_size} exceeds the {len(pool)} images of run {run} '
                       f'session {session} (memory and shots); the last batch of an epoch is dropped')
    per_epoch = len(pool) // cfg.batch_size
    key = exp.key(6, run, session)
    former = jax.device_put({'params': state['params'], 'batch_stats': state['batch_stats']})  # once, not per step
    params = self.new_columns(jax.random.fold_in(key, 0), state['params'], num_old, num_seen)
    batch_stats, opt_state = state['batch_stats'], self.tx.init(params)
    losses = []
    for s in range(cfg.epochs * per_epoch):
      idx = protocol_lib.shuffled_batch(pool, cfg.batch_size, exp.config.seed, s, (6, run, session))
      lr = optim.rate_at(s, cfg.lr, [int(m) * per_epoch for m in cfg.milestones], cfg.lr_gamma)
      params, opt_state, loss, batch_stats = self.step(
          params, optim.set_rate(opt_state, np.float32(lr)), bench.train.images[idx], bench.train.labels[idx],
          jax.random.fold_in(key, s + 1), batch_stats, former, num_old, num_seen)
      losses.append(float(loss))
    variables = {'params': jax.device_get(params), 'batch_stats': jax.device_get(batch_stats)}
    emb = self.embed(variables, exp.train_view(pool))
    protos = evaluation.prototypes(emb, bench.train.labels[pool], range(num_seen))
    memory = np.concatenate([memory, self.select(variables, shots, classes, protos[num_old:], run, session)])
    return {**variables, 'memory': memory, 'prototypes': protos}, {'losses': losses, 'images': int(len(pool))}

  def template(self, session: int) -> dict:
    novel = self.exp.bench.num_seen_classes(session) - self.exp.bench.num_base_classes
    memory = np.zeros((self.base_memory_size + novel * min(self.cfg.memory, self.exp.config.data.shots),), np.int64)
    return {**super().template(session), 'memory': memory}


# The Baseline's base session (plain CE, shuffled batches) with the authors' iCaRL classifier: no bias,
# Kaiming fan-out init; NCM over raw means.
PRESETS = {**common.BASELINE_PRESETS, 'model.head': 'linear_no_bias'}

ICARL = Method('icarl', PRESETS, common.base_model, ICaRLRunner,
               "its own base (CE, a bias-free classifier); whole network on memory + shots with iCaRL's "
               'distillation; nearest mean of exemplars', section='icarl', validate=validate_icarl)
