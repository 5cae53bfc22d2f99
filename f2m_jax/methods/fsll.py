"""FSLL (Mazumder et al. 2021) as the F2M authors re-implemented it (docs/method.md, 'The compared
methods'): the Baseline's base network, then the small-valued tensors fine-tuned with a triplet
loss, a prototype loss and an L1 drift term (without gradient unless `fsll.reg_gradient`)."""
import jax
import jax.numpy as jnp
import numpy as np

from f2m_jax import objectives, optim, trees
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.methods import Method, common
from f2m_jax.validation import need


def validate_fsll(config):
  # a weight < 0 would be maximised
  common.need_least(config, 'fsll', epochs=1, threshold=0, color_jitter=0, margin=0, pn_weight=0,
                    reg_weight=0)
  need(config.fsll.omega > 0, 'fsll.omega', config.fsll.omega,
       'must be > 0 (the prototype logits\' scale)')


def selected_paths(params, threshold):
  """The tensors FSLL fine-tunes: outside the classifier, largest |value| at most `threshold`."""
  return tuple(p for p, v in trees.flatten(params).items()
               if p[0] != 'fc' and float(np.max(np.abs(v))) <= threshold)


def pairwise_euclidean(x):
  """sqrt(max(|a|^2 + |b|^2 - 2 a.b, 1e-12)), the authors' form (a pair with itself: 1e-6)."""
  sq = jnp.sum(x * x, axis=1)
  return jnp.sqrt(jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * x @ x.T, 1e-12))


def triplet_no_hard_mining(emb, labels, num_instances, margin):
  """Their TripletLossNoHardMining: for each anchor, the 2nd..num_instances-th images of its class
  and the 2nd..num_instances-th of the other classes, in batch order, paired position by position;
  the margin ranking loss mean(max(0, d(anchor, positive) - d(anchor, negative) + margin))."""
  dist = pairwise_euclidean(emb)
  same = labels[:, None] == labels[None, :]

  def nth(mask):  # [n, num_instances - 1]: the distance to the 2nd, 3rd, ... member of `mask`
    rank = jnp.cumsum(mask, axis=1) - 1
    return jnp.stack([jnp.sum(jnp.where(mask & (rank == r), dist, 0.0), axis=1)
                      for r in range(1, num_instances)], axis=1)

  return jnp.mean(jnp.maximum(nth(same) - nth(~same) + margin, 0.0))


def prototype_loss(emb, base_prototypes, ways, shots, omega):
  """Their IncrementalPTFixPNLoss (use_cosine): cross-entropy of -omega x cosine distance to [the
  `ways` blocks' means, the base prototypes], each image's own block its class."""
  means = emb.reshape(ways, shots, -1).mean(axis=1)
  candidates = jnp.concatenate([means, base_prototypes])
  unit = lambda v: v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-8)
  logits = -omega * (1.0 - unit(emb) @ unit(candidates).T)
  return objectives.cross_entropy(logits, jnp.repeat(jnp.arange(ways), shots))


def parameter_drift(trainable, former):
  """Their IncrementalNetworkFixLoss: the L1 distance to the previous network, averaged over
  tensors."""
  return sum(jnp.sum(jnp.abs(trainable[p] - former[p])) for p in trainable) / max(len(trainable), 1)


def session_loss(emb, labels, base_prototypes, trainable, former, ways, shots, cfg):
  """FSLL's session loss on the batch's embeddings `emb` (ways blocks of shots images): triplet +
  pn_weight x prototype loss + reg_weight x drift (without gradient unless cfg.reg_gradient)."""
  drift = parameter_drift(trainable, former)
  if not cfg.reg_gradient:
    drift = jax.lax.stop_gradient(drift)
  return (triplet_no_hard_mining(emb, labels, shots, cfg.margin)
          + cfg.pn_weight * prototype_loss(emb, base_prototypes, ways, shots, cfg.omega)
          + cfg.reg_weight * drift)


class FSLLRunner(common.Runner):
  """State of a run: {'params', 'batch_stats'} of the current network and 'prototypes' (base ones
  from session 1, then the novel classes' under the current network)."""

  def __init__(self, exp, first, *_):  # (ckpts, source, log): not read
    super().__init__(exp, first, exp.model)
    self.cfg = cfg = exp.config.fsll
    self.shots, self.ways = exp.config.data.shots, len(exp.bench.session_classes[1])
    self.tx = optim.sgd(cfg.lr, cfg.momentum, cfg.weight_decay)  # their milestone is never reached
    self.step = common.sgd_step(self.loss, self.tx, exp.bench, cfg.color_jitter)  # per tensor set

  def loss(self, trainable, x, labels, frozen, batch_stats, former, base_prototypes):
    """(`session_loss`, new BN statistics) of the network of `trainable` and `frozen` leaves, BN in
    train mode."""
    variables = {'params': trees.unflatten({**frozen, **trainable}), 'batch_stats': batch_stats}
    (emb, _), new = self.network.apply(variables, x, train=True, mutable=['batch_stats'])
    return session_loss(emb, labels, base_prototypes, trainable, former, self.ways, self.shots,
                        self.cfg), new['batch_stats']

  def update(self, state, run, session, exemplars):
    exp, labels, batch = self.exp, self.exp.bench.train.labels, self.ways * self.shots
    paths = selected_paths(state['params'], self.cfg.threshold)
    trainable, frozen = trees.split(state['params'], paths)
    # the frozen leaves, the drift's reference and the base prototypes: on the device once
    on_device, former, base = jax.device_put((frozen, trainable, self.first['prototypes']))
    batch_stats, opt_state, losses = state['batch_stats'], self.tx.init(former), []
    stream = (7, run, session)
    key = exp.key(*stream)
    per_epoch = protocol_lib.task_epoch_batches(len(np.unique(labels[exemplars])), self.shots,
                                                batch)
    for epoch in range(self.cfg.epochs):
      order = protocol_lib.task_epoch(labels, exemplars, self.shots, exp.config.seed, epoch, stream)
      for idx in order[:per_epoch * batch].reshape(per_epoch, batch):
        trainable, opt_state, loss, batch_stats = self.step(
            trainable, opt_state, exp.bench.train.images[idx], labels[idx],
            jax.random.fold_in(key, len(losses)), on_device, batch_stats, former, base)
        losses.append(float(loss))
    variables = jax.device_get({'params': trees.unflatten({**frozen, **trainable}),
                                'batch_stats': batch_stats})
    novel = common.novel_prototypes(exp, self.embed, variables, exemplars, session)
    return {**variables, 'prototypes': np.concatenate([self.first['prototypes'], novel])}, {
        'losses': losses, 'trainable': len(paths)}


FSLL = Method('fsll', common.BASELINE_PRESETS,  # the Baseline's base session; NCM over raw means
              common.base_model, FSLLRunner,
              "the Baseline's base; small-magnitude tensors fine-tuned on the novel shots with "
              'triplet + prototype losses; NCM', section='fsll', validate=validate_fsll)
