"""The plain and F2M base programs of configs/folder.py:cpu (bench.program_case: one run, 10 steps a call)
timed in the same rounds, for the F2M/plain ratio under whatever XLA_FLAGS and load this process has.

  python experiments/results/cpu_folder_times/ratio.py
  XLA_FLAGS=--xla_cpu_multi_thread_eigen=false python experiments/results/cpu_folder_times/ratio.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..', '..'))

import ml_collections  # noqa: E402

from f2m_jax import sharding  # noqa: E402
from f2m_jax.run import bench, cli, pipeline  # noqa: E402

config = cli.load_config('configs/folder.py:cpu')
config.data.folder.update(train='/unused', num_base=60, way=5, num_sessions=9)
config = pipeline.resolve(config, reads_data=False)
exp = bench.bench_experiment(config, 'float32')
variant = lambda **changes: ml_collections.FrozenConfigDict({**exp.loss, **changes})
cases = [bench.program_case(exp, variant(enabled=False), 'plain', 0, 1, sharding.data_mesh()),
         bench.program_case(exp, variant(), 'f2m_shared', 2, 1, sharding.data_mesh())]
print(f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, load {open('/proc/loadavg').read().split()[:3]}")
print(bench.format_table(bench.time_cases(cases, 'float32', 1, 10)))
