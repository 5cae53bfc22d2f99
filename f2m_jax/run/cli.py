"""run.py's command line, and what it does per --mode, with user errors turned into one clear message
and exit code 2, and faults of the records (a checkpoint that cannot be read or written, a diverged
training, a file system error) into one line and exit code 3."""
from __future__ import annotations

import difflib
import importlib.util
import os
import re
import sys

import jax
import ml_collections
from absl import flags
from ml_collections import config_flags

from f2m_jax import files
from f2m_jax import registry
from f2m_jax import sharding
from f2m_jax.data import sources
from f2m_jax.experiment import Interrupted, TrainingError
from f2m_jax.files import CheckpointError, CheckpointFault
from f2m_jax.files import WorkdirError, describe_os_error
from f2m_jax.run import bench
from f2m_jax.run import dry_run as dry_run_lib
from f2m_jax.run import members
from f2m_jax.run import memory
from f2m_jax.run import pipeline
from f2m_jax.run import report
from f2m_jax.run import stopping
from f2m_jax.run import workdir as workdir_lib
from f2m_jax.run.checkpoint import quiet_orbax
from f2m_jax.run.stopping import message
from f2m_jax.run.workdir import flat_items


def main(config, workdir: str, mode: str, checkpoint=None, origin=None, dry_run: bool = False,
         time_step: bool = False) -> int:
  """Runs `mode`. `origin` ({'config', 'changes'}: the --config argument and the command line's overrides)
  is what the user changed: no method's presets replace those fields, and it goes into the records."""
  at_once = '--dry-run' if dry_run else '' if mode in ('train', 'eval') else f'--mode {mode}'  # saves nothing
  with quiet_orbax(), stopping.Stop(at_once and f'{at_once} saves nothing: rerun the same command',
                                    Interrupted) as stop:
    return stop.exit(run_mode(config, workdir, ('time_step' if time_step else 'dry_run') if dry_run else mode,
                              checkpoint, origin, stop.hook))


def run_mode(config, workdir: str, mode: str, checkpoint, origin, hook) -> int:
  """`main`'s work: the mode (`dispatch`), with errors as one line and exit codes (2 user error; 3 training
  stopped, a checkpoint that cannot be read back or written, a file system error, memory; 130 interrupted)."""
  try:
    sharding.maybe_initialize_distributed(config.get('distributed', False))
    if mode in ('train', 'eval', 'flatness'):  # bench and a dry run write nothing, compiled programs included
      enable_compilation_cache(config)
    dispatch(config, workdir, mode, checkpoint, origin, hook)
    return 0
  except (ValueError, FileNotFoundError, CheckpointError, WorkdirError) as e:  # CheckpointFault: the records'
    return message(f'error: {e}', 3 if isinstance(e, CheckpointFault) else 2)
  except TrainingError as e:
    return message(f'training stopped: {e}', 3)
  except (Interrupted, KeyboardInterrupt) as e:
    return message(f'{e or "interrupted"}; {stopping.RESUME}', stopping.EXIT_CODE)
  except OSError as e:  # the file system refused a write or read that the checks could not foresee
    return message(f'error: {describe_os_error(e)}', 3)
  except (MemoryError, jax.errors.JaxRuntimeError) as e:  # an allocation failed: the field to lower
    if not isinstance(e, MemoryError) and 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    return message(f"error: out of memory ({str(e).splitlines()[0] if str(e) else 'MemoryError'}): "
                   f"{memory.advice(pipeline.effective(config, (origin or {}).get('changes')), e)}", 3)


def dispatch(config, workdir: str, mode: str, checkpoint, origin, hook) -> None:
  """Runs `mode` and prints its table or text."""
  if mode in ('dry_run', 'time_step'):
    print(dry_run_lib.describe(config, origin, time_step=mode == 'time_step', checkpoint=checkpoint), flush=True)
  elif mode == 'bench':
    bench.run(config, workdir, origin)
  elif mode == 'flatness':
    pipeline.run_flatness(config, workdir, checkpoint, origin=origin)
  else:  # train, eval: a run, or a sweep of members
    run, table = ((members.run, members.format_summary) if members.enabled(config) else
                  (pipeline.run, report.format_session_table))
    print(table(run(config, workdir, mode=mode, checkpoint=checkpoint, origin=origin, hook=hook)), flush=True)


def enable_compilation_cache(config):
  """Where config.compilation_cache asks for it, JAX's persistent compilation cache in <cache folder>/
  jax_compilation_cache, for every program; returns the folder in use (one already set is kept), or None."""
  if not jax.config.jax_compilation_cache_dir and config.get('compilation_cache', False):
    jax.config.update('jax_compilation_cache_dir', os.path.join(sources.cache_dir(config), 'jax_compilation_cache'))
    if 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS' not in os.environ:
      jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  return jax.config.jax_compilation_cache_dir or None


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """run.py's flags, in `flag_values`."""
  fv = {'flag_values': flag_values}
  config_flags.DEFINE_config_file('config', None, "A config file (configs/cifar100.py:smoke) or a workdir's "
                                  "config.json; default: --workdir's config.json.", **fv)
  flag_values['config'].parser = ConfigFile()
  flags.DEFINE_string('workdir', None, 'Folder for config.json, metrics, checkpoints, results.', **fv)
  flags.DEFINE_enum('mode', 'train', ['train', 'eval', 'bench', 'flatness'],
                    'train: train and evaluate (resumes); eval: restore checkpoints and recompute results; '
                    'bench: time steps; flatness: flatness of a base checkpoint.', **fv)
  flags.DEFINE_string('checkpoint', None, 'A workdir whose base model to use instead of training one.', **fv)
  flags.DEFINE_bool('dry-run', False, "Print the effective config (presets, overrides, what each 'auto' becomes "
                    "here), the data, the cache and a base step's estimated cost; write nothing.", **fv)
  flags.DEFINE_bool('time-step', False, 'With --dry-run: measure one base step instead of estimating it.', **fv)


