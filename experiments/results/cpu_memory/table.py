"""The calibration table: each run's estimate (f2m_jax/memory.py) against its measured peak resident memory
(NAME.time, written by measure.sh), with the counts behind the estimate. From the repository root:
python experiments/results/cpu_memory/table.py"""
import glob
import os
import re
import shlex
import sys

sys.path.insert(0, os.getcwd())
from absl import flags  # noqa: E402  pylint: disable=g-import-not-at-top
from ml_collections import config_flags  # noqa: E402

from f2m_jax import cli, memory, pipeline  # noqa: E402

GIB = 2 ** 30


def effective_config(argv: list):
  values = flags.FlagValues()
  cli.define_flags(values)
  sys.argv = ['run.py'] + argv  # where config_flags finds the overrides
  cli.parse_flags(sys.argv, values)
  return pipeline.effective(values['config'].value, config_flags.get_override_values(values['config']))


# The sizes that ran out of memory, not run here (over the 12 GiB a run may take on this shared machine).
NOT_RUN = {'eval354535': '--config.eval.batch_size=354535', 'eval709070': '--config.eval.batch_size=709070',
           'pool22000': '--config.data.synthetic.train_per_class=22000'}


def row(name: str, argv: list, rss=None) -> str:
  parts = memory.estimate(effective_config(argv))
  need = memory.verdict(parts, 0, 0)[2]
  shown = ', '.join(f'{p[0]} {p[2] / GIB:.2f}' for p in parts if p[2] >= 0.005 * GIB)
  measured = f'{rss / GIB:.2f} | {rss / need:.2f}' if rss else 'not run | '
  return f'| {name} | {need / GIB:.2f} | {measured} | {shown} |'


def main():
  print('| run | estimate, GiB | measured peak RSS, GiB | measured / estimate | the estimate\'s parts, GiB |')
  print('|---|---:|---:|---:|---|')
  for path in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), '*.time'))):
    text = open(path).read()
    name, command = text.split('\n', 1)[0].split(': ', 1)
    rss = int(re.search(r'Maximum resident set size \(kbytes\): (\d+)', text)[1]) * 1024
    if '--dry-run' in command:  # nothing run: the runtime's own memory
      print(f'| {name} (--dry-run: imports, the config) | | {rss / GIB:.2f} | | |')
    else:
      print(row(name, shlex.split(command)[2:], rss))
  for name, change in NOT_RUN.items():
    print(row(name, ['--config', 'configs/cifar100.py:smoke', change]))


if __name__ == '__main__':
  main()
