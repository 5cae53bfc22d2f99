"""Orbax checkpoints under <workdir>/checkpoints/: base/<step>/ (TrainState), base_best/<step>/ (base.select_on_test),
model/0/ (phi*, BN statistics, base prototypes), run_<r>/<session>/, a joint session's training/run_<r>_session_<s>/
(and _best/) until the session is saved; digests.json: each one's digest and who saved it, written before it and
checked by every restore. Base states and sessions are written in the background; every read waits for them."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import weakref
from typing import Any, Callable, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from f2m_jax import files
from f2m_jax.files import CheckpointError, CheckpointFault
from f2m_jax.run import workdir as workdir_lib


RECORD = 'ncm_accuracy'  # what base models of earlier versions also hold (an accuracy), read and dropped
LEDGER = 'digests.json'  # {step folder relative to checkpoints/: {'sha256', 'by'}}


def digest(tree) -> str:
  """sha256 over each leaf's dtype, shape and bytes, in tree order."""
  h = hashlib.sha256()
  for x in map(np.ascontiguousarray, jax.tree_util.tree_leaves(tree)):
    h.update(f'{x.dtype.str}{x.shape}'.encode())
    h.update(x.reshape(-1).view(np.uint8))
  return h.hexdigest()


@contextlib.contextmanager
def quiet_orbax():
  """While active, orbax speaks only through exceptions: its absl log is off, and so is tensorstore's unraisable
  'Event loop is closed' of each write pending when a failed save's loop closed (a full disk: dozens)."""
  verbosity, hook = logging.get_verbosity(), sys.unraisablehook
  logging.set_verbosity(logging.FATAL)
  sys.unraisablehook = lambda unraisable: str(unraisable.exc_value) == 'Event loop is closed' or hook(unraisable)
  try:
    yield
  finally:
    logging.set_verbosity(verbosity)
    sys.unraisablehook = hook


def _cause(e: BaseException, limit: Optional[int] = None) -> str:
  """What went wrong, as one line: the OS's reason and file where an OSError is in the chain, else the
  exception's text without tensorstore's spec (at most `limit` characters)."""
  seen = e
  while seen is not None:
    if isinstance(seen, OSError) and seen.strerror:
      return f'{seen.strerror} ({seen.filename})' if seen.filename else seen.strerror
    seen = seen.__cause__ or seen.__context__
  text = ' '.join(f'{type(e).__name__}: {e}'.split())
  late = re.search(r'Barrier timed out\. Id: (\S+?)(?:::\d+)?\. .* task names:((?: [/\w:]*?\d+(?= |$))+)', text)
  if late:  # JAX's coordination service names the processes (its tasks) that did not reach an orbax barrier
    tasks = ', '.join(re.findall(r'(\d+)(?: |$)', late[2]))
    return f"process {tasks} did not reach orbax's barrier {late[1]} in time"
  text = re.sub(r" \[(tensorstore_spec|source locations)=.*$", '', text)
  return text if limit is None or len(text) <= limit else text[:limit] + ' ...'


def _write_fault(what: str, path: str, e: BaseException) -> CheckpointFault:
  blocked = files.in_the_way(path)
  return CheckpointFault(f'cannot write the {what} checkpoint {path}: ' + (
      blocked or f'{_cause(e)}; fix that, then rerun the same command: it resumes from the last complete checkpoint'))


# Every manager of this process that writes in the background, and a lock held through each save's synchronous
# part: `finish_writes` takes it, then waits for the writes in flight (a process ended at a signal, stopping.py).
_BACKGROUND = weakref.WeakSet()
_SAVING = threading.Lock()


def finish_writes(timeout_s: float = 120.0) -> None:
  """Waits for the save in progress (at most `timeout_s`) and for every background write in flight;
  keeps the saving lock, so that no save starts before the process ends."""
  _SAVING.acquire(timeout=timeout_s)  # pylint: disable=consider-using-with
  for manager in list(_BACKGROUND):
    with contextlib.suppress(Exception):  # a closed manager, or a write that failed: nothing to wait for
      manager.wait_until_finished()


def _host_copy(tree):
  """Owned host copies: a CPU array's buffer, which np.asarray can share, is donated to the next train step."""
  return jax.tree_util.tree_map(lambda x: np.array(x, copy=True), tree)


def has_base_model(workdir: str) -> bool:
  """Whether `workdir` holds a saved base model (checkpoints/model/<step>), without opening it."""
  folder = os.path.join(workdir, 'checkpoints', 'model')
  return os.path.isdir(folder) and any(n.isdigit() for n in os.listdir(folder))


