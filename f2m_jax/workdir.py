"""The workdir: config.json, the JSON-lines metrics log and the results files. Nothing a user
produced is overwritten: a workdir started with another result-relevant config is refused."""
from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import os
import tempfile
import time
from typing import Iterable, Optional

import jax
from flax import traverse_util

from configs import common as config_defaults
from f2m_jax.data import download

# Fields that never change what a run computes, or only how it is rounded (paths, logging, how the
# programs are laid out, batching and caching of evaluation, other modes' settings): a workdir may be
# resumed or evaluated with different values of these. A name ending in '.' covers every field below it.
NON_RESULT_FIELDS = ('data.data_dir', 'data.tfds_data_dir', 'data.cache_dir', 'base.log_every',
                     'base.checkpoint_every', 'base.steps_per_call', 'noise.draw_map', 'model.conv_backward',
                     'members.map', 'eval.batch_size', 'eval.cache_trunk', 'distributed', 'tensorboard',
                     'compilation_cache', 'memory_check', 'bench.', 'flatness.')

# How a saved config.json is read (docs/development.md, "Adding a config field"): one of CONFIG_FORMAT
# takes the defaults of the fields it lacks; one of another format (0: it records none) is read as it
# stands. Bump it where a field's default stops computing what the code computed before.
CONFIG_FORMAT = 1
SOURCE_KEY = 'base_source'  # config.json's record of --checkpoint's base model
FORMAT_KEY, GIT_KEY = 'config_format', 'git'  # and of how it was written
RECORD_KEYS = (SOURCE_KEY, FORMAT_KEY, GIT_KEY)  # not config fields
ABSENT = '<absent>'


class WorkdirError(RuntimeError):
  """The workdir belongs to another config or holds something we must not overwrite."""


def flat_items(d: dict, prefix: str = '') -> dict:
  out = {}
  for k, v in d.items():
    key = f'{prefix}{k}'
    if isinstance(v, dict):
      out.update(flat_items(v, key + '.'))
    else:
      out[key] = list(v) if isinstance(v, tuple) else v
  return out


def default_items(folder: bool) -> dict:
  """Every field's default (configs/common.py) as flat items, the folder source's section with `folder`."""
  config = config_defaults.base_config()
  if folder:
    config.data.folder = config_defaults.folder_section()
  return flat_items(config.to_dict())


def saved_items(saved: dict, defaults: dict) -> dict:
  """The fields of a saved config (config.json's contents), as flat items; where it is of
  CONFIG_FORMAT, `defaults` ({field: value}) fills the fields it lacks."""
  items = flat_items({k: v for k, v in saved.items() if k not in RECORD_KEYS})
  return {**defaults, **items} if saved.get(FORMAT_KEY, 0) == CONFIG_FORMAT else items


def config_differences(saved: dict, current: dict, defaults: Optional[dict] = None,
                       ignore: Iterable[str] = NON_RESULT_FIELDS, method_sections: Optional[dict] = None) -> list:
  """Dotted names of the result-relevant fields where a saved config and `current` differ. A field the
  saved one lacks takes its value in `defaults`; `ignore`'s fields and the sections of a method neither
  config runs (`method_sections`) are not compared."""
  b = flat_items(current)
  fill = default_items(any(k.startswith('data.folder.') for k in b)) if defaults is None else defaults
  a = saved_items(saved, {k: v for k, v in fill.items() if k in b})
  methods = {a.get('method'), b.get('method')}
  ignore = tuple(ignore) + tuple(f'{s}.' for s, m in (method_sections or {}).items() if m not in methods)
  ignored = lambda k: any(k == i or (i.endswith('.') and k.startswith(i)) for i in ignore)  # 'x.': all of x
  return sorted(k for k in set(a) | set(b) if not ignored(k) and a.get(k, ABSENT) != b.get(k, ABSENT))


def difference_details(fields: list, saved: dict, current: dict, path: str) -> str:
  """'field: saved A, now B; ...' for `fields`, and where one of them is absent on a side, which commit
  reads `saved` (config.json in `path`)."""
  a, b = flat_items({k: v for k, v in saved.items() if k not in RECORD_KEYS}), flat_items(current)
  text = '; '.join(f'{k}: saved {a.get(k, ABSENT)!r}, now {b.get(k, ABSENT)!r}' for k in fields)
  if all(k in a and k in b for k in fields):
    return text
  commit = (saved.get(GIT_KEY) or {}).get('commit') or results_commit(os.path.dirname(path))
  return (f'{text}; a field absent on one side is read only by the commit that wrote {path}: '
          + (f'{commit}, check it out to resume or evaluate this workdir' if commit else
             'it names none (config format 0); check that commit out to resume or evaluate this workdir'))


