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
from f2m_jax import padding
from f2m_jax import sharding
from f2m_jax import trees
from f2m_jax.evaluator import Evaluator, embed_spec, ncm_runs_spec
from f2m_jax.methods import Method, Runner, common
from f2m_jax.sessions import parallel_runs


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
  return exp.config.data.shots * sum(len(c) for c in bench.session_classes[1:]), bench.num_seen_classes(bench.num_sessions)


def finetune_spec(exp, paths) -> tuple:
  """(name, build) of the run's one fine-tuning program (exp.programs), padded to `finetune_sizes`
  so that one compile serves every session."""
  return ('finetune', tuple(paths)), lambda: incremental.make_finetune(session_settings(exp, paths), *finetune_sizes(exp),
                                                                      sharding.runs_mesh())


def compile_ahead(exp) -> list:
  """The plans (f2m_jax/programs.py) of what NCMRunner's first session compiles, from shapes alone:
  the test-view embedding (base prototypes, test images, shots), the frozen trunk and the suffix
  (eval.cache_trunk; the suffix where a run is evaluated alone), the fine-tuning of one run or of
  each size of run group, the one-call evaluation of each such group, and NCM."""
  cfg, bench = exp.config, exp.bench
  sds = jax.ShapeDtypeStruct
  state = exp.state_shapes()
  params, stats = state.params, state.batch_stats
  variables = {'params': params, 'batch_stats': stats}
  bs = cfg.eval.batch_size
  rows_of = lambda images, rows=bs: sds((rows,) + images.shape[1:], images.dtype)  # a batch of `images`
  test_view = rows_of(bench.test.images)
  embed = embed_spec(exp)  # the test view of the base images (prototypes), test images and shots
  views = {test_view, rows_of(exp.train_view(bench.base_train[:1]))}
  plans = [(*embed, lambda f, v=v: f.jitted.lower(variables, v)) for v in views]
  dim = exp.embedding_dim()
  paths = exp.trainable_paths(params) if cfg.incremental.finetune else ()
  block = Evaluator.trunk_block(exp, paths)
  per_call, mesh = parallel_runs(cfg), sharding.runs_mesh()
  sizes = sorted({min(per_call, cfg.runs - i) for i in range(0, cfg.runs, per_call)})  # of the run groups
  rows, classes = evaluation.eval_shapes(bench)
  if block:
    feats = jax.eval_shape(lambda v, x: exp.model.apply(v, x, train=False, last=block), variables,
                           sds((1,) + test_view.shape[1:], jnp.float32))
    plans.append((*embed_spec(exp, last=block), lambda f: f.jitted.lower(variables, test_view)))
    if 1 in sizes:  # a group of several runs is evaluated by ncm_runs instead
      plans.append((*embed_spec(exp, first=block), lambda f: f.jitted.lower(variables, rows_of(feats))))
  if cfg.incremental.finetune:
    name, build = finetune_spec(exp, paths)
    max_images, max_classes = finetune_sizes(exp)
    trainable, frozen = trees.split(params, paths)
    labels = jax.dtypes.canonicalize_dtype(bench.train.labels.dtype)
    shots, stored = rows_of(bench.train.images, max_images), sds((max_classes, dim), np.float32)
    key, num_seen = jax.eval_shape(lambda: exp.key(0)), sds((), np.int32)
    test_inputs = rows_of(feats, rows) if block else rows_of(bench.test.images, rows)
    for size in sizes:
      if size == 1:  # Runner.update: one run a call
        plans.append((name, build, lambda f: f.jitted.lower(params, stats, trainable, shots, sds((max_images,), labels),
                                                            stored, num_seen, key)))
        continue
      # finetune.runs and Evaluator.accuracies_runs: the group filled to a multiple of the devices
      r = padding.round_up(size, mesh.size if mesh is not None else 1)
      stack = lambda x, r=r: sds((r,) + x.shape, x.dtype)
      stacked = {p: stack(v) for p, v in trainable.items()}
      plans.append((name, build, lambda f, stack=stack, stacked=stacked: f.runs_jitted.lower(
          stacked, frozen, stats, trainable, stack(shots), stack(sds((max_images,), labels)), stored, num_seen,
          stack(key))))
      plans.append((*ncm_runs_spec(exp, paths, block), lambda f, stack=stack, stacked=stacked: f.jitted.lower(
          stacked, frozen, stats, test_inputs, stack(sds((classes, dim), np.float32)), num_seen)))
  plans.append(('ncm', lambda: evaluation.ncm_predict_padded,
                lambda f: f.lower(sds((rows, dim), np.float32), sds((classes, dim), np.float32), sds((), np.int32),
                                  cfg.eval.normalize_prototypes)))  # positional, as ncm_accuracies calls it
  return plans


class NCMRunner(Runner):
  """State of a run: (the network's params, the prototypes of every seen class). Base prototypes
  are those of session 1 and never recomputed; after each session the novel prototypes are
  recomputed with the (fine-tuned) network from all shots seen so far."""

  def __init__(self, exp, first: dict, ckpts=None, source=None, log=None):
    cfg = exp.config
    self.exp = exp
    self.params, self.batch_stats, self.base_protos = first['params'], first['batch_stats'], first['prototypes']
    self.paths = exp.trainable_paths(self.params)
    self.anchor = {p: jnp.asarray(v) for p, v in trees.split(self.params, self.paths)[0].items()}
    self.finetune = exp.programs.get(*finetune_spec(exp, self.paths)) if cfg.incremental.finetune else None
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

  def accuracies_runs(self, states: list, session: int) -> list:
    """A group's fine-tuned runs evaluated in one call (`Evaluator.accuracies_runs`); one run, or runs
    that were not fine-tuned, through `accuracies`."""
    if self.finetune is None or len(states) == 1:
      return super().accuracies_runs(states, session)
    return self.evaluator.accuracies_runs([s[0] for s in states], [s[1] for s in states], session)

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
             'flat-minima base training; fine-tuning of the noise set inside the box; NCM with PN', compile_ahead)
BASELINE = Method('baseline', common.BASELINE_PRESETS, common.base_model, NCMRunner,
                  'plain CE, shuffled batches; no fine-tuning; NCM with raw prototypes', compile_ahead)