def parse_flags(argv: list, flag_values: flags.FlagValues = flags.FLAGS) -> list:
  """run.py's flags parser (without --config, --workdir's config.json is the config): a bad flag, value or
  --config.FIELD stops with one line (exit code 2) before anything is written."""
  try:
    return flag_values(with_recorded_config(argv))
  except Exception as e:  # whatever absl, ml_collections or ConfigFile raise, in their words
    sys.exit(message(f'error: {" ".join(str(e).split())}', 2))


def main_flags(argv: list, flag_values: flags.FlagValues = flags.FLAGS) -> int:
  """run.py's main, from its parsed flags: a saved config's values and --checkpoint hold unless changed."""
  f = flag_values.flag_values_dict()
  problem = usage_problem(argv, f['config'], f['workdir'], f['dry-run'])
  if problem:
    return message(f'error: {problem}', 2)
  spec, checkpoint, config = config_flags.get_config_filename(flag_values['config']), f['checkpoint'], f['config']
  origin = {'config': spec, 'changes': config_flags.get_override_values(flag_values['config'])}
  if spec.endswith('.json'):  # the fields where it departs from its method's presets: its command line set them
    method, items = registry.METHODS.get(config.method), flat_items(config.to_dict())
    presets = flat_items(dict(method.presets) if method else {})
    origin['changes'] = {**{k: items[k] for k, v in presets.items() if items.get(k) != v}, **origin['changes']}
    checkpoint = checkpoint or (files.read_json(spec).get(workdir_lib.SOURCE_KEY) or {}).get('path')
  return main(config, f['workdir'], f['mode'], checkpoint, origin=origin, dry_run=f['dry-run'],
              time_step=f['time-step'])


def usage_problem(argv: list, config, workdir: str | None, dry_run: bool) -> str | None:
  """What run.py's command line lacks or has too much of, in one line, or None."""
  if len(argv) > 1:
    return f'unexpected arguments: {argv[1:]}'
  if config is None:
    return ("--config is required: a config file such as configs/cifar100.py:smoke, or a workdir's config.json"
            + (f' ({workdir} holds no config.json to read instead)' if workdir else
               "; without it, --workdir of a run is read with that run's config.json"))
  if not (workdir or dry_run):
    return '--workdir is required (except with --dry-run)'
  return None


class ConfigFile(flags.ArgumentParser):
  """--config's parser: `load_config`, locked, refusing a --config.FIELD it lacks (in sys.argv, where
  ml_collections reads them too) in a LookupError, which absl passes on unprefixed."""

  def parse(self, argument):
    config = load_config(argument)
    refuse_unknown_fields(config, sys.argv)
    config.lock()
    return config


def load_config(spec: str) -> ml_collections.ConfigDict:
  """The config that `spec` (--config's value) names: a workdir's config.json (workdir.recorded_config)
  or get_config(arg) of `path[:arg]`; a one-line ValueError where it cannot be read."""
  path, _, arg = spec.partition(':')
  if not os.path.isfile(path):  # the close name, and the configs in its folder
    folder = os.path.dirname(path) or '.'
    options = sorted(f for f in os.listdir(folder) if f.endswith('.py') and not f.startswith('_')) \
        if os.path.isdir(folder) else []
    close = difflib.get_close_matches(os.path.basename(path), options, n=1, cutoff=0.6)
    raise ValueError(f'there is no file {path}' + (f'; did you mean {os.path.join(folder, close[0])}?' if close else '')
                     + (f' (configs in {folder}/: {", ".join(options)})' if options else ''))
  try:
    if path.endswith('.json'):
      return ml_collections.ConfigDict(workdir_lib.recorded_config(path, registry.method_sections()))
    module_spec = importlib.util.spec_from_file_location('_f2m_config', os.path.abspath(path))
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()
  except Exception as e:  # whatever the file raises for a bad argument
    raise ValueError(' '.join(str(e).split())) from e


def with_recorded_config(argv: list) -> list:
  """`argv`, with --config=W/config.json first where it gives no --config and --workdir W holds one."""
  if any(re.match(r'-{1,2}config(=|$)', a) for a in argv):
    return argv
  values = [a.partition('=')[2] if '=' in a else argv[i + 1] if i + 1 < len(argv) else ''
            for i, a in enumerate(argv) if re.match(r'-{1,2}workdir(=|$)', a)]
  path = os.path.join(values[-1], 'config.json') if values and values[-1] else ''
  return argv[:1] + [f'--config={path}'] + argv[1:] if os.path.isfile(path) else argv


def refuse_unknown_fields(config, argv: list) -> None:
  """A LookupError 'unknown config field ...' for the first --config.FIELD of `argv` that `config` lacks,
  with the names close to it there, or those there."""
  for name in [m[2] for m in (re.match(r'-{1,2}(no)?config\.([\w.]+)', a) for a in argv) if m]:
    node, path = config, 'config'
    for part in name.split('.'):
      if not hasattr(node, 'keys'):
        raise LookupError(f'unknown config field config.{name}: {path} is a value, not a section')
      if part not in node:
        close = difflib.get_close_matches(part, list(node.keys()), n=3, cutoff=0.5)
        raise LookupError(f'unknown config field config.{name}: {path} has no field {part!r}; ' + (
            f'did you mean {", ".join(f"{path}.{c}" for c in close)}?' if close else
            f'its fields are {", ".join(sorted(node.keys()))}'))
      node, path = node[part], f'{path}.{part}'
