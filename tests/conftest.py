"""Shared test setup: repo root on sys.path (for `configs`), the real data folder, the smoke config."""
import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

DATA_DIR = pathlib.Path(os.environ.get('F2M_DATA_DIR') or REPO.parent / 'shared' / 'data').resolve()


@pytest.fixture
def smoke_config():
  from configs import cifar100
  return cifar100.get_config('smoke')


def without_provenance(results: dict) -> dict:
  """Results minus their provenance (when, where, how long and the config as given): two runs that
  compute the same thing must agree on everything else."""
  return {k: v for k, v in results.items() if k != 'provenance'}
