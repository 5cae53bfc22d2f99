"""Several runs of one config in one program (docs/performance.md, 'Seeds and sweeps in one
program'): S members that differ in their seed or in one field train their base sessions in lockstep;
each is exactly the single run of its own config, in its own workdir member_<i>/."""
from __future__ import annotations

import json
import os
import time
from typing import Optional

import ml_collections

from f2m_jax import evaluation
from f2m_jax import files
from f2m_jax import stats
from f2m_jax import train_loop
from f2m_jax.data import sources
from f2m_jax.experiment import Hook
from f2m_jax.files import CheckpointError
from f2m_jax.run import pipeline
from f2m_jax.run import report
from f2m_jax.run import workdir as workdir_lib
from f2m_jax.run.checkpoint import Checkpoints
from f2m_jax.validation import need

FIELDS = ('noise.bound',)  # scalars a sweep may vary besides the seed (members written out side by side)


def enabled(config) -> bool:
  return bool(config.members.seeds) or bool(config.members.field_values)


def validate(config) -> None:
  m = config.members
  need(m.seeds or m.field_values, 'members.seeds', (), 'a sweep needs members.seeds or members.field_values')
  need(not (m.seeds and m.field_values), 'members.seeds', tuple(m.seeds),
       'a sweep varies the seed or members.field, not both')
  if m.field_values:
    need(m.field in FIELDS, 'members.field', m.field, f'allowed with members.field_values: {FIELDS}')
  need(len(set(m.seeds)) == len(m.seeds) and len(set(m.field_values)) == len(m.field_values), 'members',
       (m.seeds, m.field_values), 'values must be distinct')
  need(config.base.select_on_test is False, 'base.select_on_test', config.base.select_on_test,
       'not with members (each member would keep its own best step)')


def member_configs(config) -> list:
  """The config of each member: the sweep's, with its seed or field value and no members."""
  m, out = config.members, []
  for value in (m.seeds or m.field_values):
    c = ml_collections.ConfigDict(config.to_dict())
    c.members.seeds, c.members.field_values, c.members.field = (), (), ''
    c.update_from_flattened_dict({'seed' if m.seeds else m.field: value})
    out.append(c)
  return out


def summarize(member_results: list) -> dict:
  """results.json's format over the seeds of one setting: per session the seeds' means over their draws with
  the t-interval over the seeds (members x draws taken as independent would give too narrow an interval)."""
  head = member_results[0]
  means = [[{k: s[k] and s[k]['mean'] for k in stats.KEYS} for s in r['sessions']] for r in member_results]
  return evaluation.build_results(head['dataset'], head['method'], head['protocol'],
                                  [s['num_classes'] for s in head['sessions']], means, over='seeds')


def summarize_values(field: str, values, member_results: list) -> dict:
  """A sweep over `field`: each value's results (its one member's, over its draws), never pooled."""
  keep = ('dataset', 'method', 'protocol', 'runs', 'sessions', 'pd', 'avg', 'interval')
  return {'field': field, 'values': [{'value': v, **{k: r[k] for k in keep if k in r}}
                                     for v, r in zip(values, member_results)]}


