"""Orbax checkpoints of a workdir: base train state, the base model, and every run's sessions.

Layout under <workdir>/checkpoints/:
  base/<step>/           TrainState (params, batch_stats, opt_state, step) every N steps + the last
  base_best/<step>/      with base.select_on_test only: the best model so far on the base test images
  model/0/               the base model phi*: params, batch_stats and the base prototypes
  run_<r>/<session>/     per run and session t >= 2: fine-tuned params, all prototypes, exemplar
                         indices and the session's accuracies

Orbax writes each step into a temporary folder and renames it when complete, so a process killed
while saving leaves the previous checkpoint as the latest one. The base train states and the
sessions, saved many times a run, are written in the background (orbax's async checkpointing: a
save returns once its arrays are copied, where a synchronous one holds an accelerator idle);
every read of those folders first waits for the writes in flight, and `close()` waits for all.
"""
from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from f2m_jax import trees
from f2m_jax import workdir as workdir_lib


# What orbax logs (as absl warnings) on every read-only manager, i.e. every --checkpoint, eval or
# flatness run: notes on options it ignores for reading, nothing a user can act on.
READ_ONLY_NOTES = ('CheckpointManagerOptions.read_only=True, setting ', 'Given directory is read only=')


class _DropReadOnlyNotes(logging.Filter):

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(READ_ONLY_NOTES)


logging.getLogger('absl').addFilter(_DropReadOnlyNotes())


class CheckpointError(RuntimeError):
  """A checkpoint is missing, or was written for another config (exit code 2)."""


class CheckpointFault(CheckpointError):
  """A checkpoint that cannot be read back (unreadable, truncated, or holding NaN or inf), or
  cannot be written (exit code 3)."""


# Leaves that may hold NaN: a session's accuracies, where NaN stands for None (f2m_jax/sessions.py).
MAY_BE_NAN = ("['accuracy']",)


def _cause(e: Exception, limit: int = 300) -> str:
  """An exception as one line of at most `limit` characters (orbax's run over many lines)."""
  text = ' '.join(f'{type(e).__name__}: {e}'.split())
  return text if len(text) <= limit else text[:limit] + ' ...'


def _writable(directory: str, what: str) -> None:
  """A CheckpointFault naming `directory` and the cause where it cannot take a checkpoint, before
  orbax tries (its writes in the background would fail late, or hang)."""
  why = workdir_lib.writable_folder(directory)
  if why:
    raise CheckpointFault(f'cannot write the {what} into {directory}: {why}')


# Every manager of this process that writes in the background, and a lock held through each save's
# synchronous part: `finish_writes` takes it, then waits for the writes in flight, so that a process
# ended at a signal (f2m_jax/stopping.py) leaves every checkpoint it wrote complete.
_BACKGROUND = weakref.WeakSet()
_SAVING = threading.Lock()


def finish_writes(timeout_s: float = 120.0) -> None:
  """Waits for the save in progress (at most `timeout_s`) and for every background write in flight;
  keeps the saving lock, so that no save starts before the process ends."""
  _SAVING.acquire(timeout=timeout_s)  # pylint: disable=consider-using-with
  for manager in list(_BACKGROUND):
    try:
      manager.wait_until_finished()
    except Exception:  # pylint: disable=broad-except  (a closed manager, or a write that failed: nothing to wait for)
      pass


def _manager(directory: str, keep: Optional[int], read_only: bool = False,
             background: bool = False) -> ocp.CheckpointManager:
  # In the background on one process only: with several, orbax's per-save barriers of concurrent
  # managers (a member sweep saves S workdirs at once) could meet in another order on each process.
  background = background and not read_only and jax.process_count() == 1
  if not read_only:
    _writable(directory, 'checkpoints')
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only, read_only=read_only,
                                         enable_async_checkpointing=background)
  manager = ocp.CheckpointManager(os.path.abspath(directory), options=options)
  if background:
    _BACKGROUND.add(manager)
  return manager


def _to_numpy(tree):
  return jax.tree_util.tree_map(np.asarray, tree)


def _host_copy(tree):
  """Owned host copies, for a save written in the background: np.asarray of a CPU array can share
  its buffer, which the next train step (donating its state) may overwrite."""
  return jax.tree_util.tree_map(lambda x: np.array(x, copy=True), tree)


