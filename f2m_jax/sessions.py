"""The incremental sessions of any method: every run's sessions through its runner, each run and
session checkpointed on its own and restored where saved."""
from __future__ import annotations

import numpy as np

from f2m_jax import progress
from f2m_jax import stats
from f2m_jax import trees
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.experiment import Experiment, Hook, TrainingError
from f2m_jax.files import CheckpointError, CheckpointFault



def run_sessions(exp: Experiment, runner, ckpts, log, train: bool = True,
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
    done = ckpts.sessions_done(run)
    state, exemplars, run_accs = runner.start(), np.zeros((0,), np.int64), [first]
    for session in range(2, bench.num_sessions + 1):
      shots = protocol_lib.session_shots(bench, cfg.data.protocol, run, session, cfg.data.shots, cfg.seed)
      exemplars = np.concatenate([exemplars, shots])
      if session in done:
        state, acc = restore_session(exp, runner, ckpts, run, session, exemplars)
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


def train_session(method: str, runner, ckpts, log, state, run: int, session: int,
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
  ckpts.run(run).save(session, {**runner.item(state), 'exemplars': exemplars,
                                'accuracy': np.asarray([np.nan if acc[k] is None else acc[k] for k in stats.KEYS],
                                                       np.float64)},
                       then=lambda: log.write(phase='session', run=run, session=session, **info, **acc))
  return state, acc


def restore_session(exp: Experiment, runner, ckpts, run: int, session: int,
                    exemplars: np.ndarray) -> tuple:
  """(state, accuracies) of `run` after `session`, restored (a CheckpointFault where its exemplars differ from
  the protocol's), the accuracies computed again and compared with those saved, as test images that flipped
  (base and novel ones apart). Up to k (rounding): a line. More, its digest holding, means another
  code, data or backend: a line naming who saved it and who computes, or in a resume a CheckpointError.
  Each difference goes into ckpts.differences."""
  path = f'{ckpts.root}/run_{run}/{session}'
  saved = ckpts.run(run).restore({**runner.template(session), 'exemplars': exemplars,
                                  'accuracy': np.zeros((len(stats.KEYS),), np.float64)}, session)
  if not np.array_equal(saved['exemplars'], exemplars):
    raise CheckpointFault(f'run {run} session {session}: the exemplars saved in {path} differ from the protocol\'s: '
                          'the data or the code changed since it was saved')
  state = runner.restore(saved)
  again, acc = runner.accuracies(state, session), [None if np.isnan(v) else float(v) for v in saved['accuracy']]
  acc = dict(zip(stats.KEYS, acc))
  labels = exp.bench.test.labels[protocol_lib.test_indices(exp.bench, session)]
  n, base = len(labels), int(np.sum(labels < exp.bench.num_base_classes))
  flips = sum(round(abs(again[key] - acc[key]) * c / 100) for key, c in (('acc_base', base), ('acc_novel', n - base))
              if acc[key] is not None)
  if not flips:
    return state, again
  by = (ckpts.digests().get(f'run_{run}/{session}') or {}).get('by')  # its writer
  k = max(1, -(-n // 1000))  # what rounding may flip: docs/development.md, 'When a run stops'
  ckpts.differences.append({'checkpoint': path, 'saved': acc, 'recomputed': {key: again[key] for key in acc},
                            'images': flips, 'of': n, 'saved_by': by, 'recomputed_by': ckpts.writer})
  line = (f'run {run} session {session}: the accuracies computed again from {path} differ from those it saved in '
          f'{flips} of {n} test images')
  if flips > k:
    who = lambda w: f'commit {w.get("commit")}{" (dirty)" * bool(w.get("dirty"))} on {w["backend"]} ({w["device"]})'
    line += (f', more than the {k} that rounding may flip: the code, data or backend differs from the one that '
             f'saved it (saved by {who(by) if by else "an unrecorded one"}, computed by {who(ckpts.writer)})')
    if ckpts.resume:
      raise CheckpointError(f'{line}; a resume would mix the two in one results.json: resume it with the code '
                            'and backend that saved it, or evaluate it with --mode eval, which records both')
  print(f'note: {line}' + (f', within the {k} that rounding may flip: the recomputed ones are used' if flips <= k
                           else '; the recomputed ones are used and the results record both'), flush=True)
  return state, again
