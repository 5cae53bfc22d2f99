"""`--mode bench` (docs/performance.md): times the base training program and the sessions' programs
on generated data of the config's shapes, and writes W/bench.json (never over one: then
W/bench_<timestamp>.json)."""
import collections
import dataclasses
import os
import sys
import time

import jax
import ml_collections
import numpy as np

from f2m_jax import evaluator, incremental, progress, sharding, train_loop, trees
from f2m_jax.data import synthetic
from f2m_jax.experiment import Experiment
from f2m_jax.methods import ncm
from f2m_jax.run import backend, memory, pipeline, workdir as workdir_lib

SHAPES = ('image_size', 'num_base', 'num_sessions', 'way', 'augment')
# Each dataset's SHAPES (docs/method.md, 'The problem'); a config's data.image_size wins.
DATASET_SHAPES = {'cifar100': (32, 60, 9, 5, 'crop_flip'),
                  'mini_imagenet': (84, 60, 9, 5, 'rrc_flip'),
                  'cub200': (224, 100, 11, 10, 'rrc_flip')}


def dataset_shapes(config):
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


def bench_experiment(config, dtype):
  """An Experiment of `config` at compute dtype `dtype`, from random weights, on generated images of
  its shapes: one of each class (`program_case`'s batches) and an eval batch of test images."""
  config = config.copy_and_resolve_references()
  config.model.dtype, config.model.pretrained = dtype, ''
  s = dataset_shapes(config)
  data = synthetic.make_synthetic(**{k: s[k] for k in SHAPES[:4]}, train_per_class=1,
                                  test_per_class=config.eval.batch_size // s['num_base'] + 1)
  return Experiment.create(config, dataclasses.replace(data, augment=s['augment']))


# One timed program: `fn` on `args` (`batch` images), `steps` base steps a call; with `carry` its
# first output is the next call's first argument (a train program's donated state).
Case = collections.namedtuple('Case', 'variant m batch fn args steps carry', defaults=(1, False))


def time_cases(cases, dtype, warmup, iters):
  """Compiles each case (timed apart), then `warmup` and `iters` timed rounds, each calling every
  case once, so that load falls on all alike; a status line on stderr names the case, the round and
  its time so far. Returns one record per case."""
  line, rounds, programs = progress.status('bench', file=sys.stderr), warmup + iters, []
  with line:
    for c in cases:
      line.set(f'bench: compiling {c.variant}')
      fn = c.fn
      if hasattr(fn, 'lower'):
        fn = fn.lower(*c.args).compile()
      else:  # not jitted: compiled by its first call
        jax.block_until_ready(fn(*c.args))
      # the program, its compile time, its arguments (a carry replaces the first), its times
      programs.append((fn, line.format_dict['elapsed'], list(c.args), []))
    for r in range(rounds):
      line.set(f'bench: round {r + 1} of {rounds} (the first {warmup} a warm-up), every case once')
      for c, (fn, _, args, times) in zip(cases, programs):
        line.set_description_str(f'bench: round {r + 1} of {rounds}: {c.variant}', refresh=False)
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) / c.steps)
        if c.carry:
          args[0] = out[0]
  return [record(c, fn, compile_s, times[warmup:], dtype)
          for c, (fn, compile_s, _, times) in zip(cases, programs)]


def record(c, fn, compile_s, times, dtype):
  """The times of `c` (seconds per step) as bench.json holds them; its device memory as XLA's
  analysis gives it where the backend does (memory.peak)."""
  median, analysis = np.median(times), getattr(fn, 'memory_analysis', lambda: None)()
  rec = dict(variant=c.variant, M=c.m, batch=c.batch, steps_per_call=c.steps, dtype=dtype,
             step_ms_median=1e3 * median, step_ms_min=1e3 * min(times),
             images_per_s=c.batch / median, compile_s=compile_s,
             peak_bytes=analysis and memory.peak(analysis))
  return {k: round(v, 4) if isinstance(v, float) else v for k, v in rec.items()}


def program_case(exp, changes, variant, m, num_members=1):
  """The base program of `num_members` runs of `exp` with `changes` to its loss at the config's
  steps a call, each step on the global base batch (bench.batch, else what the sampler draws) of the
  base classes in order (class-contiguous, all there)."""
  bench, b = exp.bench, exp.config.base
  batch = exp.config.bench.batch or (b.ways * b.shots if b.sampler == 'balanced' else b.batch_size)
  n, mesh = train_loop.steps_per_call(b, False), sharding.data_mesh()
  loss = ml_collections.FrozenConfigDict({**exp.loss, **changes})
  rows = np.arange(batch, dtype=np.int32) * bench.num_base_classes // batch
  state, data, keys, bounds = sharding.replicate((
      trees.stack([exp.init_state()] * num_members), (bench.train.images, bench.train.labels),
      jax.random.split(jax.random.key(0), num_members),
      np.full(num_members, exp.config.noise.bound, np.float32)), mesh)
  rows = sharding.shard_member_rows(mesh, np.broadcast_to(rows, (n, num_members, batch)))
  return Case(variant, m, num_members * batch, train_loop.base_program(exp, exp.model, loss, mesh),
              (state, *data, rows, np.int32(n), keys, bounds), n, carry=True)


