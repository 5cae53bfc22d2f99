"""A whole run of any method (f2m_jax/methods): session 1, R runs of the later sessions, results; and
the flatness of a base model. `resolve` and `run` are the entry points run.py, the tests and the
scripts call.

Every stage checkpoints what it produced, and rerunning on the same workdir continues from there.
The stages live one layer down: train_loop (session 1's training), evaluator, sessions; the
Experiment (static description of the run, PRNG keys) in experiment.py.
"""
from __future__ import annotations

import functools
import json
import os
import time
from typing import Optional

import ml_collections
import numpy as np

from f2m_jax import evaluation
from f2m_jax import flatness
from f2m_jax import programs as programs_lib
from f2m_jax import registry
from f2m_jax import validation
from f2m_jax import workdir as workdir_lib
from f2m_jax.checkpoint import CheckpointError, Checkpoints
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.data import sources
from f2m_jax.experiment import Experiment, Hook
from f2m_jax.methods import common
from f2m_jax.sessions import run_sessions
from f2m_jax.train_loop import selection_info


def resolve(config: ml_collections.ConfigDict, reads_data: bool = True) -> ml_collections.ConfigDict:
  """The effective config: the method's presets (f2m_jax/methods; e.g. `method=baseline` turns off
  noise, fine-tuning and PN and uses shuffled batches, as the paper's Baseline) over the config
  file's values, except on the fields the user set (`set_by_user`), then every value validated, and
  (`reads_data`) the data folder it will read checked before anything is written. The bench's whole
  runs pass False: they train on random data of the config's shapes."""
  config = ml_collections.ConfigDict(config.to_dict())
  method = registry.get(config.method)
  apply_presets(config, method.presets)
  validation.validate(config)
  if method.validate is not None:
    method.validate(config)
  if reads_data:
    validation.check_data_folder(config)
  return config


def apply_presets(config: ml_collections.ConfigDict, presets) -> None:
  """Sets each {dotted field: value} of `presets` in `config` unless the field is in
  config.set_by_user (the user's value stays; it is validated as any other)."""
  kept = set(config.get('set_by_user', ()))
  for field, value in presets.items():
    if field not in kept:
      *sections, name = field.split('.')
      functools.reduce(lambda node, key: node[key], sections, config)[name] = value


NETWORK_FIELDS = ('model.arch', 'model.width', 'model.head')


def check_source_network(checkpoint: str, config: ml_collections.ConfigDict) -> None:
  """--checkpoint W must hold the network this config builds (W's config.json, fields added since
  read as their legacy values): else a clear error instead of orbax's tree mismatch."""
  path = os.path.join(checkpoint, 'config.json')
  if not os.path.exists(path):
    return  # a folder of checkpoints alone: restoring will tell
  saved = workdir_lib.flat_items(workdir_lib.saved_config(checkpoint, config.to_dict()))
  ours = workdir_lib.flat_items(config.to_dict())
  diff = [f'{k}={saved.get(k)!r} there, {ours[k]!r} here' for k in NETWORK_FIELDS if saved.get(k) != ours[k]]
  if diff:
    raise CheckpointError(f'--checkpoint {checkpoint} holds another network than method={config.method} builds '
                          f'({"; ".join(diff)}); pass a workdir trained with the same network, or none (the '
                          'base session is then trained here)')


def run(config: ml_collections.ConfigDict, workdir: str, mode: str = 'train',
        checkpoint: Optional[str] = None, hook: Hook = None) -> dict:
  """Trains (or, mode='eval', only restores) and writes results.json / results.csv; returns results."""
  config = resolve(config)
  if checkpoint:
    check_source_network(checkpoint, config)
  workdir_lib.prepare(workdir, config.to_dict(), registry.method_sections())
  bench = sources.load_benchmark(config)
  exp = Experiment.create(config, bench)
  log = workdir_lib.MetricsLog(workdir, tensorboard=config.tensorboard)
  ckpts = Checkpoints(workdir)
  source = Checkpoints(checkpoint, read_only=True) if checkpoint else None
  if source is None and not ckpts.has_model() and (mode == 'eval' or ckpts.any_sessions()):
    raise CheckpointError(f'{ckpts.root}/model has no base model checkpoint (deleted?) although this workdir '
                          'is meant to hold one; restore it, pass --checkpoint WORKDIR, or use a new --workdir')
  t0 = time.time()
  method = registry.get(config.method)
  hook = compiling_ahead(exp, method, hook)
  try:
    first = method.first_session(exp, ckpts, log, source, hook)
    report_compile_ahead(exp.programs.wait(), log)
    runner = method.runner(exp, first, ckpts, source, log)
    per_run, norms = run_sessions(exp, runner, ckpts, log, train=(mode != 'eval'), hook=hook)
    base_info = selection_info(config, source or ckpts)
  finally:
    exp.programs.close()
    ckpts.close()  # also when stopped: the checkpoints written in the background are completed
  results = evaluation.build_results(bench.name, config.method, config.data.protocol,
                                     [bench.num_seen_classes(t) for t in range(1, bench.num_sessions + 1)],
                                     per_run, norms if all(n is not None for n in norms) else None)
  results['base_model'] = base_info
  wall = round(time.time() - t0, 1)
  results['provenance'] = {**workdir_lib.provenance(config.to_dict()), 'wall_time_s': wall}
  log.write(phase='done', mode=mode, wall_time_s=wall,
            base_checkpoint=os.path.abspath(checkpoint) if checkpoint else None)
  log.close()
  write_outputs(workdir, results, mode)
  return results


