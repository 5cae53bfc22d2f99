"""`--mode bench` (docs/performance.md): times the base training program and the sessions' programs
on generated data of the config's shapes, and writes W/bench.json (never over one: then
W/bench_<timestamp>.json)."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Callable, NamedTuple

import jax
import ml_collections
import numpy as np

from f2m_jax import base as base_lib
from f2m_jax import evaluator
from f2m_jax import files
from f2m_jax import incremental
from f2m_jax import progress
from f2m_jax import sharding
from f2m_jax import train_loop
from f2m_jax import trees
from f2m_jax.data import synthetic
from f2m_jax.experiment import Experiment
from f2m_jax.methods import ncm
from f2m_jax.run import backend
from f2m_jax.run import pipeline
from f2m_jax.run import workdir as workdir_lib

SHAPES = ('image_size', 'num_base', 'num_sessions', 'way', 'augment')
# Each dataset's SHAPES (docs/method.md, 'The problem'); a config's data.image_size wins.
DATASET_SHAPES = {'cifar100': (32, 60, 9, 5, 'crop_flip'),
                  'mini_imagenet': (84, 60, 9, 5, 'rrc_flip'),
                  'cub200': (224, 100, 11, 10, 'rrc_flip')}


def dataset_shapes(config: ml_collections.ConfigDict) -> dict:
  """The SHAPES of the config's dataset, no data read."""
  d = config.data
  if d.source == 'synthetic':
    return dict(d.synthetic, augment='crop_flip')
  if d.dataset in DATASET_SHAPES:
    shapes = dict(zip(SHAPES, DATASET_SHAPES[d.dataset]))
    return dict(shapes, image_size=d.get('image_size') or shapes['image_size'])
  if 'folder' not in d:
    raise ValueError(f'data.dataset={d.dataset!r} has no entry in bench.DATASET_SHAPES '
                     f'(known: {sorted(DATASET_SHAPES)})')
  if d.folder.num_base < 1:
    raise ValueError(f'data.folder.num_base={d.folder.num_base} is invalid for --mode bench, which '
                     'reads no data: give the number of base classes')
  return dict(d.folder, image_size=d.image_size)


def base_batch(config: ml_collections.ConfigDict) -> int:
  """The global base-session batch: config.bench.batch, else what the config's sampler draws."""
  b = config.base
  return config.bench.batch or (b.ways * b.shots if b.sampler == 'balanced' else b.batch_size)


