"""f2m_jax.prefetch: the base loop's host work done ahead in a background thread.
The items come back in order and unchanged, the producer really runs ahead (by `depth`, no more),
its errors reach the consumer at the right item, and leaving early stops the thread."""
from __future__ import annotations

import threading
import time

import pytest

from f2m_jax.prefetch import prefetch


def _alive() -> list:
  return [t for t in threading.enumerate() if t.name == 'f2m-prefetch']


@pytest.mark.parametrize('depth', [0, 1, 3])
def test_items_in_order_and_unchanged(depth):
  assert list(prefetch(lambda x: (x, x * x), range(20), depth)) == [(x, x * x) for x in range(20)]
  assert not _alive()


def _wait_for(condition, seconds=10.0) -> bool:
  end = time.time() + seconds
  while time.time() < end:
    if condition():
      return True
    time.sleep(0.01)
  return condition()


def test_producer_runs_ahead_by_depth_and_no_more():
  produced = []
  items = prefetch(lambda x: produced.append(x) or x, range(100), 3)
  assert next(items) == 0
  # While the consumer holds item 0: 3 results queued and one more produced, waiting for room.
  assert _wait_for(lambda: len(produced) == 5)
  time.sleep(0.3)
  assert len(produced) == 5
  assert next(items) == 1
  assert _wait_for(lambda: len(produced) == 6)
  items.close()
  assert not _alive()


def test_without_depth_nothing_is_computed_ahead():
  produced = []
  items = prefetch(lambda x: produced.append(x) or x, range(10), 0)
  assert next(items) == 0 and produced == [0] and not _alive()


def test_producer_error_is_raised_at_its_item():
  def produce(x):
    if x == 4:
      raise KeyError(f'bad item {x}')
    return x

  got = []
  with pytest.raises(KeyError, match='bad item 4'):
    for x in prefetch(produce, range(10), 2):
      got.append(x)
  assert got == [0, 1, 2, 3] and not _alive()


def test_leaving_early_stops_the_thread():
  produced = []
  for x in prefetch(lambda x: produced.append(x) or x, range(10_000), 2):
    if x == 3:
      break
  assert _wait_for(lambda: not _alive())
  assert len(produced) <= 3 + 1 + 2 + 1  # up to item 3, the queue and one waiting to be put


def test_negative_depth_is_refused():
  with pytest.raises(ValueError, match=r'prefetch depth=-1 is invalid: must be >= 0'):
    list(prefetch(lambda x: x, range(3), -1))
