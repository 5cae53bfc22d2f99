"""--dry-run: what a run would do, checked as the run checks it, with nothing written: the effective config, the
data (every path and the session layout read, a sample of image headers, no image decoded), the decoded-image
cache, and the cost of one base step (estimated from its FLOPs, or measured by running one: --time-step)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import timeit

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from f2m_jax import base as base_lib
from f2m_jax import progress
from f2m_jax import sharding
from f2m_jax.data import augment, folder, holdout, sources
from f2m_jax.run import backend
from f2m_jax.run import bench
from f2m_jax.run import members
from f2m_jax.run import pipeline
from f2m_jax.run.workdir import flat_items

def describe(config, origin, time_step: bool = False, checkpoint=None) -> str:
  """The dry run's text: the effective config as JSON (checked), what the presets and each 'auto' set, the data,
  the cache and a base step's cost (none with `checkpoint`, the base model's workdir). A sweep: its first member's."""
  if members.enabled(config):
    members.validate(config)
    config = members.member_configs(config)[0]
  resolved = pipeline.resolve(config, (origin or {}).get('changes'))
  before, after = flat_items(config.to_dict()), flat_items(resolved.to_dict())
  set_here = [f'  {k}: {before[k]!r} -> {after[k]!r}' for k in sorted(after) if before.get(k) != after[k]]
  b, p, plan = data_at_hand(resolved)
  return '\n'.join([json.dumps(resolved.to_dict(), indent=1, sort_keys=True),
                    f'set when the run starts (method {resolved.method}\'s presets, \'auto\' on {backend.devices()}):',
                    *(set_here or ['  nothing']), *data_lines(resolved, b, p), *cache_lines(resolved, plan),
                    step_line(resolved, b, time_step, checkpoint), 'dry run: nothing was written'])


def data_at_hand(config) -> tuple:
  """(the config's Benchmark, its folder.Protocol, the cache plan): a folder source's read as the run reads it, with
  one-pixel images; a line instead where a dry run reads no image (another source) or the run writes first."""
  if config.data.source == 'synthetic':
    return sources.load_benchmark(config), None, None
  spec = sources.folder_spec(config, writes=False) if config.data.source in ('folder', 'fake_folder') else None
  if spec is None:
    return (f'data: {config.data.dataset} from data.source={config.data.source!r}: a dry run reads no image of it '
            f'(the run reads it, or downloads or generates it into {sources.cache_dir(config)}, first)'), None, None
  p = folder.read_protocol(spec)
  placeholder = {s: np.zeros((len(getattr(p, s).files), 1, 1, 3), np.uint8) for s in ('train', 'test')}
  b = dataclasses.replace(folder.benchmark(spec, p, placeholder), image_size=1)
  b = holdout.validation_benchmark(b) if config.data.protocol == 'validation' else b
  return b, p, folder.cache_plan(spec, p, sources.cache_dir(config))


def spread(counts) -> str:
  """'min / median / max' of `counts`."""
  return f'{int(np.min(counts))} / {int(np.median(counts))} / {int(np.max(counts))}'


def data_lines(config, b, p) -> list:
  """Classes found and used, the session layout, images per class and where the test images come from; a
  folder source's class names and image files; the augmentation."""
  if isinstance(b, str):
    return [b]
  seen = b.num_seen_classes(b.num_sessions)
  train = np.bincount(b.train.labels[b.base_train], minlength=seen)[:b.num_base_classes]
  pool = np.bincount(b.train.labels[b.shot_pool], minlength=seen)[b.num_base_classes:seen]
  test = np.bincount(b.test.labels, minlength=seen)[:seen]
  ways = '/'.join(map(str, sorted({len(c) for c in b.session_classes[1:]})))
  origin = (', held out of the base classes\' training images' if config.data.protocol == 'validation'
            else f', from {p.test.where}' if p else '')
  names = p and ', '.join(p.order[:4]) + (f', ..., {p.order[-1]}' if len(p.order) > 4 else '')
  return [f'data: {b.name}, {f"{p.found} classes found in {p.train.where}, " if p else ""}{seen} classes '
          f'used (protocol {config.data.protocol}): session 1 of {b.num_base_classes} classes, then '
          f'{b.num_sessions - 1} sessions of {ways} classes x {config.data.shots} shots, {config.runs} runs',
          *([f'  classes in label order: {names}'] if p else []),
          f'  training images per class (min / median / max): base classes {spread(train)}; later classes '
          f'{spread(pool) if pool.size else "-"} (their shots are drawn from these)',
          f'  test images per class (min / median / max): {spread(test)}, {int(test.sum()):,} in all{origin}',
          *([f'  image files: {files_line(p.train.paths() + p.test.paths())}'] if p else []),
          f'  training augmentation: {augment.AUGMENTS[b.augment]} ({b.augment})']


