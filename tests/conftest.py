"""Shared test setup: repo root on sys.path (for `configs`), the real data folder, the smoke config."""
import collections
import dataclasses
import gc
import hashlib
import json
import math
import os
import pathlib
import sys
import tempfile

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

# Many tests compile the same smoke-sized programs; JAX's persistent compilation cache lets every
# later test, and every run.py subprocess (they inherit the variable), load them instead. Set before
# jax is imported. The figures behind this block: experiments/results/README.md, 'Figures behind
# the code's choices'.
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(
    os.environ.get('F2M_CACHE_DIR') or tempfile.gettempdir(), 'jax_compilation_cache'))
# Every program, not only those that took a second or more to compile: the suite's many small eager
# ops (model init, metrics) compile again in each worker and subprocess otherwise.
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')

# Tests compile with XLA's optimisation level 1 instead of the default 2, unless XLA_FLAGS names a
# level, and without XLA:CPU's concurrency-optimised scheduler: compiles are over half of the
# suite's time, and both make them faster on a CPU (and the scheduler's absence the steps too).
# Level 1 computes the same thing as level 2, rounded otherwise. Child processes inherit them
# (`xla_flags` adds to them).
TEST_XLA_FLAGS = '--xla_backend_optimization_level=1 --xla_cpu_enable_concurrency_optimized_scheduler=false'
if '--xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()


# pytest-xdist (pytest.ini: --dist loadfile --no-loadscope-reorder) hands the workers whole files in
# collection order: the longest go first, so that no worker is left alone with a long one at the end. A
# file's length is its time in the run that last wrote tests/durations.json (`--write-durations`: the
# seconds of its tests' setup, call and teardown, on one worker); a file not in it goes first, in name
# order, since its time is unknown (docs/development.md, "The test suite").
DURATIONS = pathlib.Path(__file__).with_name('durations.json')
_measured = collections.Counter()


def pytest_addoption(parser):
  parser.addoption('--write-durations', action='store_true',
                   help="write each test file's time in this run into tests/durations.json, the files' order "
                        'in later runs (after a full run; the entries of files that did not run are kept)')


def pytest_collection_modifyitems(items):
  seconds = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
  items.sort(key=lambda item: -seconds.get(item.path.name, math.inf))  # stable: each file's own order is kept


def pytest_runtest_logreport(report):
  _measured[pathlib.PurePath(report.nodeid.split('::')[0]).name] += report.duration


def pytest_sessionfinish(session):
  """With --write-durations, in the process that started the workers: this run's file times into
  tests/durations.json, over the entries of the same files (those of deleted files dropped)."""
  if session.config.getoption('--write-durations') and not hasattr(session.config, 'workerinput'):
    old = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    new = {**{name: t for name, t in old.items() if DURATIONS.with_name(name).is_file()},
           **{name: round(t, 1) for name, t in _measured.items()}}
    DURATIONS.write_text(json.dumps(dict(sorted(new.items())), indent=1) + '\n')


# Where the system has jemalloc (.ci/run installs it), the pytest-xdist workers and every child process
# the tests start allocate with it: under glibc's malloc about a tenth of the suite's CPU time went to
# the allocator (XLA's compiles allocate a great deal). Set in the process that starts the workers,
# before it starts them; LD_PRELOAD given by the user is left alone. The figures: docs/development.md.
if 'PYTEST_XDIST_WORKER' not in os.environ and 'LD_PRELOAD' not in os.environ:
  import ctypes.util  # pylint: disable=g-import-not-at-top
  JEMALLOC = ctypes.util.find_library('jemalloc')  # its soname, which ld.so finds on its own search path
  if JEMALLOC:
    os.environ['LD_PRELOAD'] = JEMALLOC


def pytest_collection_finish(session):
  """Python's cyclic garbage collector, once the tests and what they import are loaded: those objects
  (jax's, the package's) are frozen out of its scans, and it runs after 100,000 allocations net instead
  of 700. JAX's tracing allocates many short-lived objects, and the collector's scans of them took about
  5% of a run's CPU time (3% less with this). A test process only: the package leaves the collector alone."""
  del session
  gc.collect()
  gc.freeze()
  gc.set_threshold(100_000, 50, 100)


