"""The optimizer every session and method uses: PyTorch's SGD (weight decay added to the gradient,
heavy-ball momentum) with a step schedule, as the authors' code trains everything."""
import jax
import optax


def sgd(lr, momentum, weight_decay, milestones=(), gamma=1.0, classifier_lr=None):
  """SGD whose rate is multiplied by `gamma` after each milestone step. `classifier_lr` gives the
  classifier ('fc') its own rate, as the original's CUB setting (backbone 1e-3, classifier 1e-2)."""
  def one(rate):
    schedule = optax.piecewise_constant_schedule(rate, {int(m): gamma for m in milestones})
    return optax.chain(optax.add_decayed_weights(weight_decay),
                       optax.sgd(schedule, momentum=momentum))

  if classifier_lr is None:
    return one(lr)
  group = lambda name: 'fc' if name == 'fc' else 'backbone'
  label_fn = lambda params: {k: jax.tree_util.tree_map(lambda _: group(k), v)
                             for k, v in params.items()}
  return optax.multi_transform({'backbone': one(lr), 'fc': one(classifier_lr)}, label_fn)


def sgd_at_rate(momentum, weight_decay):
  """`sgd` whose rate the caller sets before each update (`set_rate`): a schedule in epochs of a
  size known only per session, fed to one jitted step (iCaRL, Rebalance)."""
  chain = lambda learning_rate: optax.chain(optax.add_decayed_weights(weight_decay),
                                            optax.sgd(learning_rate, momentum=momentum))
  return optax.inject_hyperparams(chain)(learning_rate=0.0)


def set_rate(opt_state, rate):
  """`sgd_at_rate`'s state with the rate of the next update set to `rate`."""
  return opt_state._replace(hyperparams={**opt_state.hyperparams, 'learning_rate': rate})


def rate_at(step, lr, milestones, gamma):
  """The rate of (0-based) step `step` of a step schedule: lr times gamma for every milestone step
  reached, computed on the host in float64."""
  return lr * gamma ** sum(step >= int(m) for m in milestones)
