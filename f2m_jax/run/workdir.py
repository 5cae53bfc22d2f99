"""The workdir: config.json, the JSON-lines metrics log and the results files. Nothing a user
produced is overwritten: a workdir started with another result-relevant config is refused."""
import contextlib
import csv
import fcntl
import importlib.metadata
import io
import json
import os
import pathlib
import platform
import re
import subprocess
import time

import jax
from flax import traverse_util

from configs import common as config_defaults
from f2m_jax import files
from f2m_jax import registry

# Fields that change no result but its rounding (paths, logging, the programs' layout, evaluation's
# batches, other modes): a workdir may be resumed or evaluated with others. A section's name covers
# its fields.
NON_RESULT_FIELDS = ('data.data_dir', 'data.tfds_data_dir', 'data.cache_dir', 'base.log_every',
                     'base.checkpoint_every', 'base.steps_per_call', 'noise.draw_map',
                     'model.conv_backward', 'members.map', 'eval.batch_size', 'eval.cache_trunk',
                     'distributed', 'tensorboard', 'compilation_cache', 'memory_check', 'bench',
                     'flatness')

# How a saved config.json is read (docs/development.md, "Adding a config field"): one of
# CONFIG_FORMAT takes the defaults of the fields it lacks, one of another (0: none recorded) is read
# as it stands. Bump it where a field's default stops computing what the code computed before.
CONFIG_FORMAT = 1
# Fields added to CONFIG_FORMAT whose default computes otherwise than the code that wrote a record
# lacking them: such a record is read with the value that code computed (nested image folders were
# their top folder).
LACKED = {'data.folder.class_depth': 1}
SOURCE_KEY = 'base_source'  # config.json's record of --checkpoint's base model
# config.json's records beside the config: that base model, how it was written, and 'ledger': that
# checkpoints/digests.json holds every checkpoint's identity
RECORD_KEYS = (SOURCE_KEY, 'config_format', 'git', 'ledger')
ABSENT = '<absent>'


def flat_items(d):
  """{'section.field': value} of a nested dict, tuples as lists (as JSON has them)."""
  flat = traverse_util.flatten_dict(d, sep='.')
  return {k: list(v) if isinstance(v, tuple) else v for k, v in flat.items()}


def default_items(items):
  """Every field's default (configs/common.py) as flat items, the folder source's section where
  flat `items` have one."""
  config = config_defaults.base_config()
  if any(k.startswith('data.folder.') for k in items):
    config.data.folder = config_defaults.folder_section()
  return flat_items(config.to_dict())


def saved_items(saved, defaults):
  """A saved config's fields as flat items, those it lacks from `defaults` where it is of
  CONFIG_FORMAT."""
  items = flat_items({k: v for k, v in saved.items() if k not in RECORD_KEYS})
  lacked = {k: v for k, v in LACKED.items() if k in defaults}
  return {**defaults, **lacked, **items} if saved.get('config_format') == CONFIG_FORMAT else items


def config_differences(saved, current, defaults=None):
  """`differing` fields of `saved` (a field it lacks: its `defaults` value) and `current`."""
  b = flat_items(current)
  fill = defaults or default_items(b)
  return differing(saved_items(saved, {k: v for k, v in fill.items() if k in b}), b)


def differing(a, b):
  """Sorted names of the fields where flat items `a` and `b` differ, but NON_RESULT_FIELDS and the
  sections of a method neither runs (registry.method_sections)."""
  methods = {a.get('method'), b.get('method')}
  others = [s for s, m in registry.method_sections().items() if m not in methods]
  skip = tuple(f'{i}.' for i in [*NON_RESULT_FIELDS, *others])
  return sorted(k for k in a.keys() | b.keys()
                if a.get(k, ABSENT) != b.get(k, ABSENT) and not f'{k}.'.startswith(skip))