def init_variables(model, image_size: int, key=None) -> dict:
  """`model`'s variables for `image_size` px images, initialised in one jitted program: flax's init
  run op by op compiles each of its hundreds of small ops in turn (about 10 s in a fresh worker).
  Jitting it changes no bit (tests/test_init.py)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  x = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
  return jax.jit(lambda k: model.init(k, x, train=False))(jax.random.key(0) if key is None else key)


def noise_view(**fields):
  """The loss view `base.base_loss` reads (`base.loss_view`) of the shared config, config.noise's `fields`
  changed (draw_map 'unroll' unless given: 'auto' is resolved when a run starts)."""
  from configs import common  # pylint: disable=g-import-not-at-top
  from f2m_jax import base  # pylint: disable=g-import-not-at-top
  config = common.base_config()
  config.noise.update({'draw_map': 'unroll', **fields})
  return base.loss_view(config)


def naive_logits(model, params, batch_stats, images, eps) -> tuple:
  """([the logits of each draw], the logits of the clean network) on one batch, computed naively: the
  whole network in train mode (batch statistics) at params + eps_j for each draw of `eps` ({path: [M,
  ...]}), one draw at a time, and at params. Differentiable in `params` (the gradient of 'noisy' backward
  weights). Under jax.enable_x64 with float64 arrays it is the reference a loss term's test holds
  `base.base_loss` to (tests/test_change_the_loss.py)."""
  from f2m_jax import base, trees  # pylint: disable=g-import-not-at-top

  def logits(p):
    return model.apply({'params': p, 'batch_stats': batch_stats}, images, train=True, mutable=['batch_stats'])[0][1]

  draws = len(next(iter(eps.values()), ()))
  return [logits(base.perturb(params, trees.index(eps, j))) for j in range(draws)], logits(params)


def xla_flags(*flags: str) -> str:
  """XLA_FLAGS for a child process: this process's flags and `flags`."""
  return ' '.join([os.environ.get('XLA_FLAGS', ''), *flags]).strip()


# Real data (the CIFAR-100 training set, the TOPIC lists) only where F2M_DATA_DIR names them; where it
# is unset this folder does not exist, and the tests that need real data skip.
DATA_DIR = pathlib.Path(os.environ.get('F2M_DATA_DIR') or REPO / 'F2M_DATA_DIR-is-unset').resolve()


@pytest.fixture
def smoke_config():
  from configs import cifar100
  return cifar100.get_config('smoke')


def without_provenance(results: dict) -> dict:
  """Results minus their provenance (when, where, how long and the config as given): two runs that
  compute the same thing must agree on everything else."""
  return {k: v for k, v in results.items() if k != 'provenance'}


def tiny_protocol(method: str, **section):
  """The smoke config shrunk further for methods that train per session: 6 base classes and 2
  sessions of 2-way 5-shot, 2 runs, 40 base steps; `section` updates config[method] (the config
  section a method owns, `Method.section`; a method without one takes no `section`)."""
  from configs import cifar100  # pylint: disable=g-import-not-at-top
  config = cifar100.get_config('smoke')
  config.method = method
  config.runs = 2
  config.data.synthetic.update(num_base=6, way=2, num_sessions=3, train_per_class=20, test_per_class=10)
  config.base.update(steps=40, milestones=(30,), batch_size=24, ways=3, log_every=10, checkpoint_every=20)
  if section:
    if method not in config:
      raise ValueError(f'method {method!r} owns no config section; tiny_protocol({method!r}) takes no settings '
                       f'(given {sorted(section)})')
    config[method].update(section)
  return config


@dataclasses.dataclass
class TinyRun:
  results: dict
  exp: object  # experiment_lib.Experiment of the config
  ckpts: object  # the workdir's Checkpoints, read-only
  first: dict  # session 1's model: {'params', 'batch_stats', 'prototypes'}


def tiny_method_run(tmp_path_factory, make_config) -> TinyRun:
  """pipeline.run(make_config()) of a tiny_protocol in a fresh folder, with the checks every such
  run passes (its method, sessions of 6, 8 and 10 classes, session 1 far above chance), and what
  the tests read back from it."""
  from f2m_jax import experiment as experiment_lib  # pylint: disable=g-import-not-at-top
  from f2m_jax.run import pipeline  # pylint: disable=g-import-not-at-top
  from f2m_jax.run.checkpoint import Checkpoints  # pylint: disable=g-import-not-at-top
  from f2m_jax.data import sources  # pylint: disable=g-import-not-at-top
  config = make_config()
  workdir = str(tmp_path_factory.mktemp(config.method) / 'full')
  results = pipeline.run(config, workdir)
  assert results['method'] == config.method
  assert [s['num_classes'] for s in results['sessions']] == [6, 8, 10]
  assert far_above_chance(results['sessions'][0]['acc']['mean'], images=60, classes=6)  # the base classes' test set
  config = pipeline.resolve(make_config())
  exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
  ckpts = Checkpoints(workdir, read_only=True)
  state = exp.init_state()
  first = ckpts.restore_model({'params': state.params, 'batch_stats': state.batch_stats,
                               'prototypes': np.zeros((exp.bench.num_base_classes, exp.embedding_dim()), np.float32)})
  return TinyRun(results, exp, ckpts, first)


