"""The base session's training loop, for one run or S runs in lockstep, and joint training's: each
call of the one program runs `base.steps_per_call` steps; the NaN stop, logging, checkpoints and the
hook on the host."""
import collections
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from f2m_jax import base as base_lib
from f2m_jax import evaluation
from f2m_jax import progress
from f2m_jax import sharding
from f2m_jax import trees
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.data import sources
from f2m_jax.experiment import Interrupted, TrainingError
from f2m_jax.padding import pad_rows

# One training of the loop: `batch_indices(step)`, its key, noise bound, `save(step, state)` and
# metrics log (run.workdir.MetricsLog).
Member = collections.namedtuple('Member', 'batch_indices key bound save log')


def train_base(exp, ckpts, log, hook=None):
  """Trains session 1 from the latest base checkpoint (or from scratch); returns the base network
  (`chosen_variables`). `hook('base_step', step=n)` is called after every call, at its last step
  n."""
  select = None
  if exp.config.base.select_on_test:
    select = TestSetSelector(exp, exp.model, 1, ckpts.best_base, log)
  states = train_base_sessions([exp], [ckpts], [log], 'base session', select, hook)
  return chosen_variables(trees.index(states, 0), select, 'base model', exp.config.base.steps)


def chosen_variables(state, select, title, steps):
  """{'params', 'batch_stats'} of a finished training as host arrays (as every later stage passes
  them: one compiled embedding program for all): the last step's, or the model `select` kept, and a
  line saying so."""
  best_step = select.store.latest_step() if select else None
  if best_step is None:  # no selection, or no selection step reached
    return jax.device_get({'params': state.params, 'batch_stats': state.batch_stats})
  best = select.store.restore(select.template)
  print(f'{title}: step {best_step} of {steps}, chosen on {select.read} '
        f'({float(best["test_acc"]):.2f}%; base.select_on_test reads the test set)', flush=True)
  return {k: best[k] for k in ('params', 'batch_stats')}


def train_base_sessions(exps, ckpts, logs, title, select=None, hook=None):
  """The base sessions of S >= 1 runs in lockstep through `train_steps`, from the latest base step
  all of them hold (`resume_step`) or from scratch, each saved into its own workdir; the final
  states, stacked."""
  held = [c.base.steps() for c in ckpts]
  start, exp = resume_step(held), exps[0]
  if 0 < start < exp.config.base.steps:
    print(f'{title}: resuming at step {start}/{exp.config.base.steps}', flush=True)
  states = trees.stack([c.base.restore(e.state_template(), start) if start else e.init_state()
                        for e, c in zip(exps, ckpts)])  # trained already where start is the end
  members = [Member(e.batch_indices, e.key(0), e.config.noise.bound,
                    saving_after(c.base.save, max(h, default=0)), log)
             for e, c, log, h in zip(exps, ckpts, logs, held)]
  return train_steps(exp, exp.model, exp.loss, members, states, start, 'base', title, select, hook)


def resume_step(held):
  """The base step that members in lockstep resume from: the latest that all of them hold, 0 where
  they share none (their background saves end at different moments)."""
  return max(set.intersection(*map(set, held)), default=0)


def saving_after(save, latest):
  """`save(step, state)` for the steps after `latest` only: a member that holds later steps than the
  sweep resumes from saves none of them again (orbax refuses a step that exists)."""
  return lambda step, state: save(step, state) if step > latest else None


def steps_per_call(cfg, selecting):
  """base.steps_per_call reduced to divide the log, checkpoint (and selection) intervals: they end
  calls."""
  intervals = [cfg.log_every, cfg.checkpoint_every] + ([cfg.select_every] if selecting else [])
  return math.gcd(cfg.steps_per_call, *intervals)


def calls_text(cfg, selecting):
  """'N a call', saying why N is less than base.steps_per_call where it is."""
  per_call = steps_per_call(cfg, selecting)
  if per_call == cfg.steps_per_call:
    return f'{per_call} a call'
  intervals = 'log_every, checkpoint_every' + ', select_every' * selecting
  return f'{per_call} a call: base.steps_per_call={cfg.steps_per_call} cut to divide {intervals}'


