"""What several methods share: the Baseline's presets, session 1's base network and prototypes, a
session's SGD step, and the runner of a whole network that changes every session."""
from __future__ import annotations

from typing import Callable, Optional

import jax
import numpy as np
import optax

from f2m_jax import evaluation
from f2m_jax.data import augment as augment_lib
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.evaluator import embedder
from f2m_jax.experiment import Experiment, Hook
from f2m_jax.train_loop import train_base


# The paper's Baseline (`Method.presets`): plain CE with shuffled batches, no fine-tuning, NCM with
# raw prototypes. Every method but F2M starts from it.
BASELINE_PRESETS = {'noise.enabled': False, 'incremental.finetune': False, 'eval.normalize_prototypes': False,
                    'base.sampler': 'shuffle', 'incremental.round_steps': False}


def base_model(exp: Experiment, ckpts, log, source=None,
               hook: Hook = None) -> dict:
  """Session 1 of every method that starts from one base network: phi*, its BN statistics and the base
  prototypes (Eq. 1), restored from `source` (--checkpoint) or the workdir if saved, else trained and saved."""
  if source is not None or ckpts.has_model():
    return (source or ckpts).restore_model(model_template(exp))
  variables = train_base(exp, ckpts, log, hook)  # the last step's, or the one chosen on test
  model = {'params': variables['params'], 'batch_stats': variables['batch_stats'],
           'prototypes': base_prototypes(exp, variables)}
  ckpts.model.save(0, model)
  return model


def model_template(exp: Experiment) -> dict:
  """Host zeros of the shapes of a saved base model: {'params', 'batch_stats', 'prototypes'}."""
  return {**exp.variables_template(),
          'prototypes': np.zeros((exp.bench.num_base_classes, exp.embedding_dim()), np.float32)}


def base_prototypes(exp: Experiment, variables) -> np.ndarray:
  """Eq. 1 for the base classes under `variables`: the mean embedding of each base class's training
  images in the test view, BN in eval mode (the run's one embedding program, `embedder`)."""
  bench = exp.bench
  print(f'base prototypes: embedding the {len(bench.base_train):,} base training images', flush=True)
  emb = embedder(exp)(variables, exp.train_view(bench.base_train))
  return evaluation.prototypes(emb, bench.train.labels[bench.base_train], bench.session_classes[0])


def sgd_step(loss_fn: Callable, tx: optax.GradientTransformation, bench, color_jitter: float = 0.0,
             edit_updates: Optional[Callable] = None) -> Callable:
  """A session's jitted step: step(trainable, opt_state, images_u8, labels, key, *args) -> (trainable,
  opt_state, loss, aux). The images augmented from `key` as in base training (and colour-jittered), the
  gradient of `loss_fn(trainable, x, labels, *args) -> (loss, aux)`, `tx`'s update, edited by
  `edit_updates(updates, *args)` where given."""
  @jax.jit
  def step(trainable, opt_state, images, labels, key, *args):
    x = augment_lib.train_inputs(key, images, bench.augment, bench.image_size, bench.mean, bench.std, color_jitter)
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, x, labels, *args)
    updates, opt_state = tx.update(grads, opt_state, trainable)
    if edit_updates is not None:
      updates = edit_updates(updates, *args)
    return optax.apply_updates(trainable, updates), opt_state, loss, aux

  return step


class Runner:
  """The runner's defaults for a run whose state is {'params', 'batch_stats', 'prototypes'} (and the
  other `keys`) of a whole network that changes every session, classified by the nearest mean. A
  subclass sets `exp`, `first` (session 1's state), `network` and `embed`, and defines `update`."""
  keys = ('params', 'batch_stats', 'prototypes')

  def first_accuracies(self) -> dict:
    return self.accuracies(self.first, 1)

  def start(self):
    return dict(self.first)

  def accuracies(self, state, session: int) -> dict:
    """NCM accuracies: the seen classes' test images embedded anew under the state's network."""
    bench = self.exp.bench
    idx = protocol_lib.test_indices(bench, session)
    emb = self.embed({'params': state['params'], 'batch_stats': state['batch_stats']}, bench.test.images[idx])
    return evaluation.ncm_accuracies(emb, bench.test.labels[idx], state['prototypes'], bench.num_base_classes,
                                     self.exp.config.eval.normalize_prototypes, pad_to=evaluation.eval_shapes(bench),
                                     session_ends=evaluation.session_ends(bench, session))

  def template(self, session: int) -> dict:
    return {**self.exp.variables_template(self.network), 'prototypes': np.zeros(
        (self.exp.bench.num_seen_classes(session), self.exp.embedding_dim()), np.float32)}

  def item(self, state) -> dict:
    return dict(state)

  def restore(self, saved: dict):
    return {k: saved[k] for k in self.keys}

  def norms(self, state):
    return evaluation.prototype_norms(state['prototypes'], self.exp.bench.num_base_classes)
