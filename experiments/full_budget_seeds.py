"""Issue 85: does F2M beat the Baseline at the authors' full budget, over base seeds? One command.

  F2M_DATA_DIR=... python experiments/full_budget_seeds.py --out OUT --deadline-s 520   # one GPU
  python experiments/full_budget_seeds.py --tiny --out DIR   # the CPU check of this script

Parts, in this order, each skipped where its output is complete (a rerun of the command resumes):
  bench     `--mode bench` at M = 2, float32: the F2M/plain step ratio and steps/s, the GPU
            figures of docs/performance.md
  f2m       the default F2M, configs/cifar100.py:trainsplit at the original's 30,003 base
            iterations, lr x 0.01 at 15,000, base seeds 0, 1, 2 in one program (a member sweep)
  baseline  the Baseline at the authors' 28,197 iterations, x 0.01 at 14,040 (as section 19 of
            experiments/results/README.md), the same seeds and shot draws
  report    `python -m f2m_jax.run.report OUT/baseline OUT/f2m --paired`: F2M - Baseline paired
            over the seeds, its verdict at the declared endpoint, session 9 (the report's default:
            the last session), in OUT/report.txt and OUT/report/
f2m and baseline read $F2M_DATA_DIR/cifar100_train.npz; the bench reads no data, so a call can
run it while the data is still arriving (experiments/device_data.py brings it in parts): where the
file is missing, the script stops before the part that reads it, with a line saying so (exit 2).
OUT/times.json: each part's wall seconds and exit code in each call, each sweep's base steps/s
(the members' lockstep steps) and its members' session phases. OUT/<part>.log: each part's output.

--deadline-s S: S seconds after the start the part running gets SIGTERM; run.py saves and exits
within a minute, and this script exits 130: run the same command again to resume. Give the device
call S + 70 s. Expected on one H200 (section 19's rates; members taken as no faster than one run
after another): bench ~80 s, F2M ~485 s, Baseline ~375 s, so two calls at --deadline-s 520.
Between the calls the workdirs stay on the device machine, in its ignored `.devcache/` beside the
data that experiments/device_data.py unpacks there (`--out .devcache/full_budget_seeds`): the
second call follows the first at once, while the machine is warm. --pack DIR writes at the end of
each call OUT less its checkpoints (the final models kept), DIR/<OUT's name>.tar.gz, to bring
back (`tar xzf` it into experiments/results/).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tarfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
ENDPOINT = 'session 9 accuracy'  # --primary s9 declares it
TRAINSPLIT = 'configs/cifar100.py:trainsplit'
SEEDS = '--config.members.seeds=(0,1,2)'
BENCH = ['--mode', 'bench', '--config.bench.M_list=(2,)']
FULL = {
    'bench': [TRAINSPLIT, *BENCH, "--config.bench.dtypes=('float32',)"],
    'f2m': [TRAINSPLIT, '--config.base.steps=30003', '--config.base.milestones=(15000,)', SEEDS],
    'baseline': [TRAINSPLIT, '--config.method=baseline', '--config.base.steps=28197',
                 '--config.base.milestones=(14040,)', SEEDS],
}
EXPECTED_S = {'bench': 80, 'f2m': 485, 'baseline': 375}  # one H200: the docstring
SMOKE = 'configs/cifar100.py:smoke'
TINY_BUDGET = ['--config.base.steps=10', '--config.base.milestones=(5,)', '--config.runs=1',
               '--config.base.log_every=5', '--config.base.checkpoint_every=5',
               '--config.members.seeds=(0,1)']
TINY = {
    'bench': [SMOKE, *BENCH, '--config.bench.iters=1', '--config.bench.warmup=0'],
    'f2m': [SMOKE, *TINY_BUDGET],
    'baseline': [SMOKE, '--config.method=baseline', *TINY_BUDGET],
}
TINY_EXPECTED_S = {'bench': 40, 'f2m': 60, 'baseline': 30}  # a 2-core CPU, nothing cached
STOP_S = 90  # run.py ends within 50 s of a SIGTERM, its writes complete (f2m_jax/run/stopping.py)


class Parts:
  """Runs run.py's parts one after another, each stopped by SIGTERM at the deadline or at a signal
  to this script, and keeps their times (OUT/times.json's, extended call by call)."""

  def __init__(self, out: pathlib.Path, deadline_s: float):
    self.out, self.start, self.deadline_s = out, time.monotonic(), deadline_s
    self.child, self.stopped = None, ''
    path = out / 'times.json'
    self.times = json.loads(path.read_text()) if path.exists() else {'parts': {}}
    self.call = 1 + max(map(len, self.times['parts'].values()), default=0)
    for s in (signal.SIGINT, signal.SIGTERM):
      signal.signal(s, self.forward)

  def forward(self, signum, _) -> None:
    self.stopped = signal.Signals(signum).name
    if self.child is not None:
      self.child.send_signal(signal.SIGTERM)

  def run(self, name: str, argv: list) -> int:
    """run.py on `argv` into OUT/<name>, its output appended to OUT/<name>.log; its exit code."""
    t0, started = time.monotonic(), time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())
    print(f'=== {name} (call {self.call}, {started}): run.py --config {" ".join(argv)}', flush=True)
    with open(self.out / f'{name}.log', 'a', encoding='utf-8') as log:
      log.write(f'=== call {self.call}, {started}\n')
      log.flush()
      command = [sys.executable, 'run.py', '--config', *argv, '--workdir', str(self.out / name)]
      self.child = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
      left = self.deadline_s - (time.monotonic() - self.start)
      try:
        self.child.wait(timeout=max(left, 0.01) if self.deadline_s else None)
      except subprocess.TimeoutExpired:
        self.stopped = f'the deadline ({self.deadline_s:g} s)'
        self.child.send_signal(signal.SIGTERM)
      try:
        rc = self.child.wait(timeout=STOP_S)
      except subprocess.TimeoutExpired:
        self.child.kill()
        rc = self.child.wait()
    self.child, wall = None, round(time.monotonic() - t0, 1)
    record = {'call': self.call, 'started': started, 'wall_s': wall, 'rc': rc}
    self.times['parts'].setdefault(name, []).append(record)
    print(f'=== {name}: exit code {rc} after {wall} s', flush=True)
    return rc


