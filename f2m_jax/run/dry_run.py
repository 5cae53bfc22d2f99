"""--dry-run: what a run would do, checked as the run checks it, with nothing written: the effective
config, the data (every path and the session layout read, a sample of image headers, no image
decoded), the decoded-image cache, and the base training's time from a step timed here."""
import contextlib
import dataclasses
import json
import pathlib

import numpy as np
from tqdm import tqdm

from f2m_jax import progress
from f2m_jax.data import augment, folder, holdout, sources
from f2m_jax.run import backend, bench, members, pipeline, workdir


def describe(config, origin, checkpoint=None):
  """The dry run's text: the effective config (a line a section), what the presets and each 'auto'
  set, the data, the cache and the base training's time (none with `checkpoint`, the base model's
  workdir); a sweep's as its first member's, its steps timed for all its members."""
  sweep = members.member_configs(config)
  resolved = pipeline.resolve(sweep[0], (origin or {}).get('changes'))
  effective = resolved.to_dict()
  before, after = workdir.flat_items(sweep[0].to_dict()), workdir.flat_items(effective)
  set_here = [f'  {k}: {before[k]!r} -> {after[k]!r}' for k in sorted(after)
              if before.get(k) != after[k]]
  b, p, plan = data_at_hand(resolved)
  return '\n'.join([
      '{', ',\n'.join(f' "{k}": {json.dumps(v, sort_keys=True)}'
                      for k, v in sorted(effective.items())), '}',
      f"set when the run starts (method {resolved.method}'s presets, 'auto' on "
      f'{backend.devices()}):',
      *(set_here or ['  nothing']), *data_lines(resolved, b, p), *cache_lines(resolved, plan),
      step_line(resolved, b, len(sweep), checkpoint), 'dry run: nothing was written'])


def data_at_hand(config):
  """(the config's Benchmark, its folder.Protocol, the cache plan): a folder source's read as the
  run reads it, with one-pixel images; (None, None, {}) where a dry run reads no image."""
  if config.data.source == 'synthetic':
    return sources.load_benchmark(config), None, {}
  spec = config.data.source in ('folder', 'fake_folder') and sources.folder_spec(
      config, writes=False)  # None: the run generates the folder first
  if not spec:
    return None, None, {}
  p = folder.read_protocol(spec)
  one_pixel = {s: np.zeros((len(getattr(p, s).files), 1, 1, 3), np.uint8)
               for s in ('train', 'test')}
  b = dataclasses.replace(folder.benchmark(spec, p, one_pixel), image_size=1)
  if config.data.protocol == 'validation':
    b = holdout.validation_benchmark(b)
  return b, p, folder.cache_plan(spec, p, sources.cache_dir(config))


def spread(counts):
  return f'{int(np.min(counts))} / {int(np.median(counts))} / {int(np.max(counts))}'


def data_lines(config, b, p):
  """Classes found and used, the session layout, images per class and where the test images come
  from; a folder source's class names and image files; the augmentation. Without `b`, a line
  saying that a dry run reads no image."""
  if b is None:
    return [f'data: {config.data.dataset} from data.source={config.data.source!r}: a dry run reads '
            f'no image of it (the run reads it, or downloads or generates it into '
            f'{sources.cache_dir(config)}, first)']
  seen, base = b.num_seen_classes(b.num_sessions), b.num_base_classes
  per_class = lambda labels: np.bincount(labels, minlength=seen)
  train, pool = per_class(b.train.labels[b.base_train]), per_class(b.train.labels[b.shot_pool])
  test = per_class(b.test.labels)[:seen]
  ways = {len(c) for c in b.session_classes[1:]}
  origin = f', from {p.test.where}' if p else ''
  if config.data.protocol == 'validation':
    origin = ", held out of the base classes' training images"
  lines = [
      f'data: {b.name}, {f"{p.found} classes found in {p.train.where}, " if p else ""}{seen} '
      f'classes used (protocol {config.data.protocol}): session 1 of {base} classes, '
      f'then {b.num_sessions - 1} sessions of {"/".join(map(str, sorted(ways)))} classes x '
      f'{config.data.shots} shots, '
      f'{config.runs} runs',
      f'  training images per class (min / median / max): base classes {spread(train[:base])}; '
      f'later classes {spread(pool[base:seen]) if seen > base else "-"} (their shots are drawn '
      'from these)',
      f'  test images per class (min / median / max): {spread(test)}, {test.sum():,} in '
      f'all{origin}',
      f'  training augmentation: {augment.AUGMENTS[b.augment]} ({b.augment})']
  if p:
    names = ', '.join(p.order[:4]) + (f', ..., {p.order[-1]}' if len(p.order) > 4 else '')
    lines.insert(1, f'  classes in label order: {names}')
    lines.insert(-1, files_line(p.train.paths() + p.test.paths(), config.data.image_size))
  return lines