def rel_norm_diff(a, b) -> float:
  """|a - b| / |b| over all leaves of two pytrees together, in float64."""
  import jax  # pylint: disable=g-import-not-at-top
  flat = lambda t: np.concatenate([np.ravel(np.float64(v)) for v in jax.tree_util.tree_leaves(jax.device_get(t))])
  x, y = flat(a), flat(b)
  return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def moved(state, init) -> tuple:
  """How far a train state's parameters and BN statistics moved from `init`'s, in float64."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree_util.tree_map(lambda a, b: np.float64(a) - np.float64(b), jax.device_get(
      (state.params, state.batch_stats)), jax.device_get((init.params, init.batch_stats)))


def far_above_chance(accuracy: float, images: int, classes: int, p_value: float = 1e-6) -> bool:
  """Whether `accuracy` (%) on `images` test images of `classes` balanced classes is one that guessing
  reaches with probability below `p_value` (binomial tail): a learning criterion that does not hang
  on one image more or less, as a fixed multiple of chance can (a tiny run scored 29 of 60 where
  3 x chance asked for 30)."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  correct = round(accuracy * images / 100)
  return stats.binom.sf(correct - 1, images, 1 / classes) < p_value


class Interrupt(Exception):
  pass


def resumed_after_interruption(make_config, workdir: str, run: int, session: int) -> dict:
  """pipeline.run(make_config(), workdir) stopped right after run `run` saved session `session`,
  then run again (it resumes); returns the second call's results."""
  from f2m_jax.run import pipeline  # pylint: disable=g-import-not-at-top

  def stop(phase, **info):
    if phase == 'session' and (info.get('run'), info.get('session')) == (run, session):
      raise Interrupt

  with pytest.raises(Interrupt):
    pipeline.run(make_config(), workdir, hook=stop)
  return pipeline.run(make_config(), workdir)


def snapshot(workdir) -> dict:
  """{relative path: sha256} of every file under `workdir`: equal snapshots, nothing written."""
  out = {}
  for root, _, files in os.walk(workdir):
    for f in files:
      path = os.path.join(root, f)
      with open(path, 'rb') as fh:
        out[os.path.relpath(path, workdir)] = hashlib.sha256(fh.read()).hexdigest()
  return out


# What tiny_smoke() changes in configs/cifar100.py:smoke.
TINY_SMOKE = {'data.synthetic.num_sessions': 3, 'base.steps': 20, 'base.checkpoint_every': 10, 'base.log_every': 5,
              'base.milestones': (15,)}


def tiny_smoke(**changes):
  """The smoke config with 3 sessions and 20 base steps (checkpoints every 10, a log line every 5, the
  rate cut at 15), and `changes` ({dotted field: value}) on top. Tests whose runs need no other shape
  derive theirs from it: their programs are then the reference run's, which the persistent compilation
  cache serves (a program of another shape compiles anew: log and checkpoint intervals set the steps a
  call, and the classes the sizes)."""
  from configs import cifar100  # pylint: disable=g-import-not-at-top
  c = cifar100.get_config('smoke')
  for field, value in {**TINY_SMOKE, **changes}.items():
    section, _, name = field.rpartition('.')
    node = c
    for part in section.split('.') if section else ():
      node = node[part]
    node[name] = value
  return c


# tiny_smoke() as run.py's command line (a child process): its runs are the reference run's.
TINY_SMOKE_ARGS = ['--config', 'configs/cifar100.py:smoke', *(f'--config.{k}={v}' for k, v in TINY_SMOKE.items())]


@pytest.fixture(scope='session')
def reference(tmp_path_factory):
  """(workdir, results) of pipeline.run(tiny_smoke()): the one uninterrupted run of the session that
  resumes, faults and records are compared with. Tests read it in place or change a copy (`copy_of`);
  it must end the session byte for byte as it was made."""
  from f2m_jax.run import pipeline  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path_factory.mktemp('reference') / 'f2m')
  results = pipeline.run(tiny_smoke(), workdir)
  made = snapshot(workdir)
  yield workdir, results
  assert snapshot(workdir) == made, 'a test changed the shared reference workdir; change a copy_of it instead'


def copy_of(reference, tmp_path, unfinished: bool = False) -> str:
  """A copy of the reference workdir; `unfinished`: without results.json (a run stopped after its
  checkpoints were saved, which train mode reads again)."""
  import shutil  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'copy')
  shutil.copytree(reference[0], workdir)
  if unfinished:
    os.remove(os.path.join(workdir, 'results.json'))
  return workdir


def run_py(argv: list, monkeypatch) -> int:
  """What `python run.py <argv[1:]>` does, in this process: run.py's flags, in a FlagValues of their own,
  parsed from `argv` (as run.py parses sys.argv), then its main; the exit code (a SystemExit's too)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from f2m_jax.run import cli  # pylint: disable=g-import-not-at-top
  flag_values = flags.FlagValues()
  cli.define_flags(flag_values)
  monkeypatch.setattr(sys, 'argv', list(argv))
  try:
    return cli.main_flags(cli.parse_flags(list(argv), flag_values), flag_values)
  except SystemExit as e:
    return e.code
