"""What several methods share: the Baseline's presets, session 1's base network and prototypes, a
session's SGD step, and the runner of a whole network that changes every session."""
import jax
import numpy as np
import optax

from f2m_jax import evaluation
from f2m_jax.data import augment as augment_lib
from f2m_jax.evaluator import embedder, seen_accuracies
from f2m_jax.train_loop import train_base
from f2m_jax.validation import need


# The paper's Baseline (`Method.presets`): plain CE with shuffled batches, no fine-tuning, NCM with
# raw prototypes. Every method but F2M starts from it.
BASELINE_PRESETS = {'noise.enabled': False, 'incremental.finetune': False,
                    'eval.normalize_prototypes': False, 'base.sampler': 'shuffle',
                    'incremental.round_steps': False}


def need_least(config, section, **least):
  """A ValueError naming the first field of config.<section> below its least value in `least` (the
  sections' rates, momenta and decays are checked with every optimizer's: validation.OPTIMIZER)."""
  for field, low in least.items():
    value = config[section][field]
    need(value >= low, f'{section}.{field}', value, f'must be >= {low}')


def base_model(exp, ckpts, log, source=None, hook=None):
  """Session 1 of every method that starts from one base network: phi*, its BN statistics and the
  base prototypes (Eq. 1), restored from `source` (--checkpoint) or the workdir if saved, else
  trained and saved."""
  if source is not None or ckpts.has_model():
    return (source or ckpts).restore_model(model_template(exp))
  variables = train_base(exp, ckpts, log, hook)  # {'params', 'batch_stats'}: last or chosen step's
  model = {**variables, 'prototypes': base_prototypes(exp, variables)}
  ckpts.model.save(0, model)
  return model


def model_template(exp):
  """Host zeros of the shapes of a saved base model: {'params', 'batch_stats', 'prototypes'}."""
  return {**exp.variables_template(), 'prototypes': zero_prototypes(exp, 1)}


def zero_prototypes(exp, session):
  """Host zeros of the shape of the prototypes of the classes seen by `session`."""
  return np.zeros((exp.bench.num_seen_classes(session), exp.embedding_dim()), np.float32)


def prototypes(exp, embed, variables, images, classes):
  """Eq. 1: the mean embedding by `embed` under `variables` of each of `classes`' training images
  among `images` (indices), in the test view, BN in eval mode."""
  emb = embed(variables, exp.train_view(images))
  return evaluation.prototypes(emb, exp.bench.train.labels[images], classes)


def base_prototypes(exp, variables):
  """Eq. 1 for the base classes (the run's one embedding program, `embedder`)."""
  bench = exp.bench
  print(f'base prototypes: embedding the {len(bench.base_train):,} base training images',
        flush=True)
  return prototypes(exp, embedder(exp), variables, bench.base_train, bench.session_classes[0])


def novel_prototypes(exp, embed, variables, exemplars, session):
  """Eq. 1 for the novel classes of sessions 2..`session` from their shots so far, `exemplars`."""
  classes = [c for s in exp.bench.session_classes[1:session] for c in s]
  return prototypes(exp, embed, variables, exemplars, classes)


def network_of(state):
  """A state's network variables: {'params', 'batch_stats'}."""
  return {'params': state['params'], 'batch_stats': state['batch_stats']}


def sgd_step(loss_fn, tx, bench, color_jitter=0.0, edit_updates=None):
  """A session's jitted step: step(trainable, opt_state, images_u8, labels, key, *args) ->
  (trainable, opt_state, loss, aux). The images augmented from `key` as in base training (and
  colour-jittered), the gradient of `loss_fn(trainable, x, labels, *args) -> (loss, aux)`, `tx`'s
  update, edited by `edit_updates(updates, *args)` where given."""
  @jax.jit
  def step(trainable, opt_state, images, labels, key, *args):
    x = augment_lib.train_inputs(key, images, bench.augment, bench.image_size, bench.mean,
                                 bench.std, color_jitter)
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, x, labels, *args)
    updates, opt_state = tx.update(grads, opt_state, trainable)
    if edit_updates is not None:
      updates = edit_updates(updates, *args)
    return optax.apply_updates(trainable, updates), opt_state, loss, aux

  return step


class Runner:
  """The runner's defaults for a run whose state is {'params', 'batch_stats', 'prototypes'} (and the
  others) of a whole network (`network`) that changes every session, classified by the nearest
  mean. A subclass defines `update`."""

  def __init__(self, exp, first, network):
    self.exp, self.network, self.embed = exp, network, embedder(exp, network=network)
    self.first = {**first, 'prototypes': np.asarray(first['prototypes'])}

  def first_accuracies(self):
    return self.accuracies(self.first, 1)

  def start(self):
    return self.first

  def accuracies(self, state, session):
    """NCM accuracies: the seen classes' test images embedded anew under the state's network."""
    variables, images = network_of(state), self.exp.bench.test.images
    return seen_accuracies(self.exp, session, lambda idx: self.embed(variables, images[idx]),
                           state['prototypes'])

  def template(self, session):
    return {**self.exp.variables_template(self.network),
            'prototypes': zero_prototypes(self.exp, session)}

  def item(self, state):
    return state

  def restore(self, saved):
    return {k: v for k, v in saved.items() if k not in ('exemplars', 'accuracy')}  # the sessions'

  def norms(self, state):
    return evaluation.prototype_norms(state['prototypes'], self.exp.bench.num_base_classes)
