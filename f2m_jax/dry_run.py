"""--dry-run: what a run would do, checked as the run checks it, with nothing written: the effective
config, the data (every path and the session layout read, no image decoded), the decoded-image cache,
and the cost of one base step (estimated from its FLOPs, or measured by running one: --time-step).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from f2m_jax import backend
from f2m_jax import base as base_lib
from f2m_jax import bench
from f2m_jax import members
from f2m_jax import pipeline
from f2m_jax import progress
from f2m_jax import sharding
from f2m_jax.data import folder, holdout, sources
from f2m_jax.workdir import flat_items


def describe(config, origin, time_step: bool = False) -> str:
  """The dry run's text: the effective config as JSON (presets and overrides applied, every 'auto'
  resolved, checked), what the presets and each 'auto' set, the data, the cache and a base step's
  cost. A sweep shows its first member's."""
  changes = (origin or {}).get('changes')
  if members.enabled(config):
    members.validate(config)
    config = members.member_configs(config)[0]
  resolved = pipeline.resolve(config, changes)
  before, after = flat_items(config.to_dict()), flat_items(resolved.to_dict())
  set_here = [f'  {k}: {before[k]!r} -> {after[k]!r}' for k in sorted(after) if before.get(k) != after[k]]
  bench_, plan = data_at_hand(resolved)
  return '\n'.join([json.dumps(resolved.to_dict(), indent=1, sort_keys=True),
                    f'set when the run starts (method {resolved.method}\'s presets, \'auto\' on {backend.devices()}):',
                    *(set_here or ['  nothing']), *data_lines(resolved, bench_, plan), *cache_lines(resolved, plan),
                    step_line(resolved, bench_, time_step), 'dry run: nothing was written'])


def data_at_hand(config) -> tuple:
  """(the config's Benchmark, its cache plan or None): with one-pixel placeholder images for a folder
  source, read as the run reads it (every path and the layout checked) without decoding an image;
  (a line saying why not, None) where that would write (a download, a generated folder's first use)."""
  if config.data.source == 'synthetic':
    return sources.load_benchmark(config), None
  if config.data.source not in ('folder', 'fake_folder'):
    return (f'data: {config.data.dataset} from data.source={config.data.source!r}; a dry run reads no image of it '
            '(the run reads, downloads or converts them first)'), None
  found = sources.folder_spec(config, writes=False)
  if found is None:
    return (f'data: generated on first use (data.source={config.data.source!r}) or TOPIC lists still to download '
            f'into {sources.cache_dir(config)}: the run writes them first'), None
  spec, tables = found
  tables = tables or folder.read_tables(spec)
  p = folder.read_protocol(spec, tables)
  placeholder = {split: np.zeros((len(t.files), 1, 1, 3), np.uint8) for split, t in (('train', p.train), ('test', p.test))}
  b = dataclasses.replace(folder.benchmark(spec, p, placeholder), image_size=1)
  b = holdout.validation_benchmark(b) if config.data.protocol == 'validation' else b
  return b, (folder.cache_plan(spec, p, sources.cache_dir(config)), len(set(tables[0].names)), tables[0].where)


def spread(counts) -> str:
  """'min / median / max' of `counts`."""
  return f'{int(np.min(counts))} / {int(np.median(counts))} / {int(np.max(counts))}'


def data_lines(config, b, plan) -> list:
  """The data summary: classes found and used, the session layout, images per class."""
  if isinstance(b, str):
    return [b]
  found = f'{plan[1]} classes found in {plan[2]}, ' if plan else ''
  seen = b.num_seen_classes(b.num_sessions)
  train = np.bincount(b.train.labels[b.base_train], minlength=seen)[:b.num_base_classes]
  pool = np.bincount(b.train.labels[b.shot_pool], minlength=seen)[b.num_base_classes:seen]
  test = np.bincount(b.test.labels, minlength=seen)[:seen]
  ways = sorted({len(c) for c in b.session_classes[1:]})
  return [f'data: {b.name}, {found}{seen} classes used (protocol {config.data.protocol}): session 1 of '
          f'{b.num_base_classes} classes, then {b.num_sessions - 1} sessions of {"/".join(map(str, ways))} '
          f'classes x {config.data.shots} shots, {config.runs} runs',
          f'  training images per class (min / median / max): base classes {spread(train)}; later classes '
          f'{spread(pool) if pool.size else "-"} (their shots are drawn from these)',
          f'  test images per class (min / median / max): {spread(test)}, {int(test.sum()):,} in all']