def difference_details(fields, saved, current, path):
  """'field: saved A, now B; ...' for `fields`, and where one of them is absent on a side, the
  commit that reads `saved` (config.json in `path`): its own record, else its results.json's."""
  a, b = saved_items(saved, {}), flat_items(current)
  text = '; '.join(f'{k}: saved {a.get(k, ABSENT)!r}, now {b.get(k, ABSENT)!r}' for k in fields)
  if all(k in a and k in b for k in fields):
    return text
  commit = (saved.get('git') or {}).get('commit')
  results = f'{os.path.dirname(path)}/results.json'
  if not commit and os.path.exists(results):
    commit = ((files.read_json(results).get('provenance') or {}).get('git') or {}).get('commit')
  return (f'{text}; a field absent on one side is read only by the commit that wrote {path} '
          f'({commit or "unrecorded: config format 0"}): check it out to resume or evaluate this '
          'workdir')


def recorded_config(path):
  """A workdir's config.json (`path`) read as a resume reads it; a WorkdirError where this code
  cannot."""
  saved = files.read_json(path)
  fill = default_items(flat_items(saved))
  items = saved_items(saved, fill)  # of CONFIG_FORMAT: with the defaults (and LACKED) it lacks
  # data.x: a dataset's own
  config = {**fill, **{k: v for k, v in items.items() if k in fill or k.startswith('data.')}}
  diff = differing(items, config)
  if diff:
    raise files.WorkdirError(f'{path} cannot be read as this code reads configs '
                             f'({difference_details(diff, saved, config, path)})')
  return traverse_util.unflatten_dict(
      {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}, sep='.')


def check_folders(*paths):
  """A WorkdirError naming the first of the folders `paths` that a file stands in the way of, or
  whose nearest existing folder this user cannot write."""
  for path in paths:
    folder = files.nearest(os.path.abspath(path))
    why = files.in_the_way(path) or (not os.access(folder, os.W_OK | os.X_OK) and
                                     f'this user cannot write {folder} (its permissions, or a '
                                     'read-only mount); make it writable, or use another '
                                     '--workdir')
    if why:
      raise files.WorkdirError(f'cannot write into {path}: {why}')


class Lock:
  """A workdir's owner: an exclusive flock on W/lock, which holds the owner's pid; a second process
  is refused, naming it. Only the primary process locks; `take` False: a read-only workdir, nobody.
  """

  def __init__(self, workdir, take=True):
    self.path, self._fd = f'{workdir}/lock', None
    self._created = not os.path.exists(self.path)
    if take and files.primary():
      self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError as e:
        holder = os.read(self._fd, 64).decode(errors='replace').strip() or 'unknown'
        os.close(self._fd)
        raise files.WorkdirError(f'{workdir} is in use by process {holder} (it holds {self.path}): '
                                 'wait for it to end, or stop it, then rerun') from e

  def claim(self):
    """Writes this process's pid into the lock file (once the workdir's checks passed)."""
    if self._fd is not None:
      os.ftruncate(self._fd, 0)
      os.pwrite(self._fd, f'{os.getpid()}\n'.encode(), 0)

  def close(self, undo=False):
    """Releases the lock; `undo`: and removes the lock file if this process created it."""
    if self._fd is not None:
      if undo and self._created:
        os.remove(self.path)
      os.close(self._fd)  # closing the file releases the flock
      self._fd = None


def check_record(workdir, config, base_source=None):
  """Whether `workdir` has a config.json; a WorkdirError where it differs from `config` or
  `base_source`."""
  path = f'{workdir}/config.json'
  if not os.path.exists(path):
    return False
  saved = files.read_json(path)
  diff = config_differences(saved, config)
  was, now = (saved.get(SOURCE_KEY) or {}).get('path'), (base_source or {}).get('path')
  moved = SOURCE_KEY in saved and was != now
  if (diff or moved) and not holds_records(workdir):
    return False  # its run stopped before it recorded anything: `prepare` writes over it
  if diff:
    raise files.WorkdirError(f'{workdir} holds a run of a different config '
                             f'({difference_details(diff, saved, config, path)}; recorded in '
                             f'{path}). Drop --config and its changes to use the recorded config, '
                             'use another --workdir, or pass --checkpoint to start new sessions '
                             'from its base model.')
  if moved:
    fix = 'drop --checkpoint, or use another --workdir'
    if was:
      fix = f'pass --checkpoint {was} to resume or evaluate it'
    raise files.WorkdirError(f'{workdir} was started with --checkpoint {was or "none"}, now '
                             f'{now or "without"}: {fix}')
  return True


