"""What several methods share: the Baseline's presets, session 1's base network and
prototypes, and NCM accuracies of a network that changes every session."""
from __future__ import annotations

from typing import Optional

import numpy as np

from f2m_jax import evaluation
from f2m_jax.checkpoint import Checkpoints
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
  if source is not None or ckpts.has_model():
    return restore_base_model(exp, source or ckpts)
  variables = train_base(exp, ckpts, log, hook)  # the last step's, or the one chosen on test
  protos = base_prototypes(exp, variables)
  save_base_model(ckpts, variables, protos)
  return {'params': variables['params'], 'batch_stats': variables['batch_stats'], 'prototypes': protos}


def save_base_model(ckpts: Checkpoints, variables: dict, protos: np.ndarray) -> None:
  ckpts.model.save(0, {'params': variables['params'], 'batch_stats': variables['batch_stats'], 'prototypes': protos})


def restore_base_model(exp: Experiment, ckpts: Checkpoints) -> dict:
  return ckpts.restore_model(model_template(exp))


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
