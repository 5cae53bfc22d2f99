"""What several methods share: the Baseline's presets, session 1's base network and
prototypes, and NCM accuracies of a network that changes every session.
"""
from __future__ import annotations

import os
from typing import Optional

import numpy as np

from f2m_jax import evaluation
from f2m_jax.checkpoint import CheckpointFault, Checkpoints
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.evaluator import embedder
from f2m_jax.experiment import Experiment, Hook
from f2m_jax.train_loop import train_base


# The paper's Baseline (`Method.presets`): plain CE with shuffled batches, no fine-tuning, NCM with
# raw prototypes. Every method but F2M starts from it.
BASELINE_PRESETS = {'noise.enabled': False, 'incremental.finetune': False, 'eval.normalize_prototypes': False,
                    'base.sampler': 'shuffle', 'incremental.round_steps': False}


def base_model(exp: Experiment, ckpts: Checkpoints, log, source: Optional[Checkpoints] = None,
               hook: Hook = None) -> dict:
  """Session 1 of every method that starts from one base network: phi*, its BN statistics and the base
  prototypes (Eq. 1), restored from `source` (--checkpoint) or the workdir if saved, else trained and saved."""
  if source is not None:
    return restore_base_model(exp, source)
  if ckpts.has_model():
    return restore_base_model(exp, ckpts)
  variables = train_base(exp, ckpts, log, hook)  # the last step's, or the one chosen on test
  protos = base_prototypes(exp, variables)
  save_base_model(exp, ckpts, variables, protos)
  return {'params': variables['params'], 'batch_stats': variables['batch_stats'], 'prototypes': protos}


def save_base_model(exp: Experiment, ckpts: Checkpoints, variables: dict, protos: np.ndarray) -> None:
  """The base model saved with its record (`base_record`), which every restore checks."""
  ckpts.save_model(variables['params'], variables['batch_stats'], protos, record=base_record(exp, variables, protos))


def restore_base_model(exp: Experiment, ckpts: Checkpoints) -> dict:
  """The saved base model, checked against its record (a CheckpointFault where `base_record` computed
  again differs); one saved before records were kept is used unchecked, and a line says so."""
  model, saved = ckpts.restore_model(model_template(exp), with_record=True)
  path = os.path.join(ckpts.root, 'model', '0')
  if saved is None:
    print(f'note: {path} was saved without a record of its accuracy (by an earlier version), so it cannot be '
          'checked', flush=True)
    return model
  again = base_record(exp, {'params': model['params'], 'batch_stats': model['batch_stats']}, model['prototypes'])
  if again != float(saved):
    raise CheckpointFault(f'the base model checkpoint {path}: its accuracy on the test images of session 1 (NCM '
                          f'with its own prototypes), computed again, is {again}%, saved {saved}%: it changed '
                          f'since it was saved; {ckpts.model_advice()}')
  return model


def base_record(exp: Experiment, variables: dict, protos: np.ndarray) -> float:
  """What the base model's checkpoint records to be checked by: the accuracy (%) of NCM with `protos`,
  unnormalized, on the test images of session 1, the same for every method that reads the model."""
  bench = exp.bench
  idx = protocol_lib.test_indices(bench, 1)
  emb = embedder(exp)(variables, bench.test.images[idx])
  return float(evaluation.ncm_accuracies(emb, bench.test.labels[idx], protos, bench.num_base_classes, False,
                                         pad_to=evaluation.eval_shapes(bench))['acc'])


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


def nearest_mean_accuracies(exp, embed, state: dict, session: int) -> dict:
  """NCM accuracies of a whole network that changes every session (state: {'params', 'batch_stats',
  'prototypes'}): the seen classes' test images embedded anew with `embed`."""
  bench = exp.bench
  idx = protocol_lib.test_indices(bench, session)
  emb = embed({'params': state['params'], 'batch_stats': state['batch_stats']}, bench.test.images[idx])
  return evaluation.ncm_accuracies(emb, bench.test.labels[idx], state['prototypes'], bench.num_base_classes,
                                   exp.config.eval.normalize_prototypes, pad_to=evaluation.eval_shapes(bench),
                                   session_ends=evaluation.session_ends(bench, session))