class Folder:
  """The steps of one kind of checkpoint, a folder under checkpoints/ opened at its first use (`keep`: the
  steps kept, None all; `what` names step {} in messages); a joint training's `best` is beside it."""

  def __init__(self, owner: 'Checkpoints', name: str, what: str, keep: Optional[int] = None,
               background: bool = False, best: Optional['Folder'] = None):
    self.owner, self.name, self.what, self.path = owner, name, what, os.path.join(owner.root, name)
    # In the background on one process only: with several, orbax's per-save barriers of concurrent
    # managers (a member sweep saves S workdirs at once) could meet in another order on each process.
    self.background = background and not owner.read_only and jax.process_count() == 1
    self.keep, self.best, self._manager = keep, best, None

  def manager(self) -> ocp.CheckpointManager:
    if self._manager is None:
      if os.path.lexists(self.path) and not os.path.isdir(self.path):
        raise CheckpointFault(files.in_the_way(self.path, 'checkpoint folder'))
      ro = self.owner.read_only
      options = ocp.CheckpointManagerOptions(max_to_keep=None if ro else self.keep, create=not ro, read_only=ro,
                                             enable_async_checkpointing=self.background,
                                             # a folder that cannot be made fails in save() itself: made in the
                                             # background, orbax's writer threads wait 300 s for it at exit
                                             async_options=ocp.AsyncOptions(create_directories_asynchronously=False))
      try:
        self._manager = ocp.CheckpointManager(os.path.abspath(self.path), options=options,
                                              item_handlers=ocp.StandardCheckpointHandler())  # item_metadata: the tree
      except RuntimeError as e:  # its barrier of the processes timed out
        raise CheckpointFault(f'cannot open the checkpoint folder {self.path}: {_cause(e)}') from e
      if self.background:
        _BACKGROUND.add(self._manager)
    return self._manager

  def steps(self) -> list:
    self.owner.settle()
    return sorted(self.manager().all_steps())

  def latest_step(self) -> Optional[int]:
    return max(self.steps(), default=None)

  def save(self, step: int, item: Any, then: Optional[Callable[[], None]] = None) -> None:
    """Saves `item` as `step` once every earlier save is complete, its digest recorded first; `then()` once
    it is complete (in the background where this folder writes so). A CheckpointFault where it fails."""
    self.owner.settle()
    path, item = os.path.join(self.path, str(step)), _host_copy(item)
    entry = {'sha256': digest(item), 'by': self.owner.writer}
    try:
      with _SAVING:
        self.owner.record(path, entry)
        self.manager().save(step, args=ocp.args.StandardSave(item), force=True)
    except Exception as e:  # pylint: disable=broad-except  (orbax raises many types)
      raise _write_fault(self.what.format(step), path, e) from e
    self.owner.in_flight.append((self, step, then))
    if not self.background:  # written already: its `then` runs now
      self.owner.settle()

  def restore(self, template: Any, step: Optional[int] = None):
    """Step `step` (None: the latest) in the shapes of `template`: a CheckpointFault naming it and what to
    do where it cannot be read or is not what its digest says; a CheckpointError where its arrays have
    other shapes (another network or data)."""
    step = self.latest_step() if step is None else step
    path, what, owner = os.path.join(self.path, str(step)), self.what.format(step), self.owner
    owner.settle()
    try:
      out = self.manager().restore(step, args=ocp.args.StandardRestore(_host_copy(template)))
    except Exception as e:  # orbax raises many types for truncated or corrupt files
      raise CheckpointFault(f'cannot restore the {what} checkpoint {path} ({_cause(e, 300)}): it is missing, '
                            f'truncated or corrupt; {owner.advice(self, path)}') from e
    other = [f'{jax.tree_util.keystr(k)} {np.shape(o)} there, {np.shape(t)} here' for (k, o), t in
             zip(jax.tree_util.tree_flatten_with_path(out)[0], jax.tree_util.tree_leaves(template))
             if np.shape(o) != np.shape(t)]
    if other:  # orbax restores the saved shapes whatever the template's
      raise CheckpointError(f'the {what} checkpoint {path} holds arrays of other shapes than this config needs '
                            f'({"; ".join(other[:3])}): it was written for another network or data (another '
                            'number of classes?)')
    entry = owner.digests().get(os.path.relpath(path, owner.root))
    if entry is not None and digest(out) != entry['sha256']:
      raise CheckpointFault(f'the {what} checkpoint {path} is not the one saved there: the digest of its arrays '
                            f'differs from the one {owner.ledger} recorded (its files changed, or it was copied '
                            f'from another run); {owner.advice(self, path)}')
    if entry is None and not owner.unchecked:
      owner.unchecked = True
      print(f'note: {path} (and any other checkpoint in {owner.root} without a digest in {LEDGER}) was saved by '
            'an earlier version, so it cannot be checked', flush=True)
    return out

  def close(self) -> None:
    for folder in filter(None, (self, self.best)):
      with contextlib.suppress(Exception):  # not opened; or a failed save, which `settle` reports once
        folder._manager.close()  # pylint: disable=protected-access

  def remove(self) -> None:
    self.close()
    for folder in filter(None, (self, self.best)):
      shutil.rmtree(folder.path, ignore_errors=True)


