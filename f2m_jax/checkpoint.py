"""Orbax checkpoints of a workdir under <workdir>/checkpoints/: base/<step>/ (TrainState), base_best/<step>/
(base.select_on_test), model/0/ (phi*, BN statistics, base prototypes), run_<r>/<session>/, and a joint
session's training/run_<r>_session_<s>/<step>/ (and run_<r>_session_<s>_best/, base.select_on_test) until
the session is saved. The base states and sessions are written in the background; every read waits for the
writes in flight, `close()` for all."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import weakref
from typing import Any, Callable, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from f2m_jax import trees
from f2m_jax import workdir as workdir_lib


class CheckpointError(RuntimeError):
  """A checkpoint is missing, or was written for another config (exit code 2)."""


class CheckpointFault(CheckpointError):
  """A checkpoint that cannot be read back (unreadable, truncated, or holding NaN or inf), or
  cannot be written (exit code 3)."""


# Leaves that may hold NaN: a session's accuracies, where NaN stands for None (f2m_jax/sessions.py).
MAY_BE_NAN = ("['accuracy']",)
# The base model's record: its NCM accuracy on session 1's test images with its own prototypes, what
# a restore computes again and compares (methods/common.py).
RECORD = 'ncm_accuracy'


@contextlib.contextmanager
def quiet_orbax():
  """While active, orbax speaks only through the exceptions Checkpoints turns into one line: its absl
  log and tensorstore's unraisable 'Event loop is closed' are off."""
  verbosity, hook = logging.get_verbosity(), sys.unraisablehook

  def drop_closed_loop(unraisable):
    if not (isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == 'Event loop is closed'):
      hook(unraisable)

  logging.set_verbosity(logging.FATAL)
  sys.unraisablehook = drop_closed_loop
  try:
    yield
  finally:
    logging.set_verbosity(verbosity)
    sys.unraisablehook = hook


def _cause(e: BaseException, limit: Optional[int] = None) -> str:
  """What went wrong, as one line: the OS's reason and its file where an OSError is in the chain or
  tensorstore reports the OS's error code, else the exception's text (at most `limit` characters)."""
  seen = e
  while seen is not None:
    if isinstance(seen, OSError) and seen.strerror:
      return f'{seen.strerror} ({seen.filename})' if seen.filename else seen.strerror
    seen = seen.__cause__ or seen.__context__
  text = ' '.join(f'{type(e).__name__}: {e}'.split())
  failed = re.search(r'"([^"]+)": [^"]*\[os_error_code=\'(\d+)\'\]', text)  # tensorstore's: the file, the OS's errno
  if failed:
    return f'{os.strerror(int(failed[2]))} ({failed[1]})'
  late = re.search(r'Barrier timed out\. Id: (\S+?)(?:::\d+)?\. .* task names:((?: [/\w:]*?\d+(?= |$))+)', text)
  if late:  # JAX's coordination service names the processes (its tasks) that did not reach an orbax barrier
    tasks = re.findall(r'(\d+)(?: |$)', late[2])
    return f"process {', '.join(tasks)} did not reach orbax's barrier {late[1]} in time"
  text = re.sub(r" \[(tensorstore_spec|source locations)=.*$", '', text)
  return text if limit is None or len(text) <= limit else text[:limit] + ' ...'


def _write_fault(what: str, path: str, e: BaseException) -> CheckpointFault:
  """The one line of a checkpoint that could not be written, and what to do."""
  blocker = workdir_lib.file_in_the_way(path)
  if blocker:
    return CheckpointFault(f'cannot write the {what} checkpoint {path}: {workdir_lib.in_the_way(blocker)}')
  return CheckpointFault(f'cannot write the {what} checkpoint {path}: {_cause(e)}; fix that, then rerun the same '
                         'command: it resumes from the last complete checkpoint')


