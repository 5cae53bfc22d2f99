"""A whole run of any method (f2m_jax/methods): session 1, R runs of the later sessions, results;
and the flatness of a base model. Rerunning on the same workdir continues from the last checkpoint.
"""
import contextlib
import json
import os
import time

import ml_collections
import numpy as np

from f2m_jax import evaluation, files, flatness, registry, stats, validation
from f2m_jax.data import protocol as protocol_lib, sources
from f2m_jax.experiment import Experiment
from f2m_jax.files import CheckpointError
from f2m_jax.methods import common
from f2m_jax.run import backend, memory, workdir as workdir_lib
from f2m_jax.run.checkpoint import Checkpoints, has_base_model
from f2m_jax.sessions import run_sessions
from f2m_jax.train_loop import selection_info


def resolve(config, changes=None, reads_data=True):
  """The config a run runs: `effective` with each 'auto' resolved here (backend.resolve), every
  value checked (validation.py, the method's `validate`), with `reads_data` the data folder and
  memory (memory.py) too."""
  config = backend.resolve(effective(config, changes))
  validation.validate(config)
  method = registry.get(config.method)
  if method.validate:
    method.validate(config)
  if reads_data:
    validation.check_data_folder(config)
    memory.check(config, *memory.generated(config))
  return config


def effective(config, changes=None):
  """The config as config.json records it: the method's presets over its values but `changes` (the
  command line's), base.shots=0 resolved (protocol.sampler_shots), each 'auto' kept for the backend
  that runs it."""
  config = ml_collections.ConfigDict(config.to_dict())
  # not over the user's values: those are validated as any other
  presets = registry.get(config.method).presets
  config.update_from_flattened_dict({k: v for k, v in presets.items() if k not in (changes or {})})
  b = config.base
  b.shots = protocol_lib.sampler_shots(b.sampler, b.batch_size, b.ways, b.shots)
  return config


def checked(config, workdir, checkpoint, origin):
  """(the effective config as a dict, `resolve`'s) once the workdir's config.json (with
  --checkpoint), then every value, are checked. `origin`: as `run`'s."""
  changes = (origin or {}).get('changes')
  record = effective(config, changes).to_dict()
  workdir_lib.check_record(workdir, record, checkpoint and {'path': os.path.abspath(checkpoint)})
  return record, resolve(config, changes)


def run(config, workdir, mode='train', checkpoint=None, hook=None, origin=None):
  """Trains (or, mode='eval', only restores) and writes results.json / results.csv; returns results.
  Every check comes before anything is written, then the workdir is held (Lock); a finished one is
  not trained again. `origin` ({'config', 'changes'}, cli.py) decides which presets apply and goes
  into the provenance."""
  record, config = checked(config, workdir, checkpoint, origin)
  writes = writes_into(workdir, mode)  # a read-only finished run is evaluated too
  path = f'{workdir}/results.json'
  # one that is not JSON named before any work
  saved = files.read_json(path) if os.path.exists(path) else None
  trains = mode == 'train' and not checkpoint and not has_base_model(workdir)
  exp = check(config, sources.load_benchmark(config), int(trains))
  base_source = checkpoint and source(checkpoint, exp)
  with contextlib.closing(workdir_lib.prepare(workdir, record, base_source=base_source,
                                              writes=writes)):
    if mode == 'train' and saved:  # finished: nothing rewritten but a lost results.csv
      Checkpoints(workdir, read_only=True).close()  # refuses a config.json edited since
      lost = not os.path.exists(f'{workdir}/results.csv')
      if lost:
        workdir_lib.write_results(workdir, 'results', stats.results_rows(saved))
      written = saved.get('provenance', {}).get('time', 'earlier')
      print(f'{workdir} is already complete ({path}, written {written}): nothing was recomputed or '
            f'rewritten{"; results.csv was missing and was written again from it" * lost}; '
            '--mode eval recomputes it from the checkpoints and compares')
      return saved
    results = compute(exp, record, workdir, mode, base_source, hook, origin, writes)
    print(write_outputs(workdir, results, mode, writes))
    return results


