"""Base session (session 1): the flat-minima loss (Eq. 3-4), its train step (Alg. 1) and the one
program every base training runs (and `--mode bench` times). `loss` is always the frozen view
`loss_view` makes. The noise bound b is passed to the program, not read from the view, so that the
members of a sweep over b share one program."""
import functools
from typing import Any, NamedTuple

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

from f2m_jax import noise as noise_lib
from f2m_jax import objectives
from f2m_jax import optim
from f2m_jax import sharding
from f2m_jax import trees
from f2m_jax.data import augment as augment_lib
from f2m_jax.models import noise_set_paths, split_block
from f2m_jax.models.resnet import fold_batch_stats

MEMBER_MAPS = ('unroll', 'vmap')
BN_UPDATES = ('all_passes', 'clean')


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  batch_stats: Any
  opt_state: Any


def perturb(params, eps):
  """params + eps: one draw ({path: array}) added to the noise set's leaves of `params`."""
  flat = trees.flatten(params)
  return trees.unflatten({**flat, **{p: flat[p] + e for p, e in eps.items()}})


def _add(a, b):
  return jax.tree_util.tree_map(jnp.add, a, b)


# The fields of other sections than config.noise that the loss reads, as 'section.field'.
LOSS_FIELDS = ()


def loss_view(config):
  """The one frozen view of the config the loss reads (`Experiment.loss`): config.noise's fields and
  each field LOSS_FIELDS names, by its own name (a name config.noise has is refused)."""
  view = dict(config.noise)
  for path in LOSS_FIELDS:
    name = path.split('.')[-1]
    if name in view:
      raise ValueError(f'base.LOSS_FIELDS names {path}, whose name config.noise has: rename it')
    view[name] = config[path]
  return ml_collections.FrozenConfigDict(view)


def base_loss(params, batch_stats, images, labels, eps, model, loss):
  """L, the sum of `loss_terms` of the clean pass and, for the M draws `eps` ({path: [M, ...]};
  empty without noise), one pass at `params + eps_j` per draw. Returns (L, (new batch_stats,
  metrics)), metrics' 'loss' being `minimised`. Each pass runs on zero running statistics, so it
  returns BN_MOMENTUM times its batch statistics; `fold_batch_stats` applies them in PyTorch's
  order."""
  zeros = jax.tree_util.tree_map(jnp.zeros_like, batch_stats)

  def run(variables, x, first, last=None):
    out, update = model.apply({**variables, 'batch_stats': zeros}, x, train=True, first=first,
                              last=last, mutable=['batch_stats'])
    return out, update['batch_stats']

  split = split_block(model, list(eps)) if eps and loss.shared_trunk else 0  # the trunk runs once
  inputs, trunk_update = run({'params': params}, images, 0, split) if split else (images, zeros)
  (emb, logits), suffix_update = run({'params': params}, inputs, split)
  updates = [_add(trunk_update, suffix_update)]  # each pass leaves the other's layers at zero
  out = {'logits': logits, 'labels': labels, 'ce_clean': objectives.cross_entropy(logits, labels)}
  metrics = {'acc': jnp.mean(jnp.argmax(logits, -1) == labels)}

  def noisy_pass(eps_j):
    """({'ce': CE(z; phi + eps_j, psi), 'pf': PF_j}, the pass's BN update) of one draw."""
    if loss.backward_weights == 'clean':  # the convs add eps_j, differentiated at the clean weights
      variables = {'params': params, 'noise': trees.unflatten(eps_j)}
    else:
      variables = {'params': perturb(params, eps_j)}
    (emb_j, logits_j), update_j = run(variables, inputs, split)
    pf_j = objectives.prototype_fixing(emb, emb_j, labels, model.num_classes)
    outputs = {'ce': objectives.cross_entropy(logits_j, labels),
               'pf': pf_j if loss.pf_gradient else jax.lax.stop_gradient(pf_j)}
    return outputs, _add(trunk_update, update_j)  # a shared trunk saw the same batch M more times

  if eps:
    per_draw, noisy_updates = map_draws(noisy_pass, eps, loss.draw_map)
    out.update(per_draw)
    updates += noisy_updates if loss.bn_updates == 'all_passes' else []
    metrics.update(ce=per_draw['ce'].mean(), pf=per_draw['pf'].mean(), ce_clean=out['ce_clean'])
  terms = loss_terms(out, loss)
  metrics['loss'] = minimised(terms, loss)
  return sum(terms.values()), (fold_batch_stats(batch_stats, updates), metrics)


def loss_terms(out, loss):
  """{name: scalar} the base loss sums, from the passes' outputs: the clean pass's ('logits',
  'labels', 'ce_clean') and the noisy passes' ('ce', 'pf': per draw [M]; absent without noise).
  Without noise the clean CE; with it Eq. 3-4 as the authors' code runs them (docs/method.md, 'Base
  session'), mean_j L_j + gamma std_j(L_j), L_j = CE_j + lambda PF_j (lambda 0 without
  noise.prototype_fixing), plus noise.clean_ce_weight CE_clean. A weight of 0 leaves its term out of
  the program (a Python branch on the frozen view); a term of the clean pass goes after the
  branches."""
  if 'ce' not in out:  # no noisy passes
    return {'ce': out['ce_clean']}
  pf = (loss.pf_weight if loss.prototype_fixing else 0.0) * out['pf']
  terms = {'ce': jnp.mean(out['ce']), 'pf': jnp.mean(pf)}
  if loss.std_weight and len(out['ce']) > 1:  # the authors' code; the paper has no such term
    terms['std'] = loss.std_weight * objectives.unbiased_std(out['ce'] + pf)
  if loss.clean_ce_weight:  # at 0 the clean pass needs no backward
    terms['clean_ce'] = loss.clean_ce_weight * out['ce_clean']
  return terms


