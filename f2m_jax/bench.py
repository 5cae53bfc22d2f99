"""`--mode bench`: times the jitted steps of a config on random data of the config's shapes.

Variants, for each compute dtype of config.bench.dtypes:
  plain              a base-session step without noise (the reference of the 'x plain' column);
  f2m_naive          F2M with the whole network mapped over the M draws, for each M of bench.M_list;
  f2m_shared         F2M with the unperturbed trunk run once (noise.draw_map mapping the draws);
  f2m_shared_<other> the same with the other draw_map ('vmap' or 'unroll');
  incremental_step   one fine-tune step of the largest incremental session;
  ncm_eval           NCM predictions for one eval batch of images, and ncm_eval_suffix from cached
                     trunk features (the incremental phase's evaluation).
Each is compiled once (lower + compile, timed apart); then config.bench.warmup untimed and
config.bench.iters timed rounds call every variant once each.

Whole runs (`whole_run`), for F2M and the Baseline: the pipeline's own base loop and incremental
sessions, as run.py runs them (on a GPU/TPU the images held on the device and base.steps_per_call
steps scanned per dispatch; on a CPU host batches, one step per dispatch; checkpoints), for
config.bench.whole_run_steps base steps and config.bench.whole_run_runs runs of sessions (on a GPU/TPU
all runs of a session fine-tuned in one call, incremental.parallel_runs; the sessions' programs
compiled ahead during base training where config.compile_ahead says so): the first call's time
(compile included), base steps/s after it, the base phase and the incremental phase (and that
phase after its first session, i.e. without compiles), and what was compiled ahead.

The records go to W/bench.json as {'provenance': ..., 'records': [...], 'whole_runs': [...]} (never
overwriting one: then W/bench_<timestamp>.json).

No dataset is read: images are random uint8 of the dataset's size, labels cover the base classes.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from f2m_jax import base as base_lib
from f2m_jax import incremental
from f2m_jax import members
from f2m_jax import objectives
from f2m_jax import pipeline
from f2m_jax import registry
from f2m_jax import sharding
from f2m_jax import trees
from f2m_jax import train_loop
from f2m_jax import workdir as workdir_lib
from f2m_jax.checkpoint import Checkpoints
from f2m_jax.experiment import Experiment
from f2m_jax.methods import ncm
from f2m_jax.sessions import parallel_runs, run_sessions
from f2m_jax.data import augment as augment_lib
from f2m_jax.data.types import Benchmark, Split, sessions_from_counts

# What a bench needs of each dataset (docs/method.md, 'The problem'): image size, base classes, sessions, way,
# training augmentation. data.image_size (if a config sets it) overrides the size.
DATASET_SHAPES = {
    'cifar100': dict(image_size=32, num_base=60, num_sessions=9, way=5, augment='crop_flip'),
    'mini_imagenet': dict(image_size=84, num_base=60, num_sessions=9, way=5, augment='rrc_flip'),
    'cub200': dict(image_size=224, num_base=100, num_sessions=11, way=10, augment='rrc_flip'),
}
FIELDS = ('variant', 'M', 'batch', 'step_ms_median', 'step_ms_min', 'images_per_s', 'compile_s',
          'peak_bytes', 'backend', 'device_kind', 'num_devices', 'dtype')


def dataset_shapes(config: ml_collections.ConfigDict) -> dict:
  """image_size, num_base, num_sessions, way and augment of the config's dataset (no data read)."""
  if config.data.source == 'synthetic':
    s = config.data.synthetic
    return dict(image_size=s.image_size, num_base=s.num_base, num_sessions=s.num_sessions, way=s.way,
                augment='crop_flip')
  if config.data.dataset not in DATASET_SHAPES:
    raise ValueError(f'data.dataset={config.data.dataset!r} has no entry in bench.DATASET_SHAPES '
                     f'(known: {sorted(DATASET_SHAPES)})')
  shapes = dict(DATASET_SHAPES[config.data.dataset])
  shapes['image_size'] = int(config.data.get('image_size', 0) or 0) or shapes['image_size']
  return shapes


def random_benchmark(config: ml_collections.ConfigDict, num_train: int, num_test: int,
                     seed: int = 0) -> Benchmark:
  """A Benchmark of random uint8 images with the dataset's shapes and class layout."""
  s = dataset_shapes(config)
  rng = np.random.default_rng(seed)
  num_classes = s['num_base'] + s['way'] * (s['num_sessions'] - 1)

  def split(n):
    images = rng.integers(0, 256, (n, s['image_size'], s['image_size'], 3), dtype=np.uint8)
    return Split(images, (np.arange(n) % num_classes).astype(np.int32))

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
  """Device memory of a compiled executable where the backend reports it: arguments + outputs +
  temporaries - donated (aliased) buffers. (`peak_memory_in_bytes` is not used: XLA:CPU leaves the
  temporaries out of it.)"""
  try:
    m = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except
    return None
  if m is None:
    return None
  return int(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes)