def holds_records(workdir):
  """Whether `workdir` (or a sweep's member in it) holds a file but a config.json, a lock and a
  TensorBoard folder (which a run opens before its first step): what a run recorded."""
  found = (p.relative_to(workdir) for p in pathlib.Path(workdir).rglob('*') if p.is_file())
  return any(p.name not in ('config.json', 'lock') and 'tensorboard' not in p.parts for p in found)


def writes_into(workdir, mode):
  """Whether `mode` writes into `workdir`: every mode does but eval of a folder this process cannot
  write."""
  return mode != 'eval' or not os.path.isdir(workdir) or os.access(workdir, os.W_OK | os.X_OK)


def prepare(workdir, config, *, base_source=None, writes=True):
  """The workdir's Lock, taken (the workdir made) once its config.json is checked (`check_record`)
  or written (a workdir with checkpoints and no config.json is refused). With `writes` False:
  checked only, no lock."""
  if writes:
    check_folders(workdir, f'{workdir}/checkpoints', f'{workdir}/tensorboard')
    os.makedirs(workdir, exist_ok=True)
  lock, path = Lock(workdir, take=writes), f'{workdir}/config.json'
  try:
    if not check_record(workdir, config, base_source):
      # a saved step, checkpoints/<kind>/<step> (empty folders another process may create first are
      # none)
      if any(p.name.isdigit() for p in pathlib.Path(workdir).glob('checkpoints/*/*')):
        raise files.WorkdirError(f'{workdir} holds checkpoints but no record of the config they '
                                 f'were trained with ({path} is missing): restore '
                                 'it, or use another --workdir')
      if writes:
        if os.path.exists(path):
          print(f'{path} replaced: its run stopped before it recorded anything', flush=True)
        record = {**config, SOURCE_KEY: base_source, 'config_format': CONFIG_FORMAT,
                  'git': git_state(), 'ledger': True}
        files.atomic_write(path, json.dumps(record, indent=2, sort_keys=True))
    lock.claim()
  except BaseException:
    lock.close(undo=True)
    raise
  return lock


def git_state():
  """The project's git commit and whether its tree had uncommitted changes ({} outside a checkout).
  """
  try:
    out = subprocess.run(['git', '-C', os.path.dirname(__file__), 'status', '--porcelain=v2',
                          '--branch', '--untracked-files=no'], capture_output=True, text=True,
                         timeout=10, check=True).stdout
  except (OSError, subprocess.SubprocessError):
    return {}
  # its header lines start with '#', the changed files' do not
  commit = re.search(r'^# branch\.oid (\S+)', out, re.M)
  return {'commit': commit and commit[1], 'dirty': re.search('^[^#]', out, re.M) is not None}


def writer():
  """Who writes or computes now: `git_state`, the backend and the device kind."""
  return {**git_state(), 'backend': jax.default_backend(), 'device': jax.devices()[0].device_kind}


def provenance(config, origin=None, **more):
  """Where a result came from: the effective config, `git_state`, the versions, the hardware;
  `origin` (the command line, cli.py) and `more` where given."""
  return {
      'config': config, 'git': git_state(),
      'versions': {'python': platform.python_version(), **{
          n: importlib.metadata.version(n) for n in ('jax', 'jaxlib', 'flax', 'optax')}},
      'hardware': {'backend': jax.default_backend(), 'device_kind': jax.devices()[0].device_kind,
                   'num_devices': jax.device_count(), 'process_count': jax.process_count(),
                   'host': platform.node(), 'cpu_count': os.cpu_count()},
      'time': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
      **{k: v for k, v in {'origin': origin, **more}.items() if v is not None},
  }


