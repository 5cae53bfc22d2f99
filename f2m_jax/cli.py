"""What run.py does per --mode, with user errors turned into one clear message and exit code 2, and
faults of the records (a checkpoint that cannot be read or written, a diverged training, a file
system error) into one line and exit code 3."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading

import jax
from absl import logging

from f2m_jax import backend
from f2m_jax import bench
from f2m_jax import members
from f2m_jax import pipeline
from f2m_jax import report
from f2m_jax import sharding
from f2m_jax.checkpoint import CheckpointError, CheckpointFault
from f2m_jax.data import sources
from f2m_jax.experiment import Interrupted, TrainingError
from f2m_jax.workdir import WorkdirError, flat_items

USER_ERRORS = (ValueError, FileNotFoundError, CheckpointError, WorkdirError)


def main(config, workdir: str, mode: str, checkpoint=None, origin=None, dry_run: bool = False) -> int:
  """Runs `mode`. `origin` ({'config': the --config argument, 'changes': {field: value} of the
  command line's --config.FIELD overrides}) is what the user changed: no method's presets replace
  those fields (f2m_jax/pipeline.py: resolve), and it goes into the start-up line and the records.
  SIGINT and SIGTERM stop a run at its next step or session boundary (exit code 130)."""
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  if dry_run:
    return run_mode(config, workdir, 'dry_run', checkpoint, origin, None)
  with stopping_at_boundaries(at_once='' if mode in ('train', 'eval') else mode) as hook:
    return run_mode(config, workdir, mode, checkpoint, origin, hook)


def describe(config, origin) -> str:
  """--dry-run: the effective config (presets and overrides applied, every 'auto' resolved, checked) as
  JSON, then what the method's presets and each 'auto' set. A sweep shows its first member's."""
  changes = (origin or {}).get('changes')
  if members.enabled(config):
    members.validate(config)
    config = members.member_configs(config)[0]
  resolved = pipeline.resolve(config, changes)
  before, after = flat_items(config.to_dict()), flat_items(resolved.to_dict())
  set_here = [f'  {k}: {before[k]!r} -> {after[k]!r}' for k in sorted(after) if before.get(k) != after[k]]
  return '\n'.join([json.dumps(resolved.to_dict(), indent=1, sort_keys=True),
                    f'set when the run starts (method {resolved.method}\'s presets, \'auto\' on {backend.devices()}):',
                    *(set_here or ['  nothing']), 'dry run: nothing was written'])


@contextlib.contextmanager
def stopping_at_boundaries(at_once: str = ''):
  """Yields a run hook that raises Interrupted at the first step or session boundary after a SIGINT
  or SIGTERM; a second signal stops at once. `at_once` names a mode that calls no hook and saves
  nothing (bench, flatness): its first signal ends the process (exit 130), since an exception raised
  from a handler can land in one of XLA's callbacks, which ignore it or crash. The previous handlers
  are restored afterwards."""
  received = []

  def handler(signum, frame):
    name = signal.Signals(signum).name
    if at_once:
      print(f'interrupted ({name}); --mode {at_once} saves nothing: rerun the same command', file=sys.stderr,
            flush=True)
      sys.stdout.flush()
      os._exit(130)
    if received:  # a KeyboardInterrupt passes the handlers that turn errors into messages
      raise KeyboardInterrupt(f'interrupted ({name}) at once')
    received.append(name)

  def hook(kind, **info):
    if received:
      where = ', '.join(f'{k} {v}' for k, v in info.items())
      raise Interrupted(f'interrupted ({received[0]}) after {"base " if kind == "base_step" else ""}{where}')

  main_thread = threading.current_thread() is threading.main_thread()  # only it may take signals
  previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
  try:
    yield hook
  finally:
    for s, h in previous.items():
      signal.signal(s, h)


def run_mode(config, workdir: str, mode: str, checkpoint, origin, hook) -> int:
  """`main`'s work: the mode, with errors as one line and exit codes (2 user error; 3 training
  stopped, a checkpoint that cannot be read back or written, a file system error; 130 interrupted)."""
  try:
    sharding.maybe_initialize_distributed(config.get('distributed', False))
    if mode != 'bench':
      enable_compilation_cache(config)
    if mode in ('train', 'eval') and members.enabled(config):
      summary = members.run(config, workdir, mode=mode, checkpoint=checkpoint, origin=origin, hook=hook)
      print(members.format_summary(summary), flush=True)
    elif mode in ('train', 'eval'):
      results = pipeline.run(config, workdir, mode=mode, checkpoint=checkpoint, origin=origin, hook=hook)
      print(report.format_session_table(results), flush=True)
    elif mode == 'flatness':
      pipeline.run_flatness(config, workdir, checkpoint, origin=origin)
    elif mode == 'bench':
      bench.run(config, workdir)
    elif mode == 'dry_run':
      print(describe(config, origin), flush=True)
    else:
      raise ValueError(f'--mode {mode} is not implemented yet')
    return 0
  except CheckpointFault as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 3
  except USER_ERRORS as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 2
  except TrainingError as e:
    print(f'training stopped: {e}', file=sys.stderr, flush=True)
    return 3
  except (Interrupted, KeyboardInterrupt) as e:
    print(f'{e or "interrupted"}; every checkpoint written is complete: rerun the same command to resume',
          file=sys.stderr, flush=True)
    return 130
  except OSError as e:  # the file system refused a write or read that the checks could not foresee
    print(f'error: {type(e).__name__}: {e}', file=sys.stderr, flush=True)
    return 3


def enable_compilation_cache(config):
  """Where config.compilation_cache asks for it, JAX's persistent compilation cache in <cache folder>/
  jax_compilation_cache, for every program however fast it compiled (JAX keeps only those of 1 s or more
  unless JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says otherwise; figures: experiments/results/README.md).
  Returns the folder in use (one already set, e.g. by JAX_COMPILATION_CACHE_DIR, is kept as is), or None."""
  if jax.config.jax_compilation_cache_dir:
    return jax.config.jax_compilation_cache_dir
  if not config.get('compilation_cache', False):
    return None
  path = os.path.join(sources.cache_dir(config), 'jax_compilation_cache')
  jax.config.update('jax_compilation_cache_dir', path)
  if 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS' not in os.environ:
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  return path
