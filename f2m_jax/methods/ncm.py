"""F2M and the paper's Baseline: a base network, then nearest-class-mean classification over
prototypes. They differ only in their effective config, so they share one runner."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from f2m_jax import evaluation
from f2m_jax import incremental
from f2m_jax import padding
from f2m_jax import trees
from f2m_jax.evaluator import Evaluator
from f2m_jax.methods import Method, common


def session_settings(exp, trainable_paths) -> incremental.SessionSettings:
  c = exp.config.incremental
  return incremental.SessionSettings(
      model=exp.model, trainable_paths=tuple(trainable_paths), steps=c.steps, lr=c.lr, momentum=c.momentum,
      weight_decay=c.weight_decay, bound=exp.config.noise.bound, clamp=c.clamp, distance=c.distance,
      augment=exp.bench.augment, image_size=exp.bench.image_size, mean=exp.bench.mean, std=exp.bench.std,
      round_steps=c.round_steps, prototype_norm=c.prototype_norm)


def finetune_sizes(exp) -> tuple:
  """(images, classes) every session's fine-tuning is padded to: the last session's."""
  bench = exp.bench
  novel = sum(len(c) for c in bench.session_classes[1:])
  return exp.config.data.shots * novel, bench.num_seen_classes(bench.num_sessions)


class NCMRunner:
  """State of a run: (params, the prototypes of every seen class); the base prototypes are session 1's, the
  novel ones recomputed after each session from all shots seen so far."""

  def __init__(self, exp, first: dict, ckpts=None, source=None, log=None):
    cfg = exp.config
    self.exp = exp
    self.params, self.batch_stats, self.base_protos = first['params'], first['batch_stats'], first['prototypes']
    self.paths = exp.trainable_paths(self.params)
    self.anchor = {p: jnp.asarray(v) for p, v in trees.split(self.params, self.paths)[0].items()}
    self.finetune = incremental.make_finetune(session_settings(exp, self.paths)) if cfg.incremental.finetune else None
    self.base_vars = {'params': self.params, 'batch_stats': self.batch_stats}
    self.evaluator = Evaluator(exp, self.base_vars, self.paths if self.finetune else ())
    self.embed = self.evaluator.embed_full  # the test view of images, shared with the evaluation (one compile)
    self.trainable_template = trees.unflatten({p: np.asarray(self.anchor[p]) for p in self.paths})

  def first_accuracies(self) -> dict:
    return self.evaluator.accuracies(self.base_vars, self.base_protos, 1, changed=False)

  def start(self):
    return self.params, self.base_protos

  def _stored(self, session: int) -> np.ndarray:
    """Eq. 5's prototypes: the base ones, zero rows for the novel classes (batch means in the loss)."""
    return padding.pad_rows(np.array(self.base_protos), self.exp.bench.num_seen_classes(session))

  def _finish(self, run_params, session: int, exemplars: np.ndarray, losses) -> tuple:
    """(state, info) after the fine-tuning: the novel prototypes from all shots seen so far."""
    bench = self.exp.bench
    variables = {'params': run_params, 'batch_stats': self.batch_stats}
    novel_classes = [c for s in bench.session_classes[1:session] for c in s]
    novel = evaluation.prototypes(self.embed(variables, self.exp.train_view(exemplars)),
                                  bench.train.labels[exemplars], novel_classes)
    return (run_params, np.concatenate([self.base_protos, novel])), {'losses': np.asarray(losses).tolist()}

  def update(self, state, run: int, session: int, exemplars: np.ndarray):
    exp, bench = self.exp, self.exp.bench
    run_params, losses = state[0], []
    if self.finetune is not None:
      inputs = incremental.pad_session(bench.train.images[exemplars], bench.train.labels[exemplars],
                                       self._stored(session), *finetune_sizes(exp))
      run_params, losses = self.finetune(run_params, self.batch_stats, self.anchor, *inputs, exp.key(2, run, session))
      run_params = jax.device_get(run_params)
    return self._finish(run_params, session, exemplars, losses)

  def accuracies(self, state, session: int) -> dict:
    run_params, protos = state
    return self.evaluator.accuracies({'params': run_params, 'batch_stats': self.batch_stats}, protos, session,
                                     changed=self.finetune is not None)

  def template(self, session: int) -> dict:
    seen = self.exp.bench.num_seen_classes(session)
    return {'trainable': self.trainable_template,
            'prototypes': np.zeros((seen, self.base_protos.shape[1]), np.float32)}

  def item(self, state) -> dict:
    run_params, protos = state
    return {'trainable': trees.unflatten(trees.split(run_params, self.paths)[0]), 'prototypes': protos}

  def restore(self, saved: dict):
    return trees.overlay(self.params, saved['trainable']), saved['prototypes']

  def norms(self, state) -> dict:
    return evaluation.prototype_norms(state[1], self.exp.bench.num_base_classes)


F2M = Method('f2m', {},  # F2M's settings are the config's (the authors' code as it runs)
             common.base_model, NCMRunner,
             'flat-minima base training; fine-tuning of the noise set inside the box; NCM with PN')
BASELINE = Method('baseline', common.BASELINE_PRESETS, common.base_model, NCMRunner,
                  'plain CE, shuffled batches; no fine-tuning; NCM with raw prototypes')