class MetricsLog:
  """<workdir>/metrics.jsonl, a JSON object per line, and with `tensorboard` the same numbers as
  TensorBoard scalars, through tensorboardX's RecordWriter (its SummaryWriter writes in a thread of
  its own: here a failed write is an OSError in this thread, naming its file). A step's line the log
  holds is not written again; a last line cut short by a kill is ended first. `invocations`: each
  earlier invocation's 'start' line, with 'end', the time of its last line."""

  def __init__(self, workdir, tensorboard=False, writes=True):
    # False: read-only
    self.path, self._writes = f'{workdir}/metrics.jsonl', writes and files.primary()
    self._tb_dir = tensorboard and self._writes and f'{workdir}/tensorboard'
    self._tb = self._start = None  # the writer is opened with the first scalar
    records = self.records()
    self._logged = {_step_key(r) for r in records if 'step' in r}
    self.invocations = []
    for r in records:
      if r.get('phase') == 'start':
        self.invocations.append({**r, 'end': r.get('time')})
      elif self.invocations:
        last = self.invocations[-1]
        last['end'] = r.get('time', last['end'])

  def records(self):
    """The log's lines as dicts, but for a line that is none (cut short by a kill, or not UTF-8);
    notes whether the last line was cut, which the next write ends first."""
    data = pathlib.Path(self.path).read_bytes() if os.path.exists(self.path) else b''
    self._cut_line = data[-1:] not in b'\n'  # neither empty nor a newline
    out = []
    for line in data.split(b'\n'):
      with contextlib.suppress(ValueError):  # json's errors and UnicodeDecodeError
        out.append(json.loads(line))
    return [r for r in out if isinstance(r, dict)]

  def start(self, mode, **fields):
    """An invocation's 'start' line (with `fields`), written with its first line (if any)."""
    self._start = {'time': round(time.time(), 3), 'phase': 'start', 'mode': mode, **fields}

  def write(self, **record):
    if not self._writes or _step_key(record) in self._logged:  # a stepless line's key is in none
      return
    record = {'time': round(time.time(), 3), **record}
    lines, self._start = [r for r in (self._start, record) if r], None
    with files.naming(self.path), open(self.path, 'a') as f:
      f.write('\n' * self._cut_line + ''.join(json.dumps(r) + '\n' for r in lines))
    self._cut_line = False
    if self._tb_dir and record.get('phase') in ('session', 'base', 'select_on_test'):
      self._scalars(record)

  def _scalars(self, record):
    """`record`'s numbers under run_<r>/ (by session), or base/ or select/ (by step; a joint
    session's selection: select_run_<r>_session_<s>/)."""
    from tensorboardX.summary import scalar  # pylint: disable=g-import-not-at-top
    if record['phase'] == 'session':
      prefix, step = f'run_{record["run"]}', record['session']
    else:
      where = f'_run_{record["run"]}_session_{record["session"]}' if 'run' in record else ''
      prefix, step = record['phase'].split('_')[0] + where, record['step']
    self.open()
    with files.naming(self._tb.path):
      for name, value in record.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and name not in ('time', 'step', 'run', 'session'):
          self._event(summary=scalar(f'{prefix}/{name}', value), step=step,
                      wall_time=record['time'])
      self._tb.flush()

  def open(self):
    """Opens the TensorBoard event file (if any) now: the base loop calls this before its first
    step."""
    if self._tb_dir and self._tb is None:
      from tensorboardX.record_writer import RecordWriter  # pylint: disable=g-import-not-at-top
      path = f'{self._tb_dir}/events.out.tfevents.{time.time():.6f}.{platform.node()}'
      with files.naming(path):
        os.makedirs(self._tb_dir, exist_ok=True)
        self._tb = RecordWriter(path)
        self._event(wall_time=time.time(), file_version='brain.Event:2')

  def _event(self, **fields):
    """Writes a TensorBoard event of `fields`."""
    from tensorboardX.proto.event_pb2 import Event  # pylint: disable=g-import-not-at-top
    self._tb.write(Event(**fields).SerializeToString())

  def close(self):
    if self._tb is not None:
      tb, self._tb = self._tb, None
      with files.naming(tb.path):
        tb.close()


def _step_key(record):
  """A step's line is logged once per phase, run, session (a joint session's selection) and step."""
  return tuple(map(record.get, ('phase', 'run', 'session', 'step')))


def write_results(workdir, name, rows, results=None):
  """<name>.csv of `rows` (dicts of one set of keys) and, with `results`, <name>.json, each
  atomically."""
  if results is not None:
    files.atomic_write(f'{workdir}/{name}.json', json.dumps(results, indent=2))
  text = io.StringIO()
  table = csv.DictWriter(text, rows[0])
  table.writeheader()
  table.writerows(rows)
  files.atomic_write(f'{workdir}/{name}.csv', text.getvalue())