def writes_into(workdir, mode, what='run'):
  """Whether `mode` writes into `workdir` (workdir.writes_into), once checked: a CheckpointError
  where --mode eval finds no `what` (no config.json) in it."""
  if mode == 'eval' and not os.path.exists(f'{workdir}/config.json'):
    raise CheckpointError(f'nothing to evaluate: {workdir} holds no {what} (no config.json); train '
                          'it first (without --mode eval)')
  return workdir_lib.writes_into(workdir, mode)


def check(config, bench, members=0):
  """The run's Experiment, once the network, its noise set, the data's limits and the memory of its
  programs (memory.py; `members` > 0: its base step of that many members too) are checked."""
  exp = Experiment.create(config, bench)
  validation.check_benchmark(exp)
  memory.check(config, *memory.programs(exp, members), compiled=True)
  return exp


def source_config(checkpoint, config):
  """--checkpoint W checked before anything is written (by a dry run too): the config W records
  (None without config.json); a CheckpointError where W holds no base model, or one of another
  network."""
  if not has_base_model(checkpoint):
    sweep = f'; it holds a sweep: pass a member, e.g. --checkpoint {checkpoint}/member_0'
    raise CheckpointError(f'--checkpoint {checkpoint} holds no base model '
                          f'({checkpoint}/checkpoints/model is missing): pass a workdir that holds '
                          'a trained one, or drop --checkpoint to train one here'
                          + sweep * os.path.isdir(f'{checkpoint}/member_0'))
  path = f'{checkpoint}/config.json'
  saved = workdir_lib.recorded_config(path) if os.path.exists(path) else None
  diff = [f'model.{k}={saved["model"][k]!r} there, {config.model[k]!r} here'
          for k in ('arch', 'width', 'head')
          if saved and saved['model'][k] != config.model[k]]
  if diff:
    raise CheckpointError(f'--checkpoint {checkpoint} holds another network than '
                          f'method={config.method} builds ({"; ".join(diff)}): set these fields to '
                          'the values there, or drop --checkpoint')
  return saved


def source(checkpoint, exp):
  """--checkpoint W's base model, checked (`source_config`, then restored) and described for the
  provenance: W's path, method, config differences from this run's, selection, commit, a `note`
  where W's method differs."""
  saved, ours = source_config(checkpoint, exp.config), exp.config.to_dict()
  out = {'path': os.path.abspath(checkpoint), 'method': None, 'differences': None, 'commit': None}
  with contextlib.closing(Checkpoints(checkpoint, read_only=True)) as ckpts:
    ckpts.restore_model(common.model_template(exp))
    if saved:
      there, here = workdir_lib.flat_items(saved), workdir_lib.flat_items(ours)
      out.update(method=saved['method'],
                 differences={k: [there.get(k), here.get(k)]
                              for k in workdir_lib.config_differences(saved, ours)},
                 selection=selection_info(ml_collections.ConfigDict(saved), ckpts))  # its own steps
  results = f'{checkpoint}/results.json'
  if os.path.exists(results):
    # its commit and whether dirty (workdir.git_state; {} outside a checkout)
    out.update((files.read_json(results).get('provenance') or {}).get('git') or {})
  if out['method'] not in (None, ours['method']):
    out['note'] = f'{ours["method"]} sessions on a base model trained by {out["method"]}'
  return out