@dataclasses.dataclass
class Case:
  """One timed program: `fn` (jitted) on `args`; `carry(args, out) -> args` threads outputs into
  the next call (a donated train state)."""
  variant: str
  m: Optional[int]
  batch: int
  fn: Callable
  args: tuple
  carry: Optional[Callable] = None


def time_cases(cases: Sequence[Case], warmup: int, iters: int) -> list:
  """Compiles each case (lower + compile, timed apart), then runs `warmup` rounds and `iters` timed
  rounds, each round calling every case once: load from other processes then falls on all cases
  alike, which keeps their ratios meaningful on a shared machine. Returns one timing dict per case."""
  compiled, compile_s = [], []
  for c in cases:
    t0 = time.perf_counter()
    compiled.append(c.fn.lower(*c.args).compile())
    compile_s.append(time.perf_counter() - t0)
  args = [c.args for c in cases]
  times = [[] for _ in cases]
  for r in range(warmup + iters):
    for i, c in enumerate(cases):
      t0 = time.perf_counter()
      out = jax.block_until_ready(compiled[i](*args[i]))
      if r >= warmup:
        times[i].append(time.perf_counter() - t0)
      if c.carry is not None:
        args[i] = c.carry(args[i], out)
  return [{'step_ms_median': 1e3 * statistics.median(t), 'step_ms_min': 1e3 * min(t), 'compile_s': s,
           'peak_bytes': peak_bytes(x)} for t, s, x in zip(times, compile_s, compiled)]


def _record(case: Case, dtype: str, timing: dict) -> dict:
  device = jax.devices()[0]
  rec = dict(variant=case.variant, M=case.m, batch=case.batch, dtype=dtype, backend=jax.default_backend(),
             images_per_s=case.batch / (timing['step_ms_median'] / 1e3), device_kind=device.device_kind,
             num_devices=jax.device_count(), **timing)
  return {k: (round(rec[k], 4) if isinstance(rec[k], float) else rec[k]) for k in FIELDS}