def files_line(paths: list, sample: int = 24) -> str:
  """The sizes and colour modes of `sample` files spread over `paths`, read from their headers."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  heads = []
  for i in np.unique(np.linspace(0, len(paths) - 1, min(sample, len(paths))).astype(int)):
    with contextlib.suppress(OSError), Image.open(paths[i]) as img:  # missing or not an image: the run names it
      heads.append((*img.size, img.mode))
  if not heads:
    return f'none of the {min(sample, len(paths))} files read is an image'
  (w0, h0), (w1, h1) = np.min([h[:2] for h in heads], 0), np.max([h[:2] for h in heads], 0)
  modes = {h[2] for h in heads}
  gray = ' (grayscale: its value in all three channels)' if modes & {'1', 'L', 'LA', 'I', 'I;16'} else ''
  return (f'{w0}x{h0}' if (w0, h0) == (w1, h1) else f'widths {w0} to {w1}, heights {h0} to {h1}') + (
      f' pixels, colour mode {"/".join(sorted(modes))}{"" if modes == {"RGB"} else f", converted to RGB{gray}"} '
      f'({len(heads)} of {len(paths):,} files read)')


def size(nbytes: float) -> str:
  for unit, scale in (('GB', 1e9), ('MB', 1e6), ('kB', 1e3)):
    if nbytes >= scale:
      return f'{nbytes / scale:.1f} {unit}'
  return f'{int(nbytes)} B'


def cache_lines(config, plan) -> list:
  """Where the cache folder is, what it holds, what this run decodes into it and how to clear it."""
  cache = pathlib.Path(sources.cache_dir(config))
  held = [size(sum(f.stat().st_size for f in (cache / d).rglob('*') if f.is_file()))
          for d in ('', 'arrays', 'jax_compilation_cache')]
  lines = [f'cache: {cache} holds {held[0]} (decoded images {held[1]}, compiled programs {held[2]})']
  for split, (paths, (folder_path, name, resize, crop)) in (plan or {}).items():
    target = folder.cached_file(paths, folder_path, name, resize, crop)
    lines.append(f'  {split}: {len(paths):,} images of {crop}x{crop} ({size(len(paths) * crop * crop * 3)}), '
                 f'{"cached already" if target.is_file() else "decoded once on the first run"}: {target}')
  return lines + ([f'  to clear: rm -r {target.parent} (every image size of this dataset: decoded again when '
                   f'needed), or rm -r {cache} (all: downloads, decoded images, compiled programs)'] if plan else [])


def step_line(config, b, time_step: bool, checkpoint) -> str:
  """The cost of one base step: none with `checkpoint` (checked as the run checks it), else measured (`time_step`)
  or estimated: its FLOPs (XLA's count of the lowered program) at the rate a matrix product reaches here."""
  if checkpoint:
    pipeline.source_config(checkpoint, config)
    return f'base training: none, the base model is read from --checkpoint {checkpoint}'
  c = ml_collections.ConfigDict(config.to_dict())
  c.base.steps_per_call = 1
  if not isinstance(b, str) and 'folder' in c.data:
    c.data.folder.num_base = b.num_base_classes  # bench's shapes
  exp, mesh, steps = bench.bench_experiment(c, c.model.dtype), sharding.data_mesh(), config.base.steps
  if time_step:
    record = bench.time_cases([bench.program_case(exp, exp.loss, 'f2m', c.noise.M, 1, mesh)],
                              c.model.dtype, 1, 2)[0]
    seconds = record['step_ms_median'] / 1e3
    return (f'base step: {seconds:.3g} s, measured (compiled in {record["compile_s"]:.0f} s, then 3 steps on random '
            f'images of the config\'s shapes); base.steps={steps:,}: about {progress.elapsed(seconds * steps)}')
  program = base_lib.make_train_program(exp.model, exp.loss, exp.optimizer(), exp.bench, c.members.map, mesh)
  state = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct((1, *s.shape), s.dtype), exp.state_shapes())
  lowered = program.lower(state, exp.bench.train.images, exp.bench.train.labels,  # traced: only shapes matter
                          np.zeros((1, 1, bench.base_batch(c)), np.int32), np.int32(1), jnp.stack([exp.key(0)]),
                          np.full((1,), c.noise.bound, np.float32))
  matmul, x = jax.jit(lambda a: a @ a), jnp.ones((1024, 1024), jnp.float32)  # the best of 5 (the first compiles)
  rate = 2 * 1024 ** 3 / min(timeit.repeat(lambda: matmul(x).block_until_ready(), number=1, repeat=5))
  flops = float(lowered.cost_analysis()['flops'])
  return (f'base step: at least {flops / rate:.2g} s, estimated: its {flops / 1e9:.3g} GFLOP at the {rate / 1e9:.0f} '
          "GFLOP/s a matrix product reaches here (a small network's step takes several times that); "
          f'base.steps={steps:,}: at least {progress.elapsed(flops / rate * steps)}. --dry-run --time-step measures it')