class Checkpoints:
  """Everything a run saves: `base` (`keep` of them kept), `model`, `best_base`, `run(r)`, `training(r, s)`.
  `resume`: a train-mode run, which refuses sessions it computes otherwise (sessions.restore_session, which
  keeps what it finds in `differences`)."""

  def __init__(self, workdir: str, keep: int = 3, read_only: bool = False, resume: bool = False):
    self.root, self.read_only, self.resume = os.path.join(workdir, 'checkpoints'), read_only, resume
    self.ledger, self.unchecked = os.path.join(self.root, LEDGER), False  # unchecked: a line said so
    self.in_flight, self.differences, self._runs = [], [], {}  # in_flight: (folder, step, then)
    self.writer = workdir_lib.writer()  # who saves and computes now
    self.base = Folder(self, 'base', 'base train state', keep, background=True)
    self.model = Folder(self, 'model', 'base model')
    self.best_base = Folder(self, 'base_best', 'best base model', 1)  # the best on the base test images

  def digests(self) -> dict:
    return files.read_json(self.ledger) if os.path.exists(self.ledger) else {}

  def record(self, path: str, entry: dict) -> None:
    """The ledger rewritten (atomically) with `entry` for checkpoint `path`, and without those of checkpoints
    deleted (every save in flight is complete: `settle`)."""
    os.makedirs(self.root, exist_ok=True)
    kept = {k: v for k, v in self.digests().items() if os.path.isdir(os.path.join(self.root, k))}
    files.atomic_write(self.ledger, json.dumps({**kept, os.path.relpath(path, self.root): entry}, indent=1))

  def run(self, run: int) -> Folder:
    if run not in self._runs:
      self._runs[run] = Folder(self, f'run_{run}', f'run {run} session {{}}', background=True)
    return self._runs[run]

  def training(self, run: int, session: int) -> Folder:
    """A joint training's train states (the last kept) and its best model."""
    name, what = f'training/run_{run}_session_{session}', f'run {run} session {session} training'
    return Folder(self, name, what, 1, best=Folder(self, f'{name}_best', f'{what} best model', 1))

  def any_sessions(self) -> bool:
    return os.path.isdir(self.root) and any(n.startswith('run_') and os.path.isdir(os.path.join(self.root, n))
                                            and os.listdir(os.path.join(self.root, n)) for n in os.listdir(self.root))

  def settle(self) -> None:
    """Waits for the saves in flight, in order, running each one's `then`: a CheckpointFault names one that failed."""
    while self.in_flight:
      folder, step, then = self.in_flight.pop(0)
      try:
        folder.manager().wait_until_finished()
      except Exception as e:  # pylint: disable=broad-except  (orbax raises many types)
        raise _write_fault(folder.what.format(step), os.path.join(folder.path, str(step)), e) from e
      if then is not None:
        then()

  def advice(self, folder: Folder, path: str) -> str:
    """What works where a checkpoint cannot be used: deleting it and what was computed from it."""
    also = (f' and {self.root}/run_*' if folder.name == 'model' and self.any_sessions() else
            f' and the later sessions in {folder.path}' if folder.name.startswith('run_') else
            f' and {folder.path[:-len("_best")]}' if folder.name.endswith('_best') else '')
    return (f'delete it{also}, then run without --mode eval (a finished run\'s results.json moved away): the run '
            'computes them again from the checkpoints before them')

  def sessions_done(self, run: int) -> list:
    """The sessions of `run` saved; a CheckpointError where one is missing before a later one."""
    done = self.run(run).steps()
    gaps = sorted(set(range(2, max(done, default=1) + 1)) - set(done))
    if gaps:
      raise CheckpointError(f'{self.root}/run_{run}: sessions {done} are saved but {gaps} are missing; restore '
                            f'them or delete the folder run_{run} to recompute that run')
    return done

  def has_model(self) -> bool:
    return self.model.latest_step() is not None

  def restore_model(self, template) -> dict:
    """The base model ({'params', 'batch_stats', 'prototypes'}) in the shapes of `template`."""
    if not self.has_model():
      raise CheckpointError(f'no base model checkpoint in {self.model.path}')
    with contextlib.suppress(Exception):  # unreadable: the restore names it
      if RECORD in self.model.manager().item_metadata(0):
        template = {**template, RECORD: np.zeros((), np.float64)}
    model = self.model.restore(template, 0)
    model.pop(RECORD, None)
    return model

  def close(self) -> None:
    """Waits for the saves in flight (`settle`), then releases the managers."""
    try:
      self.settle()
    finally:
      for folder in [self.base, self.model, self.best_base, *self._runs.values()]:
        folder.close()