def files_line(paths, image_size):
  """The line of the image files: the sizes and colour modes of 24 files spread evenly over `paths`,
  read from their headers, and the size the network sees."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  picked, heads = np.linspace(0, len(paths) - 1, min(24, len(paths))).astype(int), []
  for i in picked:  # distinct: spaced by 1 or more
    with contextlib.suppress(OSError), Image.open(paths[i]) as img:  # the run names a bad one
      heads.append((*img.size, img.mode))
  if not heads:
    return f'  image files: none of the {len(picked)} files read is an image'
  w, h, modes = zip(*heads)
  sizes = f'widths {min(w)} to {max(w)}, heights {min(h)} to {max(h)}'
  if len(set(zip(w, h))) == 1:
    sizes = f'{w[0]}x{h[0]}'
  return (f'  image files: {sizes} pixels, colour mode {"/".join(sorted(set(modes)))} in the '
          f'{len(heads)} files sampled (one in {len(paths) // len(picked):,} of {len(paths):,}; '
          'every file is decoded as RGB, a grey one into all three channels); the network sees '
          f'{image_size}x{image_size} (data.image_size)')


def cache_lines(config, plan):
  """Where the cache folder is, what it holds, what this run decodes into it and how to clear it."""
  cache = pathlib.Path(sources.cache_dir(config))
  held = [sum(f.stat().st_size for f in (cache / d).rglob('*') if f.is_file())
          for d in ('', 'arrays', 'jax_compilation_cache')]
  lines = [f'cache: {cache} holds {tqdm.format_sizeof(held[0], "B")} (decoded images '
           f'{tqdm.format_sizeof(held[1], "B")}, compiled programs '
           f'{tqdm.format_sizeof(held[2], "B")})']
  for split, (paths, args) in plan.items():
    target, crop = folder.cached_file(paths, *args), args[-1]
    lines.append(f'  {split}: {len(paths):,} images of {crop}x{crop} '
                 f'({tqdm.format_sizeof(len(paths) * crop * crop * 3, "B")}), '
                 f'{"cached already" if target.is_file() else "decoded once on the first run"}: '
                 f'{target}')
  if plan:
    lines.append(f'  to clear: rm -r {target.parent} (every image size of this dataset: decoded '
                 f'again when needed), or rm -r {cache} (all: downloads, decoded images, compiled '
                 'programs)')
  return lines


def step_line(config, b, num_members, checkpoint):
  """The base training's time: none with `checkpoint` (checked as the run checks it), else one step
  (of the `num_members` of a sweep) compiled and timed here on random images of the config's shapes
  (a folder's layout as read), times base.steps, plus the compile."""
  if checkpoint:
    pipeline.source_config(checkpoint, config)
    return f'base training: none, the base model is read from --checkpoint {checkpoint}'
  c = config.copy_and_resolve_references()
  c.base.steps_per_call = 1
  if 'folder' in c.data and b is not None:
    c.data.folder.update(num_base=b.num_base_classes, way=len(b.session_classes[-1]),
                         num_sessions=b.num_sessions)
  exp = bench.bench_experiment(c, c.model.dtype)
  r = bench.time_cases([bench.program_case(exp, {}, 'base step', c.noise.M, num_members)],
                       c.model.dtype, 1, 2)[0]
  step, steps = r['step_ms_median'] / 1e3, config.base.steps
  return (f'base training: about {progress.elapsed(r["compile_s"] + step * steps)} on this '
          f'machine at its present load: a compile of {r["compile_s"]:.0f} s, then '
          f'base.steps={steps:,} of {step:.3g} s (a step'
          f'{f" of the {num_members} members" * (num_members > 1)} timed here, the median of 2 '
          'after 1)')
