"""A whole run of any method (f2m_jax/methods): session 1, R runs of the later sessions, results.

Every stage checkpoints what it produced, and rerunning on the same workdir continues from there.
PRNG keys: fold_in(seed, 0) drives base training (then per step), fold_in(seed, 1) the init,
fold_in(fold_in(fold_in(seed, 2), run), session) the fine-tuning of one session.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm import tqdm

from f2m_jax import base as base_lib
from f2m_jax import evaluation
from f2m_jax import noise as noise_lib
from f2m_jax import prefetch as prefetch_lib
from f2m_jax import programs as programs_lib
from f2m_jax import sharding
from f2m_jax import workdir as workdir_lib
from f2m_jax.checkpoint import CheckpointError, Checkpoints
from f2m_jax.incremental import pad_rows
from f2m_jax.data import augment as augment_lib
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.data import sources
from f2m_jax.data.types import Benchmark
from f2m_jax.models import HEADS, ResNet, build_model, noise_set_paths, split_block

SAMPLERS = ('task_epochs', 'balanced', 'shuffle')


class TrainingError(RuntimeError):
  """Training diverged (NaN or inf loss)."""


def resolve(config: ml_collections.ConfigDict, reads_data: bool = True) -> ml_collections.ConfigDict:
  """The effective config: the method's own settings (f2m_jax/methods; e.g. `method=baseline` turns
  off noise, fine-tuning and PN and uses shuffled batches, as the paper's Baseline), then every
  value validated, and (`reads_data`) the data folder it will read checked before anything is
  written. The bench's whole runs pass False: they train on random data of the config's shapes."""
  from f2m_jax import methods  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict(config.to_dict())
  methods.get(config.method).configure(config)
  validate(config)
  if reads_data:
    check_data_folder(config)
  return config


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming the field, its value and what is allowed."""
  def need(ok, field, value, allowed):
    if not ok:
      raise ValueError(f'{field}={value!r} is invalid: {allowed}')

  need(c.noise.M >= 1, 'noise.M', c.noise.M, 'must be >= 1')
  need(c.noise.bound >= 0, 'noise.bound', c.noise.bound, 'must be >= 0')
  need(c.noise.distribution in noise_lib.DISTRIBUTIONS, 'noise.distribution', c.noise.distribution,
       f'allowed: {noise_lib.DISTRIBUTIONS}')
  need(c.noise.bn_updates in base_lib.BN_UPDATES, 'noise.bn_updates', c.noise.bn_updates,
       f'allowed: {base_lib.BN_UPDATES}')
  need(c.noise.pf_weight >= 0 and c.noise.std_weight >= 0, 'noise.pf_weight/std_weight',
       (c.noise.pf_weight, c.noise.std_weight), 'must be >= 0')
  need(c.runs >= 1, 'runs', c.runs, 'must be >= 1')
  need(c.base.steps >= 1, 'base.steps', c.base.steps, 'must be >= 1')
  need(c.base.sampler in SAMPLERS, 'base.sampler', c.base.sampler, f'allowed: {SAMPLERS}')
  if c.base.sampler == 'task_epochs':
    need(c.base.batch_size % c.base.shots == 0, 'base.batch_size', c.base.batch_size,
         f'the task_epochs sampler needs a multiple of base.shots={c.base.shots}')
  need(c.base.select_every >= 1, 'base.select_every', c.base.select_every, 'must be >= 1')
  need(c.crt.epochs >= 1 and c.crt.per_class >= 1 and c.crt.batch_size >= 1 and c.crt.lr > 0, 'crt',
       dict(c.crt), 'needs epochs, per_class, batch_size >= 1 and lr > 0')
  need(c.icarl.memory >= 1 and c.icarl.epochs >= 1 and c.icarl.batch_size >= 1 and c.icarl.lr > 0, 'icarl',
       dict(c.icarl), 'needs memory, epochs, batch_size >= 1 and lr > 0')
  r = c.rebalance
  need(r.memory >= 1 and r.epochs >= 1 and r.batch_size >= 1 and r.lr > 0 and r.K >= 1 and r.margin >= 0
       and r.lambda_base >= 0 and r.weight >= 0, 'rebalance', dict(r),
       'needs memory, epochs, batch_size, K >= 1, lr > 0, margin, lambda_base, weight >= 0')
  need(c.fsll.epochs >= 1 and c.fsll.lr > 0 and c.fsll.threshold >= 0, 'fsll', dict(c.fsll),
       'needs epochs >= 1, lr > 0 and threshold >= 0')
  need(c.base.ways >= 1 and c.base.shots >= 1, 'base.ways/shots', (c.base.ways, c.base.shots), 'must be >= 1')
  need(c.base.lr > 0, 'base.lr', c.base.lr, 'must be > 0')
  need(c.base.data_placement in ('auto', 'host', 'device'), 'base.data_placement', c.base.data_placement,
       "'auto', 'host' or 'device'")
  need(c.incremental.parallel_runs >= 0, 'incremental.parallel_runs', c.incremental.parallel_runs,
       'must be >= 0 (0: automatic)')
  need(c.base.steps_per_call >= 0, 'base.steps_per_call', c.base.steps_per_call, 'must be >= 0 (0: automatic)')
  need(c.base.prefetch >= 0, 'base.prefetch', c.base.prefetch, 'must be >= 0 (0: no background thread)')
  need(c.base.checkpoint_every >= 1, 'base.checkpoint_every', c.base.checkpoint_every, 'must be >= 1')
  need(c.incremental.trainable in ('noise_set', 'all'), 'incremental.trainable', c.incremental.trainable,
       "'noise_set' or 'all'")
  need(c.incremental.steps >= 0, 'incremental.steps', c.incremental.steps, 'must be >= 0')
  need(c.incremental.lr > 0, 'incremental.lr', c.incremental.lr, 'must be > 0')
  need(not c.incremental.round_steps or c.noise.bound > 0, 'incremental.round_steps', c.incremental.round_steps,
       f'rounds steps to multiples of noise.bound/2, so it needs noise.bound > 0 (is {c.noise.bound})')
  need(c.incremental.distance in ('squared_euclidean', 'euclidean'), 'incremental.distance',
       c.incremental.distance, "'squared_euclidean' or 'euclidean'")
  need(c.data.protocol in protocol_lib.PROTOCOLS, 'data.protocol', c.data.protocol,
       f'allowed: {protocol_lib.PROTOCOLS}')
  need(c.data.source in sources.SOURCES, 'data.source', c.data.source, f'allowed: {sources.SOURCES}')
  need(c.data.shots >= 1, 'data.shots', c.data.shots, 'must be >= 1')
  if c.data.split:
    from f2m_jax.data import cifar100
    need(c.data.split in cifar100.SPLITS and c.data.dataset == 'cifar100'
         and c.data.source in ('tfds', 'trainsplit'), 'data.split', c.data.split,
         f'one of {sorted(cifar100.SPLITS)} for CIFAR-100 (tfds or trainsplit source), or empty')
    need(c.data.protocol == 'draws', 'data.protocol', c.data.protocol,
         "the class splits have no TOPIC lists: use 'draws'")
  need(c.model.dtype in ('float32', 'bfloat16'), 'model.dtype', c.model.dtype, "'float32' or 'bfloat16'")
  need(c.model.head in HEADS, 'model.head', c.model.head, f'allowed: {HEADS}')
  need(c.compile_ahead in programs_lib.MODES, 'compile_ahead', c.compile_ahead, f'allowed: {programs_lib.MODES}')


