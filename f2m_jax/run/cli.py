"""run.py's command line (absl flags; --config through ml_collections' config_flags, locked), and
what it does per --mode: user errors are one clear line and exit code 2; faults of the records (a
checkpoint that cannot be read or written, a diverged training, a file system error, memory) one
line and exit code 3."""
import contextlib
import difflib
import glob
import os
import re
import sys

import jax
import ml_collections
from absl import flags
from ml_collections import config_flags

from f2m_jax import files, registry, sharding
from f2m_jax.data import sources
from f2m_jax.experiment import Interrupted, TrainingError
from f2m_jax.run import bench, dry_run, members, memory, pipeline, report, stopping
from f2m_jax.run import workdir as workdir_lib
from f2m_jax.run.checkpoint import quiet_orbax
from f2m_jax.run.stopping import message


# pylint: disable-next=redefined-outer-name
def main(config, workdir, mode, checkpoint=None, origin=None, dry_run=False):
  """Runs `mode` (returns its exit code). `origin` ({'config', 'changes'}: the --config argument
  and the command line's overrides) is what the user changed: no method's presets replace those
  fields, and it goes into the records."""
  at_once = f'--mode {mode}'  # a mode that saves nothing: a signal ends it at once
  if dry_run:
    at_once, mode = '--dry-run', 'dry_run'
  elif mode in ('train', 'eval'):
    at_once = ''
  with quiet_orbax(), stopping.Stop(at_once and f'{at_once} saves nothing: rerun the same command',
                                    Interrupted) as stop:
    return stop.exit(run_mode(config, workdir, mode, checkpoint, origin, stop.hook))


def run_mode(config, workdir, mode, checkpoint, origin, hook):
  """`main`'s work: the mode (`dispatch`), with errors as one line and exit codes (2 user error;
  3 training stopped, a checkpoint that cannot be read back or written, a file system error, memory;
  130 interrupted)."""
  try:
    sharding.maybe_initialize_distributed(config.get('distributed'))
    if mode in ('train', 'eval', 'flatness'):  # bench and a dry run write nothing, programs neither
      enable_compilation_cache(config)
    dispatch(config, workdir, mode, checkpoint, origin, hook)
    return 0
  except (ValueError, FileNotFoundError, files.CheckpointError, files.WorkdirError) as e:
    return message(f'error: {e}', 3 if isinstance(e, files.CheckpointFault) else 2)
  except TrainingError as e:
    return message(f'training stopped: {e}', 3)
  except (Interrupted, KeyboardInterrupt) as e:
    return message(f'{e or "interrupted"}; {stopping.RESUME}', stopping.EXIT_CODE)
  except OSError as e:  # the file system refused a write or read that the checks could not foresee
    return message(f'error: {files.describe_os_error(e)}', 3)
  except (MemoryError, jax.errors.JaxRuntimeError) as e:  # an allocation failed: the field to lower
    if not isinstance(e, MemoryError) and 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    config = pipeline.effective(config, (origin or {}).get('changes'))
    return message(f'error: out of memory ({(str(e) or "MemoryError").splitlines()[0]}): '
                   f'{memory.advice(config, e)}', 3)


def dispatch(config, workdir, mode, checkpoint, origin, hook):
  """Runs `mode` and prints its table or text."""
  if mode == 'dry_run':
    print(dry_run.describe(config, origin, checkpoint))
  elif mode == 'bench':
    bench.run(config, workdir, origin)
  elif mode == 'flatness':
    if members.enabled(config):  # a call measures one base model
      n = len(config.members.seeds or config.members.field_values)
      raise ValueError(f'--mode flatness measures one base model, and {workdir} holds a sweep of '
                       f'{n}: pass --workdir {workdir}/member_0 (to member_{n - 1}), one a call')
    pipeline.run_flatness(config, workdir, checkpoint, origin)
  else:  # train, eval: a sweep of members, or a run
    run = members.run if members.enabled(config) else pipeline.run
    print(report.format_session_table(run(config, workdir, mode, checkpoint, hook, origin)))


def enable_compilation_cache(config):
  """Where config.compilation_cache asks for it, JAX's persistent compilation cache in <cache
  folder>/jax_compilation_cache, for every program (one already set is kept)."""
  if not jax.config.jax_compilation_cache_dir and config.get('compilation_cache'):
    jax.config.update('jax_compilation_cache_dir',
                      os.path.join(sources.cache_dir(config), 'jax_compilation_cache'))
    if 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS' not in os.environ:
      jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)


def define_flags(flag_values=flags.FLAGS):
  """run.py's flags, in `flag_values` (absl's FlagValues)."""
  config_flags.DEFINE_config_file('config', None, 'A config file (configs/cifar100.py:smoke) or a '
                                  "workdir's config.json; default: --workdir's config.json.",
                                  flag_values=flag_values)
  flag_values['config'].parser = ConfigFile(flag_values['config'].parser)
  flags.DEFINE_string('workdir', None, 'Folder for config.json, metrics, checkpoints, results.',
                      flag_values=flag_values)
  flags.DEFINE_enum('mode', 'train', ['train', 'eval', 'bench', 'flatness'],
                    'train: train and evaluate (resumes); eval: restore checkpoints and recompute '
                    'results; bench: time steps; flatness: flatness of a base checkpoint.',
                    flag_values=flag_values)
  flags.DEFINE_string('checkpoint', None, 'A workdir whose base model to use instead of training '
                      'one.', flag_values=flag_values)
  flags.DEFINE_bool('dry-run', False, "Print the effective config (presets, overrides, what each "
                    "'auto' becomes here), the data, the cache and the base training's time here "
                    '(a step compiled and timed); write nothing.', flag_values=flag_values)


