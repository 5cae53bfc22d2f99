"""Base session (session 1): the flat-minima objective (Eq. 3-4, Alg. 1) and the one program that
trains it.

`base_loss` is one pure function of (params, batch_stats, images, labels, eps). The M noise draws
are mapped with `jax.vmap` (or written out: `draw_map`); with `shared_trunk` the unperturbed trunk
(every block before the first noised conv) runs once and only the suffix is mapped over the draws.
BatchNorm uses batch statistics in every pass; by default the running statistics are updated by the
clean pass and then by each noisy pass in turn, as in the authors' code (`bn_updates`).

`train_step` is one update of one run; `make_train_program` jits the program every base training
runs (and `--mode bench` times): `steps_per_call` steps of S >= 1 runs (a sweep's members; a single
run is S = 1) scanned in one call, each step's batches gathered on the device.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import optax

from f2m_jax import noise as noise_lib
from f2m_jax import objectives
from f2m_jax import sharding
from f2m_jax import trees
from f2m_jax.data import augment as augment_lib
from f2m_jax.models import ResNet
from f2m_jax.models.resnet import fold_batch_stats


DRAW_MAPS = ('vmap', 'unroll')
# The averages a training loop logs from a step's metrics (which also hold 'finite').
LOGGED_METRICS = ('loss', 'ce', 'pf', 'acc', 'ce_clean')


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  batch_stats: Any
  opt_state: Any


BN_UPDATES = ('all_passes', 'clean')


@dataclasses.dataclass(frozen=True)
class BaseObjective:
  """Static settings of the base objective.

  model: the network; its `clean_backward` decides how noised convs are differentiated
    (config.noise.backward_weights).
  noise_paths: the noise set; empty means plain training (no draws).
  split: index of the first block holding a noised conv (the trunk is blocks [0, split)).
  num_draws: M. pf_weight: lambda. std_weight: gamma. (The bound b is an argument of the step, so
    that the members of a sweep over it share one program.)
  pf_gradient: whether PF is differentiated (the paper) or only its value counts (the authors' code).
  bn_updates: 'all_passes' (running statistics updated by the clean pass, then by each noisy pass in
    turn, as the authors' code) or 'clean' (the clean pass only).
  draw_map: how the M noisy passes share the program: 'vmap' (one pass with a leading draw axis) or
    'unroll' (M passes written out); config.noise.draw_map, resolved by f2m_jax/backend.py.
  """
  model: ResNet
  noise_paths: tuple
  split: int
  num_draws: int
  distribution: str
  pf_weight: float
  std_weight: float
  shared_trunk: bool
  draw_map: str = 'vmap'
  pf_gradient: bool = False
  bn_updates: str = 'all_passes'

  def __post_init__(self):
    if self.draw_map not in DRAW_MAPS:
      raise ValueError(f'noise.draw_map={self.draw_map!r} is not one of {DRAW_MAPS}')
    if self.bn_updates not in BN_UPDATES:
      raise ValueError(f'noise.bn_updates={self.bn_updates!r} is not one of {BN_UPDATES}')

  @property
  def noisy(self) -> bool:
    return bool(self.noise_paths) and self.num_draws > 0


def _add(a, b):
  return jax.tree_util.tree_map(jnp.add, a, b)


def base_loss(params, batch_stats, images, labels, eps, objective: BaseObjective):
  """Eq. 3 as run: L = 1/M sum_j L_j + gamma std_j(L_j), L_j = CE(z; phi + eps_j, psi) + lambda PF_j,
  for eps {path: [M, ...]}. The clean pass's CE is not part of L (it gives PF's reference and BN
  updates), as in the authors' code.

  Returns (loss, (new_batch_stats, metrics)). Without noise (objective.noisy False) it is plain CE.
  Every pass runs on all-zero running statistics, so what it returns is BN_MOMENTUM times its own
  batch statistics; `fold_batch_stats` then applies the passes' updates in PyTorch's order.
  """
  model = objective.model
  num_classes = model.num_classes
  zeros = jax.tree_util.tree_map(jnp.zeros_like, batch_stats)

  def run(x, first, last=None, noise=None):
    variables = {'params': params, 'batch_stats': zeros}
    if noise is not None:
      variables['noise'] = noise_lib.collection(noise)
    out, upd = model.apply(variables, x, train=True, first=first, last=last, mutable=['batch_stats'])
    return out, upd['batch_stats']

  if objective.noisy and objective.shared_trunk:
    inputs, trunk_update = run(images, 0, objective.split)
    first = objective.split
  else:
    inputs, first, trunk_update = images, 0, zeros
  (emb, logits), suffix_update = run(inputs, first)
  clean_update = _add(trunk_update, suffix_update)  # each pass leaves the other's layers at zero
  clean_ce = objectives.cross_entropy(logits, labels)
  metrics = {'acc': jnp.mean(jnp.argmax(logits, -1) == labels), 'ce_clean': clean_ce}
  if not objective.noisy:
    metrics.update(loss=clean_ce, ce=clean_ce, pf=jnp.zeros(()))
    return clean_ce, (fold_batch_stats(batch_stats, [clean_update]), metrics)

  def noisy_pass(e):
    (emb_j, logits_j), update_j = run(inputs, first, noise=e)
    ce_j = objectives.cross_entropy(logits_j, labels)
    pf_j = objectives.prototype_fixing(emb, emb_j, labels, num_classes)
    if not objective.pf_gradient:
      pf_j = jax.lax.stop_gradient(pf_j)
    return ce_j, pf_j, _add(trunk_update, update_j)  # a shared trunk saw the same batch M more times

  ce, pf, noisy_updates = map_draws(noisy_pass, eps, objective.draw_map)
  updates = [clean_update] + (noisy_updates if objective.bn_updates == 'all_passes' else [])
  loss = objectives.flat_minima_objective(ce + objective.pf_weight * pf, objective.std_weight)
  metrics.update(loss=loss, ce=ce.mean(), pf=pf.mean())
  return loss, (fold_batch_stats(batch_stats, updates), metrics)


def map_draws(noisy_pass: Callable, eps: dict, draw_map: str) -> tuple:
  """(ce [M], pf [M], [BN updates of each draw]) of `noisy_pass` over the M draws of `eps`
  ({path: [M, ...]}): `jax.vmap` over the draw axis, or the M passes written out ('unroll')."""
  num_draws = next(iter(eps.values())).shape[0]
  if draw_map == 'unroll':
    per_draw = [noisy_pass({p: e[j] for p, e in eps.items()}) for j in range(num_draws)]
    ce, pf = (jnp.stack(v) for v in list(zip(*per_draw))[:2])
    return ce, pf, [u for _, _, u in per_draw]
  ce, pf, stacked = jax.vmap(noisy_pass)(eps)
  return ce, pf, [trees.index(stacked, j) for j in range(num_draws)]


def init_state(model: ResNet, key: jax.Array, image_size: int, tx: optax.GradientTransformation,
               params=None, batch_stats=None) -> TrainState:
  """A fresh state; `params`/`batch_stats` replace the random init (e.g. pretrained weights)."""
  variables = model.init(key, jnp.zeros((1, image_size, image_size, 3), jnp.float32), train=False)
  params = variables['params'] if params is None else params
  batch_stats = variables['batch_stats'] if batch_stats is None else batch_stats
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, batch_stats=batch_stats,
                    opt_state=tx.init(params))


def all_finite(tree) -> jax.Array:
  """True when every float in `tree` is finite (a scalar bool array)."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]))


def apply_step(state: TrainState, x, labels, eps, objective: BaseObjective,
               tx: optax.GradientTransformation):
  """One update of the clean parameters from network inputs `x` (already augmented and normalised)
  and the draws `eps` ({path: [M, ...]}, empty without noise): value_and_grad of `base_loss`, then
  the optimizer. Pure; `make_train_step` jits it behind the augmentation and the sampler."""
  grad_fn = jax.value_and_grad(base_loss, has_aux=True)
  (_, (new_stats, metrics)), grads = grad_fn(state.params, state.batch_stats, x, labels, eps, objective)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  # A finite loss can still take an update to inf: the step is good only if what it saves is finite.
  metrics['finite'] = jnp.isfinite(metrics['loss']) & all_finite((params, new_stats))
  return TrainState(state.step + 1, params, new_stats, opt_state), metrics


def make_train_step(objective: BaseObjective, tx: optax.GradientTransformation, augment: str, image_size: int,
                    mean, std) -> Callable:
  """train_step(state, images_u8, labels, key, bound) -> (state, metrics): one update of one run,
  pure. The batch is augmented and the noise (half-width `bound`) drawn from fold_in(key, state.step),
  so they depend only on (key, step) and a resumed run repeats an uninterrupted one."""

  def train_step(state: TrainState, images, labels, key, bound):
    k_aug, k_noise = jax.random.split(jax.random.fold_in(key, state.step))
    x = augment_lib.train_inputs(k_aug, images, augment, image_size, mean, std)
    eps = (noise_lib.sample_noise(k_noise, state.params, objective.noise_paths, objective.num_draws, bound,
                                  objective.distribution) if objective.noisy else {})
    return apply_step(state, x, labels, eps, objective, tx)

  return train_step


MEMBER_MAPS = ('unroll', 'vmap')


def map_members(step: Callable, members_map: str) -> Callable:
  """`step` of one run (`make_train_step`'s) over S runs whose arguments all carry a leading member
  axis: `jax.vmap`, or the S steps written out side by side ('unroll'; for one run exactly its step)."""
  if members_map == 'vmap':
    return jax.vmap(step)

  def unrolled(states, images, labels, keys, bounds):
    outs = [step(trees.index(states, i), images[i], labels[i], keys[i], bounds[i]) for i in range(len(keys))]
    return trees.stack(outs)

  return unrolled


def make_train_program(step: Callable, members_map: str, mesh) -> Callable:
  """program(states, images, labels, indices, num_steps, keys, bounds) -> (states, metrics): the base
  training program. `indices` [N, S, B]: N steps of S members' batches, gathered on the device from
  the training images (uint8) and labels that every member shares; states, keys and bounds [S]
  carry a leading member axis (`map_members`); metrics leaves are [N, S]. Only the first `num_steps`
  (<= N) steps count: later rows are computed and discarded, so a shorter call (the end of a budget,
  a resume) runs the same compiled program. Jitted over `mesh`: images, states and keys replicated,
  the batch axis B split over the devices; the states are donated."""
  members = map_members(step, members_map)

  def program(states, images, labels, indices, num_steps, keys, bounds):
    def body(states, xs):
      i, idx = xs
      new, metrics = members(states, jnp.take(images, idx, axis=0), jnp.take(labels, idx, axis=0), keys, bounds)
      return jax.tree_util.tree_map(lambda a, b: jnp.where(i < num_steps, a, b), new, states), metrics
    return jax.lax.scan(body, states, (jnp.arange(indices.shape[0]), indices))

  rep = sharding.replicated(mesh)
  return jax.jit(program, in_shardings=(rep, rep, rep, sharding.member_rows_sharded(mesh), rep, rep, rep),
                 out_shardings=(rep, rep), donate_argnums=(0,))
