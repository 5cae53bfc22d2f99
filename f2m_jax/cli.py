"""What run.py does per --mode, with user errors turned into one clear message and exit code 2."""
from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import sys
from typing import Iterable

import jax
from absl import flags
from absl import logging

from f2m_jax import bench
from f2m_jax import members
from f2m_jax import pipeline
from f2m_jax import registry
from f2m_jax import report
from f2m_jax import sharding
from f2m_jax.checkpoint import CheckpointError
from f2m_jax.data import sources
from f2m_jax.experiment import TrainingError
from f2m_jax.workdir import RENAMED_FIELDS, WorkdirError, config_differences, flat_items

USER_ERRORS = (ValueError, FileNotFoundError, CheckpointError, WorkdirError)


def main(config, workdir: str, mode: str, checkpoint=None, argv=None, set_by_user: Iterable[str] = ()) -> int:
  """Runs `mode`; `argv` (run.py's command line) names the --config argument and its changes in the
  start-up line and the results' provenance; `set_by_user` (the --config.FIELD overrides) joins
  config.set_by_user, the fields no method's presets replace (f2m_jax/pipeline.py: resolve)."""
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  with config.unlocked():  # a config file not built on configs/common.py may lack the field
    config.set_by_user = tuple(sorted(set(config.get('set_by_user', ())) | set(set_by_user)))
  try:
    sharding.maybe_initialize_distributed(config.get('distributed', False))
    if mode != 'bench':
      enable_compilation_cache(config)
    if mode in ('train', 'eval') and members.enabled(config):
      summary = members.run(config, workdir, mode=mode, checkpoint=checkpoint, origin=config_origin(argv, config))
      print(members.format_summary(summary), flush=True)
      print(f'summary written to {workdir}/summary.json; each member in {workdir}/member_<i>/', flush=True)
      return 0
    if mode in ('train', 'eval'):
      results = pipeline.run(config, workdir, mode=mode, checkpoint=checkpoint, origin=config_origin(argv, config))
      print(report.format_session_table(results), flush=True)
      return 0
    if mode == 'flatness':
      pipeline.run_flatness(config, workdir, checkpoint, origin=config_origin(argv, config))
      return 0
    if mode == 'bench':
      bench.run(config, workdir)
      return 0
    raise ValueError(f'--mode {mode} is not implemented yet')
  except USER_ERRORS as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 2
  except TrainingError as e:
    print(f'training stopped: {e}', file=sys.stderr, flush=True)
    return 3


def enable_compilation_cache(config):
  """Turns on JAX's persistent compilation cache in <cache folder>/jax_compilation_cache where
  config.compilation_cache asks for it, for every program however fast it compiled (JAX's default
  keeps only those of 1 s or more, and the many small ones then compile again in every run;
  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS, where set, wins; the figures: experiments/results/
  README.md, 'Figures behind the code's choices'). Returns the folder in use (one already set,
  e.g. through JAX_COMPILATION_CACHE_DIR, is kept with JAX's settings), or None."""
  if jax.config.jax_compilation_cache_dir:
    return jax.config.jax_compilation_cache_dir
  if not config.get('compilation_cache', False):
    return None
  path = os.path.join(sources.cache_dir(config), 'jax_compilation_cache')
  jax.config.update('jax_compilation_cache_dir', path)
  if 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS' not in os.environ:
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  return path


def config_origin(argv, config):
  """{'config': the --config argument, 'changes': {field: value}}: the result-relevant fields where
  `config` (with the command line's overrides) differs from the config file's own values; None
  without a --config argument in `argv`."""
  specs = _flag_values(argv or [], 'config')
  if not specs:
    return None
  flat = flat_items(config.to_dict())
  differ = config_differences(load_config_file(specs[-1]).to_dict(), config.to_dict(),
                              method_sections=registry.method_sections())
  return {'config': specs[-1], 'changes': {k: flat.get(k) for k in differ}}


# ----------------------------------------------------------------------------- config overrides

def parse_flags(argv):
  """run.py's absl flags parser: a bad `--config.FIELD=VALUE` override (unknown field, wrong type,
  malformed tuple) stops with one line naming the field, the value and what is allowed, exit code 2,
  before anything is written. Values out of range are caught later by f2m_jax/validation.py, also before
  the workdir is created."""
  problem = config_problem(argv)
  if problem:
    print(f'error: {problem}', file=sys.stderr, flush=True)
    sys.exit(2)
  try:
    rest = flags.FLAGS(argv)
  except Exception as e:  # flags.Error, or what ml_collections raises while applying an override
    problem = override_problem(argv) or ' '.join(str(e).split())
    print(f'error: {problem}', file=sys.stderr, flush=True)
    sys.exit(2)
  problem = override_problem(argv)  # some wrong types are accepted silently (an int for a tuple)
  if problem:
    print(f'error: {problem}', file=sys.stderr, flush=True)
    sys.exit(2)
  return rest


