"""The incremental sessions of any method: all runs x sessions through its Runner, each run and
session checkpointed on its own, restored where saved, and updated in groups of runs per call.
"""
from __future__ import annotations

import sys

import jax
import numpy as np
from tqdm import tqdm

from f2m_jax.checkpoint import CheckpointError, Checkpoints
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.experiment import Experiment, Hook


def parallel_runs(config) -> int:
  """How many runs one call updates in a session (incremental.parallel_runs; 0: 1 on a CPU, where
  mapping runs turns their convolutions into slower grouped ones, and all runs elsewhere)."""
  n = config.incremental.parallel_runs or (1 if jax.default_backend() == 'cpu' else config.runs)
  return max(1, min(n, config.runs))


def run_sessions(exp: Experiment, runner, ckpts: Checkpoints, log, train: bool = True,
                 hook: Hook = None) -> tuple:
  """All runs x sessions for any method (its `runner`, f2m_jax/methods), session by session, the runs
  in fixed groups of `parallel_runs` updated by one `runner.update_runs` call and evaluated by one
  `runner.accuracies_runs` call; each run and session is checkpointed on its own. A group where
  only some runs still need the session is recomputed and evaluated whole (only those are saved), so
  a resumed run computes every session in the same programs as an uninterrupted one. Returns
  per-run lists of per-session accuracy dicts and per-run prototype norms (None where the method
  has none). Sessions already checkpointed are restored; with `train=False` a missing session is
  an error (eval mode)."""
  cfg, bench = exp.config, exp.bench
  print(f'session 1: accuracy on the {len(protocol_lib.test_indices(bench, 1)):,} test images of the base classes, '
        f'then {cfg.runs} runs x {bench.num_sessions - 1} sessions', flush=True)
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
  bar = tqdm(total=cfg.runs * (bench.num_sessions - 1), desc=f'sessions ({cfg.runs} runs x {bench.num_sessions - 1})',
             unit='session', file=sys.stdout, mininterval=2.0)
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
      group_accs = runner.accuracies_runs([state for state, _ in updated], session)  # the whole group, as updated
      for run, (state, info), acc in zip(group, updated, group_accs):
        if run not in todo:
          continue  # restored above; recomputed only as part of its group
        states[run] = state
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