def sweep_times(root: pathlib.Path) -> dict:
  """A sweep's base steps/s (the median of its logged windows; each step trains every member) and
  each member's session phase (its last `done` record's wall_time_s), from metrics.jsonl."""
  def records(path):
    for line in path.read_text(encoding='utf-8').splitlines():
      try:
        yield json.loads(line)
      except json.JSONDecodeError:  # a line cut short by a stop
        pass
  logs = [list(records(p)) for p in sorted(root.glob('member_*/metrics.jsonl'))]
  rates = [r['steps_per_s'] for r in logs[0]  # null: a window of the first call alone
           if r.get('phase') == 'base' and r['steps_per_s'] is not None] if logs else []
  done = [[r['wall_time_s'] for r in log if r.get('phase') == 'done'] for log in logs]
  median = statistics.median(rates) if rates else None
  return {'members': len(logs), 'base_steps_per_s_median': median,
          'member_sessions_wall_s': [d[-1] if d else None for d in done]}


def report(out: pathlib.Path) -> int:
  """The paired report into OUT/report.txt and OUT/report/; 1 if the verdict names no ENDPOINT."""
  command = [sys.executable, '-m', 'f2m_jax.run.report', str(out / 'baseline'), str(out / 'f2m'),
             '--paired', '--primary', 's9', '--labels', 'Baseline,F2M', '--out',
             str(out / 'report')]
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
  (out / 'report.txt').write_text(done.stdout + done.stderr, encoding='utf-8')
  verdict = [line for line in done.stdout.splitlines() if line.startswith('F2M ')]
  print(f'=== report: exit code {done.returncode}; {verdict[-1] if verdict else "no verdict"}')
  if done.returncode == 0 and not (verdict and f'at {ENDPOINT}:' in verdict[-1]):
    print(f'error: the paired verdict names no {ENDPOINT}, the declared endpoint: see '
          f'{out}/report.txt', file=sys.stderr)
    return 1
  return done.returncode