def call_spans(start, steps, per_call):
  """(first step, number of steps) of each call from `start` to `steps`: calls end at multiples of
  per_call, also after a resume with another per_call."""
  ends = list(range((start // per_call + 1) * per_call, steps, per_call)) + [steps]
  return [(first, end - first) for first, end in zip([start] + ends[:-1], ends)]


def base_program(exp, model, loss, mesh):
  """The base program of `exp`'s `model` under `loss` over `mesh`, as its base training runs it
  (`--mode bench` and the memory check compile it too)."""
  return base_lib.train_program(model, loss, exp.optimizer_settings(),
                                base_lib.Inputs.of(exp.bench), exp.config.members.map, mesh)


def train_steps(exp, model, loss, members, states, start, phase, title, select=None, hook=None):
  """Steps `start`..base.steps of S >= 1 members in lockstep from `states` (leading member axis);
  returns the final states. `select(step, state)` runs every base.select_every steps; metrics go to
  each member's log under `phase`. After `hook` raised Interrupted, the call in flight ends the
  training, its states saved."""
  cfg, bench = exp.config.base, exp.bench
  if start >= cfg.steps:
    return states
  mesh = sharding.data_mesh()  # data parallel over all devices; the batch is the global batch
  per_call = steps_per_call(cfg, select is not None)
  program = base_program(exp, model, loss, mesh)
  data, keys, bounds, states = sharding.replicate(
      ((bench.train.images, bench.train.labels), jnp.stack([m.key for m in members]),
       np.asarray([m.bound for m in members], np.float32), states), mesh)
  who = f' of {len(members)} members' if len(members) > 1 else ''
  calls = calls_text(cfg, select is not None)
  status = progress.status(f'{title}: compiling the step{who} (steps {start}-{cfg.steps}, {calls})')
  records = Records(exp.config, members, phase, title, start, select, hook, status)
  pending = None  # (first step, steps, metrics, snapshot) of the call dispatched last
  try:
    for first, n in call_spans(start, cfg.steps, per_call):
      rows = np.stack([[m.batch_indices(s) for m in members] for s in range(first, first + n)])
      rows = pad_rows(rows.astype(np.int32), per_call)  # extra rows: masked
      args = (states, *data, sharding.shard_member_rows(mesh, rows), np.int32(n), keys, bounds)
      if pending is None:  # compiled first, so that the status line can tell compiling from running
        program = status.compile(program.lower(*args), sources.cache_dir(exp.config))
        compiled = progress.elapsed(status.format_dict['elapsed'])
        status.set(f'{title}: compiled in {compiled}; first call: {n} steps')
      states, metrics = program(*args)
      if pending:
        records(*pending)
      snapshot = None  # the states the host reads after the next call, which they are donated to
      if any(records.due(first + n)[1:]):
        snapshot = jax.tree_util.tree_map(jnp.copy, states)
      pending = (first, n, metrics, snapshot)
      if records.interrupted:
        break
    records(*pending)
  finally:
    status.close()
  if records.interrupted:
    raise Interrupted(f'{records.interrupted}, where its state is saved')
  records.bar.close()
  return states


class Records:
  """What the host does with each call's results: the non-finite stop, the bar, the log's averages,
  the selection, the checkpoints, the hook (an Interrupted it raises ends the training after the
  call in flight). steps_per_s counts from the end of the first call, whose time holds the warm-up
  (as big_vision's Chrono); steps_averaged is a line's window (fewer than log_every after a
  resume)."""

  def __init__(self, config, members, phase, title, start, select, hook, status):
    self.cfg, self.method, self.members, self.phase = config.base, config.method, members, phase
    self.title, self.select, self.hook, self.status = title, select, hook, status
    self.window, self.saved, self.bar, self.timed = [], (start or None), None, 0
    self.interrupted = None
    for m in members:
      m.log.open()

  def due(self, done):
    """Whether a call ending at step `done` is followed by (a log line, a selection, a save)."""
    cfg, last = self.cfg, done == self.cfg.steps
    select = self.select is not None and done % cfg.select_every == 0
    return (done % cfg.log_every == 0 or last, select,
            done % cfg.checkpoint_every == 0 or last or self.interrupted is not None)

  def __call__(self, first, n, metrics, snapshot):
    """Reads the metrics of a call of `n` steps (waiting for it), then stops, logs, selects and
    saves at its end (`steps_per_call` divides every interval), then calls the hook; `snapshot`: the
    states after it."""
    metrics, done = {k: v[:n] for k, v in jax.device_get(metrics).items()}, first + n
    for i, j in np.argwhere(~metrics.pop('finite'))[:1]:  # the first non-finite step (and member)
      who = f' (member {j})' if len(self.members) > 1 else ''
      raise TrainingError(diverged(float(metrics['loss'][i, j]), first + i + 1,
                                   f'method {self.method}{who}', self.phase, self.saved,
                                   self.cfg.lr, self.cfg.classifier_lr))
    if self.bar is None:  # the clock starts now: the first call's time holds the warm-up
      self.status.close()
      self.bar, self.t0 = progress.bar(self.cfg.steps, self.title, initial=first), time.time()
    else:
      self.timed += n
    self.bar.update(n)
    self.window.append(metrics)
    (log, select, save), host = self.due(done), jax.device_get(snapshot)
    if log:
      self._log(done)
    if select:
      self.select(done, trees.index(host, 0))
    if save:
      for j, member in enumerate(self.members):
        member.save(done, trees.index(host, j))
      self.saved = done
    try:
      if self.hook:
        self.hook('base_step', step=done)
    except Interrupted as e:
      self.interrupted = e

  def _log(self, done):
    steps = jax.tree_util.tree_map(lambda *v: np.concatenate(v), *self.window)  # {name: [n, S]}
    rate = round(self.timed / (time.time() - self.t0), 3) if self.timed else None
    extra = {'members': len(self.members)} if len(self.members) > 1 else {}
    avgs = [{k: float(np.mean(v[:, j])) for k, v in steps.items()}
            for j in range(len(self.members))]
    for member, avg in zip(self.members, avgs):
      member.log.write(phase=self.phase, step=done, steps_per_s=rate,
                       steps_averaged=len(steps['loss']), **extra, **avg)
    shown = {k: '/'.join(f'{a[k]:.3f}' for a in avgs) for k in ('loss', 'acc')}  # each member's
    self.bar.set_postfix(shown, refresh=False)
    self.window, self.t0, self.timed = [], time.time(), 0


def diverged(loss, step, who, phase, saved, lr, classifier_lr=-1.0):
  """Why a training stopped at `step` (a step is good only if its loss and the parameters it leaves
  are finite), what was kept, and the learning rate to try: a tenth."""
  what = f'the loss was {loss}'
  if math.isfinite(loss):
    what = f'the parameters became non-finite after a finite loss of {loss:.3g}'
  kept = 'no checkpoint was saved yet'
  if saved:
    kept = f'the last good checkpoint (step {saved}) is kept'
  lower = f'--config.base.lr={lr / 10:g}'
  if classifier_lr > 0:
    lower += f' --config.base.classifier_lr={classifier_lr / 10:g}'
  return (f'{who} diverged at {phase} step {step}: {what}; {kept}. The learning rate is too '
          f'large for this batch and network: try a tenth of it, {lower}, in a new --workdir (the '
          'lr is part of its config)')


class TestSetSelector:
  """base.select_on_test, the original's model selection: the accuracy of `network`'s logits' argmax
  on the test images of every class seen up to `session`; the model of the best so far (a strictly
  better one replaces it) is kept in `best` (a checkpoint.Folder), where a resumed training finds
  it. `where` (run, session) goes into each log line; `logits`: the network's logits program, if
  made."""

  def __init__(self, exp, network, session, best, log, logits=None, where=None):
    bench = exp.bench
    self.store, self.log, self.where = best, log, where or {}
    self.name = 'base_test' if session == 1 else 'seen_test'  # fields <name>_acc, best_<name>_acc
    idx = protocol_lib.test_indices(bench, session)
    self.images, self.labels = bench.test.images[idx], bench.test.labels[idx]
    self.logits = logits or evaluation.make_embed(network, bench.mean, bench.std,
                                                  exp.config.eval.batch_size, logits=True)
    self.template = {**exp.variables_template(network), 'test_acc': np.zeros((), np.float64)}
    self.best = -1.0
    if best.latest_step() is not None:
      self.best = float(best.restore(self.template)['test_acc'])
    self.read = ('the base TEST images' if session == 1 else
                 f'the TEST images of the {bench.num_seen_classes(session)} seen classes')

  def accuracy(self, variables):
    return 100.0 * float(np.mean(np.argmax(self.logits(variables, self.images), -1) == self.labels))

  def __call__(self, step, state):
    variables = jax.device_get({'params': state.params, 'batch_stats': state.batch_stats})
    acc = self.accuracy(variables)
    if acc > self.best:
      self.best = acc
      self.store.save(step, {**variables, 'test_acc': np.asarray(acc, np.float64)})
    accuracies = {f'{self.name}_acc': acc, f'best_{self.name}_acc': self.best}
    self.log.write(phase='select_on_test', **self.where, step=step, **accuracies,
                   best_step=self.store.latest_step())


def selection_info(config, ckpts):
  """How the base model was chosen, for results.json: the last step, or (base.select_on_test) the
  step with the best base-test accuracy, flagged as reading the test set."""
  if not config.base.select_on_test:
    return {'selection': 'last', 'step': int(config.base.steps)}
  step = ckpts.best_base.latest_step()
  return {'selection': 'best_base_test_accuracy', 'reads_test_set': True,
          'every': int(config.base.select_every),
          'step': int(config.base.steps if step is None else step)}
