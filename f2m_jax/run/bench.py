"""`--mode bench` (docs/performance.md): times the base training program and the sessions' programs
on random data of the config's shapes, and writes W/bench.json (never over one: then W/bench_<timestamp>.json)."""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import ml_collections
import numpy as np

from f2m_jax import base as base_lib
from f2m_jax import evaluator
from f2m_jax import files
from f2m_jax import incremental
from f2m_jax import sharding
from f2m_jax import train_loop
from f2m_jax import trees
from f2m_jax.data.types import Benchmark, Split, sessions_from_counts
from f2m_jax.experiment import Experiment
from f2m_jax.methods import ncm
from f2m_jax.run import backend
from f2m_jax.run import pipeline
from f2m_jax.run import workdir as workdir_lib

# What a bench needs of each dataset (docs/method.md, 'The problem'): image size, base classes, sessions, way,
# training augmentation. data.image_size (if a config sets it) overrides the size.
DATASET_SHAPES = {
    'cifar100': dict(image_size=32, num_base=60, num_sessions=9, way=5, augment='crop_flip'),
    'mini_imagenet': dict(image_size=84, num_base=60, num_sessions=9, way=5, augment='rrc_flip'),
    'cub200': dict(image_size=224, num_base=100, num_sessions=11, way=10, augment='rrc_flip'),
}


def dataset_shapes(config: ml_collections.ConfigDict) -> dict:
  """image_size, num_base, num_sessions, way, augment and num_classes of the config's dataset (no data read)."""
  d = config.data
  if d.source == 'synthetic':
    s = dict(d.synthetic, augment='crop_flip')
  elif d.dataset in DATASET_SHAPES:
    s = dict(DATASET_SHAPES[d.dataset])
    s['image_size'] = int(d.get('image_size', 0) or 0) or s['image_size']
  elif 'folder' in d:  # your own images: its layout
    if d.folder.num_base < 1:
      raise ValueError(f'data.folder.num_base={d.folder.num_base} is invalid for --mode bench, which reads no '
                       'data: give the number of base classes')
    s = dict(d.folder, image_size=d.image_size)
  else:
    raise ValueError(f'data.dataset={d.dataset!r} has no entry in bench.DATASET_SHAPES '
                     f'(known: {sorted(DATASET_SHAPES)})')
  shapes = {k: s[k] for k in ('image_size', 'num_base', 'num_sessions', 'way', 'augment')}
  return dict(shapes, num_classes=shapes['num_base'] + shapes['way'] * (shapes['num_sessions'] - 1))


def random_benchmark(config: ml_collections.ConfigDict, num_train: int, num_test: int,
                     seed: int = 0) -> Benchmark:
  """A Benchmark of random uint8 images with the dataset's shapes and class layout."""
  s = dataset_shapes(config)
  rng = np.random.default_rng(seed)

  def split(n):
    images = rng.integers(0, 256, (n, s['image_size'], s['image_size'], 3), dtype=np.uint8)
    return Split(images, (np.arange(n) % s['num_classes']).astype(np.int32))

  train = split(num_train)
  return Benchmark(name=config.data.dataset or 'synthetic', train=train, test=split(num_test),
                   base_train=np.flatnonzero(train.labels < s['num_base']),
                   session_classes=sessions_from_counts(s['num_base'], s['way'], s['num_sessions']),
                   shot_pool=np.arange(num_train), topic_shots=None, image_size=s['image_size'],
                   mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), augment=s['augment'])


def base_batch(config: ml_collections.ConfigDict) -> int:
  """The global base-session batch: config.bench.batch, else what the config's sampler draws."""
  b = config.base
  return config.bench.batch or (b.ways * b.shots if b.sampler == 'balanced' else b.batch_size)


def peak_bytes(compiled) -> int | None:
  """Device memory of a compiled executable where the backend reports it (else None): arguments + outputs +
  temporaries - donated buffers (XLA:CPU's `peak_memory_in_bytes` leaves the temporaries out)."""
  try:
    m = compiled.memory_analysis()
    return int(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes)
  except Exception:  # pylint: disable=broad-except  (not reported: an error, or None)
    return None


class Case(NamedTuple):
  """One timed program: `fn` on `args`, `steps` base steps a call; `carry(args, out) -> args` threads
  outputs into the next call (a donated train state)."""
  variant: str
  m: Optional[int]
  batch: int
  fn: Callable
  args: tuple
  carry: Optional[Callable] = None
  steps: int = 1


