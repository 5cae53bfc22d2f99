"""The member table: S runs' base steps in one program against S times one run's (docs/performance.md,
"Seeds and sweeps in one program"). For every S of --sizes (and S = 1), the F2M base program of S members
as a seed sweep runs it (f2m_jax/run/bench.py's `program_case`, on random data of the config's shapes, no data
read), all timed in the same rounds (`bench.time_cases`). Printed as a table: ms per step of the S members,
run-steps per second, and the speed-up over S single steps; written to OUT/members.json.

  python experiments/bench_members.py --config configs/cifar100.py --out OUT [--sizes 1 2 4 8]
      [--map unroll|vmap] [--dtype float32|bfloat16] [--M 2] [--iters 5] [--warmup 1]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

from f2m_jax.run import bench  # noqa: E402
from f2m_jax.run import cli  # noqa: E402
from f2m_jax.run import pipeline  # noqa: E402


def member_cases(config, sizes) -> list:
  """bench.Case of the config's base program for S members, for every S of `sizes` and S = 1, ascending."""
  exp = bench.bench_experiment(config, config.model.dtype)
  return [bench.program_case(exp, {}, f'members_{s}_{config.members.map}', s, s)
          for s in sorted(set((1,) + tuple(sizes)))]


def format_members(records) -> str:
  """S runs' base steps in one program against S times one run's (the first record, S = 1)."""
  single = records[0]
  lines = [f"{'members':<20} {'S':>3} {'ms per step':>12} {'run-steps/s':>12} {'x S single steps':>17} {'compile s':>9}"]
  for r in records:
    s = r['M']
    speedup = s * single['step_ms_median'] / r['step_ms_median']
    lines.append(f"{r['variant']:<20} {s:>3} {r['step_ms_median']:>12.1f} {1e3 * s / r['step_ms_median']:>12.2f} "
                 f"{speedup:>17.2f} {r['compile_s']:>9.1f}")
  return '\n'.join(lines)


def main(argv=None) -> list:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--config', default='configs/cifar100.py')
  p.add_argument('--out', required=True)
  p.add_argument('--sizes', type=int, nargs='+', default=[1, 2, 4])
  p.add_argument('--map', choices=('unroll', 'vmap'), default='unroll', help='members.map')
  p.add_argument('--dtype', choices=('float32', 'bfloat16'), default='float32', help='model.dtype')
  p.add_argument('--M', type=int, default=2, help='noise.M')
  p.add_argument('--iters', type=int, default=5)
  p.add_argument('--warmup', type=int, default=1)
  args = p.parse_args(argv)
  config = cli.load_config(args.config)
  config.members.map, config.model.dtype, config.noise.M = args.map, args.dtype, args.M
  config = pipeline.resolve(config, reads_data=False)
  records = bench.time_cases(member_cases(config, args.sizes), args.dtype, args.warmup,
                             args.iters)
  print(format_members(records), flush=True)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, 'members.json'), 'w') as f:
    json.dump({'config': args.config, 'args': vars(args), 'records': records}, f, indent=1)
  return records


if __name__ == '__main__':
  main()
