"""Entry point: python run.py --config configs/cifar100.py[:arg] --workdir DIR [--mode train|eval].

Kept thin on purpose: it parses flags (f2m_jax.command_line, which imports no JAX, so that a bad command
line is answered at once) and hands over to f2m_jax.cli (which calls f2m_jax.pipeline).
"""
import sys

from absl import app, flags
from ml_collections import config_flags

from f2m_jax import command_line

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A config file, e.g. configs/cifar100.py:smoke.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Folder for config.json, metrics, checkpoints, results.')
_MODE = flags.DEFINE_enum('mode', 'train', ['train', 'eval', 'bench', 'flatness'],
                          'train: train and evaluate (resumes); eval: restore checkpoints and recompute results; '
                          'bench: time steps; flatness: flatness of a base checkpoint.')
_CHECKPOINT = flags.DEFINE_string('checkpoint', None, 'A workdir whose base model to use instead of training one.')
_DRY_RUN = flags.DEFINE_bool('dry-run', False, 'Print the effective config (presets, overrides, what each '
                             "'auto' becomes here) and stop without writing anything.")
flags.mark_flags_as_required(['config'])


def parse_flags(argv):
  """command_line.parse_flags, which needs no JAX; where argv names a flag that run.py does not define
  (one of the libraries', such as orbax's --experimental_orbax_use_distributed_barrier), after importing
  f2m_jax.cli, whose imports define those flags."""
  args = argv[1:argv.index('--')] if '--' in argv else argv[1:]
  names = {a.lstrip('-').split('=')[0] for a in args if a.startswith('-') and not a.lstrip('-').startswith('config.')}
  if names - {n for name in flags.FLAGS for n in (name, 'no' + name)}:
    from f2m_jax import cli  # pylint: disable=g-import-not-at-top,unused-import
  return command_line.parse_flags(argv)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  origin = {'config': config_flags.get_config_filename(flags.FLAGS['config']),  # what the user changed
            'changes': config_flags.get_override_values(flags.FLAGS['config'])}
  if not (_WORKDIR.value or _DRY_RUN.value):
    raise app.UsageError('--workdir is required (except with --dry-run)')
  from f2m_jax import cli  # pylint: disable=g-import-not-at-top  (JAX and the pipeline: the command line parsed)
  return cli.main(_CONFIG.value, _WORKDIR.value, _MODE.value, _CHECKPOINT.value, origin=origin, dry_run=_DRY_RUN.value)


if __name__ == '__main__':
  sys.exit(app.run(main, flags_parser=parse_flags))