def pack(out: pathlib.Path, folder: pathlib.Path) -> None:
  """OUT less its checkpoints but the final models (checkpoints/model and the ledger of their
  digests) as FOLDER/<OUT's name>.tar.gz."""
  def keep(info):
    parts = pathlib.PurePath(info.name).parts
    below = parts[parts.index('checkpoints') + 1:] if 'checkpoints' in parts else ()
    return info if not below or below[0] in ('model', 'digests.json') else None
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / f'{out.name}.tar.gz'
  with tarfile.open(path, 'w:gz') as tar:
    tar.add(out, arcname=out.name, filter=keep)
  print(f'=== packed {path} ({path.stat().st_size / 2**20:.1f} MiB)', flush=True)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  parser.add_argument('--out', required=True, help='the output folder; the same one resumes')
  parser.add_argument('--tiny', action='store_true', help='a budget a 2-core CPU runs in minutes')
  parser.add_argument('--deadline-s', type=float, default=0.0, help='stop after S s (0: never)')
  parser.add_argument('--pack', help='also write OUT less its checkpoints to PACK/<name>.tar.gz')
  args = parser.parse_args(argv)
  if args.deadline_s < 0:
    parser.error(f'--deadline-s {args.deadline_s:g}: allowed are 0 (no deadline) or seconds > 0')
  plan, expected = (TINY, TINY_EXPECTED_S) if args.tiny else (FULL, EXPECTED_S)
  out = pathlib.Path(args.out).resolve()
  if out.exists() and not out.is_dir():
    parser.error(f'--out {args.out}: a file stands there; give a folder (the same one resumes)')
  out.mkdir(parents=True, exist_ok=True)
  parts = Parts(out, args.deadline_s)
  done = {'bench': out / 'bench' / 'bench.json', 'f2m': out / 'f2m' / 'summary.json',
          'baseline': out / 'baseline' / 'summary.json'}
  todo = [name for name in plan if not done[name].exists()]
  where = 'a 2-core CPU' if args.tiny else 'one H200'
  print(f'call {parts.call} into {out}: {", ".join(todo) or "nothing"} to run, then the report; '
        f'expected on {where} {sum(expected[n] for n in todo)} s '
        f'({", ".join(f"{n} ~{expected[n]} s" for n in todo)}); deadline {args.deadline_s:g} s '
        '(0: none)', flush=True)
  rc = 0
  npz = pathlib.Path(os.environ.get('F2M_DATA_DIR', ''), 'cifar100_train.npz')  # the full plan's
  for name in todo:
    if name != 'bench' and not args.tiny and not npz.is_file():  # the bench reads no data
      print(f'error: {npz} is missing, which {name} reads: set F2M_DATA_DIR to its folder (python '
            '-m f2m_jax.data.make_trainsplit --out DIR builds it), then run the same command '
            'again; what is done is kept', file=sys.stderr)
      return 2
    rc = parts.run(name, plan[name])
    if rc or parts.stopped:
      break
  if not rc and not parts.stopped:
    rc = report(out)
  parts.times['sweeps'] = {name: sweep_times(out / name) for name in ('f2m', 'baseline')}
  parts.times['expected_s'] = expected
  (out / 'times.json').write_text(json.dumps(parts.times, indent=1) + '\n', encoding='utf-8')
  if args.pack:
    pack(out, pathlib.Path(args.pack))
  if parts.stopped:
    print(f'stopped by {parts.stopped}: run the same command again to resume', file=sys.stderr)
    return 130
  if rc:
    print(f'error: exit code {rc}: see the logs in {out}', file=sys.stderr)
  return rc


if __name__ == '__main__':
  sys.exit(main())