def results_commit(folder: str) -> Optional[str]:
  """The commit folder/results.json was computed by, where it says."""
  path = os.path.join(folder, 'results.json')
  results = read_json(path) if os.path.exists(path) else {}
  return ((results.get('provenance') or {}).get('git') or {}).get('commit')


# Where a workdir's config is recorded: config.json, and a copy that travels with the checkpoints
# (a resume or an evaluation is compared with each that exists, whatever happened to the other).
RECORDS = ('config.json', os.path.join('checkpoints', 'config.json'))


def read_json(path: str):
  """The JSON document in `path`; a WorkdirError naming the file where it is not valid JSON."""
  with open(path) as f:
    text = f.read()
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise WorkdirError(f'{path} is not valid JSON ({e}); repair it or move it away') from e


def recorded_config(path: str, method_sections: Optional[dict] = None) -> dict:
  """The config recorded in `path` (a workdir's config.json), read as a resume reads it; a WorkdirError
  naming the field and the commit that reads it where it lacks or holds a field this code cannot read."""
  saved = read_json(path)
  items = saved_items(saved, {})
  fill = default_items(any(k.startswith('data.folder.') for k in items))
  config = {**fill, **{k: v for k, v in items.items() if k in fill or k.startswith('data.')}}  # data.x: a dataset's own
  diff = config_differences(saved, config, fill, method_sections=method_sections)
  if diff:
    raise WorkdirError(f'{path} cannot be read as this code reads configs '
                       f'({difference_details(diff, saved, config, path)})')
  return traverse_util.unflatten_dict({k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}, sep='.')


def writable_folder(path: str) -> Optional[str]:
  """Why `path` cannot be a folder this process writes into ('it is a file', 'Permission denied', ...), or
  None: created where missing, then probed with a file (root ignores permissions)."""
  if os.path.lexists(path) and not os.path.isdir(path):
    return 'it is a file, not a folder'
  try:
    os.makedirs(path, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=path, prefix='.write_probe')
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    return e.strerror or str(e)
  return None


def file_in_the_way(path: str) -> Optional[str]:
  """The file that stands where `path`, or a folder above it, should be a folder; None where none
  does."""
  parts = os.path.abspath(path).split(os.sep)
  for i in range(2, len(parts) + 1):
    prefix = os.sep.join(parts[:i])
    if os.path.lexists(prefix) and not os.path.isdir(prefix):
      return prefix
    if not os.path.lexists(prefix):
      return None
  return None


def in_the_way(blocker: str, folder: str = 'folder') -> str:
  """The line for a file `blocker` that stands where a `folder` should be, with what to do."""
  return f'{blocker} is a file where a {folder} should be; move it away, then rerun the same command'


def describe_os_error(e: OSError) -> str:
  """An OSError as the one line a user acts on: a file where a folder should be is named, with
  what to do; otherwise the OS's reason in full and the file."""
  blocker = file_in_the_way(e.filename) if e.filename and e.errno in (errno.ENOTDIR, errno.EEXIST) else None
  if blocker:
    return in_the_way(blocker)
  return f'{e.strerror or e}' + (f': {e.filename}' if e.filename else '')


def check_folders(workdir: str) -> None:
  """A WorkdirError unless the workdir, checkpoints/ and tensorboard/ are writable folders or absent;
  creates none of them but a missing workdir."""
  for path in [workdir] + [os.path.join(workdir, n) for n in ('checkpoints', 'tensorboard')
                           if os.path.lexists(os.path.join(workdir, n))]:
    why = writable_folder(path)
    if why:
      raise WorkdirError(f'cannot write into {path}: {why}. Make it a folder this user can write, or use '
                         'another --workdir')


def check_output_folder(path: str) -> None:
  """check_folders' WorkdirError for a folder a mode writes its file into at the end (bench,
  flatness), before the work; creates nothing."""
  blocker = file_in_the_way(path)
  if blocker:
    raise WorkdirError(f'cannot write into {path}: {blocker} is a file, not a folder. Move it away, or use '
                       'another --workdir')
  if os.path.isdir(path):
    check_folders(path)


