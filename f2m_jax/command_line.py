"""run.py's command line, checked before anything heavy is imported: a bad --config file or argument,
an override of a field that does not exist or a value of the wrong type is one line naming it and what
is allowed (exit code 2), in a fraction of a second. Imports no JAX (run.py imports f2m_jax.cli, and
with it JAX, only for a command line that parsed)."""
from __future__ import annotations

import difflib
import importlib.util
import os
import re
import sys

from absl import flags

# Fields renamed since workdirs were written: old name -> (new name, {old value: new value}). The old
# name given as an override is refused with the new one; a saved config.json is read in the new names
# (workdir.renamed).
RENAMED_FIELDS = {'noise.clean_backward': ('noise.backward_weights', {True: 'clean', False: 'noisy'}),
                  'incremental.normalize_base_prototypes': ('incremental.prototype_norm',
                                                            {False: 'raw', True: 'unit_base'})}


def parse_flags(argv):
  """run.py's absl flags parser: a bad --config file or argument, an override of a field that does not
  exist, or a value of the wrong type stops with one line naming it and what is allowed (exit code 2)
  before anything is written. Values out of range are caught by f2m_jax/validation.py, also before
  the workdir is created."""
  problem = config_problem(argv)
  if not problem:
    try:
      return flags.FLAGS(argv)
    except Exception as e:  # whatever absl or ml_collections raise
      message = ' '.join(str(e).split())
      match = re.match(r"flag --(config\.[\w.]+)=(.*?): (.*)", message)  # absl's 'flag --config.F=V: reason'
      problem = unknown_field(argv) or (f'{match[1]}={match[2]!r} is invalid: {match[3]}' if match else message)
  print(f'error: {problem}', file=sys.stderr, flush=True)
  sys.exit(2)


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
  return [a.split('=', 1)[1] if a.startswith(f'--{name}=') else argv[i + 1]
          for i, a in enumerate(argv) if a.startswith(f'--{name}=') or (a == f'--{name}' and i + 1 < len(argv))]


def load_config_file(spec: str):
  """get_config(arg) of `path[:arg]` (the --config flag's value), without overrides."""
  path, _, arg = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('_f2m_config', os.path.abspath(path))
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def unknown_field(argv):
  """'unknown config field ...' for the first --config.FIELD in argv that the config lacks, with
  the close names (or the renamed field's new name), or None."""
  config = load_config_file(_flag_values(argv, 'config')[-1])
  for name in (a[len('--config.'):].partition('=')[0] for a in argv if a.startswith('--config.')):
    *parents, leaf = name.split('.')
    node = config
    for i, part in enumerate(parents):
      if part not in node or not hasattr(node[part], 'keys'):
        near = difflib.get_close_matches(part, [k for k in node.keys() if hasattr(node[k], 'keys')], n=1)
        return (f"unknown config field config.{name}; config.{'.'.join(parents[:i + 1])} does not exist"
                + (f' (did you mean config.{".".join(parents[:i] + near)}?)' if near else ''))
      node = node[part]
    if leaf not in node:
      if name in RENAMED_FIELDS:
        new, values = RENAMED_FIELDS[name]
        options = ' or '.join(f'--config.{new}={v!r} (the old {k})' for k, v in values.items())
        return f'config.{name} was renamed: use {options}'
      close = difflib.get_close_matches(leaf, list(node.keys()), n=3, cutoff=0.5)
      hint = (f'did you mean {", ".join(f"config.{name[:-len(leaf)]}{c}" for c in close)}?' if close
              else f'the fields there are {", ".join(sorted(node.keys()))}')
      return f'unknown config field config.{name}; {hint}'
  return None