def bench_dtype(config: ml_collections.ConfigDict, dtype: str, mesh) -> list:
  """Every variant for one compute dtype; returns the records."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.model.dtype = dtype
  config.model.pretrained = ''  # random init: only shapes matter
  batch = base_batch(config)
  sharding.per_device_batch(batch, mesh)
  bench = random_benchmark(config, batch, config.eval.batch_size)
  exp = Experiment.create(config, bench)
  cases = _base_step_cases(exp, batch, mesh) + [_incremental_case(exp)] + _ncm_cases(exp)
  timings = time_cases(cases, config.bench.warmup, config.bench.iters)
  return [_record(c, dtype, t) for c, t in zip(cases, timings)]


def _base_step_cases(exp: Experiment, batch: int, mesh) -> list:
  """The plain step, then per M: naive and shared trunk (the config's draw_map), and the shared
  trunk with the other draw_map."""
  bench, num_base = exp.bench, exp.bench.num_base_classes
  images = bench.train.images[:batch]
  labels = (np.arange(batch) * num_base // batch).astype(np.int32)  # class-contiguous, all classes present
  images, labels = sharding.shard_batch(mesh, images, labels)
  key = sharding.replicate(jax.random.key(0), mesh)
  objective = exp.base_objective()
  other = [d for d in base_lib.DRAW_MAPS if d != objective.draw_map][0]

  def case(variant, m, **changes):
    fn = base_lib.make_train_step(dataclasses.replace(objective, **changes), exp.optimizer(), bench.augment,
                                  bench.image_size, bench.mean, bench.std, mesh=mesh)
    state = sharding.replicate(exp.init_state(), mesh)
    return Case(variant, m, batch, fn, (state, images, labels, key), lambda args, out: (out[0],) + args[1:])

  cases = [case('plain', 0, noise_paths=())]
  for m in exp.config.bench.M_list:
    noisy = dict(noise_paths=exp.noise_paths, num_draws=int(m))
    cases += [case('f2m_naive', int(m), shared_trunk=False, **noisy),
              case('f2m_shared', int(m), shared_trunk=True, **noisy)]
    if exp.config.bench.other_draw_map:
      cases.append(case(f'f2m_shared_{other}', int(m), shared_trunk=True, draw_map=other, **noisy))
  return cases


def _incremental_case(exp: Experiment) -> Case:
  """One fine-tune step of the last (largest) incremental session: all novel exemplars so far."""
  bench, shots = exp.bench, exp.config.data.shots
  state = exp.init_state()
  paths = exp.trainable_paths(state.params)
  settings = ncm.session_settings(exp, paths)
  settings = dataclasses.replace(settings, steps=1)
  novel = [c for s in bench.session_classes[1:] for c in s]
  labels = np.repeat(np.asarray(novel, np.int32), shots)
  rng = np.random.default_rng(1)
  images = rng.integers(0, 256, (len(labels),) + bench.train.images.shape[1:], dtype=np.uint8)
  stored = rng.normal(size=(bench.num_base_classes + len(novel), exp.model.widths[-1])).astype(np.float32)
  anchor = {p: v for p, v in trees.flatten(state.params).items() if p in set(paths)}
  args = (state.params, state.batch_stats, anchor, images, labels, stored, np.int32(len(stored)),
          jax.random.key(0))  # the last session fills the padded shape exactly
  return Case('incremental_step', None, len(labels), incremental.make_finetune(settings).jitted, args)


def _ncm_cases(exp: Experiment) -> list:
  """NCM predictions for one eval batch: from images, and from cached trunk features (suffix only)."""
  bench, model, split = exp.bench, exp.model, exp.split
  state = exp.init_state()
  variables = {'params': state.params, 'batch_stats': state.batch_stats}
  protos = objectives.normalize_prototypes(
      jax.random.normal(jax.random.key(3), (bench.num_seen_classes(bench.num_sessions), model.widths[-1])))

  def ncm(first):
    @jax.jit
    def predict(variables, inputs, protos):
      x = augment_lib.normalize(inputs, bench.mean, bench.std) if first == 0 else inputs
      emb, _ = model.apply(variables, x, train=False, first=first)
      return objectives.ncm_predict(emb, protos)
    return predict

  images = bench.test.images
  trunk = jax.jit(lambda v, x: model.apply(v, augment_lib.normalize(x, bench.mean, bench.std), train=False,
                                           last=split))(variables, images)
  return [Case('ncm_eval', None, len(images), ncm(0), (variables, images, protos)),
          Case('ncm_eval_suffix', None, len(images), ncm(split), (variables, trunk, protos))]


def member_cases(config: ml_collections.ConfigDict, mesh) -> list:
  """The F2M base step of one run, then of S runs (members of a seed sweep) in one program for every
  S of bench.member_sizes, mapped as members.map (vmap on GPU/TPU, unroll on a CPU): timed in the
  same rounds, so each S's speed-up over S single steps is a ratio of one run."""
  batch = base_batch(config)
  bench = random_benchmark(config, batch, config.eval.batch_size)
  sweep = ml_collections.ConfigDict(config.to_dict())
  sweep.members.seeds = tuple(range(max(config.bench.member_sizes)))
  mapping = members.member_map(sweep, same_objective=True)
  exps = [Experiment.create(c, bench) for c in members.member_configs(sweep)]
  images, labels = bench.train.images[:batch], (np.arange(batch) * bench.num_base_classes // batch).astype(np.int32)
  single = base_lib.make_train_step(exps[0].base_objective(), exps[0].optimizer(), bench.augment, bench.image_size,
                                    bench.mean, bench.std, mesh=mesh)
  x, y = sharding.shard_batch(mesh, images, labels)
  cases = [Case('members_1_single', 1, batch, single,
                (sharding.replicate(exps[0].init_state(), mesh), x, y, sharding.replicate(exps[0].key(0), mesh)),
                lambda args, out: (out[0],) + args[1:])]
  for s in config.bench.member_sizes:
    group = exps[:s]
    step = base_lib.members_step_fn([base_lib.train_step_fn(e.base_objective(), e.optimizer(), bench.augment,
                                                            bench.image_size, bench.mean, bench.std) for e in group],
                                    mapping)
    stacked = (sharding.replicate(train_loop.stack([e.init_state() for e in group]), mesh),
               *sharding.shard_member_batch(mesh, np.stack([images] * s), np.stack([labels] * s)),
               sharding.replicate(jnp.stack([e.key(0) for e in group]), mesh))
    cases.append(Case(f'members_{s}_{mapping}', s, s * batch, base_lib.make_member_step(step, mesh), stacked,
                      lambda args, out: (out[0],) + args[1:]))
  return cases


def format_members(records: Sequence[dict]) -> str:
  """S runs' base steps in one program against S single steps (the first record)."""
  single = records[0]
  lines = [f"{'members':<20} {'S':>3} {'ms per call':>12} {'run-steps/s':>12} {'x S single steps':>17} {'compile s':>9}"]
  for r in records:
    s = r['M']
    speedup = s * single['step_ms_median'] / r['step_ms_median']
    lines.append(f"{r['variant']:<20} {s:>3} {r['step_ms_median']:>12.1f} {1e3 * s / r['step_ms_median']:>12.2f} "
                 f"{speedup:>17.2f} {r['compile_s']:>9.1f}")
  return '\n'.join(lines)


def _row(r: dict, plain: dict) -> str:
  ratio = (f"{r['step_ms_median'] / plain['step_ms_median']:6.2f}"
           if r['variant'].startswith(('plain', 'f2m')) else '     -')
  peak = '-' if r['peak_bytes'] is None else f"{r['peak_bytes'] / 2**20:.0f}"
  m = '-' if r['M'] is None else r['M']
  return (f"{r['variant']:<17} {r['dtype']:<9} {m!s:>2} {r['batch']:>5} {r['step_ms_median']:>10.1f} "
          f"{r['step_ms_min']:>9.1f} {r['images_per_s']:>9.0f} {r['compile_s']:>9.1f} {peak:>8} {ratio}")


HEADER = (f"{'variant':<17} {'dtype':<9} {'M':>2} {'batch':>5} {'median ms':>10} {'min ms':>9} {'img/s':>9} "
          f"{'compile s':>9} {'peak MiB':>8} x plain")


def format_table(records: Sequence[dict]) -> str:
  """The bench table; 'x plain' is each base-step variant's median over the plain step's (same dtype)."""
  lines = [HEADER]
  for r in records:
    plain = next(p for p in records if p['variant'] == 'plain' and p['dtype'] == r['dtype'])
    lines.append(_row(r, plain))
  return '\n'.join(lines)


def output_path(workdir: str) -> str:
  """W/bench.json, or W/bench_<timestamp>.json when bench.json exists already."""
  path = os.path.join(workdir, 'bench.json')
  if os.path.exists(path):
    path = os.path.join(workdir, f"bench_{time.strftime('%Y%m%d_%H%M%S')}.json")
  return path


def whole_run(config: ml_collections.ConfigDict, method: str, steps: int, runs: int) -> dict:
  """Times `method` end to end through the pipeline on random data of the config's shapes: `steps`
  base steps and `runs` runs of every incremental session, in a temporary workdir. The config's LR
  schedule is kept (it does not change a step's time): its train step is then the program a real run
  of the config compiles, so either finds the other's in JAX's compilation cache."""
  cfg = ml_collections.ConfigDict(config.to_dict())
  cfg.method, cfg.runs, cfg.tensorboard, cfg.model.pretrained = method, runs, False, ''
  cfg.base.update(steps=steps, log_every=steps, checkpoint_every=steps, select_on_test=False)
  cfg = pipeline.resolve(cfg, reads_data=False)
  s = dataset_shapes(cfg)
  num_classes = s['num_base'] + s['way'] * (s['num_sessions'] - 1)
  per_class = max(cfg.base.shots, cfg.data.shots, -(-base_batch(cfg) // s['num_base']))
  bench = random_benchmark(cfg, num_classes * per_class, num_classes * 10)
  exp = Experiment.create(cfg, bench)
  stamps = {}

  def hook(phase, step=None, **_):
    stamps.setdefault(phase, []).append(time.perf_counter())

  with tempfile.TemporaryDirectory() as tmp:
    ckpts, log = Checkpoints(tmp), workdir_lib.MetricsLog(tmp)
    t0 = time.perf_counter()
    m = registry.get(method)
    run_hook = pipeline.compiling_ahead(exp, m, hook)  # as pipeline.run: config.compile_ahead
    first = m.first_session(exp, ckpts, log, None, run_hook)
    t1 = time.perf_counter()
    ahead = exp.programs.wait()  # any wait for the programs compiled ahead counts in the sessions
    run_sessions(exp, m.runner(exp, first, ckpts, None, log), ckpts, log, hook=run_hook)
    t2 = time.perf_counter()
    exp.programs.close()
    ckpts.close()
  base_steps, sessions = stamps['base_step'], stamps['session']
  # Steps come back a call at a time (base.steps_per_call on an accelerator): the rate is timed from
  # the end of the first call, which includes the compile.
  on_device, per_call = train_loop.data_placement(cfg, bench.train.images.nbytes)
  return dict(method=method, steps=steps, runs=runs, batch=base_batch(cfg),
              data_on_device=on_device, steps_per_call=per_call, parallel_runs=parallel_runs(cfg),
              first_step_s=round(base_steps[per_call - 1] - t0, 2),
              base_steps_per_s=(round((steps - per_call) / (base_steps[-1] - base_steps[per_call - 1]), 2)
                                if steps > per_call else None),
              base_phase_s=round(t1 - t0, 2), incremental_s=round(t2 - t1, 2),
              incremental_after_first_session_s=round(sessions[-1] - sessions[0], 2),
              sessions=len(sessions), compile_ahead=ahead, backend=jax.default_backend(),
              device_kind=jax.devices()[0].device_kind, num_devices=jax.device_count())


def format_whole_runs(rows: Sequence[dict]) -> str:
  lines = [f"{'whole run':<10} {'steps':>6} {'/call':>5} {'runs':>4} {'1st call s':>10} {'steps/s':>8} "
           f"{'base s':>8} {'sessions s':>10} {'w/o 1st':>8}"]
  for r in rows:
    rate = '-' if r['base_steps_per_s'] is None else f"{r['base_steps_per_s']:.2f}"
    lines.append(f"{r['method']:<10} {r['steps']:>6} {r['steps_per_call']:>5} {r['runs']:>4} "
                 f"{r['first_step_s']:>10.1f} {rate:>8} "
                 f"{r['base_phase_s']:>8.1f} {r['incremental_s']:>10.1f} "
                 f"{r['incremental_after_first_session_s']:>8.1f}")
  return '\n'.join(lines)


CPU_DTYPES = ('float32',)
CPU_M_LIST = (2, 4)
CPU_WHOLE_RUN = dict(steps=10, runs=1)  # an F2M step of the full config takes seconds on a CPU
CPU_MAX_MEMBERS = 4  # the members unrolled: compile time grows with S, the speed does not


def for_backend(config: ml_collections.ConfigDict, backend: str) -> ml_collections.ConfigDict:
  """With bench.backend_defaults (the default) on a CPU, time only what XLA:CPU runs well: float32
  (it has no native bfloat16 convolutions), M in (2, 4) (the paper's range) and the draws unrolled
  (its grouped convolutions under vmap take minutes a step at M = 8). On a 2-core machine the
  default then takes a few minutes instead of over 20; --config.bench.backend_defaults=False times
  everything the config lists. Elsewhere the config is used as it is."""
  config = ml_collections.ConfigDict(config.to_dict())
  if config.bench.backend_defaults and backend == 'cpu':
    config.bench.dtypes = tuple(d for d in config.bench.dtypes if d in CPU_DTYPES) or CPU_DTYPES
    config.bench.M_list = tuple(m for m in config.bench.M_list if m in CPU_M_LIST) or CPU_M_LIST
    config.bench.other_draw_map = False
    config.bench.whole_run_steps = min(config.bench.whole_run_steps, CPU_WHOLE_RUN['steps'])
    config.bench.whole_run_runs = min(config.bench.whole_run_runs, CPU_WHOLE_RUN['runs'])
    config.bench.member_sizes = tuple(s for s in config.bench.member_sizes if s <= CPU_MAX_MEMBERS)
  return config


def run(config: ml_collections.ConfigDict, workdir: str) -> list:
  """Runs every variant for every dtype of config.bench.dtypes; writes the JSON; returns the records."""
  config = for_backend(config, jax.default_backend())
  mesh = sharding.data_mesh()
  device = jax.devices()[0]
  print(f'bench on {jax.device_count()} x {device.device_kind} ({jax.default_backend()}), '
        f'{os.cpu_count()} CPU cores', flush=True)
  records = []
  for dtype in config.bench.dtypes:
    new = bench_dtype(config, dtype, mesh)
    print(format_table(new), flush=True)
    records.extend(new)
  member_records = []
  if config.bench.member_sizes:
    cases = member_cases(config, mesh)
    member_records = [_record(c, config.model.dtype, t) for c, t in
                      zip(cases, time_cases(cases, config.bench.warmup, config.bench.iters))]
    print(format_members(member_records), flush=True)
  whole = []
  if config.bench.whole_run_steps > 0:
    whole = [whole_run(config, m, config.bench.whole_run_steps, config.bench.whole_run_runs)
             for m in ('f2m', 'baseline')]
    print(format_whole_runs(whole), flush=True)
  os.makedirs(workdir, exist_ok=True)
  path = output_path(workdir)
  workdir_lib.atomic_write(path, json.dumps({'provenance': workdir_lib.provenance(config.to_dict()), 'records': records,
                                             'whole_runs': whole, 'members': member_records}, indent=1))
  print(f'bench records written to {path}', flush=True)
  return records