def minimised(terms, loss):
  """What the step minimises: the sum of `terms` less PF's where PF has no gradient
  (noise.pf_gradient False): a constant to the step, which PF acts on only through the std term
  (F2M-V has none)."""
  return sum(value for name, value in terms.items() if name != 'pf' or loss.pf_gradient)


def map_draws(noisy_pass, eps, draw_map):
  """({name: [M]}, [M BN updates]) of `noisy_pass(eps_j) -> ({name: scalar}, BN update)` over the
  draws of `eps`: `jax.vmap` over the draw axis ('vmap'), or the M passes written out ('unroll')."""
  num_draws = len(next(iter(eps.values())))
  if draw_map == 'unroll':
    outputs, stacked = trees.stack([noisy_pass(trees.index(eps, j)) for j in range(num_draws)])
  else:
    outputs, stacked = jax.vmap(noisy_pass)(eps)
  return outputs, [trees.index(stacked, j) for j in range(num_draws)]


def train_step(state, x, labels, eps, model, loss, tx):
  """One update of the clean parameters from inputs `x` and draws `eps`: the gradient of
  `base_loss`, then `tx`. Returns (state, metrics), with 'finite': whether the loss and the step are
  finite."""
  grads, (batch_stats, metrics) = jax.grad(base_loss, has_aux=True)(
      state.params, state.batch_stats, x, labels, eps, model, loss)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  leaves = jax.tree_util.tree_leaves((metrics['loss'], params, batch_stats))
  metrics['finite'] = jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves]))
  return TrainState(state.step + 1, params, batch_stats, opt_state), metrics


def init_state(model, key, image_size, tx, params=None, batch_stats=None):
  """A fresh state; `params`/`batch_stats` replace the random init (e.g. pretrained weights)."""
  variables = model.init(key, jnp.zeros((1, image_size, image_size, 3), jnp.float32), train=False)
  params = variables['params'] if params is None else params
  batch_stats = variables['batch_stats'] if batch_stats is None else batch_stats
  return TrainState(jnp.zeros((), jnp.int32), params, batch_stats, tx.init(params))


def make_train_program(model, loss, tx, data, members_map, mesh):
  """program(states, images, labels, indices, num_steps, keys, bounds) -> (states, metrics): the
  first `num_steps` of N steps of S members in one call, jitted over `mesh` (batch axis split,
  states donated). `indices` [N, S, B] gather each member's batches from the shared images; states,
  keys and bounds carry a leading member axis; metrics leaves are [N, S]. A step's augmentation and
  noise come from fold_in(key, step). members_map: 'vmap' or 'unroll' (for one run exactly its
  step)."""
  paths = tuple(noise_set_paths(model, loss.num_layers)) if loss.enabled else ()

  def member_step(state, images, labels, key, bound):
    k_aug, k_noise = jax.random.split(jax.random.fold_in(key, state.step))
    x = augment_lib.train_inputs(k_aug, images, data.augment, data.image_size, data.mean, data.std)
    eps = (noise_lib.sample_noise(k_noise, state.params, paths, loss.M, bound, loss.distribution)
           if paths else {})
    return train_step(state, x, labels, eps, model, loss, tx)

  def members(*args):  # (states, images, labels, keys, bounds), each with a leading member axis
    if members_map == 'vmap':
      return jax.vmap(member_step)(*args)
    return trees.stack([member_step(*trees.index(args, i)) for i in range(len(args[3]))])

  def program(states, images, labels, indices, num_steps, keys, bounds):
    def body(states, xs):
      i, idx = xs
      batch = jnp.take(images, idx, axis=0), jnp.take(labels, idx, axis=0)
      new, metrics = members(states, *batch, keys, bounds)
      kept = jax.tree_util.tree_map(lambda a, b: jnp.where(i < num_steps, a, b), new, states)
      return kept, metrics
    return jax.lax.scan(body, states, (jnp.arange(len(indices)), indices))

  rep = sharding.replicated(mesh)
  rows = sharding.member_rows_sharded(mesh)
  return jax.jit(program, in_shardings=(rep, rep, rep, rows, rep, rep, rep), out_shardings=rep,
                 donate_argnums=(0,))


class Inputs(NamedTuple):
  """What the base program reads of a Benchmark (`make_train_program`'s `data`): how its images are
  augmented and normalised. Hashable, unlike the Benchmark and its images."""
  augment: str
  image_size: int
  mean: tuple
  std: tuple

  @classmethod
  def of(cls, bench):
    return cls(bench.augment, bench.image_size, tuple(bench.mean), tuple(bench.std))


@functools.lru_cache(maxsize=8)
def train_program(model, loss, optimizer_settings, inputs, members_map, mesh):
  """`make_train_program` with the base optimizer `optim.sgd(*optimizer_settings)`, built once per
  process for each set of arguments: every argument that shapes the program is in the key, so a
  later training of the same program (a resume, each seed of a sweep, a second run in one process)
  finds it traced and compiled in jax.jit's caches, instead of tracing it and loading it from the
  persistent cache again (experiments/results/README.md, 'Figures behind the code's choices')."""
  return make_train_program(model, loss, optim.sgd(*optimizer_settings), inputs, members_map, mesh)
