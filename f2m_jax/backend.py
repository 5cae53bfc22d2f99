"""The one place that asks which backend a run is on: `resolve` turns each `'auto'` performance
choice of a config into a concrete value when a run starts (the figures: experiments/results/README.md)."""
from __future__ import annotations

import functools
import os
from typing import Optional

import jax
import ml_collections

# The fields `resolve` decides, and their concrete values (the figures: experiments/results/README.md).
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
  cpu = backend == 'cpu'
  return {'noise.draw_map': 'unroll' if cpu else 'vmap', 'model.conv_backward': 'cpu' if cpu else 'xla'}


def _get(config, field: str):
  return functools.reduce(lambda node, key: node[key], field.split('.'), config)


def resolve(config: ml_collections.ConfigDict, backend: str = '') -> ml_collections.ConfigDict:
  """A copy of `config` with every 'auto' of CHOICES replaced by its value on `backend` (default:
  JAX's default backend). Other values are checked against CHOICES."""
  config = ml_collections.ConfigDict(config.to_dict())
  auto = choices(backend or jax.default_backend())
  for field, allowed in CHOICES.items():
    value = _get(config, field)
    if value == 'auto':
      section, _, name = field.rpartition('.')
      config[section][name] = auto[field]
    elif value not in allowed:
      raise ValueError(f"{field}={value!r} is invalid: allowed: {allowed + ('auto',)}")
  return config


def used(config) -> dict:
  """{field: value} of the choices in a resolved config, for the records."""
  return {field: _get(config, field) for field in CHOICES}


def record(config) -> dict:
  """What an invocation's first line in the metrics log records of a resolved config: the backend and
  the choices made on it."""
  return {'backend': jax.default_backend(), 'choices': used(config)}


def moved(before: dict, config) -> Optional[str]:
  """One line naming each choice of `config` that differs from `before` (`record`'s of the workdir's
  last invocation; {} or one without choices: none), or None."""
  was, now = before.get('choices') or {}, record(config)
  changed = [f'{k}: {was[k]!r} when this workdir was last run ({before.get("backend")}), {v!r} now ({now["backend"]})'
             for k, v in now['choices'].items() if k in was and was[k] != v]
  return '; '.join(changed) or None


def available_memory() -> tuple:
  """(bytes of memory the host has in all: the least of its RAM and its cgroup's limit; bytes free now;
  bytes each device has, or None on a CPU, whose devices are the host's memory): for f2m_jax/memory.py."""
  info = {}
  if os.path.exists('/proc/meminfo'):
    with open('/proc/meminfo') as f:
      info = {k: int(v.split()[0]) * 1024 for k, v in (line.split(':', 1) for line in f)}
  total = info.get('MemTotal') or os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  for path in ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'):
    try:
      with open(path) as f:
        total = min(total, int(f.read()))
    except (OSError, ValueError):  # no such cgroup, or 'max': no limit
      pass
  first = jax.local_devices()[0]
  device = None if first.platform == 'cpu' else (first.memory_stats() or {}).get('bytes_limit')
  return total, min(total, info.get('MemAvailable', total)), device


def devices() -> str:
  """'N x <device kind> (<backend>)': where a run's programs run, for its start-up line."""
  return f'{jax.device_count()} x {jax.devices()[0].device_kind} ({jax.default_backend()})'