def compiling_ahead(exp: Experiment, method, hook: Hook) -> Hook:
  """`hook`, and (config.compile_ahead) at the first base step, once the base step's own program
  has compiled, the start of compiling the method's session programs in the background while the
  rest of session 1 trains (f2m_jax/programs.py). Without base training (a restored model) nothing
  is compiled ahead: there is nothing to overlap."""
  if not (method.compile_ahead and programs_lib.enabled(exp.config.compile_ahead)):
    return hook
  started = []

  def start_then(kind, **kw):
    if kind == 'base_step' and not started:
      started.append(True)
      exp.programs.compile_ahead(lambda: method.compile_ahead(exp))
    if hook:
      hook(kind, **kw)

  return start_then


def report_compile_ahead(done: Optional[dict], log) -> None:
  """Prints and logs (phase 'compile_ahead') what the background compiles did, once the later
  stages need their programs: `waited_s` is the part of their compiling that was not hidden."""
  if done is None:
    return
  print(f'compiled ahead: {done["programs"]} programs, {done["compile_s"]} s in the background; waited '
        f'{done["waited_s"]} s for them' + (f'; failed (compiled at first call): {done["failed"]}'
                                             if done['failed'] else ''), flush=True)
  log.write(phase='compile_ahead', **done)


def write_outputs(workdir: str, results: dict, mode: str) -> None:
  """results.json/csv. In eval mode an existing results.json is compared, never overwritten: a
  difference is written to results_eval.json and reported."""
  path = os.path.join(workdir, 'results.json')
  if mode == 'eval' and os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    strip = lambda r: {k: v for k, v in r.items() if k != 'provenance'}  # when and where differ, nothing else may
    if strip(saved) == strip(json.loads(json.dumps(results))):
      print(f'evaluation reproduced {path} exactly', flush=True)
      return
    workdir_lib.write_results(workdir, results, evaluation.results_rows(results), name='results_eval')
    print(f'evaluation differs from {path}; wrote results_eval.json beside it', flush=True)
    return
  workdir_lib.write_results(workdir, results, evaluation.results_rows(results))


def run_flatness(config: ml_collections.ConfigDict, workdir: str, checkpoint: Optional[str] = None) -> dict:
  """--mode flatness: I and sigma^2 of the base loss around the base model of `workdir` (or of
  `checkpoint`) on the base training images and the base classes' test images; writes flatness.json."""
  config = resolve(config)
  bench = sources.load_benchmark(config)
  exp = Experiment.create(config, bench)
  ckpts = Checkpoints(checkpoint or workdir, read_only=True)
  model = common.base_model(exp, ckpts, log=None, source=ckpts)
  variables = {'params': model['params'], 'batch_stats': model['batch_stats']}
  f = config.flatness
  bound = f.bound if f.bound >= 0 else config.noise.bound
  rng = np.random.default_rng([config.seed, 5])
  out = {'bound': bound, 'distribution': config.noise.distribution, 'num_layers': config.noise.num_layers,
         'checkpoint': os.path.abspath(checkpoint or workdir), 'provenance': workdir_lib.provenance(config.to_dict())}
  test_idx = protocol_lib.test_indices(bench, 1)
  for name, split, idx in (('train', bench.train, bench.base_train), ('test', bench.test, test_idx)):
    if f.max_images and len(idx) > f.max_images:
      idx = np.sort(rng.choice(idx, f.max_images, replace=False))
    clean, losses = flatness.noisy_losses(
        exp.model, variables, split.images[idx], split.labels[idx], exp.noise_paths, exp.split, bound,
        config.noise.distribution, f.num_draws, f.chunk, exp.key(3), bench.mean, bench.std,
        config.eval.batch_size)
    out[name] = {**flatness.flatness_stats(clean, losses), 'num_images': int(len(idx))}
    print(f'flatness on {name} ({len(idx)} images, {f.num_draws} draws): L*={clean:.4f} '
          f'I={out[name]["I"]:.3e} sigma^2={out[name]["sigma2"]:.3e}', flush=True)
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, 'flatness.json')
  if os.path.exists(path):
    path = os.path.join(workdir, f'flatness_{time.strftime("%Y%m%d-%H%M%S")}.json')
  workdir_lib.atomic_write(path, json.dumps(out, indent=2))
  print(f'wrote {path}', flush=True)
  return out