class Lock:
  """A workdir's owner: an exclusive flock on W/lock, which holds the owner's pid; a second process is
  refused, naming it. Only the primary process locks."""

  def __init__(self, workdir: str, take: bool = True):
    self.path, self._fd = os.path.join(workdir, 'lock'), None
    self._created = not os.path.exists(self.path)
    if not (take and primary()):  # `take` False: a read-only workdir, which no process can write
      return
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as e:
      holder = os.read(fd, 64).decode(errors='replace').strip() or 'unknown'
      os.close(fd)
      raise WorkdirError(f'{workdir} is in use by process {holder} (it holds {self.path}): wait for it to end, '
                         'or stop it, then rerun') from e
    self._fd = fd

  def claim(self) -> None:
    """Writes this process's pid into the lock file (once the workdir's checks passed)."""
    if self._fd is not None:
      os.ftruncate(self._fd, 0)
      os.pwrite(self._fd, f'{os.getpid()}\n'.encode(), 0)

  def close(self, undo: bool = False) -> None:
    """Releases the lock; `undo`: and removes the lock file if this process created it (a workdir
    refused by its checks is left as it was)."""
    if self._fd is not None:
      if undo and self._created:
        os.remove(self.path)
      os.close(self._fd)  # closing the file releases the flock
      self._fd = None


def check_records(workdir: str, config: dict, method_sections: Optional[dict] = None,
                  base_source: Optional[dict] = None, records: tuple = RECORDS) -> list:
  """The paths of `records` in `workdir` that exist, each checked against `config`
  (`config_differences`) and `base_source`; a WorkdirError otherwise."""
  present = [p for p in (os.path.join(workdir, r) for r in records) if os.path.exists(p)]
  _check_records_agree(present, workdir, method_sections)
  for path in present:
    saved = read_json(path)
    diff = config_differences(saved, config, method_sections=method_sections)
    if diff:
      raise WorkdirError(f'{workdir} holds a run of a different config '
                         f'({difference_details(diff, saved, config, path)}; recorded in {path}). Drop --config '
                         'and its changes to use the recorded config, use another --workdir, or pass --checkpoint '
                         'to start new sessions from its base model.')
    was, now = (saved.get(SOURCE_KEY) or {}).get('path'), (base_source or {}).get('path')
    if SOURCE_KEY in saved and was != now:
      raise WorkdirError(f'{workdir} was started with ' + (f'--checkpoint {was}' if was else 'no --checkpoint')
                         + ', now ' + (f'--checkpoint {now}' if now else 'without one')
                         + (f': pass --checkpoint {was} to resume or evaluate it' if was else
                            ': its base model is its own; drop --checkpoint, or use another --workdir'))
  return present


def _check_records_agree(paths: list, workdir: str, method_sections) -> None:
  """A WorkdirError naming both records of the workdir's config where they differ in a result-relevant
  field or in --checkpoint (one was edited or copied from elsewhere)."""
  if len(paths) < 2:
    return
  saved = [read_json(p) for p in paths]
  items = [flat_items({k: v for k, v in s.items() if k not in RECORD_KEYS}) for s in saved]
  diff = [k for k in config_differences(saved[0], saved[1], defaults={}, method_sections=method_sections)
          if k in items[0] and k in items[1]]
  details = [f'{k}: {items[0][k]!r} in one, {items[1][k]!r} in the other' for k in diff]
  sources = [_source_path(s) for s in saved if SOURCE_KEY in s]
  if len(sources) == 2 and sources[0] != sources[1]:
    details.append(f'--checkpoint: {sources[0]!r} in one, {sources[1]!r} in the other')
  if details:
    raise WorkdirError(f'{workdir} holds two records of its config that disagree, {paths[0]} and {paths[1]} '
                       f'({"; ".join(details)}): one was edited or copied from another workdir. Make them agree (the '
                       'checkpoints carry the second), or use another --workdir')


def _source_path(saved: dict) -> Optional[str]:
  """The --checkpoint a saved config records (None: its base model is its own)."""
  return (saved.get(SOURCE_KEY) or {}).get('path')