def parse_flags(argv, flag_values=flags.FLAGS):
  """run.py's flags parser (without --config, --workdir W's config.json is the config): a bad flag,
  value or --config.FIELD stops with one line (exit code 2) before anything is written."""
  given = flags.FlagValues()
  for name in ('config', 'workdir'):
    flags.DEFINE_string(name, None, '', flag_values=given)
  with contextlib.suppress(flags.Error):  # (a --workdir without a value: the parse below says so)
    given(argv, known_only=True)
  recorded = f'{given.workdir}/config.json'
  if given.config is None and given.workdir and os.path.isfile(recorded):
    argv = [argv[0], f'--config={recorded}', *argv[1:]]
  try:
    return flag_values(argv)
  except Exception as e:  # whatever absl, ml_collections or ConfigFile raise, in their words
    sys.exit(message(f'error: {" ".join(str(e).split())}', 2))


def main_flags(argv, flag_values=flags.FLAGS):
  """run.py's main, from its parsed flags: a saved config's values and --checkpoint hold unless
  changed."""
  # pylint: disable-next=redefined-outer-name
  config, workdir, dry_run = flag_values.config, flag_values.workdir, flag_values['dry-run'].value
  problem = usage_problem(argv, config, workdir, dry_run)
  if problem:
    return message(f'error: {problem}', 2)
  spec = config_flags.get_config_filename(flag_values['config'])
  changes = config_flags.get_override_values(flag_values['config'])
  checkpoint = flag_values.checkpoint
  if spec.endswith('.json'):  # where it departs from its method's presets: its command line set it
    items = workdir_lib.flat_items(config.to_dict())
    presets = getattr(registry.METHODS.get(config.method), 'presets', {})
    changes = {**{k: items[k] for k, v in presets.items() if items.get(k) != v}, **changes}
    checkpoint = checkpoint or (files.read_json(spec).get(workdir_lib.SOURCE_KEY) or {}).get('path')
  return main(config, workdir, flag_values.mode, checkpoint, {'config': spec, 'changes': changes},
              dry_run)


def usage_problem(argv, config, workdir, dry_run):
  """What run.py's command line lacks or has too much of, in one line, or None."""
  required = ('--config is required: a config file such as configs/cifar100.py:smoke, or a '
              "workdir's config.json")
  if len(argv) > 1:
    return f'unexpected arguments: {argv[1:]}'
  if config is None:
    if workdir:
      return f'{required} ({workdir} holds no config.json to read instead)'
    return f"{required}; without it, --workdir of a run is read with that run's config.json"
  if not (workdir or dry_run):
    return '--workdir is required (except with --dry-run)'
  return None


def load_config(spec):
  """The config `spec` names as --config reads it (configs/cifar100.py:smoke, a workdir's
  config.json), for scripts and tests; a one-line ValueError where it cannot be read."""
  flag_values = flags.FlagValues()
  define_flags(flag_values)
  try:
    flag_values(['load_config', f'--config={spec}'])
  except flags.Error as e:
    raise ValueError(' '.join(str(e).split())) from None
  return flag_values.config


class ConfigFile(flags.ArgumentParser):
  """--config's parser: config_flags' own (`files`: `path:arg` is the file's get_config(arg)), or
  a workdir's config.json (workdir.recorded_config); locked, and a --config.FIELD it lacks (in
  sys.argv, where config_flags reads them) refused in a LookupError, which absl passes on."""

  def __init__(self, files):
    self.files = files

  def parse(self, spec):  # pylint: disable=arguments-renamed
    path = spec.partition(':')[0]
    if not os.path.isfile(path):
      beside = glob.glob(os.path.join(os.path.dirname(path), '*.py'))  # the configs there
      raise ValueError(f'there is no file {path}{suggest(path, beside)}')
    if path.endswith('.json'):
      config = ml_collections.ConfigDict(workdir_lib.recorded_config(path))
    else:
      try:
        config = self.files.parse(spec)
      except ValueError as e:  # the file's own error: the last line of config_flags' traceback
        raise ValueError(str(e).strip().splitlines()[-1]) from None
    refuse_unknown_fields(config, sys.argv)
    config.lock()
    return config


def refuse_unknown_fields(config, argv):
  """A LookupError naming the first --config.FIELD of `argv` that `config` lacks, and the fields
  close to it."""
  for name in re.findall(r'^-{1,2}(?:no)?config\.([\w.]+)', '\n'.join(argv), re.M):
    node, where = config, 'config'
    for part in name.split('.'):
      fields = list(getattr(node, 'keys', list)())  # a section's fields; a value has none
      if part not in fields:
        raise LookupError(f'unknown config field config.{name}: {where} has no field {part!r}'
                          + suggest(part, fields, f'{where}.'))
      node, where = node[part], f'{where}.{part}'


def suggest(name, options, prefix=''):
  """'; did you mean <prefix><option>?' for the options close to `name`, else '; there are ...'."""
  close = difflib.get_close_matches(name, options, cutoff=0.5)
  if close:
    return f'; did you mean {", ".join(prefix + c for c in close)}?'
  return f'; there are {", ".join(sorted(options))}' if options else ''
