"""Orbax checkpoints under <workdir>/checkpoints/: base/<step>/ (TrainState), base_best/<step>/
(base.select_on_test), model/0/ (phi*, BN statistics, base prototypes), run_<r>/<session>/, a joint
session's training/run_<r>_session_<s>/ (and _best/) until the session is saved. digests.json, the
ledger: the config the run started with and each checkpoint's digest, writer and identity (the run's
config, its own place, the checkpoint it was computed from), written before it and checked by every
restore. Base states and sessions are written in the background; every read waits for them."""
import contextlib
import functools
import hashlib
import json
import os
import pathlib
import re
import shutil
import sys
import threading
import weakref

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from f2m_jax import files
from f2m_jax.files import CheckpointError, CheckpointFault
from f2m_jax.run import workdir as workdir_lib

# what base models of earlier versions also hold (an accuracy), read and dropped
RECORD = 'ncm_accuracy'
# a session's accuracies: stats.KEYS, and acc_sessions since identities: any length
ACCURACY = "['accuracy']"


def digest(tree):
  """sha256 over each leaf's dtype, shape and bytes, in tree order."""
  h = hashlib.sha256()
  for x in map(np.ascontiguousarray, jax.tree.leaves(tree)):
    h.update(f'{x.dtype.str}{x.shape}'.encode() + x.tobytes())
  return h.hexdigest()


@contextlib.contextmanager
def quiet_orbax():
  """While active, orbax speaks only through exceptions: its absl log is off, and so is
  tensorstore's unraisable 'Event loop is closed' of each write pending when a failed save's loop
  closed (a full disk: dozens)."""
  verbosity, hook = logging.get_verbosity(), sys.unraisablehook
  logging.set_verbosity(logging.FATAL)
  sys.unraisablehook = lambda u: str(u.exc_value) == 'Event loop is closed' or hook(u)
  try:
    yield
  finally:
    logging.set_verbosity(verbosity)
    sys.unraisablehook = hook


def _cause(e, limit=None):
  """What went wrong, as one line: the OS's reason and file where an OSError is in the chain, else
  the exception's text without tensorstore's spec (at most `limit` characters)."""
  seen = e
  while seen:
    if isinstance(seen, OSError) and seen.strerror:
      return f'{seen.strerror} ({seen.filename})' if seen.filename else seen.strerror
    seen = seen.__cause__ or seen.__context__
  text = ' '.join(f'{type(e).__name__}: {e}'.split())
  late = re.search(r'Barrier timed out\. Id: (\S+?)(?:::\d+)?\. .* '
                   r'task names:((?: [/\w:]*?\d+(?= |$))+)', text)
  # JAX's coordination service names the processes (its tasks) that did not reach an orbax barrier
  if late:
    tasks = ', '.join(re.findall(r'(\d+)(?: |$)', late[2]))
    return f"process {tasks} did not reach orbax's barrier {late[1]} in time"
  text = re.sub(r" \[(tensorstore_spec|source locations)=.*$", '', text)
  return text if limit is None or len(text) <= limit else text[:limit] + ' ...'


def _write_fault(folder, step, e):
  path = f'{folder.path}/{step}'
  fix = (f'{_cause(e)}; fix that, then rerun the same command: it resumes from the last complete '
         'checkpoint')
  return CheckpointFault(f'cannot write the {folder.what.format(step)} checkpoint {path}: '
                         f'{files.in_the_way(path) or fix}')


# Every manager of this process that writes in the background, and a lock held through each save's
# synchronous part: `finish_writes` takes it, then waits for the writes in flight (a process ended
# at a signal, stopping.py).
_BACKGROUND = weakref.WeakSet()
_SAVING = threading.Lock()


def finish_writes():
  """Waits for the save in progress (at most 120 s) and for every background write in flight; keeps
  the saving lock, so that no save starts before the process ends."""
  _SAVING.acquire(timeout=120)  # pylint: disable=consider-using-with
  for manager in list(_BACKGROUND):
    # a closed manager, or a write that failed: nothing to wait for
    with contextlib.suppress(Exception):
      manager.wait_until_finished()


def _host_copy(tree):
  """Owned host copies: a CPU array's buffer, which np.asarray can share, is donated to the next
  train step."""
  return jax.tree.map(np.array, tree)  # np.array copies


def has_base_model(workdir):
  """Whether `workdir` holds a saved base model (checkpoints/model/<step>), without opening it."""
  return any(p.name.isdigit() for p in pathlib.Path(workdir).glob('checkpoints/model/*'))