def check_data_folder(c: ml_collections.ConfigDict) -> None:
  """Raises ValueError where the config's source reads a data folder that is unset or missing."""
  if c.data.source in ('trainsplit', 'folder') and not sources.data_dir(c):
    raise ValueError(f'data.source={c.data.source!r} needs a data folder: set F2M_DATA_DIR or '
                     '--config.data.data_dir')
  if sources.data_dir(c) and not os.path.isdir(sources.data_dir(c)):
    raise ValueError(f'data folder {sources.data_dir(c)!r} (data.data_dir or F2M_DATA_DIR) does not exist')


@dataclasses.dataclass
class Experiment:
  """Everything static about a run, built once from the config and the data."""
  config: ml_collections.ConfigDict
  bench: Benchmark
  model: ResNet
  noise_paths: tuple
  split: int
  _epoch: Optional[tuple] = dataclasses.field(default=None, repr=False)  # (epoch, indices) of task_epochs
  # The jitted programs after session 1, one each per run, compiled ahead while it trains (programs.py).
  programs: programs_lib.Programs = dataclasses.field(default_factory=programs_lib.Programs, repr=False)

  @classmethod
  def create(cls, config, bench: Benchmark) -> 'Experiment':
    dtype = jnp.bfloat16 if config.model.dtype == 'bfloat16' else jnp.float32
    model = build_model(config.model.arch, bench.num_base_classes, config.model.width or None, dtype,
                        clean_backward=config.noise.clean_backward, head=config.model.head)
    paths = tuple(noise_set_paths(model, config.noise.num_layers))
    return cls(config, bench, model, paths, split_block(model, paths))

  def network(self, num_classes: int) -> ResNet:
    """The config's network with another classifier size (joint training, cRT)."""
    return self.model.clone(num_classes=num_classes)

  def key(self, *path: int) -> jax.Array:
    k = jax.random.key(self.config.seed)
    for p in path:
      k = jax.random.fold_in(k, p)
    return k

  def base_objective(self) -> base_lib.BaseObjective:
    n = self.config.noise
    return base_lib.BaseObjective(
        model=self.model, noise_paths=self.noise_paths if n.enabled else (), split=self.split,
        num_draws=n.M, bound=n.bound, distribution=n.distribution,
        pf_weight=n.pf_weight if n.prototype_fixing else 0.0, std_weight=n.std_weight,
        shared_trunk=n.shared_trunk, draw_map=base_lib.resolve_draw_map(n.draw_map),
        pf_gradient=n.pf_gradient, bn_updates=n.bn_updates)

  def optimizer(self):
    b = self.config.base
    return base_lib.make_optimizer(b.lr, b.momentum, b.weight_decay, b.milestones, b.lr_gamma,
                                   b.classifier_lr if b.classifier_lr > 0 else None)

  def trainable_paths(self, params) -> tuple:
    if self.config.incremental.trainable == 'noise_set':
      return self.noise_paths
    return tuple(p for p in noise_lib.flatten(params) if p[0] != 'fc')

  def batch_indices(self, step: int) -> np.ndarray:
    """Indices of base step `step`'s batch: a pure function of (seed, step) for every sampler."""
    b, bench = self.config.base, self.bench
    if b.sampler == 'task_epochs':
      per_epoch = protocol_lib.task_epoch_batches(bench.num_base_classes, b.shots, b.batch_size)
      epoch, pos = divmod(step, per_epoch)
      if self._epoch is None or self._epoch[0] != epoch:
        self._epoch = (epoch, protocol_lib.task_epoch(bench.train.labels, bench.base_train, b.shots,
                                                      self.config.seed, epoch))
      return self._epoch[1][pos * b.batch_size:(pos + 1) * b.batch_size]
    if b.sampler == 'balanced':
      return protocol_lib.balanced_batch(bench.train.labels, bench.base_train, b.ways, b.shots,
                                         self.config.seed, step)
    return protocol_lib.shuffled_batch(bench.base_train, b.batch_size, self.config.seed, step)

  def train_view(self, indices) -> np.ndarray:
    """Training images as prototypes see them: the test transform (a centre crop where the stored
    images are larger than the network input), no augmentation (Eq. 1, DESIGN.md)."""
    return augment_lib.eval_view(self.bench.train.images[indices], self.bench.image_size)

  def state_shapes(self):
    """The train state's shapes and dtypes (jax.ShapeDtypeStruct), without running the init."""
    return jax.eval_shape(lambda: base_lib.init_state(self.model, self.key(1), self.bench.image_size,
                                                      self.optimizer()))

  def state_template(self):
    """Host zeros of the train state's shapes, to restore checkpoints into: the init runs op by op and
    compiled for 11 s at ResNet-20's shapes on the 2-core CPU before a restore could start."""
    return jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), self.state_shapes())

  def embedding_dim(self) -> int:
    """D, the size of the network's embedding (prototypes are [classes, D]), from shapes alone."""
    shapes, size = self.state_shapes(), self.bench.image_size
    return jax.eval_shape(lambda v, x: self.model.apply(v, x, train=False)[0],
                          {'params': shapes.params, 'batch_stats': shapes.batch_stats},
                          jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32)).shape[1]

  def init_state(self):
    params = batch_stats = None
    if self.config.model.pretrained:
      from f2m_jax.models import torch_import
      params, batch_stats = torch_import.load_torchvision_resnet18(
          self.config.model.pretrained, self.model, self.bench.image_size, key=self.key(1))
    return base_lib.init_state(self.model, self.key(1), self.bench.image_size, self.optimizer(),
                               params, batch_stats)