def config_problem(argv):
  """A one-line description of what is wrong with the --config argument in argv (no such file, or
  its get_config refuses the argument after ':'), or None."""
  specs = _flag_values(argv, 'config')
  if not specs:
    return None
  spec = specs[-1]
  path = spec.partition(':')[0]
  if not os.path.isfile(path):
    folder = os.path.dirname(path) or '.'
    options = sorted(f for f in os.listdir(folder) if f.endswith('.py') and not f.startswith('_')) \
        if os.path.isdir(folder) else []
    close = difflib.get_close_matches(os.path.basename(path), options, n=1, cutoff=0.6)
    return (f'--config {spec}: there is no file {path}'
            + (f'; did you mean {os.path.join(folder, close[0])}?' if close else '')
            + (f' (configs in {folder}/: {", ".join(options)})' if options else ''))
  try:
    load_config_file(spec)
  except Exception as e:  # whatever the config file raises for a bad argument
    return f'--config {spec}: ' + ' '.join(str(e).split())
  return None


def _flag_values(argv, name: str) -> list:
  """Values of --name=V / --name V in argv, in order."""
  out = []
  for i, a in enumerate(argv):
    if a.startswith(f'--{name}='):
      out.append(a.split('=', 1)[1])
    elif a == f'--{name}' and i + 1 < len(argv):
      out.append(argv[i + 1])
  return out


def _overrides(argv) -> list:
  """(dotted field, value) of every --config.FIELD=VALUE (or --config.FIELD VALUE) in argv."""
  out = []
  for i, a in enumerate(argv):
    if a.startswith('--config.'):
      name, sep, value = a[len('--config.'):].partition('=')
      if not sep:
        value = argv[i + 1] if i + 1 < len(argv) else ''
      out.append((name, value))
  return out


def load_config_file(spec: str):
  """get_config(arg) of `path[:arg]` (the --config flag's value), without overrides."""
  path, _, arg = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('_f2m_config', os.path.abspath(path))
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _fields(config, prefix: str = '') -> dict:
  out = {}
  for k, v in config.items():
    name = f'{prefix}{k}'
    out[name] = v
    if hasattr(v, 'items') and not isinstance(v, dict):
      out.update(_fields(v, name + '.'))
  return out


def _type_problem(current, value: str):
  """What is wrong with `value` for a field whose default is `current`, or None."""
  if isinstance(current, bool):
    if value.lower() not in ('true', 'false', '1', '0'):
      return 'expects True or False'
  elif isinstance(current, int):
    try:
      int(value)
    except ValueError:
      return 'expects an integer'
  elif isinstance(current, float):
    try:
      float(value)
    except ValueError:
      return 'expects a number'
  elif isinstance(current, (tuple, list)):
    example = '(15000,)' if not current else repr(tuple(current)) if len(current) > 1 else f'({current[0]!r},)'
    try:
      parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      return f'expects a tuple such as {example}'
    if not isinstance(parsed, (tuple, list)):
      return f'expects a tuple such as {example} (a single entry needs the trailing comma)'
  elif hasattr(current, 'items'):
    return f'is a group of fields ({", ".join(sorted(current.keys()))}); set one of them'
  return None


def override_problem(argv):
  """A one-line description of the first bad --config override in argv, or None."""
  specs = _flag_values(argv, 'config')
  overrides = _overrides(argv)
  if not specs or not overrides:
    return None
  try:
    config = load_config_file(specs[-1])
  except Exception:  # the --config file itself is the problem: absl's own message says so
    return None
  fields = _fields(config)
  for name, value in overrides:
    if name in RENAMED_FIELDS and name not in fields:
      new, values = RENAMED_FIELDS[name]
      options = ' or '.join(f'--config.{new}={v!r} (the old {k})' for k, v in values.items())
      return f'config.{name} was renamed: use {options}'
    if name not in fields:
      parent, _, leaf = name.rpartition('.')
      siblings = {k.rpartition('.')[2]: k for k in fields if k.rpartition('.')[0] == parent}
      close = difflib.get_close_matches(leaf, list(siblings), n=3, cutoff=0.5)
      if close:
        hint = 'did you mean ' + ', '.join(f'config.{siblings[c]}' for c in close) + '?'
      elif siblings:
        hint = 'the fields there are ' + ', '.join(sorted(siblings))
      else:
        groups = [k for k, v in fields.items() if hasattr(v, 'items')]
        near = difflib.get_close_matches(parent, groups, n=1, cutoff=0.5)
        hint = f'config.{parent} does not exist either' + (f' (did you mean config.{near[0]}?)' if near else '')
      return f'unknown config field config.{name} (given {value!r}); {hint}'
    problem = _type_problem(fields[name], value)
    if problem:
      default = '' if hasattr(fields[name], 'items') else f' (default {fields[name]!r})'
      return f'config.{name}={value!r} is invalid: config.{name} {problem}{default}'
  return None
