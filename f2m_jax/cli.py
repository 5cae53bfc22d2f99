"""What run.py does per --mode, with user errors turned into one clear message and exit code 2."""
from __future__ import annotations

import sys

from f2m_jax.checkpoint import CheckpointError
from f2m_jax.workdir import WorkdirError

USER_ERRORS = (ValueError, FileNotFoundError, CheckpointError, WorkdirError)


def main(config, workdir: str, mode: str, checkpoint=None) -> int:
  from absl import logging
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  from f2m_jax import pipeline, report, sharding
  try:
    sharding.maybe_initialize_distributed(config.get('distributed', False))
    if mode in ('train', 'eval'):
      results = pipeline.run(config, workdir, mode=mode, checkpoint=checkpoint)
      print(report.format_session_table(results), flush=True)
      print(f'results written to {workdir}/results.json and results.csv', flush=True)
      return 0
    if mode == 'flatness':
      pipeline.run_flatness(config, workdir, checkpoint)
      return 0
    if mode == 'bench':
      from f2m_jax import bench
      bench.run(config, workdir)
      return 0
    raise ValueError(f'--mode {mode} is not implemented yet')
  except USER_ERRORS as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 2
  except pipeline.TrainingError as e:
    print(f'training stopped: {e}', file=sys.stderr, flush=True)
    return 3
