"""The incremental sessions of any method: every run's sessions through its runner, each run and
session checkpointed on its own and restored where saved.
"""
from __future__ import annotations

import numpy as np

from f2m_jax import progress
from f2m_jax import trees
from f2m_jax.checkpoint import CheckpointError, CheckpointFault, Checkpoints
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.experiment import Experiment, Hook, TrainingError

ACCURACY_KEYS = ('acc', 'acc_base', 'acc_novel', 'hm')


def run_sessions(exp: Experiment, runner, ckpts: Checkpoints, log, train: bool = True,
                 hook: Hook = None) -> tuple:
  """All runs x sessions of a method's `runner`: per-run lists of accuracy dicts and per-run prototype norms
  (or None). Checkpointed sessions are restored; with `train=False` a missing one is an error."""
  cfg, bench = exp.config, exp.bench
  print(f'session 1: accuracy on the {len(protocol_lib.test_indices(bench, 1)):,} test images of the base classes, '
        f'then {cfg.runs} runs x {bench.num_sessions - 1} sessions', flush=True)
  first = runner.first_accuracies()
  bar = progress.bar(cfg.runs * (bench.num_sessions - 1), f'sessions ({cfg.runs} runs x {bench.num_sessions - 1})',
                     unit='session')
  accs, norms = [], []
  for run in range(cfg.runs):
    done = saved_sessions(ckpts, run)
    state, exemplars, run_accs = runner.start(), np.zeros((0,), np.int64), [first]
    for session in range(2, bench.num_sessions + 1):
      shots = protocol_lib.session_shots(bench, cfg.data.protocol, run, session, cfg.data.shots, cfg.seed)
      exemplars = np.concatenate([exemplars, shots])
      if session in done:
        state, acc = restore_session(runner, ckpts, run, session, exemplars)
      elif train:
        state, acc = train_session(cfg.method, runner, ckpts, log, state, run, session, exemplars)
        if hook:
          hook('session', run=run, session=session)
      else:
        raise CheckpointError(f'run {run} session {session} has no checkpoint in {ckpts.root}; '
                              'train first (run without --mode eval)')
      run_accs.append(acc)
      bar.update(1)
    accs.append(run_accs)
    norms.append(runner.norms(state))
  bar.close()
  return accs, norms


def saved_sessions(ckpts: Checkpoints, run: int) -> set:
  """The sessions of `run` saved in `ckpts`; a CheckpointError where one is missing before a later one."""
  done = set(ckpts.sessions_done(run))
  gaps = sorted(set(range(2, max(done, default=1) + 1)) - done)
  if gaps:
    raise CheckpointError(f'{ckpts.root}/run_{run}: sessions {sorted(done)} are saved but {gaps} are missing; '
                          f'restore them or delete the folder run_{run} to recompute that run')
  return done


def train_session(method: str, runner, ckpts: Checkpoints, log, state, run: int, session: int,
                  exemplars: np.ndarray) -> tuple:
  """(state, accuracies) of `run` after training `session`; saved, then logged. A TrainingError, before
  anything is saved, where the state, its accuracies or its metrics hold NaN or inf."""
  state, info = runner.update(state, run, session, exemplars)
  acc = runner.accuracies(state, session)
  bad = trees.non_finite({'state': runner.item(state), 'accuracies': acc, 'metrics': info})
  if bad:
    kept = f'run {run} session {session - 1}' if session > 2 else 'the base model'
    raise TrainingError(f'non-finite values ({", ".join(bad[:3])}) of method {method} in run {run} session '
                        f'{session}; it was not saved, the last good checkpoint ({kept}) is kept')
  ckpts.save_session(run, session, {**runner.item(state), 'exemplars': exemplars,
                                    'accuracy': np.asarray([np.nan if acc[k] is None else acc[k]
                                                            for k in ACCURACY_KEYS], np.float64)},
                     then=lambda: log.write(phase='session', run=run, session=session, **info, **acc))
  return state, acc


def restore_session(runner, ckpts: Checkpoints, run: int, session: int, exemplars: np.ndarray) -> tuple:
  """(state, accuracies) of `run` after `session`, restored, the accuracies computed again; a
  CheckpointFault where they differ from those saved or its exemplars from the protocol's."""
  saved = ckpts.restore_session(run, session, {**runner.template(session), 'exemplars': exemplars,
                                                'accuracy': np.zeros((len(ACCURACY_KEYS),), np.float64)})
  if not np.array_equal(saved['exemplars'], exemplars):
    raise CheckpointFault(f'run {run} session {session}: the exemplars saved in {ckpts.root}/run_{run}/{session} '
                          'differ from the protocol\'s: the file is corrupt, or the data or the code changed since '
                          'it was saved')
  acc = {k: None if np.isnan(v) else float(v) for k, v in zip(ACCURACY_KEYS, np.asarray(saved['accuracy']))}
  state = runner.restore(saved)
  again = runner.accuracies(state, session)
  if any(again[k] != acc[k] for k in ACCURACY_KEYS):  # the checkpoint holds these (not acc_sessions)
    differ = ', '.join(f'{k} {again[k]} (saved {acc[k]})' for k in ACCURACY_KEYS if again[k] != acc[k])
    raise CheckpointFault(f'run {run} session {session}: the accuracies computed again from '
                          f'{ckpts.root}/run_{run}/{session} differ from those saved in it ({differ}): the '
                          f'checkpoint (or the base model) changed since it was saved; {ckpts.session_advice(run)}')
  return state, again