def time_cases(cases: Sequence[Case], dtype: str, warmup: int, iters: int) -> list:
  """Compiles each case (timed apart), then `warmup` and `iters` timed rounds, each calling every case once,
  so that load falls on all alike. Returns one record per case, times per step."""
  compiled, compile_s = [], []
  for c in cases:
    t0 = time.perf_counter()
    if hasattr(c.fn, 'lower'):  # jitted: compiled ahead for its arguments
      compiled.append(c.fn.lower(*c.args).compile())
    else:  # anything else: called once
      compiled.append(c.fn)
      jax.block_until_ready(c.fn(*c.args))
    compile_s.append(time.perf_counter() - t0)
  args = [c.args for c in cases]
  times = [[] for _ in cases]
  for r in range(warmup + iters):
    for i, c in enumerate(cases):
      t0 = time.perf_counter()
      out = jax.block_until_ready(compiled[i](*args[i]))
      if r >= warmup:
        times[i].append((time.perf_counter() - t0) / c.steps)
      if c.carry is not None:
        args[i] = c.carry(args[i], out)
  records = []
  for c, t, s, f in zip(cases, times, compile_s, compiled):
    median = 1e3 * statistics.median(t)
    rec = dict(variant=c.variant, M=c.m, batch=c.batch, steps_per_call=c.steps, step_ms_median=median,
               step_ms_min=1e3 * min(t), images_per_s=c.batch / (median / 1e3), compile_s=s, peak_bytes=peak_bytes(f),
               backend=jax.default_backend(), device_kind=jax.devices()[0].device_kind,
               num_devices=jax.device_count(), dtype=dtype)
    records.append({k: round(v, 4) if isinstance(v, float) else v for k, v in rec.items()})
  return records