def base_cases(exp):
  """The plain step, then for each M of bench.M_list F2M's step with each draw through the whole
  network and through the suffix after a shared trunk (and the other noise.draw_map, with
  bench.other_draw_map)."""
  other = next(d for d in backend.CHOICES['noise.draw_map'] if d != exp.loss.draw_map)
  variants = {'naive': {'shared_trunk': False}, 'shared': {'shared_trunk': True}}
  if exp.config.bench.other_draw_map:
    variants[f'shared_{other}'] = {'shared_trunk': True, 'draw_map': other}
  return [program_case(exp, {'enabled': False}, 'plain', 0)] + [
      program_case(exp, {'M': m, **changes}, f'f2m_{name}', m)
      for m in map(int, exp.config.bench.M_list) for name, changes in variants.items()]


def session_cases(exp):
  """One fine-tuning step of the last (largest) incremental session, on all novel shots so far
  (`bench_experiment`'s image of each class); the sessions' test-view embedding of one eval batch
  from images, and from the cached trunk features (the suffix only), as `evaluator.Evaluator` runs
  them."""
  bench, state = exp.bench, exp.init_state()
  paths = exp.trainable_paths(state.params)
  settings = dataclasses.replace(ncm.session_settings(exp, paths), steps=1)
  shots, seen = ncm.finetune_sizes(exp)
  labels = np.arange(shots, dtype=np.int32) // exp.config.data.shots + bench.num_base_classes
  variables = {'params': state.params, 'batch_stats': state.batch_stats}
  test = bench.test.images[:exp.config.eval.batch_size]
  trunk = evaluator.embedder(exp, last=exp.split)(variables, test, keep_on_device=True)
  args = (state.params, state.batch_stats, trees.split(state.params, paths)[0],
          bench.train.images[labels], labels,
          np.ones((seen, exp.embedding_dim()), np.float32),  # the seen classes' prototypes
          np.int32(seen), jax.random.key(0))
  return [Case('incremental_step', None, shots, incremental.make_finetune(settings), args),
          Case('ncm_eval', None, len(test), evaluator.embedder(exp), (variables, test)),
          Case('ncm_eval_suffix', None, len(test), evaluator.embedder(exp, first=exp.split),
               (variables, trunk))]


def format_table(records):
  """The bench table; 'x plain' is each base-step variant's median over the plain step's (same
  dtype)."""
  lines = [f"{'variant':<17} {'dtype':<9} {'M':>2} {'batch':>5} {'median ms':>10} {'min ms':>9} "
           f"{'img/s':>9} {'compile s':>9} {'peak MiB':>8} x plain"]
  plain = {r['dtype']: r['step_ms_median'] for r in records if r['variant'] == 'plain'}
  for r in records:
    m, ratio = r['M'], f"{r['step_ms_median'] / plain[r['dtype']]:6.2f}"
    if m is None:  # a session's program: no base step to compare with
      m, ratio = '-', '     -'
    peak = '-' if r['peak_bytes'] is None else f"{r['peak_bytes'] / 2**20:.0f}"
    lines.append(f"{r['variant']:<17} {r['dtype']:<9} {m!s:>2} "
                 f"{r['batch']:>5} {r['step_ms_median']:>10.1f} {r['step_ms_min']:>9.1f} "
                 f"{r['images_per_s']:>9.0f} {r['compile_s']:>9.1f} {peak:>8} {ratio}")
  return '\n'.join(lines)


def run(config, workdir, origin=None):
  """Times every variant for every dtype of config.bench.dtypes, prints their tables and writes the
  records to W/bench.json, or where it exists W/bench_<timestamp>.json (pipeline.unused), `origin`
  (`pipeline.run`'s) in their provenance."""
  config = pipeline.resolve(config, (origin or {}).get('changes'), reads_data=False)
  workdir_lib.check_folders(workdir)
  print(f'bench on {backend.devices()}, {os.cpu_count()} CPU cores; {backend.used(config)}',
        flush=True)
  records = []
  for dtype in config.bench.dtypes:
    exp = bench_experiment(config, dtype)
    timed = time_cases(base_cases(exp) + session_cases(exp), dtype, config.bench.warmup,
                       config.bench.iters)
    print(format_table(timed), flush=True)
    records += timed
  path = pipeline.write_new(workdir, 'bench', {
      'provenance': workdir_lib.provenance(config.to_dict(), origin), 'records': records})
  print(f'bench records written to {path}', flush=True)
  return records
