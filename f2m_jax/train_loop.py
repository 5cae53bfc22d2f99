"""The base session's training loop, for one run or S runs in lockstep (a seed sweep), and joint
training's: batches from a pure function of (seed, step), one jitted step or a scanned call of
several per dispatch, the host's work done ahead by a background thread, logging, checkpoints, the
NaN stop, and the original's opt-in model selection on the test set.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import math
import sys
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from f2m_jax import base as base_lib
from f2m_jax import evaluation
from f2m_jax import prefetch as prefetch_lib
from f2m_jax import programs as programs_lib
from f2m_jax import sharding
from f2m_jax import workdir as workdir_lib
from f2m_jax.checkpoint import Checkpoints
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.experiment import Experiment, Hook, TrainingError
from f2m_jax.padding import pad_rows


@dataclasses.dataclass(frozen=True)
class Member:
  """One base training of the loop: its objective and key, the indices of its batch at each step
  (`batch_indices(step)`, into the training images all members share), `save(step, state)` for its
  train state at checkpoint steps and the last, and the metrics log of its workdir."""
  objective: base_lib.BaseObjective
  batch_indices: Callable[[int], np.ndarray]
  key: jax.Array
  save: Callable
  log: workdir_lib.MetricsLog


def train_base(exp: Experiment, ckpts: Checkpoints, log: workdir_lib.MetricsLog, hook: Hook = None):
  """Trains session 1 from the latest base checkpoint (or from scratch); returns the final state.
  `hook('base_step', step=n)` is called after every step (tests use it to interrupt a run)."""
  select = TestSetSelector(exp, ckpts, log) if exp.config.base.select_on_test else None
  states = train_base_sessions([exp], [ckpts], [log], 'base session', keep_bar=True, select=select, hook=hook)
  return unstack(states, 0)


def train_base_sessions(exps: Sequence[Experiment], ckpts: Sequence[Checkpoints], logs: Sequence, title: str,
                        mapping: str = 'unroll', keep_bar: bool = False, select: Optional[Callable] = None,
                        hook: Hook = None):
  """The base sessions of S >= 1 runs (a sweep's members) in lockstep through `train_steps`, from the
  last base step every one of them saved (restored from its workdir) or from scratch; each state is
  saved into its own workdir. Returns the final states, with a leading member axis."""
  saved = [c.latest_base_step() for c in ckpts]
  start = None if None in saved else min(saved)

  def states():  # called while the step compiles (config.compile_ahead)
    if start is None:
      return stack([e.init_state() for e in exps])
    print(f'resuming the {title} at step {start}/{exps[0].config.base.steps}', flush=True)
    return stack([c.restore_base_state(e.state_template(), start) for e, c in zip(exps, ckpts)])

  members = [Member(e.base_objective(), e.batch_indices, e.key(0), c.save_base_state, log)
             for e, c, log in zip(exps, ckpts, logs)]
  return train_steps(exps[0], members, states, start or 0, phase='base', title=title, mapping=mapping,
                     keep_bar=keep_bar, select=select, hook=hook)


def stack(trees):
  """The states (or any trees) of S members as one tree with a leading member axis."""
  return jax.tree_util.tree_map(lambda *v: jnp.stack([jnp.asarray(x) for x in v]), *trees)


def unstack(tree, i: int):
  return jax.tree_util.tree_map(lambda x: x[i], tree)


def train_steps(exp: Experiment, members: Sequence[Member], states, start: int, phase: str, title: str,
                mapping: str = 'unroll', keep_bar: bool = False, select: Optional[Callable] = None,
                hook: Hook = None):
  """Steps `start`..base.steps of S >= 1 members in lockstep from `states` (of `start` steps, with a
  leading member axis; or a function that returns those of the config's network, called while the
  step compiles in a background thread where config.compile_ahead says so), with the base.* budget
  (optimizer, logging and checkpoint intervals, data path, prefetch); returns the final states. The base session's loop for one run or a sweep
  (f2m_jax/members.py), and joint training's (f2m_jax/methods/joint.py).

  `mapping` ('vmap' or 'unroll') is how the members share one program (base.members_step_fn).
  `select(step, state)` (one member only) is called every base.select_every steps; each member's
  metrics go to its log under `phase`, progress to one bar named `title`; a non-finite step raises
  TrainingError naming the step (and the member). The device is never drained for the host: a
  call is dispatched before the previous call's metrics are read, and a state to be saved is first
  copied on the device, so that the next call may donate it."""
  cfg = exp.config.base
  if start >= cfg.steps:
    return states() if callable(states) else states
  num = len(members)
  mesh = sharding.data_mesh()  # data parallel over all devices; the batch is the global batch
  images, labels = exp.bench.train.images, exp.bench.train.labels
  on_device, per_call = data_placement(exp.config, images.nbytes)
  step = base_lib.members_step_fn(
      [base_lib.train_step_fn(m.objective, exp.optimizer(), exp.bench.augment, exp.bench.image_size,
                              exp.bench.mean, exp.bench.std) for m in members], mapping)
  step_fn = (base_lib.make_multi_step if on_device else base_lib.make_member_step)(step, mesh)
  keys = jnp.stack([m.key for m in members])

  def indices(s: int) -> np.ndarray:  # [S, B]: every member's batch at step s
    return np.stack([m.batch_indices(s) for m in members]).astype(np.int32)

  what = f'the step{f" of {num} members" if num > 1 else ""} (steps {start}-{cfg.steps})'
  ahead = None
  if callable(states):
    if programs_lib.enabled(exp.config.compile_ahead):
      ahead = compile_step_ahead(step_fn, exp, mesh, indices(start), keys, on_device, per_call)
      print(f'{title}: compiling {what} in the background while the states are made', flush=True)
    states = states()
  # the training images live on the device (each call runs `per_call` steps), or batches come from the host
  data = sharding.replicate((images, labels), mesh) if on_device else ()

  def host_part(call):  # the host's share of a call, done ahead by `prefetch`: indices (and images)
    first, n = call
    if on_device:  # a shorter call is padded to per_call rows (image 0's batches), which do not count
      rows = np.stack([indices(s) for s in range(first, first + n)])
      return sharding.shard_member_rows(mesh, pad_rows(rows, per_call)), np.int32(n)
    idx = indices(first)
    return sharding.shard_member_batch(mesh, images[idx], labels[idx])

  states, keys = sharding.replicate((states, keys), mesh)
  for m in members:
    m.log.open()
  # The bar starts once the first call is done, so that its rate and ETA leave out the compile.
  print(f'{title}: ' + (f'compiling {what}' if ahead is None else wait_for(ahead)), flush=True)
  bar = None
  window, t0, saved = [], time.time(), (start or None)
  extra = {'members': num} if num > 1 else {}

  def needs_state(done: int) -> bool:  # a call ending at step `done` is followed by a save or a selection
    return (done % cfg.checkpoint_every == 0 or done == cfg.steps
            or (select is not None and done % cfg.select_every == 0))

  def finish(first: int, n: int, metrics, snapshot):
    """Reads the metrics of a call of `n` steps (waiting for it), stops on a non-finite step, then
    logs, selects and saves; `snapshot` is a copy of the states after the call where one is needed."""
    nonlocal window, t0, saved, bar
    metrics = jax.device_get(metrics)  # leaves [N, S] (device path) or [S]
    per_step = [{k: v[i] for k, v in metrics.items()} for i in range(n)] if on_device else [metrics]
    for i, m in enumerate(per_step):
      bad = np.flatnonzero(~np.asarray(m['finite']))
      if bad.size:
        who = f' in member {int(bad[0])}' if num > 1 else ''
        kept = f'the last good checkpoint (step {saved}) is kept' if saved else 'no checkpoint was saved yet'
        raise TrainingError(f'non-finite loss or parameters (loss {m["loss"][bad[0]]}){who} at {phase} step '
                            f'{first + i + 1}; {kept}')
    if bar is None:
      bar = tqdm(total=cfg.steps, desc=title, initial=first + n, file=sys.stdout, mininterval=2.0, leave=keep_bar)
    else:
      bar.update(len(per_step))
    host = None if snapshot is None else jax.device_get(snapshot)
    for i, m in enumerate(per_step):  # logging, selection and checkpoints fall on call boundaries
      window.append(m)
      done = first + i + 1
      if done % cfg.log_every == 0 or done == cfg.steps:
        rate = round(len(window) / (time.time() - t0), 3)
        for j, member in enumerate(members):
          avg = {k: float(np.mean([w[k][j] for w in window])) for k in base_lib.LOGGED_METRICS}
          member.log.write(phase=phase, step=done, steps_per_s=rate, **extra, **avg)
        if num == 1:
          bar.set_postfix(loss=f'{avg["loss"]:.3f}', acc=f'{100 * avg["acc"]:.1f}')
        window, t0 = [], time.time()
      if select and done % cfg.select_every == 0:
        select(done, unstack(host, 0))
      if done % cfg.checkpoint_every == 0 or done == cfg.steps:
        for j, member in enumerate(members):
          member.save(done, unstack(host, j))
        saved = done
      if hook:
        hook('base_step', step=done)

  calls = call_spans(start, cfg.steps, per_call)
  pending = None  # (first step, steps, metrics, snapshot) of the call dispatched last
  with contextlib.closing(prefetch_lib.prefetch(host_part, calls, cfg.prefetch)) as batches:
    for (first, n), batch in zip(calls, batches):
      states, metrics = step_fn(states, *data, *batch, keys)
      if pending:
        finish(*pending)
      snapshot = jax.tree_util.tree_map(jnp.copy, states) if needs_state(first + n) else None
      pending = (first, n, metrics, snapshot)
  finish(*pending)
  bar.close()
  return states


def compile_step_ahead(step_fn, exp: Experiment, mesh, indices: np.ndarray, keys, on_device: bool, per_call: int):
  """Starts compiling `step_fn` (`train_steps`'s) for the shapes of its calls in a background thread,
  from abstract states of the config's network (`Experiment.state_shapes`) stacked over the members;
  returns (future, start time). The jitted function keeps the executable for arguments of these
  shapes and shardings, so its first call does not compile again (f2m_jax/programs.py)."""
  rep = sharding.replicated(mesh)
  sds = lambda shape, dtype, where=rep: jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dtype), sharding=where)
  images, labels = exp.bench.train.images, exp.bench.train.labels
  if on_device:  # the step count comes as a host scalar, without a sharding
    data = (sds(images.shape, images.dtype), sds(labels.shape, labels.dtype),
            sds((per_call,) + indices.shape, np.int32, sharding.member_rows_sharded(mesh)), sds((), np.int32, None))
  else:
    batch = sharding.member_batch_sharded(mesh)
    data = (sds(indices.shape + images.shape[1:], images.dtype, batch), sds(indices.shape, labels.dtype, batch))

  def compile_it() -> float:
    stacked = jax.tree_util.tree_map(lambda s: sds((len(indices),) + s.shape, s.dtype), exp.state_shapes())
    step_fn.lower(stacked, *data, jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=rep)).compile()
    return time.time()

  executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='compile_step')
  future = executor.submit(compile_it)
  executor.shutdown(wait=False)
  return future, time.time()


def wait_for(ahead) -> str:
  """Waits for `compile_step_ahead`'s compile; says how long it took and how much of it was waited
  for. A failed compile is reported and left to the first call."""
  future, started = ahead
  t0 = time.time()
  try:
    done = future.result()
  except Exception as e:  # pylint: disable=broad-except
    return f'compiling the step ahead failed ({type(e).__name__}: {e}); it compiles at its first call'
  return f'the step compiled in the background in {done - started:.1f} s, of which {time.time() - t0:.1f} s waited for'


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
    stats = jax.local_devices()[0].memory_stats() or {}
    limit = stats.get('bytes_limit', 8 << 30) // 4
    on_device = backend != 'cpu' and images_nbytes <= limit
  else:
    on_device = b.data_placement == 'device'
  per_call = b.steps_per_call or (1 if backend == 'cpu' else 20)
  for every in (b.log_every, b.checkpoint_every) + ((b.select_every,) if b.select_on_test else ()):
    per_call = math.gcd(per_call, every)
  return on_device, (per_call if on_device else 1)


class TestSetSelector:
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
      self.best = float(ckpts.restore_best_base(exp.variables_template())['test_acc'])

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