def program_case(exp: Experiment, noise: ml_collections.FrozenConfigDict, variant: str, m: Optional[int],
                 num_members: int, mesh) -> Case:
  """The base program of `num_members` runs of `exp` under `noise` (seeds 0..S-1) at the config's steps
  a call, each step on batches of the base classes in order (class-contiguous, every class present)."""
  bench, cfg = exp.bench, exp.config
  batch, n = base_batch(cfg), train_loop.steps_per_call(cfg.base, False)
  program = base_lib.make_train_program(exp.model, noise, exp.optimizer(), bench, cfg.members.map, mesh)
  rows = np.broadcast_to((np.arange(batch) * bench.num_base_classes // batch).astype(np.int32), (n, num_members, batch))
  keys = [jax.random.key(s) for s in range(num_members)]
  args = (sharding.replicate(trees.stack([exp.init_state()] * num_members), mesh),
          *sharding.replicate((bench.train.images, bench.train.labels), mesh), sharding.shard_member_rows(mesh, rows),
          np.int32(n), sharding.replicate(trees.stack(keys), mesh),
          sharding.replicate(np.full((num_members,), cfg.noise.bound, np.float32), mesh))
  return Case(variant, m, num_members * batch, program, args, lambda a, out: (out[0],) + a[1:], n)


def bench_experiment(config: ml_collections.ConfigDict, dtype: str) -> Experiment:
  """An Experiment of `config` at compute dtype `dtype` on random data: every base class holds a
  batch's worth of images (row i of a batch is image i), init from random weights."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.model.dtype, config.model.pretrained = dtype, ''
  num_train = max(base_batch(config), dataset_shapes(config)['num_base'])
  return Experiment.create(config, random_benchmark(config, num_train, config.eval.batch_size))


def bench_dtype(config: ml_collections.ConfigDict, dtype: str, mesh) -> list:
  """Every variant for one compute dtype; prints their table and returns the records."""
  exp = bench_experiment(config, dtype)
  sharding.per_device_batch(base_batch(config), mesh)
  other = [d for d in backend.CHOICES['noise.draw_map'] if d != exp.loss.draw_map][0]
  variant = lambda **changes: ml_collections.FrozenConfigDict({**exp.loss, **changes})
  cases = [program_case(exp, variant(enabled=False), 'plain', 0, 1, mesh)]
  for m in map(int, config.bench.M_list):
    cases += [program_case(exp, variant(M=m, shared_trunk=False), 'f2m_naive', m, 1, mesh),
              program_case(exp, variant(M=m, shared_trunk=True), 'f2m_shared', m, 1, mesh)]
    if config.bench.other_draw_map:
      cases.append(program_case(exp, variant(M=m, shared_trunk=True, draw_map=other), f'f2m_shared_{other}',
                                m, 1, mesh))
  records = time_cases(cases + [incremental_case(exp)] + ncm_cases(exp), dtype, config.bench.warmup, config.bench.iters)
  print(format_table(records), flush=True)
  return records


def incremental_case(exp: Experiment) -> Case:
  """One fine-tuning step of the last (largest) incremental session: all novel exemplars so far."""
  bench, shots = exp.bench, exp.config.data.shots
  state = exp.init_state()
  paths = exp.trainable_paths(state.params)
  finetune = incremental.make_finetune(dataclasses.replace(ncm.session_settings(exp, paths), steps=1))
  novel = [c for s in bench.session_classes[1:] for c in s]
  labels = np.repeat(np.asarray(novel, np.int32), shots)
  rng = np.random.default_rng(1)
  images = rng.integers(0, 256, (len(labels),) + bench.train.images.shape[1:], dtype=np.uint8)
  stored = rng.normal(size=(bench.num_base_classes + len(novel), exp.embedding_dim())).astype(np.float32)
  anchor = trees.split(state.params, paths)[0]
  args = (state.params, state.batch_stats, anchor, images, labels, stored, np.int32(len(stored)), jax.random.key(0))
  return Case('incremental_step', None, len(labels), finetune, args)


def ncm_cases(exp: Experiment) -> list:
  """The sessions' test-view embedding of one eval batch: from images, and from the cached trunk
  features (the suffix only), as `evaluator.Evaluator` runs them."""
  state = exp.init_state()
  variables = {'params': state.params, 'batch_stats': state.batch_stats}
  images = exp.bench.test.images
  trunk = evaluator.embedder(exp, last=exp.split)(variables, images, keep_on_device=True)
  return [Case('ncm_eval', None, len(images), evaluator.embedder(exp), (variables, images)),
          Case('ncm_eval_suffix', None, len(images), evaluator.embedder(exp, first=exp.split), (variables, trunk))]


def format_table(records: Sequence[dict]) -> str:
  """The bench table; 'x plain' is each base-step variant's median over the plain step's (same dtype)."""
  lines = [f"{'variant':<17} {'dtype':<9} {'M':>2} {'batch':>5} {'median ms':>10} {'min ms':>9} {'img/s':>9} "
           f"{'compile s':>9} {'peak MiB':>8} x plain"]
  for r in records:
    plain = next(p for p in records if p['variant'] == 'plain' and p['dtype'] == r['dtype'])
    ratio = (f"{r['step_ms_median'] / plain['step_ms_median']:6.2f}"
             if r['variant'].startswith(('plain', 'f2m')) else '     -')
    peak = '-' if r['peak_bytes'] is None else f"{r['peak_bytes'] / 2**20:.0f}"
    m = '-' if r['M'] is None else r['M']
    lines.append(f"{r['variant']:<17} {r['dtype']:<9} {m!s:>2} {r['batch']:>5} {r['step_ms_median']:>10.1f} "
                 f"{r['step_ms_min']:>9.1f} {r['images_per_s']:>9.0f} {r['compile_s']:>9.1f} {peak:>8} {ratio}")
  return '\n'.join(lines)


def output_path(workdir: str) -> str:
  """W/bench.json, or W/bench_<timestamp>.json when bench.json exists already."""
  path = os.path.join(workdir, 'bench.json')
  return os.path.join(workdir, f"bench_{time.strftime('%Y%m%d_%H%M%S')}.json") if os.path.exists(path) else path


def run(config: ml_collections.ConfigDict, workdir: str, origin: Optional[dict] = None) -> list:
  """Runs every variant for every dtype of config.bench.dtypes; writes the JSON and returns the records.
  `origin` as `pipeline.run`'s, recorded in bench.json."""
  config = pipeline.resolve(config, (origin or {}).get('changes'), reads_data=False)
  workdir_lib.check_folders(workdir)
  mesh = sharding.data_mesh()
  print(f'bench on {backend.devices()}, {os.cpu_count()} CPU cores; {backend.used(config)}', flush=True)
  records = [r for dtype in config.bench.dtypes for r in bench_dtype(config, dtype, mesh)]
  os.makedirs(workdir, exist_ok=True)
  path = output_path(workdir)
  provenance = {**workdir_lib.provenance(config.to_dict()), **({'origin': origin} if origin else {})}
  files.atomic_write(path, json.dumps({'provenance': provenance, 'records': records}, indent=1))
  print(f'bench records written to {path}', flush=True)
  return records