def writes_into(workdir: str, mode: str) -> bool:
  """Whether `mode` writes into `workdir`: every mode does but eval, which writes nothing into an
  existing folder this process cannot write (a read-only mount)."""
  return mode != 'eval' or not os.path.isdir(workdir) or writable_folder(workdir) is None


def holds_checkpoints(workdir: str) -> bool:
  """Whether W/checkpoints holds a saved step (checkpoints/<kind>/<step>; empty folders, which another
  process of a multi-host run may create first, do not count)."""
  root = os.path.join(workdir, 'checkpoints')
  kinds = [os.path.join(root, k) for k in (os.listdir(root) if os.path.isdir(root) else [])]
  return any(n.isdigit() for k in kinds if os.path.isdir(k) for n in os.listdir(k))


def prepare(workdir: str, config: dict, method_sections: Optional[dict] = None,
            base_source: Optional[dict] = None, records: tuple = RECORDS, writes: bool = True) -> Lock:
  """Takes the workdir (creating it, and its Lock), checks each existing record of its config against the
  other and against `config`, then writes the missing ones. A workdir with checkpoints but no record is
  refused. With `writes` False the records are checked, nothing is written, no lock taken. Returns the Lock."""
  if writes:
    check_folders(workdir)
    os.makedirs(workdir, exist_ok=True)
  lock = Lock(workdir, take=writes)
  try:
    paths = [os.path.join(workdir, r) for r in records]
    present = check_records(workdir, config, method_sections, base_source, records)
    if not present and holds_checkpoints(workdir):
      raise WorkdirError(f'{workdir} holds checkpoints but no record of the config they were trained with '
                         f'({" and ".join(paths)} are missing): restore one, or use another --workdir')
    missing = sorted(set(paths) - set(present)) if writes else []
    record = {**config, SOURCE_KEY: base_source, FORMAT_KEY: CONFIG_FORMAT, GIT_KEY: git_state() if missing else {}}
    for path in missing:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      atomic_write(path, json.dumps(record, indent=2, sort_keys=True))
    lock.claim()
  except BaseException:
    lock.close(undo=True)
    raise
  return lock


def git_state(path: str = None) -> dict:
  """The project's git commit and whether its tree had uncommitted changes ({} outside a checkout)."""
  import subprocess
  root = path or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    commit = subprocess.run(['git', '-C', root, 'rev-parse', 'HEAD'], capture_output=True, text=True,
                            timeout=10, check=True).stdout.strip()
    status = subprocess.run(['git', '-C', root, 'status', '--porcelain', '--untracked-files=no'],
                            capture_output=True, text=True, timeout=10, check=True).stdout
  except (OSError, subprocess.SubprocessError):
    return {}
  return {'commit': commit, 'dirty': bool(status.strip())}


def provenance(config: dict) -> dict:
  """Where a result came from: the effective config, the git commit (and whether the tree was dirty), the
  library versions and the hardware."""
  import platform
  import jaxlib
  import flax
  import optax
  device = jax.devices()[0]
  return {
      'config': config,
      'git': git_state(),
      'versions': {'python': platform.python_version(), 'jax': jax.__version__, 'jaxlib': jaxlib.__version__,
                   'flax': flax.__version__, 'optax': optax.__version__},
      'hardware': {'backend': jax.default_backend(), 'device_kind': device.device_kind,
                   'num_devices': jax.device_count(), 'process_count': jax.process_count(),
                   'host': platform.node(), 'cpu_count': os.cpu_count()},
      'time': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
  }


def primary() -> bool:
  """Whether this process writes the run's files: process 0 of a multi-process run (every process
  computes the same results; orbax coordinates the checkpoints' writes itself), and a lone process."""
  return jax.process_index() == 0


def atomic_write(path: str, text: str) -> None:
  """`text` into `path` through a temporary file (a reader never sees half a file); only on the
  primary process."""
  if not primary():
    return
  with download.written_atomically(path) as tmp:
    tmp.write_text(text)


