"""Host work ahead of the device: `prefetch` runs a producer in a background thread, `depth` items ahead.

The base loop uses it for what the host prepares per call (batch indices, and on the host data path
the gathered images), put on the device before the device needs them, so the host never holds the
accelerator up. The items come back in order and are exactly what the producer returns; an error
in the producer is raised in the consumer, at the item where it happened.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar('T')
_END = object()


class _Failed:
  def __init__(self, error: BaseException):
    self.error = error


def prefetch(produce: Callable[..., T], items: Iterable, depth: int) -> Iterator[T]:
  """Yields produce(item) for each item; with depth >= 1 a background thread computes up to `depth`
  results ahead of the consumer, with depth 0 each is computed when asked for (no thread). Closing
  the generator (or leaving a `for` loop over it early) stops the thread."""
  if depth < 0:
    raise ValueError(f'prefetch depth={depth} is invalid: must be >= 0 (0: no background thread)')
  if depth == 0:
    yield from map(produce, items)
    return
  results: queue.Queue = queue.Queue(maxsize=depth)
  stop = threading.Event()

  def put(value) -> bool:
    while not stop.is_set():
      try:
        results.put(value, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def work():
    try:
      for item in items:
        if not put(produce(item)):
          return
    except BaseException as e:  # pylint: disable=broad-except  (handed to the consumer)
      put(_Failed(e))
      return
    put(_END)

  thread = threading.Thread(target=work, name='f2m-prefetch', daemon=True)
  thread.start()
  try:
    while True:
      value = results.get()
      if value is _END:
        return
      if isinstance(value, _Failed):
        raise value.error
      yield value
  finally:
    stop.set()
    thread.join()