def compute(exp, record, workdir, mode, base_source, hook, origin, writes):
  """`run`'s work once the checks passed: session 1 and every run's sessions through the method,
  then the results with their provenance (not yet written). `record`: the effective config; `writes`
  False: a read-only workdir's eval."""
  config, bench = exp.config, exp.bench
  log = workdir_lib.MetricsLog(workdir, tensorboard=config.tensorboard, writes=writes)
  source = base_source and Checkpoints(base_source['path'], read_only=True)
  ckpts = Checkpoints(workdir, read_only=not writes, source=source)  # closing it closes the source
  if not (source or ckpts.has_model()) and (mode == 'eval' or ckpts.any_sessions()):
    raise CheckpointError(f'{ckpts.root}/model has no base model checkpoint (deleted?) although '
                          'this workdir is meant to hold one; restore it, pass --checkpoint '
                          'WORKDIR, or use a new --workdir')
  # the start line, and the choices made otherwise than last time
  print('\n'.join(filter(None, [
      start_line(config, bench, workdir, mode, ckpts, base_source, origin),
      backend.moved((log.invocations or [{}])[-1], config)])))
  times = [round(i['end'] - i['time'], 1) for i in log.invocations
           if mode == 'train' == i.get('mode')]  # the earlier invocations', then this one's
  log.start(mode, **backend.record(config))
  t0, method = time.time(), registry.get(config.method)
  # also when stopped: the background saves complete
  with contextlib.closing(log), contextlib.closing(ckpts):
    first = method.first_session(exp, ckpts, log, source, hook)
    runner = method.runner(exp, first, ckpts, source, log)
    per_run, norms = run_sessions(exp, runner, ckpts, log, train=mode != 'eval', hook=hook)
    base_info = (base_source or {}).get('selection') or selection_info(config, source or ckpts)
  times.append(round(time.time() - t0, 1))
  results, digest = results_document(exp, per_run, norms, base_info, ckpts.differences)
  # the config as config.json has it; `choices`: what each 'auto' became here
  results['provenance'] = workdir_lib.provenance(
      record, origin, choices=backend.used(config),
      wall_time_s=round(sum(times), 1), invocation_times_s=times,
      shots=digest, base_source=base_source)
  log.write(phase='done', mode=mode, wall_time_s=times[-1],
            base_checkpoint=(base_source or {}).get('path'))
  return results


def results_document(exp, per_run, norms, base_info, differences):
  """results.json's contents but the provenance, and the digest of the runs' shots (for it): every
  session's statistics, the base model's selection, and the restored sessions' accuracies computed
  otherwise than saved (sessions.restore_session's)."""
  config, bench, data = exp.config, exp.bench, exp.config.data
  draws = protocol_lib.shot_draws(bench, data.protocol, data.shots, config.seed, config.runs)
  seen = evaluation.session_ends(bench, bench.num_sessions)
  results = stats.build_results(bench.name, config.method, data.protocol, seen, per_run,
                                None if None in norms else norms,  # dicts, or None
                                same_shots=draws['same'])
  results['base_model'] = base_info
  if differences:
    results['checkpoint_differences'] = differences
  return results, draws['digest']


def start_line(config, bench, workdir, mode, ckpts, base_source, origin):
  """The line before any work: what runs, on which devices, into which workdir, from which base
  model."""
  if base_source:
    base = f'base model from --checkpoint {base_source["path"]}'
    if 'note' in base_source:
      base += f' ({base_source["note"]})'
  elif ckpts.has_model():
    base = 'base model restored from this workdir'
  else:  # a resumed one says so when it starts (train_loop)
    base = f'base training {base_budget(config)}'
  done = sum(len(ckpts.sessions_done(r)) for r in range(config.runs)) if ckpts.any_sessions() else 0
  return (f'f2m-jax {mode}: {_what(config, origin)} on {backend.devices()}; workdir {workdir}; '
          f'{base}; then {config.runs} runs x {bench.num_sessions - 1} sessions'
          f'{f" ({done} restored)" * bool(done)}')


def base_budget(config):
  """'S steps of B (sampler), lr L[, M=.., b=..]': the base training `config` asks for."""
  b, noise = config.base, config.noise
  batch = b.ways * b.shots if b.sampler == 'balanced' else b.batch_size
  return (f'{b.steps} steps of {batch} ({b.sampler}), lr {b.lr:g}'
          f'{f", M={noise.M}, b={noise.bound:g}" * noise.enabled}')

def _what(config, origin):
  """The --config argument and its changes, and the method (and a sweep's member: its seed)."""
  if not (origin or {}).get('config'):
    return f'method={config.method}'
  changes = ', '.join(f'{k}={v!r}' for k, v in (origin.get('changes') or {}).items())
  member = f', sweep member {origin.get("sweep_member")}, seed {config.seed}'
  return (f'{origin["config"]}{f" with {changes}" * bool(changes)} (method {config.method}'
          f'{member * ("sweep_member" in origin)})')


def unused(workdir, name):
  """`name`, or where <workdir>/<name>.json exists, `name` with the time appended: a new file's
  name."""
  return name + time.strftime('_%Y%m%d-%H%M%S') * os.path.exists(f'{workdir}/{name}.json')