def _check_folder(directory: str) -> None:
  """A CheckpointFault where a file stands in place of the checkpoint folder `directory`."""
  if os.path.lexists(directory) and not os.path.isdir(directory):
    raise CheckpointFault(workdir_lib.in_the_way(directory, 'checkpoint folder'))


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
  _check_folder(directory)
  options = ocp.CheckpointManagerOptions(max_to_keep=None if read_only else keep, create=not read_only,
                                         read_only=read_only, enable_async_checkpointing=background,
                                         # a folder that cannot be made fails in save() itself: made in the
                                         # background, orbax's writer threads wait 300 s for it at exit
                                         async_options=ocp.AsyncOptions(create_directories_asynchronously=False))
  try:
    manager = ocp.CheckpointManager(os.path.abspath(directory), options=options,
                                    item_handlers=ocp.StandardCheckpointHandler())  # so item_metadata reads the tree
  except RuntimeError as e:  # its barrier of the processes timed out
    raise CheckpointFault(f'cannot open the checkpoint folder {directory}: {_cause(e)}') from e
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
    for name in os.listdir(self.root) if os.path.isdir(self.root) else ():  # every kind is a folder
      if name != 'config.json' and not name.startswith('.'):  # (another process's temporary or probe file)
        _check_folder(os.path.join(self.root, name))
    self._read_only = read_only
    self._in_flight = []  # (manager, step, what, then) of the saves not yet known to be complete
    self._base = _manager(os.path.join(self.root, 'base'), keep, read_only, background=True)
    self._model = _manager(os.path.join(self.root, 'model'), None, read_only)
    # The best base model on the base test images (base.select_on_test).
    self.best_base = _Best(self, os.path.join(self.root, 'base_best'), 'best base model', read_only)
    self._runs = {}

  def _run(self, run: int) -> ocp.CheckpointManager:
    if run not in self._runs:
      self._runs[run] = _manager(os.path.join(self.root, f'run_{run}'), None, self._read_only, background=True)
    return self._runs[run]

  def any_sessions(self) -> bool:
    return os.path.isdir(self.root) and any(n.startswith('run_') and os.listdir(os.path.join(self.root, n))
                                            for n in os.listdir(self.root))

  def _settle(self, manager: Optional[ocp.CheckpointManager] = None) -> None:
    """Waits for the saves in flight (of `manager` only, where given): a CheckpointFault naming the
    first that failed, whichever later call of orbax's raised it; each complete save's `then` runs."""
    for entry in [e for e in self._in_flight if manager is None or e[0] is manager]:
      self._in_flight.remove(entry)
      saved_by, step, what, then = entry
      try:
        saved_by.wait_until_finished()
      except Exception as e:  # pylint: disable=broad-except  (orbax raises many types)
        raise _write_fault(what, os.path.join(str(saved_by.directory), str(step)), e) from e
      if then is not None:
        then()

  def _restore(self, manager: ocp.CheckpointManager, step: int, template: Any, what: str, advice: str):
    """The checkpoint `step` of `manager` in the shapes of `template`; a CheckpointFault naming it
    (with `advice`: what to do that works) where it cannot be read or holds NaN or inf, a
    CheckpointError where its arrays have other shapes (another network or data)."""
    path = os.path.join(str(manager.directory), str(step))
    self._settle(manager)
    try:
      out = manager.restore(step, args=ocp.args.StandardRestore(template))
    except Exception as e:  # orbax raises many types for truncated or corrupt files
      raise CheckpointFault(f'cannot restore the {what} checkpoint {path} ({_cause(e, 300)}): it is missing, '
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

  def _save(self, manager: ocp.CheckpointManager, step: int, item: Any, what: str,
            then: Optional[Callable[[], None]] = None) -> None:
    """Saves `item` as `step` (in the background where `manager` writes so), then `then()` once it
    is complete: a CheckpointFault naming that checkpoint where it cannot be written."""
    self._settle(manager)
    try:
      with _SAVING:
        manager.save(step, args=ocp.args.StandardSave(item), force=True)
    except Exception as e:  # pylint: disable=broad-except  (orbax raises many types)
      raise _write_fault(what, os.path.join(str(manager.directory), str(step)), e) from e
    self._in_flight.append((manager, step, what, then))
    if manager not in (self._base, *self._runs.values()):  # written already: its `then` runs now
      self._settle(manager)

  # Base training state.
  def latest_base_step(self) -> Optional[int]:
    self._settle(self._base)
    return self._base.latest_step()

  def base_steps(self) -> list:
    """The base train states' steps, in order."""
    self._settle(self._base)
    return sorted(self._base.all_steps())

  def save_base_state(self, step: int, state: Any) -> None:
    self._save(self._base, step, _host_copy(state), 'base train state')

  def restore_base_state(self, template: Any, step: Optional[int] = None):
    step = self.latest_base_step() if step is None else step
    earlier = [s for s in self._base.all_steps() if s < step]
    advice = (f'delete that folder to resume from the base train state of step {max(earlier)}' if earlier else
              'delete that folder to train the base session again from step 0')
    return self._restore(self._base, step, _to_numpy(template), 'base train state', advice)

  # Base model phi* and base prototypes, with its record (`RECORD`, methods/common.py).
  def has_model(self) -> bool:
    return self._model.latest_step() is not None

  def save_model(self, params, batch_stats, prototypes: np.ndarray, record: Optional[float] = None) -> None:
    """The base model; `record`: the accuracy a restore checks it against (methods/common.py)."""
    self._settle()  # every base train state first: the base model marks base training as done
    item = {'params': params, 'batch_stats': batch_stats, 'prototypes': prototypes,
            **({} if record is None else {RECORD: np.asarray(record, np.float64)})}
    self._save(self._model, 0, _to_numpy(item), 'base model')

  def restore_model(self, template, with_record: bool = False):
    """{'params', 'batch_stats', 'prototypes'} of the base model in the shapes of `template`; with
    `with_record`, (that, its record or None: models saved before records were kept hold none)."""
    if not self.has_model():
      raise CheckpointError(f'no base model checkpoint in {self._model.directory}')
    try:
      recorded = RECORD in self._model.item_metadata(0)
    except Exception:  # pylint: disable=broad-except  (unreadable: the restore below names it)
      recorded = True
    template = {**template, **({RECORD: np.zeros((), np.float64)} if recorded else {})}
    model = self._restore(self._model, 0, _to_numpy(template), 'base model', self.model_advice())
    record = model.pop(RECORD, None)
    return (model, None if record is None else float(record)) if with_record else model

  def model_advice(self) -> str:
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
    self._settle(self._run(run))
    return sorted(self._run(run).all_steps())

  def save_session(self, run: int, session: int, item: dict, then: Optional[Callable[[], None]] = None) -> None:
    """Saves a session (in the background); `then()` (its metrics line) once the save is complete."""
    self._settle()  # the sessions before it first (another run's last one), so their `then`s keep their order
    self._save(self._run(run), session, _host_copy(item), f'run {run} session {session}', then)

  def restore_session(self, run: int, session: int, template: dict) -> dict:
    return self._restore(self._run(run), session, _to_numpy(template), f'run {run} session {session}',
                         self.session_advice(run))

  @staticmethod
  def session_advice(run: int) -> str:
    return (f'delete that folder and those of the later sessions of run {run} (and move a finished run\'s '
            'results.json away), then run without --mode eval to compute them again')

  def close(self) -> None:
    """Waits for the saves in flight (a CheckpointFault naming one that failed), then releases the
    managers."""
    try:
      self._settle()
    finally:
      for m in [self._base, self._model, *self._runs.values()]:
        with contextlib.suppress(Exception):  # a failed save is reported by _settle, once
          m.close()
      self.best_base.close()


class _Best:
  """The best model so far of a selection on test images, in its own folder (one step kept): step(),
  save(step, params, batch_stats, test_acc), restore(template) -> {'params', 'batch_stats', 'test_acc'}."""

  def __init__(self, owner: Checkpoints, path: str, what: str, read_only: bool = False):
    self._owner, self.path, self._what, self._read_only = owner, path, what, read_only
    self._opened = None  # the folder is made at the first use (a run without the selection has none)

  def _manager(self) -> Optional[ocp.CheckpointManager]:
    if self._opened is None and not (self._read_only and not os.path.isdir(self.path)):
      self._opened = _manager(self.path, 1, self._read_only)
    return self._opened

  def step(self) -> Optional[int]:
    manager = self._manager()
    return None if manager is None else manager.latest_step()

  def save(self, step: int, params, batch_stats, test_acc: float) -> None:
    item = {'params': params, 'batch_stats': batch_stats, 'test_acc': np.asarray(test_acc, np.float64)}
    self._owner._save(self._manager(), step, _to_numpy(item), self._what)

  def restore(self, template: dict) -> dict:
    template = {**template, 'test_acc': np.zeros((), np.float64)}
    return self._owner._restore(self._manager(), self.step(), _to_numpy(template), self._what,
                                'the best model so far cannot be recovered; start again with a new --workdir')

  def close(self) -> None:
    if self._opened is not None:
      with contextlib.suppress(Exception):  # a failed save is reported by the owner's _settle, once
        self._opened.close()


class _Training:
  """Train states of one per-session training: latest_step(), save(step, state), restore(template);
  `best`: the best model so far of its selection on test images (base.select_on_test), beside them."""

  def __init__(self, owner: Checkpoints, manager: ocp.CheckpointManager, what: str):
    self._owner, self._manager, self._what = owner, manager, what
    self.best = _Best(owner, f'{manager.directory}_best', f'{what} best model', owner._read_only)

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def save(self, step: int, state: Any) -> None:
    self._owner._save(self._manager, step, _to_numpy(state), self._what)

  def restore(self, template: Any) -> Any:
    return self._owner._restore(self._manager, self._manager.latest_step(), _to_numpy(template), self._what,
                                'delete that folder to start this training again')

  def close(self) -> None:
    self._manager.close()
    self.best.close()

  def remove(self) -> None:
    import shutil  # pylint: disable=g-import-not-at-top
    for path in (str(self._manager.directory), self.best.path):
      shutil.rmtree(path, ignore_errors=True)
