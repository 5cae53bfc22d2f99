"""F2M and the paper's Baseline: a base network, then nearest-class-mean classification over
prototypes. They differ only in their effective config, so they share one runner."""
import jax
import numpy as np

from f2m_jax import evaluation, incremental, padding, trees
from f2m_jax.evaluator import Evaluator
from f2m_jax.methods import Method, common

SETTINGS = ('steps', 'lr', 'momentum', 'weight_decay', 'clamp', 'distance', 'round_steps',
            'prototype_norm')  # config.incremental's fields in the fine-tuning's settings


def session_settings(exp, trainable_paths):
  """The fine-tuning's settings: config.incremental's SETTINGS, the noise bound, the data's view."""
  c, bench = exp.config.incremental, exp.bench
  return incremental.SessionSettings(
      exp.model, tuple(trainable_paths), bound=exp.config.noise.bound,
      **{k: c[k] for k in SETTINGS},
      **{k: getattr(bench, k) for k in ('augment', 'image_size', 'mean', 'std')})


def finetune_sizes(exp):
  """(images, classes) every session's fine-tuning is padded to: the last session's."""
  seen = exp.bench.num_seen_classes(exp.bench.num_sessions)
  return exp.config.data.shots * (seen - exp.bench.num_base_classes), seen


class NCMRunner:
  """State of a run: (params, the prototypes of every seen class); the base prototypes are session
  1's, the novel ones recomputed after each session from all shots seen so far."""

  def __init__(self, exp, first, *_):  # (ckpts, source, log): not read
    self.exp, self.base_vars, self.base_protos = exp, common.network_of(first), first['prototypes']
    self.params = first['params']
    self.paths = exp.trainable_paths(self.params)
    trainable = jax.device_get(trees.split(self.params, self.paths)[0])  # host arrays
    self.anchor, self.trainable_template = jax.device_put(trainable), trees.unflatten(trainable)
    self.finetune = None
    if exp.config.incremental.finetune:
      self.finetune = incremental.make_finetune(session_settings(exp, self.paths))
    self.evaluator = Evaluator(exp, self.base_vars, self.paths if self.finetune else ())
    self.embed = self.evaluator.embed_full  # the test view, the evaluation's (one compile)

  def first_accuracies(self):
    return self.evaluator.accuracies(self.base_vars, self.base_protos, 1, changed=False)

  def start(self):
    return self.params, self.base_protos

  def update(self, state, run, session, exemplars):
    """The noise set fine-tuned inside the box (where incremental.finetune) against Eq. 5's
    prototypes (the base ones, zero rows for the novel classes: batch means in the loss), then the
    novel prototypes from all shots seen so far."""
    exp, bench = self.exp, self.exp.bench
    run_params, losses = state[0], []
    if self.finetune is not None:
      stored = padding.pad_rows(np.array(self.base_protos), bench.num_seen_classes(session))
      inputs = incremental.pad_session(bench.train.images[exemplars], bench.train.labels[exemplars],
                                       stored, *finetune_sizes(exp))
      run_params, losses = self.finetune(run_params, self.base_vars['batch_stats'], self.anchor,
                                         *inputs, exp.key(2, run, session))
      run_params = jax.device_get(run_params)
    novel = common.novel_prototypes(exp, self.embed, {**self.base_vars, 'params': run_params},
                                    exemplars, session)
    return (run_params, np.concatenate([self.base_protos, novel])), {
        'losses': np.asarray(losses).tolist()}

  def accuracies(self, state, session):
    return self.evaluator.accuracies({**self.base_vars, 'params': state[0]}, state[1], session,
                                     changed=self.finetune is not None)

  def template(self, session):
    return {'trainable': self.trainable_template,
            'prototypes': common.zero_prototypes(self.exp, session)}

  def item(self, state):
    return {'trainable': trees.unflatten(trees.split(state[0], self.paths)[0]),
            'prototypes': state[1]}

  def restore(self, saved):
    return trees.overlay(self.params, saved['trainable']), saved['prototypes']

  def norms(self, state):
    return evaluation.prototype_norms(state[1], self.exp.bench.num_base_classes)


F2M = Method('f2m', {},  # F2M's settings are the config's (the authors' code as it runs)
             common.base_model, NCMRunner,
             'flat-minima base training; fine-tuning of the noise set inside the box; NCM with PN')
BASELINE = Method('baseline', common.BASELINE_PRESETS, common.base_model, NCMRunner,
                  'plain CE, shuffled batches; no fine-tuning; NCM with raw prototypes')