def run(config: ml_collections.ConfigDict, root: str, mode: str = 'train', checkpoint: Optional[str] = None,
        hook: Hook = None, origin: Optional[dict] = None) -> dict:
  """The sweep: every member's base session in one program, then each member's sessions; writes and
  returns root/summary.json. `origin` as `pipeline.run`'s; every check comes before anything is written."""
  if checkpoint:
    raise ValueError('--checkpoint takes one base model; a member sweep trains its own')
  validate(config)
  changes = (origin or {}).get('changes')
  records = [pipeline.effective(c, changes) for c in member_configs(config)]  # as config.json: 'auto' kept
  configs = [pipeline.resolve(c, changes) for c in records]
  pipeline.resolve(config, changes)  # the sweep's every value checked
  sweep = pipeline.effective(config, changes)
  bench = sources.load_benchmark(configs[0])  # before anything is written: missing data stop here
  trains = len(configs) if mode == 'train' else 0  # the sweep's base step: the first member's
  exps = [pipeline.check(c, bench, 0 if i else trains)  # what the data, networks, memory allow
          for i, c in enumerate(configs)]
  if mode == 'eval' and not os.path.exists(os.path.join(root, 'config.json')):
    raise CheckpointError(f'nothing to evaluate: {root} holds no sweep (no config.json); train it first')
  writes = workdir_lib.writes_into(root, mode)  # a read-only finished run is evaluated too
  lock = workdir_lib.prepare(root, sweep.to_dict(), writes=writes)
  try:
    dirs = [os.path.join(root, f'member_{i}') for i in range(len(configs))]
    if mode == 'train':
      train_members(exps, records, dirs, hook)
    results = [pipeline.run(c, d, mode=mode, hook=hook, origin={**origin, 'sweep_member': i} if origin else None)
               for i, (c, d) in enumerate(zip(records, dirs))]
  finally:
    lock.close()
  summary = sweep_summary(sweep, dirs, configs, results, origin)
  print(write_summary(root, summary, mode, writes), flush=True)
  return summary


def sweep_summary(sweep, dirs: list, configs: list, results: list, origin: Optional[dict]) -> dict:
  """summary.json: the statistics, each member's workdir, seed (and value), last accuracy and PD; the provenance."""
  m = sweep.members
  summary = summarize_values(m.field, m.field_values, results) if m.field_values else summarize(results)
  summary['members'] = [{'workdir': os.path.basename(d), 'seed': int(c.seed),
                         **({m.field: v} if m.field_values else {}),
                         'acc_last': r['sessions'][-1]['acc']['mean'], 'pd': r['pd']['mean']}
                        for d, c, r, v in zip(dirs, configs, results, m.field_values or [None] * len(dirs))]
  summary['provenance'] = {**workdir_lib.provenance(sweep.to_dict()), **({'origin': origin} if origin else {})}
  return summary


def write_summary(root: str, summary: dict, mode: str, writes: bool = True) -> str:
  """root/summary.json; returns a line saying what was written. In eval mode a reproduced summary is left
  alone, another is written beside it otherwise (with `writes` False: the JSON follows the line)."""
  path = os.path.join(root, 'summary.json')
  if mode == 'eval' and os.path.exists(path):
    strip = lambda d: {k: v for k, v in json.loads(json.dumps(d)).items() if k != 'provenance'}
    if strip(files.read_json(path)) == strip(summary):
      return f'the members reproduce {path}; it is unchanged'
    path = os.path.join(root, f'summary_eval_{time.strftime("%Y%m%d-%H%M%S")}.json')
  if not writes:
    return f'{root} is read-only, so the summary follows as JSON:\n{json.dumps(summary, indent=1)}'
  files.atomic_write(path, json.dumps(summary, indent=1))
  return f'summary written to {path}; each member in {root}/member_<i>/'


def train_members(exps: list, records: list, dirs: list, hook: Hook) -> None:
  """The members' base sessions in lockstep, each saved into its own workdir (created and held here, its
  config.json `records`'), unless every member already holds its base model."""
  ckpts, logs, locks = [], [], []
  try:
    for d, e, r in zip(dirs, exps, records):
      locks.append(workdir_lib.prepare(d, r.to_dict()))
      ckpts.append(Checkpoints(d))
      logs.append(workdir_lib.MetricsLog(d, tensorboard=e.config.tensorboard))
    if not all(ck.has_model() for ck in ckpts):
      train_loop.train_base_sessions(exps, ckpts, logs, f'base sessions of {len(exps)} members '
                                     f'({exps[0].config.members.map})', hook=hook)
  finally:
    for item in ckpts + logs + locks:
      item.close()


def format_summary(summary: dict) -> str:
  """The table printed after a sweep: a seed sweep's as a run's; a field's as the report's, a row per value."""
  if 'values' not in summary:
    return report.format_session_table(summary)
  rows = [report.Row(f'{summary["field"]}={v["value"]:g}', v) for v in summary['values']]
  return (f'{len(rows)} values of {summary["field"]}: accuracy per session, mean ± 95% interval over each value\'s '
          f'draws\n{report.format_table(rows)}')
