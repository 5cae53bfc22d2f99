"""The calibration table: each run's estimate (f2m_jax/run/memory.py: the runtime, the decoded images and the
largest phase, the programs' sizes from XLA's memory analysis) against its measured peak resident memory
(NAME.time, written by measure.sh; OUT: another folder of them). From the repository root, F2M_DATA_DIR set
as for measure.sh: python experiments/results/cpu_memory/table.py [NAME...]"""
import glob
import os
import re
import shlex
import sys

sys.path.insert(0, os.getcwd())
from absl import flags  # noqa: E402  pylint: disable=g-import-not-at-top
from ml_collections import config_flags  # noqa: E402

from f2m_jax.data import sources  # noqa: E402
from f2m_jax.experiment import Experiment  # noqa: E402
from f2m_jax.run import cli, memory, pipeline  # noqa: E402

GIB = 2 ** 30


def effective_config(argv: list):
  values = flags.FlagValues()
  cli.define_flags(values)
  sys.argv = ['run.py'] + argv  # where config_flags finds the overrides
  cli.parse_flags(sys.argv, values)
  changes = config_flags.get_override_values(values['config'])
  config = pipeline.resolve(values['config'].value, changes, reads_data=False)
  config.memory_check = True  # the runs measured turned it off
  return config


# The sizes that ran out of memory, not run here (over the 12 GiB a run may take on this shared machine).
NOT_RUN = {'eval354535': '--config.eval.batch_size=354535', 'eval709070': '--config.eval.batch_size=709070',
           'pool22000': '--config.data.synthetic.train_per_class=22000'}


def row(name: str, argv: list, rss=None) -> str:
  """The run's estimate as the check makes it on a CPU: the runtime, the decoded images and the largest
  phase of rendering (`generated`, before the data is read) and the programs (`programs`, once it is
  read, times PROGRAMS)."""
  config = effective_config(argv)
  images, phases = memory.generated(config)
  if not name.startswith('pool22000'):  # 17 GiB of rendering: its programs are the smoke's
    images, programs = memory.programs(Experiment.create(config, sources.load_benchmark(config)), 1)
    phases = {**{f'rendering ({k})': v for k, v in phases.items()},
              **{k: memory.PROGRAMS * v for k, v in programs.items()}}  # with the host's copies
  need = memory.RUNTIME + images + max(phases.values())
  shown = ', '.join(f'{k} {v / GIB:.2f}' for k, v in {'images': images, **phases}.items() if v >= 0.005 * GIB)
  measured = f'{rss / GIB:.2f} | {rss / need:.2f}' if rss else 'not run | '
  return f'| {name} | {need / GIB:.2f} | {measured} | runtime {memory.RUNTIME / GIB:.2f}, {shown} |'


def main():
  print('| run | estimate, GiB | measured peak RSS, GiB | measured / estimate | the estimate\'s parts, GiB (the '
        'programs: under the field the check names) |')
  print('|---|---:|---:|---:|---|', flush=True)
  folder = os.environ.get('OUT') or os.path.dirname(os.path.abspath(__file__))  # as measure.sh's
  names = sys.argv[1:]
  for path in sorted(glob.glob(os.path.join(folder, '*.time'))):
    text = open(path).read()
    name, command = text.split('\n', 1)[0].split(': ', 1)
    if names and name not in names:
      continue
    rss = int(re.search(r'Maximum resident set size \(kbytes\): (\d+)', text)[1]) * 1024
    if '--dry-run' in command:  # nothing run: the runtime's own memory
      print(f'| {name} (--dry-run: imports, the config) | | {rss / GIB:.2f} | | |')
    else:
      print(row(name, shlex.split(command)[2:], rss), flush=True)
  for name, change in NOT_RUN.items():
    if not names or name in names:
      print(row(name, ['--config', 'configs/cifar100.py:smoke', change]), flush=True)


if __name__ == '__main__':
  main()
