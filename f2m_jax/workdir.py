"""The workdir: config.json, the JSON-lines metrics log and the results files. Nothing a user
produced is overwritten: a workdir started with another result-relevant config is refused."""
from __future__ import annotations

import csv
import json
import os
import time
from typing import Iterable, Optional

import jax
from flax import traverse_util

# Fields that never change what a run computes, or only how it is rounded (paths, logging, how the
# programs are laid out, batching and caching of evaluation, other modes' settings): a workdir may be
# resumed or evaluated with different values of these. A name ending in '.' covers every field below
# it. Some are fields of earlier versions, still found in saved config.json files.
NON_RESULT_FIELDS = ('data.data_dir', 'data.tfds_data_dir', 'data.cache_dir', 'base.log_every',
                     'base.checkpoint_every', 'base.steps_per_call', 'noise.draw_map', 'model.conv_backward',
                     'members.map', 'eval.batch_size', 'eval.cache_trunk', 'distributed', 'tensorboard',
                     'compilation_cache', 'bench.', 'flatness.',
                     'base.data_placement', 'base.prefetch', 'incremental.parallel_runs', 'compile_ahead',
                     'set_by_user')


# Fields added after workdirs were already being written, with the value that reproduces what a run
# did before the field existed: a saved config.json without the field is compared as if it held this
# value, so such a workdir resumes unless the current config asks for something else.
LEGACY_VALUES = {'data.split': '', 'noise.pf_gradient': True, 'noise.bn_updates': 'clean',
                 'noise.backward_weights': 'noisy', 'base.select_on_test': False, 'base.select_every': 1500,
                 'model.head': 'linear', 'data.synthetic.seed': 0, 'incremental.prototype_norm': 'raw'}

# Fields renamed since workdirs were written: old name -> (new name, {old value: new value}). A saved
# config.json is read in the new names; the old name given as an override is refused with the new one
# (f2m_jax/cli.py).
RENAMED_FIELDS = {'noise.clean_backward': ('noise.backward_weights', {True: 'clean', False: 'noisy'}),
                  'incremental.normalize_base_prototypes': ('incremental.prototype_norm',
                                                            {False: 'raw', True: 'unit_base'})}

# Fields removed since workdirs were written, with the one value whose behaviour the code still
# computes: a saved config.json holding that value reads as if it did not hold the field (so it
# resumes), any other value stays and is reported as a difference (so it is refused).
# noise.pf_classes: 'all_base' only rescaled lambda by |C_z|/|C^1| (docs/method.md, Eq. 4).
REMOVED_FIELDS = {'noise.pf_classes': 'batch'}


def renamed(flat: dict) -> dict:
  """Flat config items in the current names: RENAMED_FIELDS' old names and values translated to the
  new ones, and REMOVED_FIELDS dropped where they hold the value the code still computes."""
  out = dict(flat)
  for old, (new, values) in RENAMED_FIELDS.items():
    if old in out:
      out[new] = values[out.pop(old)]
  for field, value in REMOVED_FIELDS.items():
    if field in out and out[field] == value:
      del out[field]
  return out


def _ignored(key: str, ignore: Iterable[str]) -> bool:
  return any(key == i or (i.endswith('.') and key.startswith(i)) for i in ignore)


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


def config_differences(saved: dict, current: dict, ignore: Iterable[str] = NON_RESULT_FIELDS,
                       method_sections: Optional[dict] = None) -> list:
  """Dotted names of fields whose values differ (or exist on one side only), ignoring `ignore`.
  `method_sections` ({section: method}, f2m_jax/registry.py) names the sections one method alone
  reads: they are compared only when one of the two configs runs that method (so a workdir written
  before a method existed resumes, and its settings never block another method's resume)."""
  a, b = renamed(flat_items(saved)), flat_items(current)
  a.update({k: v for k, v in LEGACY_VALUES.items() if k not in a and k in b})
  methods = {a.get('method'), b.get('method')}
  ignore = tuple(ignore) + tuple(f'{s}.' for s, m in (method_sections or {}).items() if m not in methods)
  return sorted(k for k in set(a) | set(b)
                if not _ignored(k, ignore) and a.get(k, '<absent>') != b.get(k, '<absent>'))


SOURCE_KEY = 'base_source'  # config.json's record of --checkpoint's base model (not a config field)


