"""F2M and the paper's Baseline: a base network, then nearest-class-mean classification over
prototypes. F2M trains the base with the flat-minima objective and fine-tunes the noise set inside
the box in every later session; the Baseline trains plain CE and never fine-tunes. Both differ only
in their effective config, so they share one runner.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from f2m_jax import evaluation
from f2m_jax import incremental
from f2m_jax import noise as noise_lib
from f2m_jax import sharding
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.methods import Method, Runner


def configure_f2m(config) -> None:
  """F2M's defaults are the config's (the authors' code as it runs)."""


def configure_baseline(config) -> None:
  """The paper's Baseline: plain CE with shuffled batches, no fine-tuning, NCM with raw prototypes."""
  config.noise.enabled = False
  config.incremental.finetune = False
  config.eval.normalize_prototypes = False
  config.base.sampler = 'shuffle'
  config.incremental.round_steps = False


def first_session(exp, ckpts, log, source=None, hook=None) -> dict:
  from f2m_jax import pipeline  # pylint: disable=g-import-not-at-top
  return pipeline.base_model(exp, ckpts, log, source, hook)


def session_settings(exp, trainable_paths) -> incremental.SessionSettings:
  c = exp.config.incremental
  return incremental.SessionSettings(
      model=exp.model, trainable_paths=tuple(trainable_paths), steps=c.steps, lr=c.lr, momentum=c.momentum,
      weight_decay=c.weight_decay, bound=exp.config.noise.bound, clamp=c.clamp, distance=c.distance,
      augment=exp.bench.augment, image_size=exp.bench.image_size, mean=exp.bench.mean, std=exp.bench.std,
      round_steps=c.round_steps)


def nearest_mean_accuracies(exp, embed, state: dict, session: int) -> dict:
  """NCM accuracies of a whole network that changes every session (state: {'params', 'batch_stats',
  'prototypes'}): the seen classes' test images embedded anew with `embed`."""
  bench = exp.bench
  idx = protocol_lib.test_indices(bench, session)
  emb = embed({'params': state['params'], 'batch_stats': state['batch_stats']}, bench.test.images[idx])
  return evaluation.ncm_accuracies(emb, bench.test.labels[idx], state['prototypes'], bench.num_base_classes,
                                   exp.config.eval.normalize_prototypes, pad_to=evaluation.eval_shapes(bench))


def merge(params, trainable_nested):
  flat = noise_lib.flatten(params)
  flat.update(noise_lib.flatten(trainable_nested))
  return noise_lib.unflatten(flat)


class NCMRunner(Runner):
  """State of a run: (the network's params, the prototypes of every seen class). Base prototypes
  are those of session 1 and never recomputed; after each session the novel prototypes are
  recomputed with the (fine-tuned) network from all shots seen so far."""

  def __init__(self, exp, first: dict, ckpts=None, source=None, log=None):
    from f2m_jax.pipeline import Evaluator  # pylint: disable=g-import-not-at-top
    cfg, bench = exp.config, exp.bench
    self.exp = exp
    self.params, self.batch_stats, self.base_protos = first['params'], first['batch_stats'], first['prototypes']
    self.paths = exp.trainable_paths(self.params)
    self.anchor = {p: jnp.asarray(v) for p, v in noise_lib.flatten(self.params).items() if p in set(self.paths)}
    self.finetune = None
    if cfg.incremental.finetune:  # padded to the last session's sizes: one compile serves every session
      max_images = cfg.data.shots * sum(len(c) for c in bench.session_classes[1:])
      self.finetune = incremental.make_finetune(session_settings(exp, self.paths), max_images,
                                                bench.num_seen_classes(bench.num_sessions), sharding.runs_mesh())
    self.base_vars = {'params': self.params, 'batch_stats': self.batch_stats}
    self.evaluator = Evaluator(exp, self.base_vars, self.paths if self.finetune else ())
    self.embed = self.evaluator.embed_full  # the test view of images, shared with the evaluation (one compile)
    self.trainable_template = noise_lib.unflatten({p: np.asarray(self.anchor[p]) for p in self.paths})

  def first_accuracies(self) -> dict:
    return self.evaluator.accuracies(self.base_vars, self.base_protos, 1, changed=False)

  def start(self):
    return self.params, self.base_protos

  def _stored(self, session: int) -> np.ndarray:
    """Eq. 5's prototypes: the base ones, zero rows for the novel classes (batch means in the loss)."""
    stored = np.zeros((self.exp.bench.num_seen_classes(session), self.base_protos.shape[1]), np.float32)
    stored[:len(self.base_protos)] = self.base_protos
    return stored

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
      run_params, losses = self.finetune(run_params, self.batch_stats, self.anchor, bench.train.images[exemplars],
                                         bench.train.labels[exemplars], self._stored(session),
                                         exp.key(2, run, session))
      run_params = jax.device_get(run_params)
    return self._finish(run_params, session, exemplars, losses)

  def update_runs(self, states: list, runs: list, session: int, exemplars: list) -> list:
    """The runs' fine-tuning in one call mapped over the runs (`make_finetune`'s `runs`), split over
    this process's devices when it has several."""
    if self.finetune is None or len(runs) == 1:
      return super().update_runs(states, runs, session, exemplars)
    exp, bench = self.exp, self.exp.bench
    params, losses = self.finetune.runs([s[0] for s in states], self.batch_stats, self.anchor,
                                        [bench.train.images[e] for e in exemplars],
                                        [bench.train.labels[e] for e in exemplars], self._stored(session),
                                        [exp.key(2, r, session) for r in runs])
    return [self._finish(p, session, e, l) for p, e, l in zip(params, exemplars, np.asarray(losses))]

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
    wanted = set(self.paths)
    return {'trainable': noise_lib.unflatten({p: v for p, v in noise_lib.flatten(run_params).items() if p in wanted}),
            'prototypes': protos}

  def restore(self, saved: dict):
    return merge(self.params, saved['trainable']), saved['prototypes']

  def norms(self, state) -> dict:
    return evaluation.prototype_norms(state[1], self.exp.bench.num_base_classes)


F2M = Method('f2m', configure_f2m, first_session, NCMRunner,
             'flat-minima base training; fine-tuning of the noise set inside the box; NCM with PN')
BASELINE = Method('baseline', configure_baseline, first_session, NCMRunner,
                  'plain CE, shuffled batches; no fine-tuning; NCM with raw prototypes')
