"""The one place that asks which backend a run is on: `resolve` turns each `'auto'` performance
choice of a config into a concrete value when a run starts (the figures: experiments/results/README.md)."""
from __future__ import annotations

import contextlib
import os
import pathlib
from typing import Optional

import jax
import ml_collections
from flax import traverse_util

# The fields `resolve` decides: (their value on a GPU or TPU, on a CPU).
CHOICES = {
    # How the M noisy passes share one program: 'vmap' (the paper's shape; faster on an H200) or
    # 'unroll' (written out; XLA:CPU runs vmapped convolutions as slow grouped ones). Section
    # 'Per-step and whole-run benchmarks'.
    'noise.draw_map': ('vmap', 'unroll'),
    # The convolutions' backward: 'xla' (XLA's own transposes) or 'cpu' (the forms XLA:CPU's Eigen
    # kernels run fast, also inside a lax.scan). Sections 'CPU speed: the convolution backward's forms'
    # (and '... measured again').
    'model.conv_backward': ('xla', 'cpu'),
}


def choices(backend: str) -> dict:
  """{field: value} that 'auto' means on `backend` ('cpu', 'gpu', 'tpu')."""
  return {field: values[backend == 'cpu'] for field, values in CHOICES.items()}


def used(config) -> dict:
  """{field: value} of CHOICES' fields in `config`, for the records."""
  items = traverse_util.flatten_dict(config.to_dict(), sep='.')
  return {field: items[field] for field in CHOICES}


def resolve(config: ml_collections.ConfigDict, backend: str = '') -> ml_collections.ConfigDict:
  """A copy of `config` with every 'auto' of CHOICES replaced by its value on `backend` (default:
  JAX's default backend). Other values are checked against CHOICES."""
  config, auto = ml_collections.ConfigDict(config.to_dict()), choices(backend or jax.default_backend())
  fields = used(config)
  for field, value in fields.items():
    if value not in CHOICES[field] + ('auto',):
      raise ValueError(f"{field}={value!r} is invalid: allowed: {CHOICES[field] + ('auto',)}")
  config.update_from_flattened_dict({field: auto[field] for field, value in fields.items() if value == 'auto'})
  return config


def record(config) -> dict:
  """What an invocation's 'start' line in the metrics log records: the backend and the choices made on it."""
  return {'backend': jax.default_backend(), 'choices': used(config)}


def moved(before: dict, config) -> Optional[str]:
  """One line naming each choice of `config` that differs from `before` (the last invocation's `record`)."""
  was, now = before.get('choices') or {}, record(config)
  changed = [f'{k}: {was[k]!r} when this workdir was last run ({before.get("backend")}), {v!r} now ({now["backend"]})'
             for k, v in now['choices'].items() if k in was and was[k] != v]
  return '; '.join(changed) or None


def available_memory() -> tuple:
  """(bytes of memory the host has in all: the least of its RAM and its cgroup's limit; bytes free now;
  bytes each device has, or None on a CPU, whose devices are the host's memory): for f2m_jax/run/memory.py."""
  info = {}
  if os.path.exists('/proc/meminfo'):
    with open('/proc/meminfo') as f:
      info = {k: int(v.split()[0]) * 1024 for k, v in (line.split(':', 1) for line in f)}
  total = info.get('MemTotal') or os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  for path in ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'):
    with contextlib.suppress(OSError, ValueError):  # no such cgroup, or 'max': no limit
      total = min(total, int(pathlib.Path(path).read_text()))
  first = jax.local_devices()[0]
  device = None if first.platform == 'cpu' else (first.memory_stats() or {}).get('bytes_limit')
  return total, min(total, info.get('MemAvailable', total)), device


def devices() -> str:
  """'N x <device kind> (<backend>)': where a run's programs run, for its start-up line."""
  return f'{jax.device_count()} x {jax.devices()[0].device_kind} ({jax.default_backend()})'