def saved_config(workdir: str, defaults: dict) -> dict:
  """W/config.json as a full config: fields added after it was written take their LEGACY_VALUES
  value where they have one, else the value in `defaults` (a section only another method reads)."""
  with open(os.path.join(workdir, 'config.json')) as f:
    saved = json.load(f)
  saved.pop(SOURCE_KEY, None)
  items = flat_items(defaults)
  items.update(LEGACY_VALUES)
  items.update(renamed(flat_items(saved)))
  return traverse_util.unflatten_dict(items, sep='.')


def _removed_detail(field: str, value) -> str:
  return (f'{field}: saved {value!r}, a field since removed; the code now always computes what '
          f'{field}={REMOVED_FIELDS[field]!r} did, so this run cannot be resumed or evaluated with it')


def prepare(workdir: str, config: dict, method_sections: Optional[dict] = None,
            base_source: Optional[dict] = None) -> None:
  """Creates the workdir and config.json, or checks an existing config.json against `config`
  (`method_sections`: as `config_differences`). `base_source` ({'path', ...}: --checkpoint's base
  model) is recorded beside the config; a workdir started from one base model is refused with
  another or none (a config.json written before it was recorded is not checked)."""
  path = os.path.join(workdir, 'config.json')
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    recorded, saved_base = SOURCE_KEY in saved, saved.pop(SOURCE_KEY, None)
    diff = config_differences(saved, config, method_sections=method_sections)
    if diff:
      details = '; '.join(_removed_detail(k, flat_items(saved)[k]) if k in REMOVED_FIELDS else
                          f'{k}: saved {flat_items(saved).get(k, "<absent>")!r}, now '
                          f'{flat_items(config).get(k, "<absent>")!r}' for k in diff)
      raise WorkdirError(f'{workdir} holds a run of a different config ({details}). Use another --workdir, '
                         'or pass --checkpoint to start new sessions from its base model.')
    was, now = (saved_base or {}).get('path'), (base_source or {}).get('path')
    if recorded and was != now:
      raise WorkdirError(f'{workdir} was started with ' + (f'--checkpoint {was}' if was else 'no --checkpoint')
                         + ', now ' + (f'--checkpoint {now}' if now else 'without one')
                         + (f': pass --checkpoint {was} to resume or evaluate it' if was else
                            ': its base model is its own; drop --checkpoint, or use another --workdir'))
    return
  os.makedirs(workdir, exist_ok=True)
  record = {**config, SOURCE_KEY: base_source}
  atomic_write(path, json.dumps(record, indent=2, sort_keys=True))


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
  """Where a result came from: the effective config, the project's git commit (and whether the tree
  was dirty), the library versions and the hardware. Written into results.json, flatness.json and
  bench.json."""
  import platform
  import jax
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
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    f.write(text)
  os.replace(tmp, path)


class MetricsLog:
  """Appends one JSON object per line to <workdir>/metrics.jsonl and, with `tensorboard`, writes the
  same numbers as TensorBoard scalars into <workdir>/tensorboard/ (tensorboardX, no TensorFlow;
  viewing them needs `pip install tensorboard`): base training as base/<name> against the step, the
  test-set selection as select/<name>, and each run's sessions as run_<r>/<name> against the
  session. Units as their writers give them: phase 'base' logs `acc` (the training batches'
  accuracy) as a fraction 0..1; phases 'session' and 'select_on_test' log accuracies in percent."""

  def __init__(self, workdir: str, tensorboard: bool = False):
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self._tb_dir = os.path.join(workdir, 'tensorboard') if tensorboard else None
    self._tb = None  # opened with the first scalar, so a run that fails before any adds no file

  def write(self, **record) -> None:
    if not primary():
      return
    record = {'time': round(time.time(), 3), **record}
    with open(self.path, 'a') as f:
      f.write(json.dumps(record) + '\n')
    if self._tb_dir is not None:
      self._scalars(record)

  def _scalars(self, record: dict) -> None:
    phase = record.get('phase')
    if phase == 'session':
      prefix, step = f'run_{record["run"]}', record['session']
    elif phase in ('base', 'select_on_test'):
      prefix, step = {'base': 'base', 'select_on_test': 'select'}[phase], record['step']
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
    if self._tb_dir is not None and self._tb is None and primary():
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._tb = SummaryWriter(self._tb_dir, flush_secs=30)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def write_results(workdir: str, results: dict, rows: list, name: str = 'results') -> None:
  """<name>.json and <name>.csv, each written atomically (on the primary process)."""
  if not primary():
    return
  atomic_write(os.path.join(workdir, f'{name}.json'), json.dumps(results, indent=2))
  tmp = os.path.join(workdir, f'{name}.csv.tmp{os.getpid()}')
  with open(tmp, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  os.replace(tmp, os.path.join(workdir, f'{name}.csv'))