class Folder:
  """The steps of one kind of checkpoint, a folder under checkpoints/ opened at its first use
  (`keep`: the steps kept, None all; `what` names step {} in messages); a joint training's `best` is
  beside it. Its `kind`: base (base_best too), model, run or training/run."""

  def __init__(self, owner, name, what, keep=None, background=False, best=None):
    self.owner, self.name, self.what, self.path = owner, name, what, f'{owner.root}/{name}'
    self.kind, self.keep, self.best = name.split('_')[0], keep, best
    # In the background on one process only: with several, orbax's per-save barriers of concurrent
    # managers (a member sweep saves S workdirs at once) could meet in another order on each
    # process.
    self.background = background and not owner.read_only and jax.process_count() == 1

  @functools.cached_property
  def manager(self):
    """Its orbax CheckpointManager, opened at the first use."""
    blocked = files.in_the_way(self.path, 'checkpoint folder')  # a file here, or above
    if blocked:
      raise CheckpointFault(blocked)
    ro = self.owner.read_only
    try:
      manager = ocp.CheckpointManager(  # its handler: item_metadata gives the tree
          os.path.abspath(self.path), item_handlers=ocp.StandardCheckpointHandler(),
          options=ocp.CheckpointManagerOptions(
              max_to_keep=None if ro else self.keep, create=not ro, read_only=ro,
              enable_async_checkpointing=self.background,
              # a folder that cannot be made fails in save() itself: made in the background,
              # orbax's writer threads wait 300 s for it at exit
              async_options=ocp.AsyncOptions(create_directories_asynchronously=False)))
    except RuntimeError as e:  # its barrier of the processes timed out
      raise CheckpointFault(f'cannot open the checkpoint folder {self.path}: {_cause(e)}') from e
    if self.background:
      _BACKGROUND.add(manager)
    return manager

  def steps(self):
    self.owner.settle()
    return sorted(self.manager.all_steps())

  def latest_step(self):
    return max(self.steps(), default=None)

  def save(self, step, item, then=lambda: None):
    """Saves `item` as `step` once every earlier save is complete, its ledger entry written first;
    `then()` once it is complete (in the background where this folder writes so). A CheckpointFault
    where it fails."""
    owner = self.owner
    owner.settle()
    item = _host_copy(item)
    try:
      with _SAVING:
        owner.record(self.kind, f'{self.name}/{step}', digest(item))
        self.manager.save(step, args=ocp.args.StandardSave(item), force=True)
    except Exception as e:  # pylint: disable=broad-except  (orbax raises many types)
      raise _write_fault(self, step, e) from e
    owner.in_flight.append((self, step, then))
    if not self.background:  # written already: its `then` runs now
      owner.settle()

  def restore(self, template, step=None):
    """Step `step` (None: the latest) in the shapes of `template`: a CheckpointFault naming it and
    what to do where it is another run's (`Checkpoints.entry`), cannot be read or is not what its
    digest says; a CheckpointError where its arrays have other shapes (another network or data)."""
    step = self.latest_step() if step is None else step
    rel, owner = f'{self.name}/{step}', self.owner
    this = f'the {self.what.format(step)} checkpoint {owner.root}/{rel}'
    owner.settle()
    entry = owner.entry(self, rel)
    try:
      out = self.manager.restore(step, args=ocp.args.StandardRestore(_host_copy(template)))
    except Exception as e:  # orbax raises many types for truncated or corrupt files
      raise CheckpointFault(f'cannot restore {this} ({_cause(e, 300)}): it is missing, truncated '
                            f'or corrupt; {owner.advice(self)}') from e
    other = [f'{jax.tree_util.keystr(k)} {np.shape(o)} there, {np.shape(t)} here' for (k, o), t in
             zip(jax.tree.leaves_with_path(out), jax.tree.leaves(template))
             if np.shape(o) != np.shape(t) and jax.tree_util.keystr(k) != ACCURACY]
    if other:  # orbax restores the saved shapes whatever the template's
      raise CheckpointError(f'{this} holds arrays of other shapes than this config needs '
                            f'({"; ".join(other[:3])}): it was written for another network or '
                            'data (another number of classes?)')
    sha = digest(out)
    if entry and sha != entry['sha256']:
      raise CheckpointFault(f'{this} is not the one saved there: the digest of its arrays differs '
                            f'from the one {owner.ledger} recorded (its files changed, or it was '
                            f'copied from another run); {owner.advice(self)}')
    owner.made[self.kind] = [rel, sha[:16]]
    return out

  def close(self, remove=False):
    """Releases its managers (and its `best`'s); `remove`: and deletes their folders."""
    # not opened (not in its vars); or a failed save, which `settle` reports once
    with contextlib.suppress(Exception):
      vars(self)['manager'].close()
    if remove:
      shutil.rmtree(self.path, ignore_errors=True)
    if self.best:
      self.best.close(remove)