Hook = Optional[Callable[..., None]]


def train_base(exp: Experiment, ckpts: Checkpoints, log: workdir_lib.MetricsLog, hook: Hook = None):
  """Trains session 1 from the latest base checkpoint (or from scratch); returns the final state.
  `hook('base_step', step=n)` is called after every step (tests use it to interrupt a run)."""
  cfg = exp.config.base
  start = ckpts.latest_base_step()
  if start is not None:
    state = ckpts.restore_base_state(exp.state_template(), start)
    state = jax.tree_util.tree_map(jnp.asarray, state)
    print(f'resuming base training at step {start}/{cfg.steps}', flush=True)
  else:
    state = exp.init_state()
  select = _TestSetSelector(exp, ckpts, log) if cfg.select_on_test else None
  return train_steps(exp, exp.base_objective(), state, start or 0, exp.batch_indices, ckpts.save_base_state,
                     log, exp.key(0), phase='base', title='base session', keep_bar=True, select=select, hook=hook)


def train_steps(exp: Experiment, objective, state, start: int, batch_indices: Callable, save: Callable, log,
                key, phase: str, title: str, keep_bar: bool = False, select: Optional[Callable] = None,
                hook: Hook = None):
  """Steps `start`..base.steps of `objective` from `state` (of `start` steps), with the base.* budget
  (optimizer, logging and checkpoint intervals, data path, prefetch); returns the final state.
  `batch_indices(step)` indexes the training images; `save(step, state)` at every checkpoint step and
  the last, `select(step, state)` every base.select_every steps; metrics go to `log` under `phase`,
  progress to a bar named `title`; a non-finite step raises TrainingError naming it. The base
  session's loop, and joint's (f2m_jax/methods/joint.py)."""
  cfg = exp.config.base
  if start >= cfg.steps:
    return state
  mesh = sharding.data_mesh()  # data parallel over all devices; the batch is the global batch
  images, labels = exp.bench.train.images, exp.bench.train.labels
  on_device, per_call = data_placement(exp.config, images.nbytes)
  args = (objective, exp.optimizer(), exp.bench.augment, exp.bench.image_size, exp.bench.mean, exp.bench.std)
  if on_device:  # the training images live on the device; each call runs `per_call` steps
    step_fn = base_lib.make_multi_step(*args, mesh=mesh)
    data = sharding.replicate((images, labels), mesh)
  else:
    step_fn = base_lib.make_train_step(*args, mesh=mesh)
    data = ()

  def host_part(call):  # the host's share of a call, done ahead by `prefetch`: indices (and images)
    first, n = call
    if on_device:  # a shorter call is padded to per_call rows (image 0's batches), which do not count
      indices = np.stack([batch_indices(s) for s in range(first, first + n)]).astype(np.int32)
      return sharding.shard_rows(mesh, pad_rows(indices, per_call)), np.int32(n)
    idx = batch_indices(first)
    return sharding.shard_batch(mesh, images[idx], labels[idx])

  state, key = sharding.replicate((state, key), mesh)
  bar = tqdm(total=cfg.steps, desc=title, initial=start, file=sys.stdout, mininterval=2.0, leave=keep_bar)
  window, t0, saved = [], time.time(), (start or None)

  def needs_state(done: int) -> bool:  # a call ending at step `done` is followed by a save or a selection
    return done % cfg.checkpoint_every == 0 or (select is not None and done % cfg.select_every == 0)

  def finish(first: int, n: int, metrics, state=None):
    """Reads the metrics of a call of `n` steps (waiting for it), stops on a non-finite step, then
    logs; `state` is the state after the call, given when the call ends where a checkpoint or
    selection needs it."""
    nonlocal window, t0, saved
    metrics = jax.device_get(metrics)
    per_step = [{k: v[i] for k, v in metrics.items()} for i in range(n)] if on_device else [metrics]
    for i, m in enumerate(per_step):
      if not m['finite']:
        kept = f'the last good checkpoint (step {saved}) is kept' if saved else 'no checkpoint was saved yet'
        raise TrainingError(f'non-finite loss or parameters (loss {m["loss"]}) at {phase} step '
                            f'{first + i + 1}; {kept}')
    bar.update(len(per_step))
    for i, m in enumerate(per_step):  # logging, selection and checkpoints fall on call boundaries
      window.append(m)
      done = first + i + 1
      if done % cfg.log_every == 0 or done == cfg.steps:
        avg = {k: float(np.mean([w[k] for w in window])) for k in ('loss', 'ce', 'pf', 'acc', 'ce_clean')}
        bar.set_postfix(loss=f'{avg["loss"]:.3f}', acc=f'{100 * avg["acc"]:.1f}')
        log.write(phase=phase, step=done, steps_per_s=round(len(window) / (time.time() - t0), 3), **avg)
        window, t0 = [], time.time()
      if select and done % cfg.select_every == 0:
        select(done, state)
      if done % cfg.checkpoint_every == 0 or done == cfg.steps:
        save(done, state)
        saved = done
      if hook:
        hook('base_step', step=done)

  # Each call is dispatched before the previous call's metrics are read (the device never waits for
  # the host's logging), unless the previous call ends where its state must be saved first: the
  # next call donates that state.
  calls = call_spans(start, cfg.steps, per_call)
  pending = None  # (first step, steps, metrics) of the call dispatched last
  with contextlib.closing(prefetch_lib.prefetch(host_part, calls, cfg.prefetch)) as batches:
    for (first, n), batch in zip(calls, batches):
      if pending and needs_state(first):
        finish(*pending, state=state)
        pending = None
      state, metrics = step_fn(state, *data, *batch, key)
      if pending:
        finish(*pending)
      pending = (first, n, metrics)
  if pending:
    finish(*pending, state=state)
  bar.close()
  return state