def size(nbytes: float) -> str:
  for unit, scale in (('GB', 1e9), ('MB', 1e6), ('kB', 1e3)):
    if nbytes >= scale:
      return f'{nbytes / scale:.1f} {unit}'
  return f'{int(nbytes)} B'


def folder_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files
             if os.path.isfile(os.path.join(root, f)))


def cache_lines(config, plan) -> list:
  """Where the cache folder is, what it holds, what this run decodes into it and how to clear it."""
  cache = sources.cache_dir(config)
  held = folder_bytes(cache) if os.path.isdir(cache) else 0
  arrays = os.path.join(cache, 'arrays')
  lines = [f'cache: {cache} holds {size(held)} (decoded images {size(folder_bytes(arrays) if os.path.isdir(arrays) else 0)}'
           f', compiled programs {size(folder_bytes(os.path.join(cache, "jax_compilation_cache")))})']
  if plan is not None:
    splits = plan[0]
    for split, (paths, (folder_path, name, resize, crop)) in splits.items():
      target = folder.cached_file([os.fspath(p) for p in paths], folder_path, name, resize, crop)
      state = 'cached already' if target.is_file() else 'decoded once on the first run'
      lines.append(f'  {split}: {len(paths):,} images of {crop}x{crop} ({size(len(paths) * crop * crop * 3)}), '
                   f'{state}: {target}')
    lines.append(f'  to clear: rm -r {folder_path} (every image size of this dataset: decoded again when needed), '
                 f'or rm -r {cache} (all: downloads, decoded images, compiled programs)')
  return lines


def step_line(config, b, time_step: bool) -> str:
  """The cost of one base step: measured (`time_step`: compiled and run on random images of the
  config's shapes) or estimated (its FLOPs at the rate a matrix product reaches here)."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.base.steps_per_call = 1
  if not isinstance(b, str) and 'folder' in c.data:
    c.data.folder.num_base = b.num_base_classes  # bench's shapes
  exp = bench.bench_experiment(c, c.model.dtype)
  mesh = sharding.data_mesh()
  steps = config.base.steps
  if time_step:
    record = bench.time_cases([bench.program_case(exp, exp.noise, 'f2m', c.noise.M, 1, mesh)],
                              c.model.dtype, 1, 2)[0]
    seconds = record['step_ms_median'] / 1e3
    return (f'base step: {seconds:.3g} s, measured (compiled in {record["compile_s"]:.0f} s, then 3 steps on random '
            f'images of the config\'s shapes); base.steps={steps:,}: about {progress.elapsed(seconds * steps)}')
  flops, rate = step_flops(exp, mesh), matmul_rate()
  seconds = flops / rate
  return (f'base step: at least {seconds:.2g} s, estimated: its {flops / 1e9:.3g} GFLOP at the {rate / 1e9:.0f} '
          "GFLOP/s a matrix product reaches here (a small network's step takes several times that); "
          f'base.steps={steps:,}: at least {progress.elapsed(seconds * steps)}. --dry-run --time-step measures it')


def step_flops(exp, mesh) -> float:
  """XLA's count of the floating-point operations of one base step (traced and lowered, not compiled)."""
  cfg = exp.config
  program = base_lib.make_train_program(exp.model, exp.noise, exp.optimizer(), exp.bench, cfg.members.map, mesh)
  state = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct((1, *s.shape), s.dtype), exp.state_shapes())
  images = jax.ShapeDtypeStruct(exp.bench.train.images.shape, np.uint8)
  labels = jax.ShapeDtypeStruct(exp.bench.train.labels.shape, np.int32)
  rows = np.zeros((1, 1, bench.base_batch(cfg)), np.int32)
  lowered = program.lower(state, images, labels, rows, np.int32(1), jnp.stack([exp.key(0)]),
                          np.full((1,), cfg.noise.bound, np.float32))
  return float(lowered.cost_analysis()['flops'])


def matmul_rate(n: int = 1024, repeats: int = 5) -> float:
  """FLOP/s of an n x n float32 matrix product on the default device (the best of `repeats`)."""
  x = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda a: a @ a)
  f(x).block_until_ready()
  best = float('inf')
  for _ in range(repeats):
    t0 = time.perf_counter()
    f(x).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2 * n ** 3 / best
