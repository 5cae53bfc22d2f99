"""iCaRL as the F2M authors re-implemented it (docs/method.md, 'The compared methods'): its own base
network, then the whole network trained on a memory of exemplars and the shots with sigmoid
distillation, classified by the nearest mean of exemplars. The classifier is kept at the size of
the last session (unseen columns zero and out of the loss), so one compiled step serves every
session."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from f2m_jax import optim, padding
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.methods import Method, common
from f2m_jax.models.resnet import fan_out_init
from f2m_jax.validation import need

EXEMPLARS = ('herding', 'random')
# The heads whose logits iCaRL's distillation reads: its own, and the Baseline's (--checkpoint).
HEADS = ('linear_no_bias', 'linear')


def validate_icarl(config):
  common.need_least(config, 'icarl', memory=1, epochs=1, batch_size=1, color_jitter=0)
  need(config.icarl.exemplars in EXEMPLARS, 'icarl.exemplars', config.icarl.exemplars,
       f'allowed: {EXEMPLARS}')
  need(config.model.head in HEADS, 'model.head', config.model.head,
       f'method=icarl needs one of {HEADS}')


def herding(features, mean, m):
  """iCaRL's exemplar selection (Rebuffi et al. 2017, Alg. 4) as the authors run it: m times, the
  not yet chosen row whose addition brings the chosen rows' mean closest (mean squared difference)
  to `mean`; the first of equal candidates. Returns the chosen row numbers in order."""
  if m > len(features):
    raise ValueError(f'icarl.memory={m} exceeds the {len(features)} images of a class')
  features = np.asarray(features, np.float64)
  chosen, total = [], np.zeros_like(features[0])
  for k in range(m):
    distance = np.mean((mean - (features + total) / (k + 1)) ** 2, axis=1)
    distance[chosen] = np.inf  # each row once
    chosen.append(int(np.argmin(distance)))
    total += features[chosen[-1]]
  return np.asarray(chosen, np.int64)


def random_exemplars(labels, pool, classes, m, rng):
  """The authors' `random: true` memory: for each class in turn, the first `m` of a random
  permutation of its images in `pool` (all where it has fewer). `labels` are those of `pool`."""
  picks = [pool[labels == c] for c in classes]
  return np.concatenate([p[rng.permutation(len(p))[:m]] for p in picks])


def distillation_targets(labels, former_logits, num_old, num_classes):
  """iCaRL's targets: one-hot over `num_classes` columns, the first `num_old` of which are replaced
  by the previous network's sigmoid outputs (its knowledge of the old classes)."""
  onehot = jax.nn.one_hot(labels, num_classes)
  return jnp.where(jnp.arange(num_classes) < num_old, jax.nn.sigmoid(former_logits), onehot)


def masked_sigmoid_cross_entropy(logits, targets, num_seen):
  """PyTorch's BCEWithLogitsLoss (mean) over the first `num_seen` columns only."""
  mask = (jnp.arange(logits.shape[-1]) < num_seen).astype(logits.dtype)
  per_entry = optax.sigmoid_binary_cross_entropy(logits, targets)
  return jnp.sum(per_entry * mask) / (logits.shape[0] * jnp.sum(mask))


def new_columns(key, params, start, stop, draw=fan_out_init):
  """params with classifier columns [start, stop) drawn by `draw(key, shape, dtype)`, by default
  as the authors' iCaRL columns, N(0, 2 / embedding) (kaiming_normal_ fan_out), and their bias,
  where the head has one, 0."""
  fc = {k: jnp.asarray(v) for k, v in params['fc'].items()}
  fresh = draw(key, (fc['kernel'].shape[0], stop - start), fc['kernel'].dtype)
  fc['kernel'] = fc['kernel'].at[:, start:stop].set(fresh)
  if 'bias' in fc:
    fc['bias'] = fc['bias'].at[start:stop].set(0.0)
  return {**params, 'fc': fc}


def pad_classifier(params, num_classes):
  """params with the classifier widened to `num_classes` zero columns (kernel, and bias if any; a
  scalar, such as the cosine head's sigma, kept)."""
  fc = {k: padding.pad_rows(np.asarray(v), num_classes, axis=v.ndim - 1) if v.ndim else v
        for k, v in params['fc'].items()}
  return {**params, 'fc': fc}