class Checkpoints:
  """Everything a run saves: `base` (the last 3 kept), `model`, `best_base`, `run(r)`,
  `training(r, s)`; `source`: --checkpoint's, whose base model the sessions are computed from. A
  config.json that differs from the config the ledger recorded is refused (a WorkdirError): it was
  edited after checkpoints were saved. `made`: [place, digest] of the last base state and base model
  saved or restored; `differences`: the restored sessions' accuracies computed otherwise
  (sessions.py); `in_flight`: (folder, step, then)."""

  def __init__(self, workdir, read_only=False, source=None):
    self.root, self.read_only, self.source = f'{workdir}/checkpoints', read_only, source
    # its ledger: {'config': config.json's items, 'checkpoints': {step folder under checkpoints/:
    # entry}}; unchecked: a line said so
    self.ledger, self.unchecked = f'{self.root}/digests.json', False
    self.in_flight, self.differences, self._runs, self.made = [], [], {}, {}
    path = f'{workdir}/config.json'
    saved = files.read_json(path) if os.path.exists(path) else {}
    self.config, self.keeps_ledger = workdir_lib.saved_items(saved, {}), 'ledger' in saved
    was = self.read()['config']
    diff = was is not None and workdir_lib.differing(was, self.config)
    if diff:
      raise files.WorkdirError(
          f'{path} differs from the config its checkpoints were saved with, which {self.ledger} '
          f'keeps ({workdir_lib.difference_details(diff, was, self.config, path)}): restore it, or '
          f'start a new run from it with --config {path} --workdir NEW; nothing was trained')
    self.base = Folder(self, 'base', 'base train state', 3, background=True)
    self.model = Folder(self, 'model', 'base model')
    # the best on the base test images
    self.best_base = Folder(self, 'base_best', 'best base model', 1)

  @functools.cached_property
  def writer(self):
    return workdir_lib.writer()  # who saves and computes now

  def read(self):
    """The ledger: {'config': the run's (None: an earlier version's ledger, its entries alone),
    'checkpoints'}; a CheckpointFault naming it where it is not one a run writes."""
    doc = files.read_json(self.ledger, CheckpointFault) if os.path.exists(self.ledger) else {}
    if not isinstance(doc, dict) or 'checkpoints' not in doc:  # not a dict: refused below
      doc = {'config': None, 'checkpoints': doc}
    # one a run writes: a config and entries, each a digest and an identity (or none)
    entries = doc['checkpoints']
    if not (isinstance(entries, dict) and isinstance(doc.get('config') or {}, dict) and all(
        isinstance(e, dict) and isinstance(e.get('sha256'), str)
        and isinstance(e.get('config', {}), dict) for e in entries.values())):
      raise CheckpointFault(f'{self.ledger} is not a ledger of checkpoints as a run writes it (its '
                            f'digests and identities): restore it, or move {self.root} away to '
                            'train anew')
    return doc

  def lineage(self, kind):
    """[place, digest] of the checkpoint one of `kind` is computed from, saved or restored by this
    run."""
    parent = {'model': 'base', 'run': 'model'}.get(kind)  # the kind it is computed from
    return (self.source if parent == 'model' and self.source else self).made.get(parent)

  def record(self, kind, rel, sha):
    """The ledger rewritten (atomically) with the entry of checkpoint `rel` (under checkpoints/) of
    `kind` (its digest `sha`, who writes it, its identity), and without those of checkpoints deleted
    (every save in flight is complete)."""
    os.makedirs(self.root, exist_ok=True)
    kept = {k: v for k, v in self.read()['checkpoints'].items()
            if os.path.isdir(f'{self.root}/{k}')}
    kept[rel] = {'sha256': sha, 'by': self.writer, 'config': self.config, 'as': rel,
                 'from': self.lineage(kind)}
    files.atomic_write(self.ledger, json.dumps({'config': self.config, 'checkpoints': kept}))
    self.made[kind] = [rel, sha[:16]]

  def entry(self, folder, rel):
    """The ledger's entry of checkpoint `rel` (under checkpoints/), once its identity (the run's
    config, its place, the checkpoint it was computed from) is checked against this run's: a
    CheckpointFault where it differs, or where it has none in a workdir whose config.json says the
    ledger keeps every one; an earlier version's (or none, {}): a line."""
    path, entries = f'{self.root}/{rel}', self.read()['checkpoints']
    entry = entries.get(rel, {})
    if 'as' not in entry:
      if self.keeps_ledger:
        gone = '' if os.path.exists(self.ledger) else ' (which is missing)'
        raise CheckpointFault(f'{path} has no entry in {self.ledger}{gone}: it was not saved by '
                              'this run (copied in?), or its entry was removed; '
                              f'{self.advice(folder)}')
      if not self.unchecked:
        self.unchecked = True
        print(f'note: {path} (and any other checkpoint in {self.root} without an identity in '
              f"{self.ledger}) was saved by an earlier version, so it cannot be checked as this "
              "run's", flush=True)
      return entry
    parent = entry.get('from')
    was = {**entry['config'], 'saved as': entry['as'], 'computed from': parent}
    # a base state still here (a session's base model: this run's below)
    if parent and parent[0] in entries:
      parent = [parent[0], entries[parent[0]]['sha256'][:16]]
    now = {**self.config, 'saved as': rel, 'computed from': self.lineage(folder.kind) or parent}
    diff = workdir_lib.differing(was, now)
    if diff:
      what = (f'{k}={was.get(k, workdir_lib.ABSENT)!r} there, '
              f'{now.get(k, workdir_lib.ABSENT)!r} here' for k in diff[:3])
      raise CheckpointFault(f'{path} was saved by another run: {"; ".join(what)}; '
                            f'{self.advice(folder)}')
    return entry

  def run(self, run):
    return self._runs.setdefault(
        run, Folder(self, f'run_{run}', f'run {run} session {{}}', background=True))

  def training(self, run, session):
    """A joint training's train states (the last kept) and its best model."""
    name, what = f'training/run_{run}_session_{session}', f'run {run} session {session} training'
    return Folder(self, name, what, 1, best=Folder(self, f'{name}_best', f'{what} best model', 1))

  def any_sessions(self):
    return any(pathlib.Path(self.root).glob('run_*/*'))

  def settle(self):
    """Waits for the saves in flight, in order, running each one's `then`: a CheckpointFault names
    one that failed."""
    while self.in_flight:
      folder, step, then = self.in_flight.pop(0)
      try:
        folder.manager.wait_until_finished()
      except Exception as e:  # pylint: disable=broad-except  (orbax raises many types)
        raise _write_fault(folder, step, e) from e
      then()

  def advice(self, folder):
    """What works where a checkpoint cannot be used: deleting it and what was computed from it."""
    also = ''
    if folder.name == 'model' and self.any_sessions():
      also = f' and {self.root}/run_*'
    elif folder.kind == 'run':
      also = f' and the later sessions in {folder.path}'
    elif folder.name.endswith('_best'):
      also = f' and {folder.path.removesuffix("_best")}'
    return (f'delete it{also}, then run without --mode eval (a finished run\'s results.json moved '
            'away): the run computes them again from the checkpoints before them')

  def sessions_done(self, run):
    """The sessions of `run` saved; a CheckpointError where one is missing before a later one."""
    done = self.run(run).steps()
    gaps = [s for s in range(2, max(done, default=1)) if s not in done]
    if gaps:
      raise CheckpointError(f'{self.root}/run_{run}: sessions {done} are saved but {gaps} are '
                            f'missing; restore them or delete the folder run_{run} to recompute '
                            'that run')
    return done

  def has_model(self):
    return self.model.latest_step() is not None

  def restore_model(self, template):
    """The base model ({'params', 'batch_stats', 'prototypes'}) in the shapes of `template`."""
    if not self.has_model():
      raise CheckpointError(f'no base model checkpoint in {self.model.path}')
    with contextlib.suppress(Exception):  # unreadable: the restore names it
      if RECORD in self.model.manager.item_metadata(0):
        template = {**template, RECORD: np.zeros((), np.float64)}
    model = self.model.restore(template, 0)
    model.pop(RECORD, None)
    return model

  def close(self):
    """Waits for the saves in flight (`settle`), then releases the managers (and the source's)."""
    try:
      self.settle()
    finally:
      for each in filter(None, [self.base, self.model, self.best_base, *self._runs.values(),
                                self.source]):
        each.close()
