"""Diagnostic: the linear classifier's accuracy on the base classes' test images at every base
checkpoint of a workdir, the number the authors' train.py logs every val_freq iterations.

    python experiments/base_test_curve.py WORKDIR [--watch SECONDS]

It reads the test set, so it is for comparing training curves with the authors' logs only; no
result of a run depends on it. Appends one JSON line per checkpoint step to
WORKDIR/base_test_curve.jsonl (steps already there are skipped); with --watch it keeps polling
until the base model checkpoint exists, so checkpoints that a run later deletes (it keeps the
last 3) are measured while they exist.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

from f2m_jax import evaluation  # noqa: E402
from f2m_jax import experiment as experiment_lib  # noqa: E402
from f2m_jax.data import protocol, sources  # noqa: E402
from f2m_jax.run import pipeline  # noqa: E402
from f2m_jax.run import workdir as workdir_lib  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('workdir')
  parser.add_argument('--watch', type=float, default=0.0, help='poll every SECONDS until the run ends')
  args = parser.parse_args()
  saved = workdir_lib.recorded_config(os.path.join(args.workdir, 'config.json'))
  config = pipeline.resolve(ml_collections.ConfigDict(saved))
  bench = sources.load_benchmark(config)
  exp = experiment_lib.Experiment.create(config, bench)
  template = exp.init_state()
  idx = protocol.test_indices(bench, 1)
  images, labels = bench.test.images[idx], bench.test.labels[idx]
  logits = evaluation.make_embed(exp.model, bench.mean, bench.std, config.eval.batch_size, logits=True)
  out = os.path.join(args.workdir, 'base_test_curve.jsonl')
  done = set()
  if os.path.exists(out):
    with open(out) as f:
      done = {json.loads(line)['step'] for line in f}
  base_dir = os.path.join(os.path.abspath(args.workdir), 'checkpoints', 'base')
  checkpointer = ocp.StandardCheckpointer()
  while True:
    # Read the finished step folders directly (a manager here could tidy the running job's files).
    finished = os.path.exists(os.path.join(args.workdir, 'checkpoints', 'model', '0', 'commit_success.txt'))
    names = os.listdir(base_dir) if os.path.isdir(base_dir) else []
    steps = sorted(int(n) for n in names if n.isdigit() and
                   os.path.exists(os.path.join(base_dir, n, 'commit_success.txt')) and int(n) not in done)
    for step in steps:
      try:
        state = checkpointer.restore(os.path.join(base_dir, str(step), 'default'),
                                     jax.tree_util.tree_map(np.asarray, template))
      except (FileNotFoundError, ValueError):  # deleted by the run meanwhile
        continue
      pred = np.argmax(logits({'params': state.params, 'batch_stats': state.batch_stats}, images), -1)
      record = {'step': int(step), 'base_test_acc': round(100.0 * float(np.mean(pred == labels)), 2)}
      with open(out, 'a') as f:
        f.write(json.dumps(record) + '\n')
      print(record, flush=True)
      done.add(step)
    if not args.watch or finished:
      return
    time.sleep(args.watch)


if __name__ == '__main__':
  main()