class ICaRLRunner(common.Runner):
  """State of a run: {'params', 'batch_stats'} (classifier padded to every class), 'memory'
  (exemplar indices of the classes learned before, in class order) and 'prototypes' (one per seen
  class)."""
  section = 'icarl'
  draw = staticmethod(fan_out_init)  # the new classifier columns' (`new_columns`)
  edit_updates = None  # `common.sgd_step`'s (Rebalance freezes columns)

  def __init__(self, exp, first, *_):  # (ckpts, source, log): not read
    bench = exp.bench
    super().__init__(exp, first, exp.network(bench.num_seen_classes(bench.num_sessions)))
    self.first['params'] = pad_classifier(first['params'], self.network.num_classes)
    self.cfg = cfg = exp.config[self.section]
    self.tx = optim.sgd_at_rate(cfg.momentum, cfg.weight_decay)  # the rate: set before each step
    self.step = common.sgd_step(self.loss, self.tx, bench, cfg.color_jitter, self.edit_updates)
    self.base_memory_size = int(np.minimum(np.bincount(bench.train.labels[bench.base_train]),
                                           cfg.memory).sum())  # min(images, memory) per class
    self.base_memory = None  # herding's base memory: the same for every run, chosen once
    if cfg.exemplars == 'herding':
      self.base_memory = self.select(common.network_of(self.first), bench.base_train,
                                     bench.session_classes[0], self.first['prototypes'], 0, 1)

  def loss(self, params, x, labels, batch_stats, former, num_old, num_seen):
    """(the loss, new BN statistics): sigmoid cross-entropy against `distillation_targets` of the
    logits of the previous network (`former`, BN in eval mode); BN in train mode."""
    former_logits = self.network.apply(former, x, train=False)[1]
    targets = distillation_targets(labels, former_logits, num_old, former_logits.shape[-1])
    (_, logits), new = self.network.apply({'params': params, 'batch_stats': batch_stats}, x,
                                          train=True, mutable=['batch_stats'])
    return masked_sigmoid_cross_entropy(logits, targets, num_seen), new['batch_stats']

  def select(self, variables, pool, classes, means, run, session):
    """`memory` exemplars of each class among `pool` after session `session` of run `run`: by
    herding towards its mean under `variables`, or at random (a function of the seed, run and
    session)."""
    labels = self.exp.bench.train.labels[pool]
    if self.cfg.exemplars == 'random':
      rng = np.random.default_rng([self.exp.config.seed, 8, run, session])
      return random_exemplars(labels, pool, classes, self.cfg.memory, rng)
    emb = self.embed(variables, self.exp.train_view(pool))
    members = [np.flatnonzero(labels == c) for c in classes]
    return np.concatenate([pool[m[herding(emb[m], mean, min(self.cfg.memory, len(m)))]]
                           for m, mean in zip(members, means)])

  def start(self):
    return {**self.first, 'memory': self.base_memory}

  def update(self, state, run, session, exemplars):
    exp, bench, cfg, labels = self.exp, self.exp.bench, self.cfg, self.exp.bench.train.labels
    num_old, num_seen = bench.num_seen_classes(session - 1), bench.num_seen_classes(session)
    classes = bench.session_classes[session - 1]
    shots = exemplars[np.isin(labels[exemplars], classes)]
    memory = state['memory']
    if memory is None:  # random exemplars: each run draws its own base memory, as theirs
      memory = self.select(None, bench.base_train, bench.session_classes[0], None, run, 1)
    pool = np.concatenate([memory, shots])
    if cfg.batch_size > len(pool):
      raise ValueError(f'{self.section}.batch_size={cfg.batch_size} exceeds the {len(pool)} images '
                       f'of run {run} session {session} (memory and shots); the last batch of an '
                       'epoch is dropped')
    per_epoch, key = len(pool) // cfg.batch_size, exp.key(6, run, session)
    former = jax.device_put(common.network_of(state))  # once, not per step
    params = new_columns(jax.random.fold_in(key, 0), state['params'], num_old, num_seen, self.draw)
    batch_stats, opt_state, losses = state['batch_stats'], self.tx.init(params), []
    for s in range(cfg.epochs * per_epoch):
      idx = protocol_lib.shuffled_batch(pool, cfg.batch_size, exp.config.seed, s, (6, run, session))
      lr = optim.rate_at(s, cfg.lr, [int(m) * per_epoch for m in cfg.milestones], cfg.lr_gamma)
      params, opt_state, loss, batch_stats = self.step(
          params, optim.set_rate(opt_state, np.float32(lr)), bench.train.images[idx], labels[idx],
          jax.random.fold_in(key, s + 1), batch_stats, former, num_old, num_seen)
      losses.append(float(loss))
    variables = jax.device_get({'params': params, 'batch_stats': batch_stats})
    protos = common.prototypes(exp, self.embed, variables, pool, range(num_seen))
    memory = np.concatenate([memory, self.select(variables, shots, classes, protos[num_old:], run,
                                                 session)])
    return {**variables, 'memory': memory, 'prototypes': protos}, {'losses': losses,
                                                                   'images': len(pool)}

  def template(self, session):
    novel = self.exp.bench.num_seen_classes(session) - self.exp.bench.num_base_classes
    size = self.base_memory_size + novel * min(self.cfg.memory, self.exp.config.data.shots)
    return {**super().template(session), 'memory': np.zeros(size, np.int64)}


# The Baseline's base session (plain CE, shuffled batches) with the authors' iCaRL classifier: no
# bias, Kaiming fan-out init; NCM over raw means.
PRESETS = {**common.BASELINE_PRESETS, 'model.head': 'linear_no_bias'}

ICARL = Method('icarl', PRESETS, common.base_model, ICaRLRunner,
               "its own base (CE, a bias-free classifier); whole network on memory + shots with "
               "iCaRL's distillation; nearest mean of exemplars", section='icarl',
               validate=validate_icarl)
