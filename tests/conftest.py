"""Shared test setup: repo root on sys.path (for `configs`), the real data folder, the smoke config."""
import os
import pathlib
import sys
import tempfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

# Many tests compile the same smoke-sized programs (a ResNet-20 F2M step takes 30 s or more to
# compile on 2 cores); JAX's persistent compilation cache lets every later test, and every run.py
# subprocess (they inherit the variable), load them instead. Set before jax is imported.
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(
    os.environ.get('F2M_CACHE_DIR') or tempfile.gettempdir(), 'jax_compilation_cache'))

DATA_DIR = pathlib.Path(os.environ.get('F2M_DATA_DIR') or REPO.parent / 'shared' / 'data').resolve()


@pytest.fixture
def smoke_config():
  from configs import cifar100
  return cifar100.get_config('smoke')


def without_provenance(results: dict) -> dict:
  """Results minus their provenance (when, where, how long and the config as given): two runs that
  compute the same thing must agree on everything else."""
  return {k: v for k, v in results.items() if k != 'provenance'}


def tiny_protocol(config, method: str):
  """The smoke config shrunk further for methods that train per session: 6 base classes and 2
  sessions of 2-way 5-shot, 2 runs, 40 base steps."""
  config.method = method
  config.runs = 2
  config.data.synthetic.update(num_base=6, way=2, num_sessions=3, train_per_class=20, test_per_class=10)
  config.base.update(steps=40, milestones=(30,), batch_size=24, log_every=10, checkpoint_every=20)
  return config


class Interrupt(Exception):
  pass


def resumed_after_interruption(make_config, workdir: str, run: int, session: int) -> dict:
  """pipeline.run(make_config(), workdir) stopped right after run `run` saved session `session`,
  then run again (it resumes); returns the second call's results."""
  from f2m_jax import pipeline  # pylint: disable=g-import-not-at-top

  def stop(phase, **info):
    if phase == 'session' and (info.get('run'), info.get('session')) == (run, session):
      raise Interrupt

  with pytest.raises(Interrupt):
    pipeline.run(make_config(), workdir, hook=stop)
  return pipeline.run(make_config(), workdir)
