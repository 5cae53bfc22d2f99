"""Several hosts, on this machine: two processes on localhost (JAX's CPU collectives over gloo),
the same run.py command in each, as docs/performance.md tells users to run them. The run's files
are written once (process 0), and the results equal those of one process with the same devices; a
wait for a process that does not come ends in one line."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter

import pytest

from conftest import REPO, without_provenance, xla_flags
from f2m_jax.run import checkpoint

TIMEOUT_S = 900
# The Baseline: the machinery under test (one SPMD base program over the processes' devices, every
# process computing the sessions, process 0 writing) is every method's; its programs compile fastest
TINY = ['--config', 'configs/cifar100.py:smoke', '--config.method=baseline', '--config.runs=1',
        '--config.data.synthetic.num_sessions=2', '--config.base.steps=4',
        '--config.base.milestones=(2,)', '--config.base.checkpoint_every=2',
        '--config.base.log_every=2', '--config.tensorboard=False']


def free_ports(n: int) -> list:
  """n distinct ports free now (each socket held until all are chosen)."""
  with contextlib.ExitStack() as held:
    sockets = [held.enter_context(socket.socket()) for _ in range(n)]
    for s in sockets:
      s.bind(('127.0.0.1', 0))
    return [s.getsockname()[1] for s in sockets]


def run_py(workdir, *extra, env=None):
  return subprocess.Popen([sys.executable, 'run.py', *TINY, '--workdir', str(workdir), *extra],
                          cwd=REPO, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def process_env(port: int, i: int, **extra) -> dict:
  """Process i of a run of two, its coordinator on `port`; a hang prints each thread's stack."""
  return dict(JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}', JAX_NUM_PROCESSES='2',
              JAX_PROCESS_ID=str(i), JAX_CPU_COLLECTIVES_IMPLEMENTATION='gloo',
              PYTHONFAULTHANDLER='1', **extra)


def finished(*procs):
  """Waits for `procs` (all killed if one does not end), each to end with exit code 0."""
  try:
    outs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert [p.returncode for p in procs] == [0] * len(procs), [out[-3000:] for out in outs]


def load(path):
  with open(path) as f:
    return without_provenance(json.load(f))


def written_once(workdir):
  """Each metrics record once (not once per process), no temporary file left behind."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f]
  keys = Counter((r.get('phase'), r.get('step'), r.get('run'), r.get('session')) for r in records)
  assert max(keys.values()) == 1, keys.most_common(3)
  assert not [n for n in os.listdir(workdir) if '.tmp' in n]


@pytest.mark.slow
def test_a_member_sweep_over_two_processes_equals_one_process_with_two_devices(tmp_path):
  """A seed sweep run by two processes, each holding one CPU device: the global mesh has two, the
  members' base sessions split their batches over them (the one base program, which a single run
  calls as a sweep of one member), every process computes every member's sessions, the files are
  written once (process 0), and the sweep equals one process's with two devices (the same SPMD
  program), file for file. Beside it (it mostly waits), process 0 of a run whose process 1 never
  comes ends after F2M_DISTRIBUTED_TIMEOUT_S with one line, exit code 3, having written nothing."""
  sweep = '--config.members.seeds=(0,1)'
  port, sweep_port = free_ports(2)
  alone = run_py(tmp_path / 'alone', env=process_env(port, 0, F2M_DISTRIBUTED_TIMEOUT_S='2'))
  finished(*[run_py(tmp_path / 'hosts', sweep, env=process_env(sweep_port, i)) for i in range(2)])
  out = alone.communicate(timeout=TIMEOUT_S)[0]
  assert (alone.returncode, out) == (3, f'error: process 0: not every process joined 127.0.0.1:'
                                        f'{port} within 2 s: missing process 1\n')
  assert not (tmp_path / 'alone').exists()
  devices = xla_flags('--xla_force_host_platform_device_count=2')
  finished(run_py(tmp_path / 'one', sweep, env={'XLA_FLAGS': devices}))
  assert load(tmp_path / 'hosts' / 'summary.json') == load(tmp_path / 'one' / 'summary.json')
  for i in range(2):
    member = tmp_path / 'hosts' / f'member_{i}'
    assert load(member / 'results.json') == load(tmp_path / 'one' / f'member_{i}' / 'results.json')
    with open(member / 'results.json') as f:
      assert json.load(f)['provenance']['hardware']['process_count'] == 2
    written_once(member)


def test_distributed_without_a_coordinator_ends_at_once(tmp_path):
  """--config.distributed=True where JAX finds no coordinator: one line, exit code 2, nothing
  written (6f2b875's timer outlived JAX's error: a false 'not every process joined', exit 3)."""
  p = run_py(tmp_path / 'w', '--config.distributed=True', env={'F2M_DISTRIBUTED_TIMEOUT_S': '30'})
  line, t0 = p.stdout.readline(), time.time()  # the child's whole output (stderr with it)
  assert (p.communicate(timeout=60)[0], p.returncode) == ('', 2) and time.time() - t0 < 5, line
  assert line.startswith('error: joining the processes: coordinator_address should be defined.')
  assert not (tmp_path / 'w').exists()


def test_another_processs_temporary_files_do_not_stop_a_process(tmp_path):
  """Process 0 writes checkpoints/digests.json through a temporary file while process 1 opens the
  folder: such a file is no file in a checkpoint folder's place (an earlier version refused another
  process's temporary file, and the other process waited at orbax's first barrier: once in 9
  two-process sweeps)."""
  (tmp_path / 'checkpoints').mkdir()
  for name in ('.config.json.43ypdem3.tmp', '.write_probe5y4gquox'):
    (tmp_path / 'checkpoints' / name).write_text('{')
  checkpoint.Checkpoints(str(tmp_path)).close()


def test_a_barrier_that_timed_out_names_the_process_that_did_not_come():
  """orbax's barriers go through JAX's coordination service (f2m_jax/sharding.py), whose timeout
  names the processes that did not arrive: the checkpoint's one line says which (JAX's text)."""
  text = ('DEADLINE_EXCEEDED: Barrier timed out. Id: CheckpointManager:create_directory::0. This '
          'usually happens because a task triggered the barrier too early or too slowly. Please '
          'look at the task logs (both timed out and first task) to debug further.\n# of tasks '
          'that reached the barrier: 1/3.\nThe first task at the barrier: 0. Some timed out task '
          'names:\n1\n2\n\nRPC: /xla.coordination.CoordinationService/Barrier '
          "[type.googleapis.com/tensorflow.CoordinationServiceError='']")
  assert checkpoint._cause(RuntimeError(text)) == (  # pylint: disable=protected-access
      "process 1, 2 did not reach orbax's barrier CheckpointManager:create_directory in time")


if sys.platform != 'linux':  # gloo over localhost is what CI machines run; elsewhere untested
  pytestmark = pytest.mark.skip('multi-process CPU collectives are tested on Linux')
