"""Joint training and cRT, the paper's approximate upper bound (docs/method.md, 'The compared
methods'). Unlike the authors' (one fixed draw), every run trains on its own draw of the shots."""
import functools

import jax
import ml_collections
import numpy as np

from f2m_jax import objectives, optim, train_loop, trees
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.evaluator import embedder, seen_accuracies
from f2m_jax.files import CheckpointError
from f2m_jax.methods import Method, common, icarl


def validate_crt(config):
  common.need_least(config, 'crt', epochs=1, per_class=1, batch_size=1)


def train_network(exp, network, pool, key, training, log, desc, stream, select=None):
  """A new network (model.pretrained's trunk where set, else a random init) trained on `pool` with
  shuffled batches and the base.* budget, resuming from `training`. Returns {'params',
  'batch_stats'}: the last step's, or with `select` (a train_loop.TestSetSelector, every
  base.select_every steps) the best one kept."""
  cfg = exp.config.base
  state = exp.init_state(network, key)
  start = training.latest_step()
  if start is not None:
    state = training.restore(state)
  plain = ml_collections.FrozenConfigDict({**exp.loss, 'enabled': False})  # whatever config.noise
  batch = lambda step: protocol_lib.shuffled_batch(pool, cfg.batch_size, exp.config.seed, step,
                                                   stream)
  member = train_loop.Member(batch, jax.random.fold_in(key, 1), 0.0, training.save, log)
  states = train_loop.train_steps(exp, network, plain, [member], trees.stack([state]), start or 0,
                                  desc, desc, select)
  return train_loop.chosen_variables(trees.index(states, 0), select, desc, cfg.steps)


class JointRunner(common.Runner):
  """State of a run: the variables of the session's network (a classifier over all seen classes)."""

  def __init__(self, exp, first, ckpts, source=None, log=None):
    self.exp, self.ckpts, self.source, self.log = exp, ckpts, source, log
    self.first = common.network_of(first)
    # one compiled program per session, kept as long as this runner
    self.logits_fn = functools.cache(
        lambda session: embedder(exp, network=self.network(session), logits=True))

  def network(self, session):
    return self.exp.network(self.exp.bench.num_seen_classes(session))

  def update(self, state, run, session, exemplars):
    exp, network, select = self.exp, self.network(session), None
    pool = np.concatenate([exp.bench.base_train, exemplars])
    training = self.ckpts.training(run, session)
    try:
      if exp.config.base.select_on_test:  # the authors' best on test (docs/method.md)
        select = train_loop.TestSetSelector(exp, network, session, training.best, self.log,
                                            self.logits_fn(session),
                                            {'run': run, 'session': session})
      variables = train_network(exp, network, pool, exp.key(4, run, session), training, self.log,
                                f'joint run {run} session {session}', (run, session), select)
    finally:
      training.close()
    # the session checkpoint keeps the network; its train states are not needed
    training.close(remove=True)
    return variables, {'images': len(pool)}

  def accuracies(self, state, session):
    """The linear classifier's accuracies on the test images of every class seen up to `session`."""
    images, logits = self.exp.bench.test.images, self.logits_fn(session)
    return seen_accuracies(self.exp, session, lambda idx: np.argmax(logits(state, images[idx]), -1))

  def template(self, session):
    return self.exp.variables_template(self.network(session))

  def norms(self, state):
    return None


# ----------------------------------------------------------------------------- cRT

def _reinit_classifier(params, key):
  """The classifier re-initialised as the original: N(0, 0.001) weights, zero bias (where the head
  has one; another head's other parameters kept)."""
  draw = lambda k, shape, dtype: 1e-3 * jax.random.normal(k, shape, dtype)
  return icarl.new_columns(key, params, 0, params['fc']['kernel'].shape[-1], draw)


def retrain_classifier(exp, network, variables, pool, key, stream):
  """cRT: every layer but the classifier frozen (BN in eval mode), the classifier re-initialised and
  trained with class-aware batches on `pool` under the crt.* schedule."""
  c, bench, labels = exp.config.crt, exp.bench, exp.bench.train.labels
  params = _reinit_classifier(variables['params'], key)
  counts = np.bincount(labels[pool])  # an epoch: the largest class's size x the classes
  per_epoch = max(int(counts.max()) * np.count_nonzero(counts) // c.batch_size, 1)
  tx = optim.sgd(c.lr, c.momentum, c.weight_decay, [int(m) * per_epoch for m in c.milestones],
                 c.lr_gamma)
  fc, frozen = params['fc'], {k: v for k, v in params.items() if k != 'fc'}
  batch_stats = variables['batch_stats']

  def loss_fn(fc_params, x, labels):
    _, logits = network.apply({'params': {**frozen, 'fc': fc_params}, 'batch_stats': batch_stats},
                              x, train=False)
    return objectives.cross_entropy(logits, labels), None

  step = common.sgd_step(loss_fn, tx, bench)
  opt_state = tx.init(fc)
  for epoch in range(c.epochs):
    order = protocol_lib.class_aware_epoch(labels, pool, c.per_class, exp.config.seed, epoch,
                                           stream)
    for pos in range(per_epoch):
      idx = order[pos * c.batch_size:(pos + 1) * c.batch_size]
      fc, opt_state, _, _ = step(fc, opt_state, bench.train.images[idx], labels[idx],
                                 jax.random.fold_in(key, epoch * per_epoch + pos))
  return {'params': {**frozen, 'fc': jax.device_get(fc)}, 'batch_stats': batch_stats}


def crt_first_session(exp, ckpts, log, source=None, hook=None):
  """Session 1: the joint workdir's base network and its own classifier, not retrained (theirs has
  no session-1 cRT; the paper prints cRT's session 1 equal to joint's)."""
  if source is None:  # the pipeline calls the runner after this
    raise ValueError('method=crt retrains the classifier of a joint model: pass --checkpoint '
                     'JOINT_WORKDIR (a workdir of method=joint)')
  return common.base_model(exp, ckpts, log, source)


class CRTRunner(JointRunner):
  """Per session: the joint run's network for that session (`source`: its workdir), classifier
  retrained."""

  def update(self, state, run, session, exemplars):
    exp = self.exp
    if session not in self.source.sessions_done(run):
      raise CheckpointError(f'the joint workdir ({self.source.root}) has no run {run} session '
                            f'{session}: train it first (or give this run fewer runs or sessions)')
    saved = self.source.run(run).restore({**self.template(session), 'exemplars': exemplars,
                                          'accuracy': np.zeros(4)}, session)
    if not np.array_equal(saved['exemplars'], exemplars):
      raise CheckpointError(f'run {run} session {session}: the joint workdir trained on other '
                            'shots (another seed, protocol or data)')
    pool = np.concatenate([exp.bench.base_train, exemplars])
    variables = retrain_classifier(exp, self.network(session), self.restore(saved), pool,
                                   exp.key(5, run, session), (run, session))
    return variables, {'images': len(pool)}


JOINT = Method('joint', common.BASELINE_PRESETS,  # plain CE with shuffled batches in every session
               common.base_model, JointRunner,
               'a new network (model.pretrained where set) on all data seen so far, every session; '
               'linear classifier')
CRT = Method('crt', common.BASELINE_PRESETS, crt_first_session, CRTRunner,
             "joint's networks, from session 2 on the classifier retrained class-balanced with the "
             'rest frozen',
             section='crt', validate=validate_crt)