def write_new(workdir, name, doc):
  """Writes `doc` into <workdir>/<name>.json, or where that exists into a new file (`unused`);
  returns its path."""
  os.makedirs(workdir, exist_ok=True)
  path = f'{workdir}/{unused(workdir, name)}.json'
  files.atomic_write(path, json.dumps(doc, indent=1))
  return path


def differing(path, doc):
  """The keys of the JSON file `path` but 'provenance' (when and where) whose values `doc` (as JSON
  has it) changes; keys `path` lacks (one of an earlier version) are not compared."""
  saved, new = files.read_json(path), json.loads(json.dumps(doc))
  return sorted(k for k in saved
                if k != 'provenance' and saved[k] != new.get(k, workdir_lib.ABSENT))


def write_outputs(workdir, results, mode, writes=True):
  """results.json/csv; returns a line saying what was compared and written. In eval mode a
  difference goes to a new results_eval.json; a read-only workdir (`writes` False) gets the JSON on
  stdout instead."""
  path, name, line = f'{workdir}/results.json', 'results', 'no results.json to compare with'
  if mode == 'eval' and os.path.exists(path):
    differ = differing(path, results)
    if not differ:
      return (f'evaluation reproduced {path} exactly (every run and session computed again from '
              'its checkpoint); results.json unchanged, nothing written'
              f'{" but its lines in metrics.jsonl" * writes}')
    line = f'evaluation differs from {path} in {", ".join(differ)}'
    name = unused(workdir, 'results_eval')
  if not writes:
    return (f'{line}; {workdir} is read-only, so the results follow as JSON:\n'
            f'{json.dumps(results, indent=1)}')
  workdir_lib.write_results(workdir, name, stats.results_rows(results), results)
  if mode != 'eval':
    return f'results written to {path} and results.csv'
  return (f'{line}; wrote {name}.json and {name}.csv'
          f'{" beside it (results.json unchanged)" * (name != "results")}')


def run_flatness(config, workdir, checkpoint=None, origin=None):
  """--mode flatness: I and sigma^2 of the base loss around the base model of `workdir` (or
  `checkpoint`), into flatness.json."""
  record, config = checked(config, workdir, checkpoint, origin)
  workdir_lib.check_folders(workdir)
  bench, f, noise = sources.load_benchmark(config), config.flatness, config.noise
  source = checkpoint or workdir
  exp = Experiment.create(config, bench)
  bound = f.bound if f.bound >= 0 else noise.bound
  print(f'f2m-jax flatness: {_what(config, origin)} on {backend.devices()}; base model of '
        f'{source}; {f.num_draws} draws at bound {bound:g} on the base training and test images '
        f'(at most {f.max_images or "all"} each); writes {workdir}/flatness.json')
  with contextlib.closing(Checkpoints(source, read_only=True)) as ckpts:
    model = ckpts.restore_model(common.model_template(exp))
  variables = {k: model[k] for k in ('params', 'batch_stats')}
  rng = np.random.default_rng([config.seed, 5])
  out = {'bound': bound, 'distribution': noise.distribution, 'num_layers': noise.num_layers,
         'checkpoint': os.path.abspath(source),
         'provenance': workdir_lib.provenance(record, origin, choices=backend.used(config))}
  for name, split, idx in (('train', bench.train, bench.base_train),
                           ('test', bench.test, protocol_lib.test_indices(bench, 1))):
    if f.max_images and len(idx) > f.max_images:
      idx = np.sort(rng.choice(idx, f.max_images, replace=False))
    clean, losses = flatness.noisy_losses(
        exp.model, variables, split.images[idx], split.labels[idx], exp.noise_paths, exp.split,
        bound, noise.distribution, f.num_draws, f.chunk, exp.key(3), bench.mean, bench.std,
        config.eval.batch_size, progress=f'flatness on {name} ({len(idx):,} images)')
    out[name] = {**flatness.flatness_stats(clean, losses), 'num_images': len(idx)}
    print(f'flatness on {name} ({len(idx)} images, {f.num_draws} draws): L*={clean:.4f} '
          f'I={out[name]["I"]:.3e} sigma^2={out[name]["sigma2"]:.3e}')
  path = write_new(workdir, 'flatness', out)
  print(f'wrote {path}')
  return out