class MetricsLog:
  """Appends one JSON object per line to <workdir>/metrics.jsonl and, with `tensorboard`, the same numbers
  as TensorBoard scalars. A line of a (phase, run, session, step) the log holds already is not written
  again; a last line cut short by a kill is ended before the next."""

  def __init__(self, workdir: str, tensorboard: bool = False, writes: bool = True):
    self.path, self._writes = os.path.join(workdir, 'metrics.jsonl'), writes  # False: a read-only workdir's
    self._tb_dir = os.path.join(workdir, 'tensorboard') if tensorboard else None
    self._tb = None  # opened with the first scalar, so a run that fails before any adds no file
    self._logged = {_step_key(r) for r in self.records() if 'step' in r}
    self._start = None
    self._cut_line = self._cut()

  def _cut(self) -> bool:
    """Whether the log's last line was cut short (a kill in the middle of a write)."""
    if not os.path.exists(self.path) or os.path.getsize(self.path) == 0:
      return False
    with open(self.path, 'rb') as f:
      f.seek(-1, os.SEEK_END)
      return f.read(1) != b'\n'

  def records(self) -> list:
    """The lines written so far, as dicts (a line cut short by a kill is skipped)."""
    out = []
    if os.path.exists(self.path):
      with open(self.path) as f:
        for line in f:
          try:
            out.append(json.loads(line))
          except json.JSONDecodeError:
            pass
    return out

  def invocation_times(self, mode: str = 'train') -> list:
    """Seconds each invocation in `mode` logged so far ran: from its 'start' line to its last line
    (for one that was killed, the last line it wrote)."""
    spans = []
    for r in self.records():
      if r.get('phase') == 'start':
        spans.append([r.get('mode'), r['time'], r['time']])
      elif spans:
        spans[-1][2] = r['time']
    return [round(end - start, 1) for m, start, end in spans if m == mode]

  def start(self, mode: str) -> None:
    """Marks an invocation's start: its 'start' line goes in with the first line it writes (one that
    stops before it writes any leaves the log as it was)."""
    self._start = {'time': round(time.time(), 3), 'phase': 'start', 'mode': mode}

  def write(self, **record) -> None:
    if not (primary() and self._writes) or ('step' in record and _step_key(record) in self._logged):
      return
    record = {'time': round(time.time(), 3), **record}
    lines = [self._start, record] if self._start else [record]
    self._start = None
    text = ''.join(json.dumps(r) + '\n' for r in lines)
    try:
      with open(self.path, 'a') as f:
        f.write(('\n' if self._cut_line else '') + text)
      self._cut_line = False
    except OSError as e:  # the file named, which a failed write() does not do
      raise OSError(e.errno, e.strerror, self.path) from e
    if self._tb_dir is not None:
      self._scalars(record)

  def _scalars(self, record: dict) -> None:
    phase = record.get('phase')
    if phase == 'session':
      prefix, step = f'run_{record["run"]}', record['session']
    elif phase in ('base', 'select_on_test'):
      prefix, step = {'base': 'base', 'select_on_test': 'select'}[phase], record['step']
      if 'run' in record:  # a joint session's selection
        prefix += f'_run_{record["run"]}_session_{record["session"]}'
    else:
      return
    self.open()
    for name, value in record.items():
      if name not in ('time', 'phase', 'step', 'run', 'session') and isinstance(value, (int, float)) \
          and not isinstance(value, bool):
        self._tb.add_scalar(f'{prefix}/{name}', value, step, walltime=record['time'])

  def open(self) -> None:
    """Opens the TensorBoard writer (if any) now: the base loop calls this before its first step, so
    that opening it (an import and a writer thread) does not stall the running loop."""
    if self._tb_dir is not None and self._tb is None and primary() and self._writes:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._tb = SummaryWriter(self._tb_dir, flush_secs=30)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def _step_key(record: dict) -> tuple:
  """What a line of a step is logged once by: its phase, run, session (a joint session's selection) and step."""
  return record.get('phase'), record.get('run'), record.get('session'), record['step']


def write_results(workdir: str, results: dict, rows: list, name: str = 'results') -> None:
  """<name>.json and <name>.csv, each written atomically (on the primary process)."""
  atomic_write(os.path.join(workdir, f'{name}.json'), json.dumps(results, indent=2))
  write_csv(os.path.join(workdir, f'{name}.csv'), rows)


def write_csv(path: str, rows: list) -> None:
  """`rows` (dicts of one set of keys) into the CSV file `path`, atomically (on the primary process)."""
  if not primary():
    return
  text = io.StringIO(newline='')
  writer = csv.DictWriter(text, fieldnames=list(rows[0]))
  writer.writeheader()
  writer.writerows(rows)
  atomic_write(path, text.getvalue())
