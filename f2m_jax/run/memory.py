"""A run's peak memory, checked before anything is written: a run that needs more than this machine
has (on a GPU: its programs, more than a device has) is refused naming the field to lower, one that
needs more than is free now is warned about; config.memory_check=False skips both.

The need: the runtime (RUNTIME: JAX, XLA, compiling), the decoded images (1 B a pixel channel) and
the largest phase, each freed when it ends: rendering generated images (GENERATION B a pixel channel
of the larger split, float64; checked before it runs: `generated`), the base step and the evaluation
(with the test set's trunk features that fine-tuning caches on the devices). The programs are sized
by XLA's memory analysis (arguments, outputs and temporaries, less the donated buffers; per device),
compiled once the data is read as the run compiles them, so that jax.jit's caches hold them for it
(`programs`); on a CPU, times PROGRAMS (the host's copies and the sessions' programs around them).
The constants are measured in experiments/results/README.md, "Peak memory against the estimate".
"""
import contextlib
import functools
import sys
import traceback

import jax
import numpy as np
from ml_collections.config_flags import config_path

from f2m_jax import evaluator, progress, sharding, train_loop
from f2m_jax.run import backend

GIB = 2 ** 30
RUNTIME, GENERATION, PROGRAMS = GIB, 30, 1.3


def generated(c):
  """(bytes of the decoded images, {field: bytes} of rendering them) of generated data, before it is
  rendered; (0, {}) for other data."""
  s = c.data.synthetic
  if c.data.source != 'synthetic':
    return 0, {}
  pixels = (s.num_base + s.way * (s.num_sessions - 1)) * 3 * s.image_size ** 2
  larger = max(['train_per_class', 'test_per_class'], key=s.get)
  return pixels * (s.train_per_class + s.test_per_class), {
      f'data.synthetic.{larger}': GENERATION * pixels * s[larger]}


def programs(exp, members=0):
  """`generated`'s once the data is read: the decoded images, and the evaluation and (`members` > 0)
  the base step of that many members, compiled as the run compiles them (its arguments placed as it
  places them), each under the field of its largest part (the network, the cached trunk features,
  the rest); (0, {}) where config.memory_check is False."""
  c, bench, mesh = exp.config, exp.bench, sharding.data_mesh()
  if not c.memory_check:
    return 0, {}
  state = exp.state_shapes()
  variables = {'params': state.params, 'batch_stats': state.batch_stats}
  images = jax.ShapeDtypeStruct((c.eval.batch_size, *bench.test.images.shape[1:]), np.uint8)
  block, cached = evaluator.Evaluator.trunk_block(exp, exp.trainable_paths(state.params)), 0
  if block:  # the test set's trunk features, which the sessions keep on the devices
    cached = nbytes(jax.eval_shape(evaluator.embedder(exp, last=block).program, variables,
                                   bench.test.images))
  lowered = [('eval.batch_size', variables, cached,
              evaluator.embedder(exp).program.lower(variables, images))]
  if members:
    like = lambda a, *lead: jax.ShapeDtypeStruct((*lead, *np.shape(a)), a.dtype,
                                                 sharding=sharding.replicated(mesh))
    states, keys, bounds = jax.tree_util.tree_map(lambda a: like(a, members),
                                                  (state, jax.eval_shape(exp.key), np.float32(0)))
    rows = jax.ShapeDtypeStruct(
        (train_loop.steps_per_call(c.base, c.base.select_on_test), members,
         len(exp.batch_indices(0))), np.int32, sharding=sharding.member_rows_sharded(mesh))
    step = train_loop.base_program(exp, exp.model, exp.loss, mesh)
    lowered.append((batch_field(c), states, 0, step.lower(
        states, like(bench.train.images), like(bench.train.labels), rows, np.int32(0), keys,
        bounds)))
  phases = {}
  with contextlib.closing(progress.status("memory check: compiling the run's programs (a minute or "
                                          "more on a CPU, seconds where JAX's cache holds them)")):
    for field, network, held, program in lowered:
      size, network = held + peak(program.compile().memory_analysis()), nbytes(network)
      shares = {field: size - held - network, 'model.width': network, 'eval.cache_trunk': held}
      field = max(shares, key=shares.get)
      phases[field] = max(size, phases.get(field, 0))
  return bench.train.images.nbytes + bench.test.images.nbytes, phases


def peak(m):
  """A compiled program's device memory from XLA's analysis `m`: its arguments, outputs and
  temporaries, less the donated buffers."""
  return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
          - m.alias_size_in_bytes)


def nbytes(tree):
  return sum(a.size * a.dtype.itemsize for a in jax.tree_util.tree_leaves(tree))


def check(config, images, phases, compiled=False):
  """A ValueError naming the field of the largest of `phases` where the runtime, `images` and it
  cannot fit in this machine's memory (`compiled` programs on a GPU: it alone in a device's), a
  warning where they may not fit in what is free now; nothing where config.memory_check is False or
  no phase is given."""
  if not (config.memory_check and phases):
    return
  total, free, device = backend.available_memory()
  field = max(phases, key=phases.get)
  size, where = phases[field], 'this machine'
  if compiled and device is not None:  # a GPU: the programs against each device's memory
    need, total, free, where = size, device, device, 'each device'
  else:  # the runtime, the images and the programs with the host's copies around them
    size *= PROGRAMS if compiled else 1
    need = RUNTIME + images + size
  said = f'{field}={config_path.get_value(field, config)!r}'
  sizes = (f'the run needs about {need / GIB:.2f} GiB ({size / GIB:.2f} GiB for {field}; '
           'f2m_jax/run/memory.py)')
  if need > total:
    raise ValueError(f'{said} is invalid: {sizes}, more than the {total / GIB:.2f} GiB {where} has '
                     '(--config.memory_check=False skips this check)')
  if need > free:
    _warn(f'warning: {said} may not fit in memory: {sizes}, {free / GIB:.2f} GiB free now')


def advice(config, error):
  """What an allocation failure says (cli.py): the field of the phase it came from, to lower."""
  frames = [f.name for f in traceback.extract_tb(error.__traceback__)]
  field = batch_field(config)
  if 'embed' in frames:
    field = 'eval.batch_size'
  elif 'make_synthetic' in frames:
    field = 'data.synthetic.train_per_class'
  return f'lower {field}={config_path.get_value(field, config)!r} (f2m_jax/run/memory.py)'


def batch_field(c):
  return 'base.ways' if c.base.sampler == 'balanced' else 'base.batch_size'


@functools.cache
def _warn(line):
  """Each warning once per process (a sweep checks each member and the sweep)."""
  print(line, file=sys.stderr, flush=True)