def has_base_model(workdir: str) -> bool:
  """Whether `workdir` holds a saved base model (checkpoints/model/<step>), without opening it."""
  folder = os.path.join(workdir, 'checkpoints', 'model')
  return os.path.isdir(folder) and any(n.isdigit() for n in os.listdir(folder))


class Checkpoints:
  """Save and restore everything a run produces. `keep` bounds the base train states kept."""

  def __init__(self, workdir: str, keep: int = 3, read_only: bool = False):
    self.root = os.path.join(workdir, 'checkpoints')
    if read_only and not os.path.isdir(os.path.join(self.root, 'model')):
      raise CheckpointError(f'{workdir} has no base model checkpoint ({self.root}/model)')
    self._read_only = read_only
    self._base = _manager(os.path.join(self.root, 'base'), keep, read_only, background=True)
    self._model = _manager(os.path.join(self.root, 'model'), None, read_only)
    self._runs = {}

  def _run(self, run: int) -> ocp.CheckpointManager:
    if run not in self._runs:
      self._runs[run] = _manager(os.path.join(self.root, f'run_{run}'), None, self._read_only, background=True)
    return self._runs[run]

  def any_sessions(self) -> bool:
    return os.path.isdir(self.root) and any(n.startswith('run_') and os.listdir(os.path.join(self.root, n))
                                            for n in os.listdir(self.root))

  @staticmethod
  def _restore(manager: ocp.CheckpointManager, step: int, template: Any, what: str, advice: str):
    """The checkpoint `step` of `manager` in the shapes of `template`; a CheckpointFault naming it
    (with `advice`: what to do that works) where it cannot be read or holds NaN or inf, a
    CheckpointError where its arrays have other shapes (another network or data)."""
    path = os.path.join(str(manager.directory), str(step))
    manager.wait_until_finished()
    try:
      out = manager.restore(step, args=ocp.args.StandardRestore(template))
    except Exception as e:  # orbax raises many types for truncated or corrupt files
      raise CheckpointFault(f'cannot restore the {what} checkpoint {path} ({_cause(e)}): it is missing, '
                            f'truncated or corrupt; {advice}') from e
    other = [f'{jax.tree_util.keystr(k)} {np.shape(o)} there, {np.shape(t)} here' for (k, o), t in
             zip(jax.tree_util.tree_flatten_with_path(out)[0], jax.tree_util.tree_leaves(template))
             if np.shape(o) != np.shape(t)]
    if other:  # orbax restores the saved shapes whatever the template's
      raise CheckpointError(f'the {what} checkpoint {path} holds arrays of other shapes than this config needs '
                            f'({"; ".join(other[:3])}): it was written for another network or data (another '
                            'number of classes?)')
    bad = [k for k in trees.non_finite(out) if not k.startswith(MAY_BE_NAN)]
    if bad:
      raise CheckpointFault(f'the {what} checkpoint {path} holds NaN or inf (in {", ".join(bad[:3])}): it is '
                            f'corrupt; {advice}')
    return out

  @staticmethod
  def _save(manager: ocp.CheckpointManager, step: int, item: Any, what: str) -> None:
    """Saves `item` as `step`; a CheckpointFault naming the folder and the cause where it cannot."""
    _writable(str(manager.directory), f'{what} checkpoint')
    try:
      with _SAVING:
        manager.save(step, args=ocp.args.StandardSave(item), force=True)
    except Exception as e:
      raise CheckpointFault(f'cannot write the {what} checkpoint {manager.directory}/{step}: {_cause(e)}') from e

  # Base training state.
  def latest_base_step(self) -> Optional[int]:
    self._base.wait_until_finished()
    return self._base.latest_step()

  def base_steps(self) -> list:
    """The base train states' steps, in order."""
    self._base.wait_until_finished()
    return sorted(self._base.all_steps())

  def save_base_state(self, step: int, state: Any) -> None:
    self._save(self._base, step, _host_copy(state), 'base train state')

  def restore_base_state(self, template: Any, step: Optional[int] = None):
    step = self.latest_base_step() if step is None else step
    earlier = [s for s in self._base.all_steps() if s < step]
    advice = (f'delete that folder to resume from the base train state of step {max(earlier)}' if earlier else
              'delete that folder to train the base session again from step 0')
    return self._restore(self._base, step, _to_numpy(template), 'base train state', advice)

  # The best base model on the base test images (base.select_on_test).
  def _best_manager(self) -> Optional[ocp.CheckpointManager]:
    path = os.path.join(self.root, 'base_best')
    if self._read_only and not os.path.isdir(path):
      return None
    if not hasattr(self, '_best'):
      self._best = _manager(path, 1, self._read_only)
    return self._best

  def best_base_step(self) -> Optional[int]:
    manager = self._best_manager()
    return None if manager is None else manager.latest_step()

  def save_best_base(self, step: int, params, batch_stats, test_acc: float) -> None:
    item = {'params': params, 'batch_stats': batch_stats, 'test_acc': np.asarray(test_acc, np.float64)}
    self._save(self._best_manager(), step, _to_numpy(item), 'best base model')

  def restore_best_base(self, template: dict) -> dict:
    """{'params', 'batch_stats', 'test_acc'} of the best model; template: params and batch_stats."""
    template = {**template, 'test_acc': np.zeros((), np.float64)}
    manager = self._best_manager()
    return self._restore(manager, manager.latest_step(), _to_numpy(template), 'best base model',
                         'the best model so far cannot be recovered; start again with a new --workdir')

  # Base model phi* and base prototypes.
  def has_model(self) -> bool:
    return self._model.latest_step() is not None

  def save_model(self, params, batch_stats, prototypes: np.ndarray) -> None:
    item = {'params': params, 'batch_stats': batch_stats, 'prototypes': prototypes}
    self._save(self._model, 0, _to_numpy(item), 'base model')

  def restore_model(self, template) -> dict:
    if not self.has_model():
      raise CheckpointError(f'no base model checkpoint in {self._model.directory}')
    return self._restore(self._model, 0, _to_numpy(template), 'base model', self._model_advice())

  def _model_advice(self) -> str:
    """What works where the base model cannot be read: it has no earlier version; it can be computed
    again from the last base train state, if one is kept (the sessions, computed on it, go too)."""
    step = self.latest_base_step()
    if step is None:
      return 'there is no earlier base model, nor a base train state to compute it from: start again with a new --workdir'
    sessions = f' and the sessions ({self.root}/run_*)' if self.any_sessions() else ''
    return (f'there is no earlier base model; delete {self.root}/model{sessions} (and move a finished run\'s '
            'results.json away), then run without --mode eval to compute it again from the last base train state '
            f'({self.root}/base/{step})')

  # A training of its own per run and session (joint training): train states, the last kept.
  def training(self, run: int, session: int) -> '_Training':
    return _Training(self, _manager(os.path.join(self.root, 'training', f'run_{run}_session_{session}'), 1,
                                    self._read_only), f'run {run} session {session} training')

  # Incremental sessions.
  def sessions_done(self, run: int) -> list:
    self._run(run).wait_until_finished()
    return sorted(self._run(run).all_steps())

  def save_session(self, run: int, session: int, item: dict) -> None:
    self._save(self._run(run), session, _host_copy(item), f'run {run} session {session}')

  def restore_session(self, run: int, session: int, template: dict) -> dict:
    advice = (f'delete that folder and those of the later sessions of run {run} (and move a finished run\'s '
              'results.json away), then run without --mode eval to compute them again')
    return self._restore(self._run(run), session, _to_numpy(template), f'run {run} session {session}', advice)

  def close(self) -> None:
    """Waits for the saves in flight, then releases the managers."""
    for m in [self._base, self._model, *self._runs.values(), *([self._best] if hasattr(self, '_best') else [])]:
      m.close()


class _Training:
  """Train states of one per-session training: latest_step(), save(step, state), restore(template)."""

  def __init__(self, owner: Checkpoints, manager: ocp.CheckpointManager, what: str):
    self._owner, self._manager, self._what = owner, manager, what

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def save(self, step: int, state: Any) -> None:
    self._owner._save(self._manager, step, _to_numpy(state), self._what)

  def restore(self, template: Any) -> Any:
    return self._owner._restore(self._manager, self._manager.latest_step(), _to_numpy(template), self._what,
                                'delete that folder to start this training again')

  def close(self) -> None:
    self._manager.close()

  def remove(self) -> None:
    import shutil  # pylint: disable=g-import-not-at-top
    shutil.rmtree(str(self._manager.directory), ignore_errors=True)