def call_spans(start: int, steps: int, per_call: int) -> list:
  """(first step, number of steps) of each call from `start` to `steps`: calls end at multiples of
  per_call (which divides the logging, checkpoint and selection intervals), also after a resume with
  another per_call, so those always see a call's end state."""
  ends = list(range((start // per_call + 1) * per_call, steps, per_call)) + [steps]
  return [(first, end - first) for first, end in zip([start] + ends[:-1], ends)]


def data_placement(config, images_nbytes: int) -> tuple:
  """(images on the device?, steps per call) for base training.

  base.data_placement 'auto' keeps the training images on the device (uint8, replicated) when not on
  a CPU and they take at most a quarter of the first device's memory (2 GiB where the backend does
  not say): CIFAR-100 is 154 MB, miniImageNet at 92 px 1.3 GB, CUB at 256 px 1.2 GB. base.steps_per_call
  0 means 1 on a CPU (where a dispatch costs nothing next to a step) and 20 elsewhere; it is reduced to
  divide log_every, checkpoint_every (and select_every), so those fall on call boundaries, and is 1
  when the images stay on the host."""
  b = config.base
  backend = jax.default_backend()
  if b.data_placement == 'auto':
    stats = jax.devices()[0].memory_stats() or {}
    limit = stats.get('bytes_limit', 8 << 30) // 4
    on_device = backend != 'cpu' and images_nbytes <= limit
  else:
    on_device = b.data_placement == 'device'
  per_call = b.steps_per_call or (1 if backend == 'cpu' else 20)
  for every in (b.log_every, b.checkpoint_every) + ((b.select_every,) if b.select_on_test else ()):
    per_call = math.gcd(per_call, every)
  return on_device, (per_call if on_device else 1)


class _TestSetSelector:
  """base.select_on_test: the original's model selection. Measures the linear classifier's accuracy
  on the base classes' test images and keeps the best model so far (strictly better replaces it)
  in the workdir's base_best checkpoint. It reads the test set, so results say so."""

  def __init__(self, exp: Experiment, ckpts: Checkpoints, log):
    bench = exp.bench
    self.ckpts, self.log = ckpts, log
    idx = protocol_lib.test_indices(bench, 1)
    self.images, self.labels = bench.test.images[idx], bench.test.labels[idx]
    self.logits = evaluation.make_embed(exp.model, bench.mean, bench.std, exp.config.eval.batch_size, logits=True)
    self.best = -1.0
    if ckpts.best_base_step() is not None:
      template = exp.state_template()
      self.best = float(ckpts.restore_best_base(
          {'params': template.params, 'batch_stats': template.batch_stats})['test_acc'])

  def __call__(self, step: int, state) -> None:
    variables = {'params': jax.device_get(state.params), 'batch_stats': jax.device_get(state.batch_stats)}
    acc = 100.0 * float(np.mean(np.argmax(self.logits(variables, self.images), -1) == self.labels))
    if acc > self.best:
      self.best = acc
      self.ckpts.save_best_base(step, variables['params'], variables['batch_stats'], acc)
    self.log.write(phase='select_on_test', step=step, base_test_acc=acc, best_base_test_acc=self.best,
                   best_step=self.ckpts.best_base_step())


def selection_info(config, ckpts: Checkpoints) -> dict:
  """How the base model was chosen, for results.json: the last step, or (base.select_on_test) the
  step with the best base-test accuracy, flagged as reading the test set."""
  if not config.base.select_on_test:
    return {'selection': 'last', 'step': int(config.base.steps)}
  step = ckpts.best_base_step()
  return {'selection': 'best_base_test_accuracy', 'reads_test_set': True, 'every': int(config.base.select_every),
          'step': int(step) if step is not None else int(config.base.steps)}


def embed_spec(exp: Experiment, first: int = 0, last: Optional[int] = None) -> tuple:
  """(name, build) of the run's one program (exp.programs) for `evaluation.make_embed`'s test-view
  embedding from pixels (the defaults), the trunk's features before block `last`, or the suffix's
  embedding from the features entering block `first`."""
  bench, bs = exp.bench, exp.config.eval.batch_size
  mean, std = (bench.mean, bench.std) if first == 0 else (None, None)
  return ('embed', first, last), lambda: evaluation.make_embed(exp.model, mean, std, bs, first=first, last=last)


class Evaluator:
  """Test-set NCM accuracies. When only suffix blocks change after session 1, the frozen trunk's
  features of the test set are computed once and each evaluation runs only the suffix."""

  def __init__(self, exp: Experiment, base_variables, trainable_paths):
    self.exp = exp
    self.embed_full = exp.programs.get(*embed_spec(exp))
    self._trunk = None
    block = self.trunk_block(exp, trainable_paths)
    if block:
      self._trunk = exp.programs.get(*embed_spec(exp, last=block))(base_variables, exp.bench.test.images)
      self.embed_suffix = exp.programs.get(*embed_spec(exp, first=block))
    self._static = None

  @staticmethod
  def trunk_block(exp: Experiment, trainable_paths) -> int:
    """The first block that `trainable_paths` change, where the test set's features are cached
    before it (fine-tuning on, eval.cache_trunk); 0 for no cache."""
    first = split_block(exp.model, trainable_paths) if trainable_paths else 0
    cache = exp.config.incremental.finetune and exp.config.eval.cache_trunk  # eval.cache_trunk=False: no cache
    return first if cache and 0 < first < exp.model.num_blocks else 0

  def embeddings(self, variables, changed: bool) -> np.ndarray:
    """Embeddings of the whole test set under `variables` (`changed`: differs from phi*)."""
    if self._trunk is not None and changed:
      return self.embed_suffix(variables, self._trunk)
    if changed:
      return self.embed_full(variables, self.exp.bench.test.images)
    if self._static is None:
      self._static = self.embed_full(variables, self.exp.bench.test.images)
    return self._static

  def accuracies(self, variables, protos: np.ndarray, session: int, changed: bool) -> dict:
    bench = self.exp.bench
    idx = protocol_lib.test_indices(bench, session)
    emb = self.embeddings(variables, changed)[idx]
    return evaluation.ncm_accuracies(emb, bench.test.labels[idx], protos, bench.num_base_classes,
                                     self.exp.config.eval.normalize_prototypes, pad_to=evaluation.eval_shapes(bench))


def base_model(exp: Experiment, ckpts: Checkpoints, log, source: Optional[Checkpoints] = None,
               hook: Hook = None) -> dict:
  """phi*, its BN statistics and the base prototypes: restored if saved, else trained and saved."""
  template = exp.state_template()
  model_template = {'params': template.params, 'batch_stats': template.batch_stats,
                    'prototypes': np.zeros((exp.bench.num_base_classes, exp.embedding_dim()), np.float32)}
  if source is not None:
    return source.restore_model(model_template)
  if ckpts.has_model():
    return ckpts.restore_model(model_template)
  state = train_base(exp, ckpts, log, hook)
  variables = jax.device_get({'params': state.params, 'batch_stats': state.batch_stats})  # host arrays,
  # as every later stage passes them (one compiled embedding program for all)
  if exp.config.base.select_on_test and ckpts.best_base_step() is not None:
    best = ckpts.restore_best_base({'params': template.params, 'batch_stats': template.batch_stats})
    variables = {'params': best['params'], 'batch_stats': best['batch_stats']}
    print(f'base model: step {ckpts.best_base_step()} of {exp.config.base.steps}, chosen on the base TEST '
          f'images ({float(best["test_acc"]):.2f}%; base.select_on_test reads the test set)', flush=True)
  bench = exp.bench
  emb = exp.programs.get(*embed_spec(exp))(variables, exp.train_view(bench.base_train))
  protos = evaluation.prototypes(emb, bench.train.labels[bench.base_train], bench.session_classes[0])
  ckpts.save_model(variables['params'], variables['batch_stats'], protos)
  return {'params': variables['params'], 'batch_stats': variables['batch_stats'], 'prototypes': protos}


def parallel_runs(config) -> int:
  """How many runs one call updates in a session (incremental.parallel_runs; 0: 1 on a CPU, where
  mapping runs turns their convolutions into slower grouped ones, and all runs elsewhere)."""
  n = config.incremental.parallel_runs or (1 if jax.default_backend() == 'cpu' else config.runs)
  return max(1, min(n, config.runs))


def run_sessions(exp: Experiment, runner, ckpts: Checkpoints, log, train: bool = True,
                 hook: Hook = None) -> tuple:
  """All runs x sessions for any method (its `runner`, f2m_jax/methods), session by session, the runs
  in fixed groups of `parallel_runs` updated by one `runner.update_runs` call; each run and session
  is checkpointed on its own. A group where only some runs still need the session is recomputed
  whole (only those are saved), so a resumed run computes every session in the same program as an
  uninterrupted one. Returns per-run lists of per-session accuracy dicts and per-run prototype
  norms (None where the method has none). Sessions already checkpointed are restored; with
  `train=False` a missing session is an error (eval mode)."""
  cfg, bench = exp.config, exp.bench
  first = runner.first_accuracies()
  runs = range(cfg.runs)
  done = {run: set(ckpts.sessions_done(run)) for run in runs}
  for run in runs:
    gaps = sorted(set(range(2, max(done[run], default=1) + 1)) - done[run])
    if gaps:
      raise CheckpointError(f'{ckpts.root}/run_{run}: sessions {sorted(done[run])} are saved but {gaps} are missing; '
                            f'restore them or delete the folder run_{run} to recompute that run')
  states = [runner.start() for _ in runs]
  exemplars = [np.zeros((0,), np.int64) for _ in runs]
  accs = [[first] for _ in runs]
  per_call = parallel_runs(cfg)
  bar = tqdm(total=cfg.runs * (bench.num_sessions - 1), desc='incremental sessions', file=sys.stdout,
             mininterval=2.0)
  for session in range(2, bench.num_sessions + 1):
    before, todo = list(states), []
    for run in runs:
      shots = protocol_lib.session_shots(bench, cfg.data.protocol, run, session, cfg.data.shots, cfg.seed)
      exemplars[run] = np.concatenate([exemplars[run], shots])
      if session not in done[run]:
        todo.append(run)
        continue
      saved = ckpts.restore_session(run, session, {**runner.template(session), 'exemplars': exemplars[run],
                                                   'accuracy': np.zeros((4,), np.float64)})
      if not np.array_equal(saved['exemplars'], exemplars[run]):
        raise CheckpointError(f'run {run} session {session}: saved exemplars differ from the protocol '
                              '(the data or protocol changed since it was saved)')
      states[run] = runner.restore(saved)
      accs[run].append(_unpack_accuracy(saved['accuracy']))
      bar.update(1)
    if todo and not train:
      raise CheckpointError(f'run {todo[0]} session {session} has no checkpoint in {ckpts.root}; '
                            'train first (run without --mode eval)')
    for group in (list(runs[i:i + per_call]) for i in range(0, cfg.runs, per_call)):
      if not set(group) & set(todo):
        continue
      updated = runner.update_runs([before[r] for r in group], group, session, [exemplars[r] for r in group])
      for run, (state, info) in zip(group, updated):
        if run not in todo:
          continue  # restored above; recomputed only as part of its group
        states[run] = state
        acc = runner.accuracies(state, session)
        ckpts.save_session(run, session, {**runner.item(state), 'exemplars': exemplars[run],
                                          'accuracy': _pack_accuracy(acc)})
        log.write(phase='session', run=run, session=session, **info, **acc)
        accs[run].append(acc)
        bar.update(1)
        if hook:
          hook('session', run=run, session=session)
  bar.close()
  return accs, [runner.norms(state) for state in states]


def _pack_accuracy(acc: dict) -> np.ndarray:
  return np.asarray([np.nan if acc[k] is None else acc[k] for k in ('acc', 'acc_base', 'acc_novel', 'hm')],
                    np.float64)


def _unpack_accuracy(a: np.ndarray) -> dict:
  vals = [None if np.isnan(v) else float(v) for v in np.asarray(a)]
  return dict(zip(('acc', 'acc_base', 'acc_novel', 'hm'), vals))


NETWORK_FIELDS = ('model.arch', 'model.width', 'model.head')


def check_source_network(checkpoint: str, config: ml_collections.ConfigDict) -> None:
  """--checkpoint W must hold the network this config builds (W's config.json, fields added since
  read as their legacy values): else a clear error instead of orbax's tree mismatch."""
  path = os.path.join(checkpoint, 'config.json')
  if not os.path.exists(path):
    return  # a folder of checkpoints alone: restoring will tell
  saved = workdir_lib.flat_items(workdir_lib.saved_config(checkpoint, config.to_dict()))
  ours = workdir_lib.flat_items(config.to_dict())
  diff = [f'{k}={saved.get(k)!r} there, {ours[k]!r} here' for k in NETWORK_FIELDS if saved.get(k) != ours[k]]
  if diff:
    raise CheckpointError(f'--checkpoint {checkpoint} holds another network than method={config.method} builds '
                          f'({"; ".join(diff)}); pass a workdir trained with the same network, or none (the '
                          'base session is then trained here)')


def run(config: ml_collections.ConfigDict, workdir: str, mode: str = 'train',
        checkpoint: Optional[str] = None, hook: Hook = None) -> dict:
  """Trains (or, mode='eval', only restores) and writes results.json / results.csv; returns results."""
  from f2m_jax import methods  # pylint: disable=g-import-not-at-top
  config = resolve(config)
  if checkpoint:
    check_source_network(checkpoint, config)
  workdir_lib.prepare(workdir, config.to_dict())
  bench = sources.load_benchmark(config)
  exp = Experiment.create(config, bench)
  log = workdir_lib.MetricsLog(workdir, tensorboard=config.tensorboard)
  ckpts = Checkpoints(workdir)
  source = Checkpoints(checkpoint, read_only=True) if checkpoint else None
  if source is None and not ckpts.has_model() and (mode == 'eval' or ckpts.any_sessions()):
    raise CheckpointError(f'{ckpts.root}/model has no base model checkpoint (deleted?) although this workdir '
                          'is meant to hold one; restore it, pass --checkpoint WORKDIR, or use a new --workdir')
  t0 = time.time()
  method = methods.get(config.method)
  hook = compiling_ahead(exp, method, hook)
  try:
    first = method.first_session(exp, ckpts, log, source, hook)
    report_compile_ahead(exp.programs.wait(), log)
    runner = method.runner(exp, first, ckpts, source, log)
    per_run, norms = run_sessions(exp, runner, ckpts, log, train=(mode != 'eval'), hook=hook)
    base_info = selection_info(config, source or ckpts)
  finally:
    exp.programs.close()
    ckpts.close()  # also when stopped: the checkpoints written in the background are completed
  results = evaluation.build_results(bench.name, config.method, config.data.protocol,
                                     [bench.num_seen_classes(t) for t in range(1, bench.num_sessions + 1)],
                                     per_run, norms if all(n is not None for n in norms) else None)
  results['base_model'] = base_info
  wall = round(time.time() - t0, 1)
  results['provenance'] = {**workdir_lib.provenance(config.to_dict()), 'wall_time_s': wall}
  log.write(phase='done', mode=mode, wall_time_s=wall,
            base_checkpoint=os.path.abspath(checkpoint) if checkpoint else None)
  log.close()
  write_outputs(workdir, results, mode)
  return results


def compiling_ahead(exp: Experiment, method, hook: Hook) -> Hook:
  """`hook`, and (config.compile_ahead) at the first base step, once the base step's own program
  has compiled, the start of compiling the method's session programs in the background while the
  rest of session 1 trains (f2m_jax/programs.py). Without base training (a restored model) nothing
  is compiled ahead: there is nothing to overlap."""
  if not (method.compile_ahead and programs_lib.enabled(exp.config.compile_ahead)):
    return hook
  started = []

  def start_then(kind, **kw):
    if kind == 'base_step' and not started:
      started.append(True)
      exp.programs.compile_ahead(lambda: method.compile_ahead(exp))
    if hook:
      hook(kind, **kw)

  return start_then


def report_compile_ahead(done: Optional[dict], log) -> None:
  """Prints and logs (phase 'compile_ahead') what the background compiles did, once the later
  stages need their programs: `waited_s` is the part of their compiling that was not hidden."""
  if done is None:
    return
  print(f'compiled ahead: {done["programs"]} programs, {done["compile_s"]} s in the background; waited '
        f'{done["waited_s"]} s for them' + (f'; failed (compiled at first call): {done["failed"]}'
                                             if done['failed'] else ''), flush=True)
  log.write(phase='compile_ahead', **done)


def write_outputs(workdir: str, results: dict, mode: str) -> None:
  """results.json/csv. In eval mode an existing results.json is compared, never overwritten: a
  difference is written to results_eval.json and reported."""
  path = os.path.join(workdir, 'results.json')
  if mode == 'eval' and os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    strip = lambda r: {k: v for k, v in r.items() if k != 'provenance'}  # when and where differ, nothing else may
    if strip(saved) == strip(json.loads(json.dumps(results))):
      print(f'evaluation reproduced {path} exactly', flush=True)
      return
    workdir_lib.write_results(workdir, results, evaluation.results_rows(results), name='results_eval')
    print(f'evaluation differs from {path}; wrote results_eval.json beside it', flush=True)
    return
  workdir_lib.write_results(workdir, results, evaluation.results_rows(results))


def run_flatness(config: ml_collections.ConfigDict, workdir: str, checkpoint: Optional[str] = None) -> dict:
  """--mode flatness: I and sigma^2 of the base loss around the base model of `workdir` (or of
  `checkpoint`) on the base training images and the base classes' test images; writes flatness.json."""
  from f2m_jax import flatness
  config = resolve(config)
  bench = sources.load_benchmark(config)
  exp = Experiment.create(config, bench)
  ckpts = Checkpoints(checkpoint or workdir, read_only=True)
  model = base_model(exp, ckpts, log=None, source=ckpts)
  variables = {'params': model['params'], 'batch_stats': model['batch_stats']}
  f = config.flatness
  bound = f.bound if f.bound >= 0 else config.noise.bound
  rng = np.random.default_rng([config.seed, 5])
  out = {'bound': bound, 'distribution': config.noise.distribution, 'num_layers': config.noise.num_layers,
         'checkpoint': os.path.abspath(checkpoint or workdir), 'provenance': workdir_lib.provenance(config.to_dict())}
  test_idx = protocol_lib.test_indices(bench, 1)
  for name, split, idx in (('train', bench.train, bench.base_train), ('test', bench.test, test_idx)):
    if f.max_images and len(idx) > f.max_images:
      idx = np.sort(rng.choice(idx, f.max_images, replace=False))
    clean, losses = flatness.noisy_losses(
        exp.model, variables, split.images[idx], split.labels[idx], exp.noise_paths, exp.split, bound,
        config.noise.distribution, f.num_draws, f.chunk, exp.key(3), bench.mean, bench.std,
        config.eval.batch_size)
    out[name] = {**flatness.flatness_stats(clean, losses), 'num_images': int(len(idx))}
    print(f'flatness on {name} ({len(idx)} images, {f.num_draws} draws): L*={clean:.4f} '
          f'I={out[name]["I"]:.3e} sigma^2={out[name]["sigma2"]:.3e}', flush=True)
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, 'flatness.json')
  if os.path.exists(path):
    path = os.path.join(workdir, f'flatness_{time.strftime("%Y%m%d-%H%M%S")}.json')
  workdir_lib.atomic_write(path, json.dumps(out, indent=2))
  print(f'wrote {path}', flush=True)
  return out