def bench_experiment(config: ml_collections.ConfigDict, dtype: str) -> Experiment:
  """An Experiment of `config` at compute dtype `dtype`, from random weights, on generated images of
  its shapes: one of each class (`program_case`'s batches) and an eval batch of test images."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.model.dtype, config.model.pretrained = dtype, ''
  s = dataset_shapes(config)
  data = synthetic.make_synthetic(**{k: s[k] for k in SHAPES[:4]}, train_per_class=1,
                                  test_per_class=config.eval.batch_size // s['num_base'] + 1)
  return Experiment.create(config, dataclasses.replace(data, augment=s['augment']))


class Case(NamedTuple):
  """One timed program: `fn` on `args`, `steps` base steps a call; with `carry` its first output is
  the next call's first argument (a train program's donated state)."""
  variant: str
  m: int | None
  batch: int
  fn: Callable
  args: tuple
  steps: int = 1
  carry: bool = False


def time_cases(cases: list, dtype: str, warmup: int, iters: int) -> list:
  """Compiles each case (timed apart), then `warmup` and `iters` timed rounds, each calling every
  case once, so that load falls on all alike; a status line on stderr names the case, the round and
  its time so far. Returns one record per case, times per step."""
  line, timed = progress.status('bench', file=sys.stderr), []
  with line:
    for c in cases:
      line.set(f'bench: compiling {c.variant}')
      fn = c.fn.lower(*c.args).compile() if hasattr(c.fn, 'lower') else c.fn
      if fn is c.fn:  # not jitted: compiled by its first call
        jax.block_until_ready(fn(*c.args))
      timed.append(dict(c=c, fn=fn, args=c.args, compile_s=line.format_dict['elapsed'], times=[]))
    for r in range(warmup + iters):
      line.set(f'bench: round {r + 1} of {warmup + iters} (the first {warmup} a warm-up), every '
               'case once')
      for t in timed:
        line.set_description_str(f'bench: round {r + 1} of {warmup + iters}: {t["c"].variant}',
                                 refresh=False)
        t0 = time.perf_counter()
        out = jax.block_until_ready(t['fn'](*t['args']))
        if r >= warmup:
          t['times'].append((time.perf_counter() - t0) / t['c'].steps)
        if t['c'].carry:
          t['args'] = (out[0], *t['args'][1:])
  return [record(**t, dtype=dtype) for t in timed]


def record(c: Case, fn, args, compile_s: float, times: list, dtype: str) -> dict:
  """The times of `c` (seconds per step) as bench.json holds them; its device memory as XLA's
  analysis gives it where the backend does (arguments + outputs + temporaries - donated buffers)."""
  del args
  median, memory = np.median(times), getattr(fn, 'memory_analysis', lambda: None)()
  peak = memory and (memory.temp_size_in_bytes + memory.argument_size_in_bytes
                     + memory.output_size_in_bytes - memory.alias_size_in_bytes)
  rec = dict(variant=c.variant, M=c.m, batch=c.batch, steps_per_call=c.steps, dtype=dtype,
             step_ms_median=1e3 * median, step_ms_min=1e3 * min(times),
             images_per_s=c.batch / median, compile_s=compile_s, peak_bytes=peak)
  return {k: round(v, 4) if isinstance(v, float) else v for k, v in rec.items()}


def program_case(exp: Experiment, noise: ml_collections.FrozenConfigDict, variant: str,
                 m: int | None, num_members: int, mesh) -> Case:
  """The base program of `num_members` runs of `exp` under `noise` (seeds 0..S-1) at the config's
  steps a call, each step on a batch of the base classes in order (class-contiguous, all there)."""
  bench, cfg = exp.bench, exp.config
  batch, n = base_batch(cfg), train_loop.steps_per_call(cfg.base, False)
  program = base_lib.make_train_program(exp.model, noise, exp.optimizer(), bench, cfg.members.map,
                                        mesh)
  rows = np.arange(batch, dtype=np.int32) * bench.num_base_classes // batch
  state, data, keys, bounds = sharding.replicate((
      trees.stack([exp.init_state()] * num_members), (bench.train.images, bench.train.labels),
      trees.stack([jax.random.key(s) for s in range(num_members)]),
      np.full(num_members, cfg.noise.bound, np.float32)), mesh)
  rows = sharding.shard_member_rows(mesh, np.broadcast_to(rows, (n, num_members, batch)))
  args = (state, *data, rows, np.int32(n), keys, bounds)
  return Case(variant, m, num_members * batch, program, args, n, carry=True)


def base_cases(exp: Experiment, mesh) -> list:
  """The plain step, then for each M of bench.M_list F2M's step with each draw through the whole
  network and through the suffix after a shared trunk (and the other noise.draw_map, with
  bench.other_draw_map)."""
  other = [d for d in backend.CHOICES['noise.draw_map'] if d != exp.loss.draw_map][0]
  variants = [('plain', 0, {'enabled': False})]
  for m in map(int, exp.config.bench.M_list):
    variants += [('f2m_naive', m, {'M': m, 'shared_trunk': False}),
                 ('f2m_shared', m, {'M': m, 'shared_trunk': True})]
    if exp.config.bench.other_draw_map:
      variants.append((f'f2m_shared_{other}', m, {'M': m, 'shared_trunk': True, 'draw_map': other}))
  noise = lambda changes: ml_collections.FrozenConfigDict({**exp.loss, **changes})
  return [program_case(exp, noise(changes), name, m, 1, mesh) for name, m, changes in variants]


def session_cases(exp: Experiment) -> list:
  """One fine-tuning step of the last (largest) incremental session, on all novel shots so far
  (`bench_experiment`'s image of each class); the sessions' test-view embedding of one eval batch
  from images, and from the cached trunk features (the suffix only), as `evaluator.Evaluator` runs
  them."""
  bench, state = exp.bench, exp.init_state()
  paths = exp.trainable_paths(state.params)
  settings = dataclasses.replace(ncm.session_settings(exp, paths), steps=1)
  seen = bench.num_seen_classes(bench.num_sessions)
  labels = np.repeat(np.arange(bench.num_base_classes, seen, dtype=np.int32), exp.config.data.shots)
  stored = np.ones((seen, exp.embedding_dim()), np.float32)  # the seen classes' prototypes
  variables = {'params': state.params, 'batch_stats': state.batch_stats}
  test = bench.test.images[:exp.config.eval.batch_size]
  trunk = evaluator.embedder(exp, last=exp.split)(variables, test, keep_on_device=True)
  args = (state.params, state.batch_stats, trees.split(state.params, paths)[0],
          bench.train.images[labels], labels, stored, np.int32(seen), jax.random.key(0))
  return [Case('incremental_step', None, len(labels), incremental.make_finetune(settings), args),
          Case('ncm_eval', None, len(test), evaluator.embedder(exp), (variables, test)),
          Case('ncm_eval_suffix', None, len(test), evaluator.embedder(exp, first=exp.split),
               (variables, trunk))]


def format_table(records: list) -> str:
  """The bench table; 'x plain' is each base-step variant's median over the plain step's (same
  dtype)."""
  lines = [f"{'variant':<17} {'dtype':<9} {'M':>2} {'batch':>5} {'median ms':>10} {'min ms':>9} "
           f"{'img/s':>9} {'compile s':>9} {'peak MiB':>8} x plain"]
  for r in records:
    plain = next(p for p in records if p['variant'] == 'plain' and p['dtype'] == r['dtype'])
    ratio = (f"{r['step_ms_median'] / plain['step_ms_median']:6.2f}"
             if r['variant'].startswith(('plain', 'f2m')) else '     -')
    peak = '-' if r['peak_bytes'] is None else f"{r['peak_bytes'] / 2**20:.0f}"
    m = '-' if r['M'] is None else r['M']
    lines.append(f"{r['variant']:<17} {r['dtype']:<9} {m!s:>2} {r['batch']:>5} "
                 f"{r['step_ms_median']:>10.1f} {r['step_ms_min']:>9.1f} {r['images_per_s']:>9.0f} "
                 f"{r['compile_s']:>9.1f} {peak:>8} {ratio}")
  return '\n'.join(lines)


def output_path(workdir: str) -> str:
  """W/bench.json, or W/bench_<timestamp>.json when bench.json exists already."""
  path = os.path.join(workdir, 'bench.json')
  if os.path.exists(path):
    return os.path.join(workdir, f"bench_{time.strftime('%Y%m%d_%H%M%S')}.json")
  return path


def run(config: ml_collections.ConfigDict, workdir: str, origin: dict | None = None) -> list:
  """Times every variant for every dtype of config.bench.dtypes, prints their tables and writes the
  records to `output_path`, `origin` (`pipeline.run`'s) in their provenance."""
  config = pipeline.resolve(config, (origin or {}).get('changes'), reads_data=False)
  workdir_lib.check_folders(workdir)
  mesh = sharding.data_mesh()
  sharding.per_device_batch(base_batch(config), mesh)
  print(f'bench on {backend.devices()}, {os.cpu_count()} CPU cores; {backend.used(config)}',
        flush=True)
  records = []
  for dtype in config.bench.dtypes:
    exp = bench_experiment(config, dtype)
    timed = time_cases(base_cases(exp, mesh) + session_cases(exp), dtype, config.bench.warmup,
                       config.bench.iters)
    print(format_table(timed), flush=True)
    records += timed
  path = output_path(workdir)
  provenance = workdir_lib.provenance(config.to_dict(), origin)
  os.makedirs(workdir, exist_ok=True)
  files.atomic_write(path, json.dumps({'provenance': provenance, 'records': records}, indent=1))
  print(f'bench records written to {path}', flush=True)
  return records
