"""Several runs of one config in one program (docs/performance.md, 'Seeds and sweeps in one
program'): S members that differ in their seed or in one field train their base sessions in
lockstep; each is exactly the single run of its own config, in its own workdir member_<i>/."""
import contextlib
import json
import os

import ml_collections

from f2m_jax import files, stats, train_loop
from f2m_jax.data import sources
from f2m_jax.run import backend, pipeline, workdir
from f2m_jax.run.checkpoint import Checkpoints
from f2m_jax.validation import need

FIELDS = ('noise.bound',)  # scalars a sweep may vary besides the seed (members side by side)


def enabled(config):
  return bool(config.members.seeds or config.members.field_values)


def member_configs(config):
  """The config of each member: the sweep's (validated), with its seed or field value and no
  members; [config] where it is no sweep."""
  if not enabled(config):
    return [config]
  m = config.members
  values = m.seeds or m.field_values
  need(bool(m.seeds) != bool(m.field_values), 'members.seeds', m.seeds,
       'a sweep varies the seed or members.field (members.field_values): one of them, not both')
  need(m.field in FIELDS or not m.field_values, 'members.field', m.field,
       f'allowed with members.field_values: {FIELDS}')
  name = 'members.seeds' if m.seeds else 'members.field_values'
  need(len(set(values)) == len(values), name, values, 'values must be distinct')
  need(not config.base.select_on_test, 'base.select_on_test', config.base.select_on_test,
       'not with members (each member would keep its own best step)')
  out = []
  for value in values:
    c = ml_collections.ConfigDict(config.to_dict())
    c.members.update(seeds=(), field_values=(), field='')
    c.update_from_flattened_dict({'seed' if m.seeds else m.field: value})
    out.append(c)
  return out


def summarize_values(field, values, member_results):
  """A sweep over `field`: each value's results (its one member's, over its draws), never pooled."""
  return {'field': field,
          'values': [{'value': v, **{k: x for k, x in r.items() if k != 'provenance'}}
                     for v, r in zip(values, member_results)]}


def run(config, root, mode='train', checkpoint=None, hook=None, origin=None):
  """The sweep: every member's base session in one program, then each member's sessions; writes and
  returns root/summary.json. `origin` as `pipeline.run`'s; every check comes before anything is
  written."""
  if checkpoint:
    raise ValueError('--checkpoint takes one base model; a member sweep trains its own')
  changes = (origin or {}).get('changes')
  sweep = pipeline.effective(config, changes)
  records = member_configs(sweep)  # 'auto' kept
  configs = [pipeline.resolve(c, changes) for c in records]
  choices = backend.used(pipeline.resolve(sweep, changes))  # the sweep's every value checked
  bench = sources.load_benchmark(configs[0])  # before anything is written: missing data stop here
  trains = len(configs) if mode == 'train' else 0  # the sweep's base step: the first member's
  exps = [pipeline.check(c, bench, 0 if i else trains)  # what the data, networks, memory allow
          for i, c in enumerate(configs)]
  writes = pipeline.writes_into(root, mode, 'sweep')  # a read-only finished one is evaluated too
  dirs = [f'{root}/member_{i}' for i in range(len(configs))]
  with contextlib.closing(workdir.prepare(root, sweep.to_dict(), writes=writes)):
    if mode == 'train':
      train_members(exps, records, dirs, hook)
    results = [pipeline.run(c, d, mode, hook=hook, origin=origin and {**origin, 'sweep_member': i})
               for i, (c, d) in enumerate(zip(records, dirs))]
  summary = summarize(sweep.members, configs, results)
  summary['provenance'] = workdir.provenance(sweep.to_dict(), origin, choices=choices)
  print(write_summary(root, summary, mode, writes))
  return summary


def summarize(m, configs, results):
  """The sweep's summary over its members' `results`: one row per value of the field's sweep
  (`m`: config.members), or the statistics over the seeds; and a line per member."""
  if m.field_values:
    summary = summarize_values(m.field, m.field_values, results)
  else:
    summary = stats.seed_summary(results)
  summary['members'] = [{'workdir': f'member_{i}', 'seed': int(c.seed),
                         **({m.field: c[m.field]} if m.field_values else {}),
                         'acc_last': r['sessions'][-1]['acc']['mean'], 'pd': r['pd']['mean']}
                        for i, (c, r) in enumerate(zip(configs, results))]
  return summary


def write_summary(root, summary, mode, writes):
  """root/summary.json; returns a line saying what was written. In eval mode a reproduced summary
  is left alone, another is written beside it otherwise (with `writes` False: the JSON follows the
  line)."""
  path = f'{root}/summary.json'
  if mode == 'eval' and os.path.exists(path):
    if not pipeline.differing(path, summary):
      return f'the members reproduce {path}; it is unchanged'
    path = f'{root}/{pipeline.unused(root, "summary_eval")}.json'
  if not writes:
    return f'{root} is read-only, so the summary follows as JSON:\n{json.dumps(summary, indent=1)}'
  files.atomic_write(path, json.dumps(summary, indent=1))
  return f'summary written to {path}; each member in {root}/member_<i>/'


def train_members(exps, records, dirs, hook):
  """The members' base sessions in lockstep, each saved into its own workdir (created and held
  here, its config.json `records`'), unless every member already holds its base model."""
  ckpts, logs, locks = [], [], []
  try:
    for d, e, r in zip(dirs, exps, records):
      locks.append(workdir.prepare(d, r.to_dict()))
      ckpts.append(Checkpoints(d))
      logs.append(workdir.MetricsLog(d, tensorboard=e.config.tensorboard))
    if not all(ck.has_model() for ck in ckpts):
      train_loop.train_base_sessions(exps, ckpts, logs, f'base sessions of {len(exps)} members '
                                     f'({exps[0].config.members.map})', hook=hook)
  finally:
    for item in ckpts + logs + locks:
      item.close()

