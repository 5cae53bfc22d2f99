"""Profiles base steps of one run as the loop runs them on a GPU/TPU, and counts what the device did.

The program is the one every base training runs and --mode bench times (base.make_train_program, as
bench.program_case builds it for one run): the images on the device and STEPS_PER_CALL steps scanned per
dispatch; on a CPU the same program, for a check of this script. Random images of the config's shapes
(no data read). After one call that
compiles, CALLS calls are traced with jax.profiler (TensorBoard's format, and a Perfetto JSON that this
script reads back). Printed, and written to OUT/profile.json:
  - per device track (a GPU stream, or a host thread on a CPU): events, events per step, busy seconds
    (the union of its events' intervals), the share of the traced span it was idle;
  - the traced span and the wall time of the calls.
On a GPU the kernels are the events of the '/device:GPU:0' process's stream tracks.

  python experiments/profile_steps.py --config configs/cifar100.py --out OUT [--calls 3 --steps_per_call 10]
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

import jax  # noqa: E402

from f2m_jax.run import cli  # noqa: E402
from f2m_jax.run import pipeline  # noqa: E402
from f2m_jax.run import bench as bench_lib  # noqa: E402


def busy_seconds(intervals) -> float:
  """The length of the union of [start, end) intervals (microseconds in, seconds out)."""
  total, end = 0.0, float('-inf')
  for s, e in sorted(intervals):
    if e > end:
      total += e - max(s, end)
      end = e
  return total / 1e6


def tracks(trace: dict) -> dict:
  """{'process / thread': [(start, end) in us]} of the trace's complete ('X') events."""
  names, threads, out = {}, {}, {}
  for ev in trace.get('traceEvents', []):
    if ev.get('ph') == 'M' and ev.get('name') == 'process_name':
      names[ev['pid']] = ev['args']['name']
    elif ev.get('ph') == 'M' and ev.get('name') == 'thread_name':
      threads[(ev['pid'], ev['tid'])] = ev['args']['name']
  for ev in trace.get('traceEvents', []):
    if ev.get('ph') == 'X' and 'dur' in ev:
      key = f"{names.get(ev['pid'], ev['pid'])} / {threads.get((ev['pid'], ev.get('tid')), ev.get('tid'))}"
      out.setdefault(key, []).append((float(ev['ts']), float(ev['ts']) + float(ev['dur'])))
  return out


def summarize(trace: dict, steps: int) -> dict:
  all_events = [iv for ivs in tracks(trace).values() for iv in ivs]
  span = (max(e for _, e in all_events) - min(s for s, _ in all_events)) / 1e6 if all_events else 0.0
  rows = {}
  for key, ivs in sorted(tracks(trace).items(), key=lambda kv: -len(kv[1])):
    busy = busy_seconds(ivs)
    rows[key] = {'events': len(ivs), 'events_per_step': round(len(ivs) / steps, 1), 'busy_s': round(busy, 4),
                 'idle_share': round(1 - busy / span, 3) if span else None}
  device = {k: v for k, v in rows.items() if '/device:' in k}
  return {'span_s': round(span, 4), 'device_tracks': device, 'top_tracks': dict(list(rows.items())[:12])}


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--config', default='configs/cifar100.py')
  p.add_argument('--out', required=True)
  p.add_argument('--calls', type=int, default=3)
  p.add_argument('--steps_per_call', type=int, default=10)
  args = p.parse_args(argv)
  config = cli.load_config(args.config)
  n = args.steps_per_call
  config.base.update(steps_per_call=n, log_every=n, checkpoint_every=n)
  config = pipeline.resolve(config, reads_data=False)
  exp = bench_lib.bench_experiment(config, config.model.dtype)
  case = bench_lib.program_case(exp, {}, 'f2m', config.noise.M, 1)
  batch, call = case.batch, case.args
  t0 = time.perf_counter()
  out = jax.block_until_ready(case.fn(*call))
  compile_s = time.perf_counter() - t0
  call = case.carry(call, out)
  os.makedirs(args.out, exist_ok=True)
  trace_dir = os.path.join(args.out, 'trace')
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    t0 = time.perf_counter()
    for _ in range(args.calls):
      out = case.fn(*call)
      call = case.carry(call, out)
    jax.block_until_ready(out)
    wall = time.perf_counter() - t0
  path = sorted(glob.glob(os.path.join(trace_dir, '**', '*perfetto_trace.json.gz'), recursive=True))[-1]
  with gzip.open(path) as f:
    trace = json.load(f)
  steps = args.calls * n
  out = {'config': args.config, 'batch': batch, 'steps': steps, 'steps_per_call': n, 'first_call_s': round(compile_s, 2),
         'wall_s': round(wall, 4), 'steps_per_s': round(steps / wall, 2), 'backend': jax.default_backend(),
         'device_kind': jax.devices()[0].device_kind, 'trace': os.path.relpath(path, args.out),
         **summarize(trace, steps)}
  with open(os.path.join(args.out, 'profile.json'), 'w') as f:
    json.dump(out, f, indent=1)
  print(json.dumps(out, indent=1))
  return out


if __name__ == '__main__':
  main()
