"""The incremental sessions of any method: every run's sessions through its runner, each run and
session checkpointed on its own and restored where saved."""
import numpy as np

from f2m_jax import progress
from f2m_jax import stats
from f2m_jax import trees
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.experiment import TrainingError
from f2m_jax.files import CheckpointError, CheckpointFault


def run_sessions(exp, runner, ckpts, log, train=True, hook=None):
  """All runs x sessions of a method's `runner`: per-run lists of accuracy dicts and per-run
  prototype norms (or None). Checkpointed sessions are restored; with `train=False` (--mode eval) a
  missing one is an error, and every restored one's accuracies are computed again. `hook` is called
  after each session."""
  cfg, bench = exp.config, exp.bench
  print(f'session 1: accuracy on the {len(protocol_lib.test_indices(bench, 1)):,} test images of '
        f'the base classes, then {cfg.runs} runs x {bench.num_sessions - 1} sessions', flush=True)
  first = runner.first_accuracies()
  bar = progress.bar(cfg.runs * (bench.num_sessions - 1), f'sessions ({cfg.runs} runs x '
                                                          f'{bench.num_sessions - 1})',
                     unit='session')
  accs, norms = [], []
  for run in range(cfg.runs):
    done = ckpts.sessions_done(run)
    state, exemplars, run_accs = runner.start(), np.zeros((0,), np.int64), [first]
    for session in range(2, bench.num_sessions + 1):
      shots = protocol_lib.session_shots(bench, cfg.data.protocol, run, session, cfg.data.shots,
                                         cfg.seed)
      exemplars = np.concatenate([exemplars, shots])
      if session in done:
        state, acc = restore_session(runner, ckpts, run, session, exemplars, not train)
      elif train:
        state, acc = train_session(cfg.method, runner, ckpts, log, state, run, session, exemplars)
      else:
        raise CheckpointError(f'run {run} session {session} has no checkpoint in {ckpts.root}; '
                              'train first (run without --mode eval)')
      if hook:  # a stop asked for during a restore too (an evaluation has no other boundary)
        hook('session', run=run, session=session)
      run_accs.append(acc)
      bar.update(1)
    accs.append(run_accs)
    norms.append(runner.norms(state))
  bar.close()
  return accs, norms


def _as_array(acc):
  """A session's accuracies as its checkpoint holds them: stats.KEYS, then acc_sessions; NaN for
  None (numpy's float conversion of None)."""
  return np.asarray([acc[k] for k in stats.KEYS] + list(acc['acc_sessions']), np.float64)


def train_session(method, runner, ckpts, log, state, run, session, exemplars):
  """(state, accuracies) of `run` after training `session`; saved, then logged. A TrainingError,
  before anything is saved, where the state, its accuracies or its metrics hold NaN or inf."""
  state, info = runner.update(state, run, session, exemplars)
  acc = runner.accuracies(state, session)
  bad = trees.non_finite({'state': runner.item(state), 'accuracies': acc, 'metrics': info})
  if bad:
    kept = f'run {run} session {session - 1}' if session > 2 else 'the base model'
    raise TrainingError(f'non-finite values ({", ".join(bad[:3])}) of method {method} in run {run} '
                        f'session {session}; it was not saved, the last good checkpoint ({kept}) '
                        'is kept')
  item = {**runner.item(state), 'exemplars': exemplars, 'accuracy': _as_array(acc)}
  logged = lambda: log.write(phase='session', run=run, session=session, **info, **acc)
  ckpts.run(run).save(session, item, then=logged)
  return state, acc


def restore_session(runner, ckpts, run, session, exemplars, recompute):
  """(state, accuracies) of `run` after `session`, restored (a CheckpointFault where its exemplars
  differ from the protocol's): with the accuracies it saved, its digest and identity holding
  (`Checkpoints.entry`); with `recompute` (--mode eval), or one an earlier version saved (stats.KEYS
  alone), computed again. Where those differ from the saved ones, a line names the possible causes,
  and ckpts.differences records both."""
  path = f'{ckpts.root}/run_{run}/{session}'
  saved = ckpts.run(run).restore({**runner.template(session), 'exemplars': exemplars,
                                  'accuracy': np.zeros((len(stats.KEYS),))}, session)  # any length
  if not np.array_equal(saved['exemplars'], exemplars):
    raise CheckpointFault(f'run {run} session {session}: the exemplars saved in {path} differ from '
                          'the protocol\'s: the data or the code changed since it was saved')
  state = runner.restore(saved)
  values, n = [None if np.isnan(v) else float(v) for v in saved['accuracy']], len(stats.KEYS)
  acc = dict(zip(stats.KEYS, values), **({'acc_sessions': values[n:]} if len(values) > n else {}))
  if not recompute and 'acc_sessions' in acc:
    return state, acc
  again = runner.accuracies(state, session)
  if recompute and {k: again[k] for k in acc} != acc:
    by = (ckpts.read()['checkpoints'].get(f'run_{run}/{session}') or {}).get('by')
    ckpts.differences.append({'checkpoint': path, 'saved': acc, 'recomputed': again, 'saved_by': by,
                              'recomputed_by': ckpts.writer})
    print(f'note: {difference_line(run, session, path, acc, again, by, ckpts.writer)}', flush=True)
  return state, again


def difference_line(run, session, path, saved, again, by, now):
  """What differs between the `saved` and recomputed accuracies of a session, who saved and who
  computes them (commit, backend, device), and what may cause it: the code or machine where those
  differ, else the data or the evaluation's rounding (eval.batch_size and eval.cache_trunk sum in
  another order: near-ties flip)."""
  who = lambda w: (f'commit {w.get("commit")}{" (dirty)" * bool(w.get("dirty"))} on {w["backend"]} '
                   f'({w["device"]})')
  same = bool(by) and who(by) == who(now) and not by.get('dirty')
  changed = '; '.join(f'{k} {saved[k]:.2f} saved, {again[k]:.2f} now' for k in stats.KEYS
                      if saved[k] != again[k])
  causes = 'the data, or the rounding of eval.batch_size or eval.cache_trunk at near-ties'
  if not same:
    causes = f'the code or machine, {causes}'
  return (f'run {run} session {session}: the accuracies computed again from {path} differ from '
          f'those it saved ({changed}); saved by {who(by) if by else "an unrecorded writer"}, '
          f'computed by {who(now)}: possible causes: {causes}; the results record both')
