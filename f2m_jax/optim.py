"""The optimizer every session and method uses: PyTorch's SGD (weight decay added to the gradient,
heavy-ball momentum) with a step schedule, as the authors' code trains everything."""
from __future__ import annotations

from typing import Optional, Sequence

import jax
import optax


def sgd(lr: float, momentum: float, weight_decay: float, milestones: Sequence[int] = (), gamma: float = 1.0,
        classifier_lr: Optional[float] = None) -> optax.GradientTransformation:
  """SGD whose rate is multiplied by `gamma` after each milestone step. `classifier_lr` gives the
  classifier ('fc') its own rate, as the original's CUB setting (backbone 1e-3, classifier 1e-2)."""
  def one(rate):
    schedule = optax.piecewise_constant_schedule(rate, {int(m): gamma for m in milestones})
    return optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(schedule, momentum=momentum))

  if classifier_lr is None:
    return one(lr)
  label_fn = lambda params: {k: jax.tree_util.tree_map(lambda _: 'fc' if k == 'fc' else 'backbone', v)
                             for k, v in params.items()}
  return optax.multi_transform({'backbone': one(lr), 'fc': one(classifier_lr)}, label_fn)


def sgd_direction(momentum: float, weight_decay: float) -> optax.GradientTransformation:
  """`sgd` before its rate: the step is -rate x this update, with the rate chosen by the caller at
  each step (a schedule in epochs of a size known only per session, fed to one jitted step)."""
  return optax.chain(optax.add_decayed_weights(weight_decay), optax.trace(decay=momentum))
