"""The one place that asks which backend a run is on: `resolve` turns each `'auto'` performance
choice of a config into a concrete value when a run starts (the figures:
experiments/results/README.md)."""
import contextlib
import os
import pathlib
import re

import jax
import ml_collections

# The fields `resolve` decides: (their value on a GPU or TPU, on a CPU).
CHOICES = {
    # How the M noisy passes share one program: 'vmap' (the paper's shape; faster on an H200) or
    # 'unroll' (written out; XLA:CPU runs vmapped convolutions as slow grouped ones). Section
    # 'Per-step and whole-run benchmarks'.
    'noise.draw_map': ('vmap', 'unroll'),
    # The convolutions' backward: 'xla' (XLA's own transposes) or 'cpu' (the forms XLA:CPU's
    # Eigen kernels run fast, also inside a lax.scan). Sections 'CPU speed: the convolution
    # backward's forms' (and '... measured again').
    'model.conv_backward': ('xla', 'cpu'),
}


def choices(backend):
  """{field: value} that 'auto' means on `backend` ('cpu', 'gpu', 'tpu')."""
  return {field: values[backend == 'cpu'] for field, values in CHOICES.items()}


def used(config):
  """{field: value} of CHOICES' fields in `config`, for the records."""
  return {field: config[field] for field in CHOICES}


def resolve(config, backend=''):
  """A copy of `config` with every 'auto' of CHOICES replaced by its value on `backend` (default:
  JAX's default backend). Other values are checked against CHOICES."""
  config = ml_collections.ConfigDict(config.to_dict())
  auto = choices(backend or jax.default_backend())
  for field, value in used(config).items():
    if value not in CHOICES[field] + ('auto',):
      raise ValueError(f"{field}={value!r} is invalid: allowed: {CHOICES[field] + ('auto',)}")
    if value == 'auto':
      config.update_from_flattened_dict({field: auto[field]})
  return config


def record(config):
  """What an invocation's 'start' line in the metrics log records: the backend and the choices made
  on it."""
  return {'backend': jax.default_backend(), 'choices': used(config)}


def moved(before, config):
  """One line naming each choice of `config` that differs from `before` (the last invocation's
  `record`)."""
  was = before.get('choices', {})
  changed = [f'{k}: {was[k]!r} when this workdir was last run ({before.get("backend")}), '
             f'{v!r} now ({jax.default_backend()})' for k, v in used(config).items()
             if was.get(k, v) != v]
  return '; '.join(changed) or None


def available_memory():
  """(bytes of memory the host has in all: the least of its RAM and its cgroup's limit; bytes free
  now (MemAvailable, where /proc/meminfo says); bytes each device has, or None on a CPU, whose
  devices are the host's memory): for f2m_jax/run/memory.py."""
  total = free = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  with contextlib.suppress(OSError, TypeError):  # no /proc/meminfo, or no such line: all of it
    free = int(re.search(r'MemAvailable: *(\d+)',
                         pathlib.Path('/proc/meminfo').read_text())[1]) * 1024
  for path in ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'):
    with contextlib.suppress(OSError, ValueError):  # no such cgroup, or 'max': no limit
      total = min(total, int(pathlib.Path(path).read_text()))
  device = (jax.local_devices()[0].memory_stats() or {}).get('bytes_limit')  # a CPU's: None
  return total, min(total, free), device


def devices():
  """'N x <device kind> (<backend>)': where a run's programs run, for its start-up line."""
  return f'{jax.device_count()} x {jax.devices()[0].device_kind} ({jax.default_backend()})'
