"""Incremental sessions t >= 2 (Sec. 4.2, Alg. 1): fine-tune the trainable leaves inside the box
[phi* - b, phi* + b] (an optax update, then `jnp.clip`); BatchNorm in eval mode."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax

from f2m_jax import objectives
from f2m_jax import optim
from f2m_jax import trees
from f2m_jax.data import augment as augment_lib
from f2m_jax.models import ResNet
from f2m_jax.padding import pad_rows


# The norms of Eq. 5's prototypes (config.incremental.prototype_norm; docs/method.md's table).
PROTOTYPE_NORMS = ('raw', 'unit_base', 'unit_all')


@dataclasses.dataclass(frozen=True)
class SessionSettings:
  model: ResNet
  trainable_paths: tuple
  steps: int
  lr: float
  momentum: float
  weight_decay: float
  bound: float
  clamp: bool
  distance: str
  augment: str
  image_size: int
  mean: tuple
  std: tuple
  round_steps: bool = False
  prototype_norm: str = 'raw'  # one of PROTOTYPE_NORMS


def clip_to_box(trainable, anchor, bound):
  """Sec. 4.2: clamp every trainable element to [phi* - b, phi* + b], phi* being the base model."""
  return {p: jnp.clip(v, anchor[p] - bound, anchor[p] + bound) for p, v in trainable.items()}


def session_loss(trainable, frozen, batch_stats, x, labels, stored, num_seen, settings):
  """Eq. 5 for the current network (BN in eval mode), its prototypes at `settings.prototype_norm`:
  'unit_base' the stored rows at unit norm, 'unit_all' every prototype
  (`objectives.metric_loss`)."""
  params = trees.unflatten({**frozen, **trainable})
  emb, _ = settings.model.apply({'params': params, 'batch_stats': batch_stats}, x, train=False)
  if settings.prototype_norm == 'unit_base':
    stored = objectives.normalize_prototypes(stored)
  return objectives.metric_loss(emb, labels, stored, settings.distance, num_seen,
                                unit_prototypes=settings.prototype_norm == 'unit_all')


def round_gradient(g, lr, quantum):
  """The original's gradient rounding (not in the paper; docs/method.md, 'Incremental sessions'):
  the gradient whose plain SGD step is lr*g rounded to a multiple of `quantum` (2*lr*g, once, where
  that rounds the whole tensor to zero)."""
  q = jnp.round(lr * g / quantum)
  q = jnp.where(jnp.all(q == 0), jnp.round(2 * lr * g / quantum), q)
  return q * quantum / lr


def session_optimizer(settings):
  """A fresh SGD (momentum, weight decay) per session, as the original; with `round_steps`, each
  tensor's gradient is first rounded by `round_gradient` with quantum b/2."""
  tx = optim.sgd(settings.lr, settings.momentum, settings.weight_decay)
  if not settings.round_steps:
    return tx
  quantum = settings.bound / 2
  rounded = lambda g, _: jax.tree.map(lambda x: round_gradient(x, settings.lr, quantum), g)
  return optax.chain(optax.stateless(rounded), tx)


def session_step(trainable, opt_state, frozen, batch_stats, anchor, x, labels, stored, num_seen,
                 settings, tx):
  """One fine-tuning step on inputs `x`: Eq. 5's gradient on the trainable leaves, the optax update,
  then the clamp to the box. Returns (trainable, opt_state, loss)."""
  loss, grads = jax.value_and_grad(session_loss)(trainable, frozen, batch_stats, x, labels, stored,
                                                 num_seen, settings)
  updates, opt_state = tx.update(grads, opt_state, trainable)
  trainable = optax.apply_updates(trainable, updates)
  if settings.clamp:
    trainable = clip_to_box(trainable, anchor, settings.bound)
  return trainable, opt_state, loss


def finetune_session(trainable, frozen, batch_stats, anchor, step_inputs, labels, stored, num_seen,
                     settings, tx=None):
  """One session's E steps of `session_step` on flat dicts from a fresh optimizer, step i on the
  inputs `step_inputs(i)`, clamped to the box around `anchor` (phi*). Returns (trainable,
  losses[E])."""
  tx = tx or session_optimizer(settings)

  def step(i, carry):
    trainable, opt_state, losses = carry
    trainable, opt_state, loss = session_step(trainable, opt_state, frozen, batch_stats, anchor,
                                              step_inputs(i), labels, stored, num_seen, settings,
                                              tx)
    return trainable, opt_state, losses.at[i].set(loss)

  carry = (trainable, tx.init(trainable), jnp.zeros((settings.steps,), augment_lib.float_dtype()))
  # One traced step in a loop (experiments/results/README.md, 'Figures behind the code's choices').
  trainable, _, losses = jax.lax.fori_loop(0, settings.steps, step, carry)
  return trainable, losses


@functools.lru_cache(maxsize=8)
def make_finetune(settings):
  """finetune(params, batch_stats, anchor, images_u8, labels, stored, num_seen, key) -> (params,
  losses[E]), jitted: one session of one run. `stored`: [C, D] prototypes, the first `num_seen` rows
  seen. `pad_session` pads every session to the last one's sizes (one compile; padding takes no part
  in the loss). Built once per process for each `settings` (every value the program depends on), as
  `base.train_program`."""
  tx = session_optimizer(settings)

  @jax.jit
  def finetune(params, batch_stats, anchor, images, labels, stored, num_seen, key):
    def step_inputs(i):  # step i's augmentation draws: fold_in(key, i)
      return augment_lib.train_inputs(jax.random.fold_in(key, i), images, settings.augment,
                                      settings.image_size, settings.mean, settings.std)

    trainable, frozen = trees.split(params, settings.trainable_paths)
    trainable, losses = finetune_session(trainable, frozen, batch_stats, anchor, step_inputs,
                                         labels, stored, num_seen, settings, tx)
    return trees.unflatten({**frozen, **trainable}), losses

  return finetune


def pad_session(images, labels, stored, max_images, max_classes):
  """(images, labels, stored, num_seen) of a session padded to `max_images` rows (label -1) and
  `max_classes` prototype rows, for `make_finetune`'s program."""
  return (pad_rows(images, max_images), pad_rows(labels, max_images, -1),
          pad_rows(stored, max_classes), jnp.int32(len(stored)))
