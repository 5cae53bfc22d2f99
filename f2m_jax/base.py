"""Base session (session 1): the flat-minima objective and a jitted train step (Eq. 3-4, Alg. 1).

`base_loss` is one pure function of (params, batch_stats, images, labels, eps). The M noise draws
are mapped with `jax.vmap` (or unrolled: `draw_map`); with `shared_trunk` the unperturbed trunk
(every block before the first noised conv) runs once and only the suffix is mapped over the draws.
BatchNorm uses batch statistics in every pass; the running statistics are updated from the clean
pass alone.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import optax

from f2m_jax import noise as noise_lib
from f2m_jax import objectives
from f2m_jax.data import augment as augment_lib
from f2m_jax.models import ResNet


DRAW_MAPS = ('vmap', 'unroll')


def resolve_draw_map(name: str) -> str:
  """noise.draw_map: 'auto' is 'unroll' on CPU and 'vmap' elsewhere (the faster one in `--mode bench`:
  XLA:CPU's grouped convolutions are slow, a GPU runs the vmapped draws best)."""
  if name == 'auto':
    return 'unroll' if jax.default_backend() == 'cpu' else 'vmap'
  return name


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  batch_stats: Any
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class BaseObjective:
  """Static settings of the base objective.

  noise_paths: the noise set; empty means plain training (no draws).
  split: index of the first block holding a noised conv (the trunk is blocks [0, split)).
  num_draws: M. bound: b. pf_weight: lambda. std_weight: gamma.
  draw_map: how the M noisy passes are batched: 'vmap' (one pass with a leading draw axis; the
    convolutions become grouped ones) or 'unroll' (M passes in one program; XLA:CPU runs these
    several times faster than grouped convolutions).
  """
  model: ResNet
  noise_paths: tuple
  split: int
  num_draws: int
  bound: float
  distribution: str
  pf_weight: float
  std_weight: float
  shared_trunk: bool
  draw_map: str = 'vmap'

  def __post_init__(self):
    if self.draw_map not in DRAW_MAPS:
      raise ValueError(f'noise.draw_map={self.draw_map!r} is not one of {DRAW_MAPS}')

  @property
  def noisy(self) -> bool:
    return bool(self.noise_paths) and self.num_draws > 0


def base_loss(params, batch_stats, images, labels, eps, objective: BaseObjective):
  """Eq. 3: L = 1/M sum_j [CE(z; phi + eps_j, psi) + lambda PF_j] + gamma std_j, for eps [M, ...].

  Returns (loss, (new_batch_stats, metrics)). Without noise (objective.noisy False) it is plain CE.
  """
  model = objective.model
  num_classes = model.num_classes
  if objective.noisy and objective.shared_trunk:
    h, upd = model.apply({'params': params, 'batch_stats': batch_stats}, images, train=True,
                         last=objective.split, mutable=['batch_stats'])
    inputs, first, stats = h, objective.split, upd['batch_stats']
  else:
    inputs, first, stats = images, 0, batch_stats
  (emb, logits), upd = model.apply({'params': params, 'batch_stats': stats}, inputs, train=True,
                                   first=first, mutable=['batch_stats'])
  new_stats = upd['batch_stats']
  clean_ce = objectives.cross_entropy(logits, labels)
  metrics = {'acc': jnp.mean(jnp.argmax(logits, -1) == labels), 'ce_clean': clean_ce}
  if not objective.noisy:
    metrics.update(loss=clean_ce, ce=clean_ce, pf=jnp.zeros(()))
    return clean_ce, (new_stats, metrics)

  def noisy_pass(e):
    (emb_j, logits_j), _ = model.apply({'params': noise_lib.perturb(params, e), 'batch_stats': batch_stats},
                                       inputs, train=True, first=first, mutable=['batch_stats'])
    ce_j = objectives.cross_entropy(logits_j, labels)
    pf_j = objectives.prototype_fixing(emb, emb_j, labels, num_classes)
    return ce_j, pf_j

  if objective.draw_map == 'unroll':
    num_draws = next(iter(eps.values())).shape[0]
    per_draw = [noisy_pass({p: e[j] for p, e in eps.items()}) for j in range(num_draws)]
    ce, pf = (jnp.stack(v) for v in zip(*per_draw))
  else:
    ce, pf = jax.vmap(noisy_pass)(eps)
  loss = objectives.flat_minima_objective(ce + objective.pf_weight * pf, objective.std_weight)
  metrics.update(loss=loss, ce=ce.mean(), pf=pf.mean())
  return loss, (new_stats, metrics)


def make_optimizer(lr: float, momentum: float, weight_decay: float, milestones: Sequence[int],
                   gamma: float, classifier_lr: Optional[float] = None) -> optax.GradientTransformation:
  """PyTorch-style SGD: weight decay added to the gradient, heavy-ball momentum, step schedule
  (lr times gamma after each milestone iteration). `classifier_lr` gives the classifier ('fc') its
  own rate, as the original's CUB setting (backbone 1e-3, classifier 1e-2)."""
  def sgd(rate):
    schedule = optax.piecewise_constant_schedule(rate, {int(m): gamma for m in milestones})
    return optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(schedule, momentum=momentum))

  if classifier_lr is None:
    return sgd(lr)
  label_fn = lambda params: {k: jax.tree_util.tree_map(lambda _: 'fc' if k == 'fc' else 'backbone', v)
                             for k, v in params.items()}
  return optax.multi_transform({'backbone': sgd(lr), 'fc': sgd(classifier_lr)}, label_fn)


def init_state(model: ResNet, key: jax.Array, image_size: int, tx: optax.GradientTransformation,
               params=None, batch_stats=None) -> TrainState:
  """A fresh state; `params`/`batch_stats` replace the random init (e.g. pretrained weights)."""
  variables = model.init(key, jnp.zeros((1, image_size, image_size, 3), jnp.float32), train=False)
  params = variables['params'] if params is None else params
  batch_stats = variables['batch_stats'] if batch_stats is None else batch_stats
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, batch_stats=batch_stats,
                    opt_state=tx.init(params))


def make_train_step(objective: BaseObjective, tx: optax.GradientTransformation, augment: str,
                    image_size: int, mean, std, mesh=None) -> Callable:
  """train_step(state, images_u8, labels, key) -> (state, metrics), pure and jitted.

  The step's randomness is fold_in(key, state.step): augmentation and noise depend only on
  (key, step), so a resumed run repeats an uninterrupted one. With a `mesh` (f2m_jax.sharding) the
  step is one SPMD program over it: state and key replicated, images and labels sharded on axis 0."""

  def train_step(state: TrainState, images, labels, key):
    k_aug, k_noise = jax.random.split(jax.random.fold_in(key, state.step))
    x = augment_lib.train_inputs(k_aug, images, augment, image_size, mean, std)
    eps = (noise_lib.sample_noise(k_noise, state.params, objective.noise_paths, objective.num_draws,
                                  objective.bound, objective.distribution) if objective.noisy else {})
    grad_fn = jax.value_and_grad(base_loss, has_aux=True)
    (_, (new_stats, metrics)), grads = grad_fn(state.params, state.batch_stats, x, labels, eps, objective)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics['finite'] = jnp.isfinite(metrics['loss'])
    return TrainState(state.step + 1, params, new_stats, opt_state), metrics

  if mesh is not None:
    from f2m_jax import sharding
    return sharding.jit_data_parallel(train_step, mesh)
  return jax.jit(train_step, donate_argnums=(0,))
