"""A run's jitted programs after session 1, built once and shared, and compiled ahead in a
background thread while session 1 trains (`compile_ahead`).

XLA compiles a jitted function at its first call with new shapes. The incremental sessions' programs
(the fine-tuning of a group of runs, the embeddings, NCM) compiled at the first session, after the
minutes of base training during which the host mostly waits for the accelerator (what that cost:
experiments/results/README.md, 'Figures behind the code's choices'). Their
shapes are known before training starts, so `Programs.compile_ahead` lowers and compiles them from
abstract arguments (`jax.ShapeDtypeStruct`) in a background thread, started once the base step's
own program has compiled (`pipeline.compiling_ahead`); a jitted function keeps the
executable that `.lower(...).compile()` built for those shapes, so the first real call does not
compile again. The programs and their results are the same; only when they compile changes. A
failed compile ahead is reported and left to the first call.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Callable, Hashable, Optional, Sequence, Tuple

import jax

# (name, build, lower): `build()` makes the program (once per run; `Programs.get(name, build)` returns
# it), `lower(program)` its jax.stages.Lowered for the shapes of a call to come.
Plan = Tuple[Hashable, Callable[[], Any], Callable[[Any], Any]]

MODES = ('auto', 'on', 'off')


def enabled(mode: str) -> bool:
  """config.compile_ahead: 'on', 'off', or 'auto' (on where the backend is no CPU: there the base
  steps use every core, so compiling beside them saves nothing)."""
  return mode == 'on' or (mode == 'auto' and jax.default_backend() != 'cpu')


class Programs:
  """Named programs, each built by its first `get` (or compile-ahead plan) and shared afterwards."""

  def __init__(self):
    self._lock = threading.Lock()
    self._built = {}
    self._pending = {}  # name -> futures of its compiles ahead
    self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
    self._started = None
    self.compiled = []  # (name, seconds) of the compiles ahead that finished
    self.failed = []  # (name, error) of those that raised

  def _program(self, name: Hashable, build: Callable):
    with self._lock:
      if name not in self._built:
        self._built[name] = build()
      return self._built[name]

  def get(self, name: Hashable, build: Callable):
    """Program `name`, built by `build()` on first use; waits for its compiles ahead, if any."""
    program = self._program(name, build)
    for future in self._pending.get(name, ()):
      future.result()
    return program

  def compile_ahead(self, plans: Callable[[], Sequence[Plan]]) -> None:
    """Compiles the programs that `plans()` lists one after another in a background thread; `get`
    and `wait` wait for them. A failure to list them is reported by `wait`, not raised."""
    self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='compile_ahead')
    self._started = time.time()
    try:
      plans = plans()
    except Exception as e:  # pylint: disable=broad-except
      self.failed.append(('listing the programs', f'{type(e).__name__}: {e}'))
      return
    for name, build, lower in plans:
      self._pending.setdefault(name, []).append(self._executor.submit(self._compile, name, build, lower))

  def _compile(self, name: Hashable, build: Callable, lower: Callable) -> None:
    t0 = time.time()
    try:
      lower(self._program(name, build)).compile()
      self.compiled.append((name, time.time() - t0))
    except Exception as e:  # pylint: disable=broad-except
      self.failed.append((name, f'{type(e).__name__}: {e}'))

  def wait(self) -> Optional[dict]:
    """Waits for every compile ahead; returns what they did (None where none was started):
    programs, seconds compiling, seconds since the start, failures."""
    if self._executor is None:
      return None
    t0 = time.time()
    for futures in list(self._pending.values()):
      for future in futures:
        future.result()
    return {'programs': len(self.compiled), 'compile_s': round(sum(s for _, s in self.compiled), 2),
            'waited_s': round(time.time() - t0, 2), 'since_start_s': round(time.time() - self._started, 2),
            'failed': [f'{n}: {e}' for n, e in self.failed]}

  def close(self) -> None:
    """Drops the compiles not yet started (a stopped run); one in progress finishes in the background."""
    if self._executor is not None:
      self._executor.shutdown(wait=False, cancel_futures=True)
