"""The memory check (f2m_jax/run/memory.py) against machines of chosen sizes: a run that needs more than the
total memory is refused naming the field, one that needs more than is free now is warned about, and
memory_check=False skips both; the programs it compiles are the run's own; an allocation failure during
a run is one line naming the field to lower."""
import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import cifar100
from conftest import tiny_smoke
from f2m_jax import evaluator
from f2m_jax.data import sources
from f2m_jax.experiment import Experiment
from f2m_jax.run import backend, cli, memory, pipeline

GIB = 2 ** 30


def experiment(**fields) -> Experiment:
  c = pipeline.resolve(tiny_smoke(**fields))
  return Experiment.create(c, sources.load_benchmark(c))


@pytest.fixture(scope='module')
def checked():
  """(config, images, phases) of the tiny smoke config (24 classes of 60 images of 16 px) with
  eval.batch_size=20000."""
  exp = experiment(**{'eval.batch_size': 20000})
  images, phases = memory.programs(exp, 1)
  network = sum(a.nbytes for a in jax.tree_util.tree_leaves(exp.variables_template()))
  assert images == 24 * 60 * 3 * 16 ** 2 and set(phases) == {'eval.batch_size', 'base.batch_size'}
  # At least what the evaluation program holds by hand: the network, a batch of images, its embeddings.
  assert phases['eval.batch_size'] >= network + 20000 * (3 * 16 ** 2 + 4 * exp.embedding_dim())
  return exp.config, images, phases


def test_the_evaluation_holds_the_test_sets_trunk_features_where_they_are_cached():
  """What the sessions keep on the devices (evaluator.Evaluator, fine-tuning on), measured by computing it."""
  exp = experiment()
  block = evaluator.Evaluator.trunk_block(exp, exp.trainable_paths(exp.state_shapes().params))
  held = evaluator.embedder(exp, last=block)(exp.variables_template(), exp.bench.test.images, keep_on_device=True)
  on, off = memory.programs(exp)[1], memory.programs(experiment(**{'eval.cache_trunk': False}))[1]
  assert block > 0 and sum(on.values()) - sum(off.values()) == held.nbytes > 0


@pytest.mark.parametrize('total, free, kind', [(-1, -1, 'refuse'), (+1, -1, 'warn'), (+1, +1, 'fits')])
def test_refused_over_the_total_warned_over_what_is_free(monkeypatch, capsys, checked, total, free, kind):
  c, images, phases = checked
  size = memory.PROGRAMS * phases['eval.batch_size']  # the largest phase, with the host's copies
  need = memory.RUNTIME + images + size
  monkeypatch.setattr(backend, 'available_memory', lambda: (need + total, need + free, None))
  memory._warn.cache_clear()
  said = f'the run needs about {need / GIB:.2f} GiB ({size / GIB:.2f} GiB for eval.batch_size'
  if kind == 'refuse':
    with pytest.raises(ValueError) as e:
      memory.check(c, images, phases, compiled=True)
    assert str(e.value).startswith(f'eval.batch_size=20000 is invalid: {said}') and '\n' not in str(e.value)
    assert f'more than the {(need - 1) / GIB:.2f} GiB this machine has' in str(e.value)
  else:
    memory.check(c, images, phases, compiled=True)
  err = capsys.readouterr().err.splitlines()
  assert len(err) == (kind == 'warn')
  assert all(line.startswith(f'warning: eval.batch_size=20000 may not fit in memory: {said}') for line in err)


def test_a_gpu_checks_the_programs_against_each_devices_memory(monkeypatch, checked):
  c, images, phases = checked  # the host's size (0 here) is not the programs'
  monkeypatch.setattr(backend, 'available_memory', lambda: (0, 0, max(phases.values())))
  memory.check(c, images, phases, compiled=True)
  monkeypatch.setattr(backend, 'available_memory', lambda: (0, 0, max(phases.values()) - 1))
  with pytest.raises(ValueError, match='more than the .* GiB each device has'):
    memory.check(c, images, phases, compiled=True)


def test_memory_check_false_skips_the_check_and_compiles_nothing(monkeypatch, capsys):
  monkeypatch.setattr(backend, 'available_memory', lambda: (1, 1, None))  # 1 B: refused where checked
  exp = experiment(memory_check=False)
  assert memory.programs(exp, 1) == (0, {})
  memory.check(exp.config, *memory.generated(exp.config))
  assert capsys.readouterr().err == ''


@pytest.mark.parametrize('split, size, kind', [('train_per_class', 22000, 'warn'),  # issue 73: 15.9 GiB, rising
                                              ('test_per_class', 30000, 'refuse'), ('train_per_class', 40, 'fits')])
def test_generated_data_is_checked_before_it_is_rendered(monkeypatch, capsys, split, size, kind):
  """The smoke config's 36 classes at 16 px on 24 GiB, 18 of them free (other processes running): 30 B a
  pixel channel of the larger split while it renders, besides the runtime and 1 B a pixel channel of both."""
  c = cifar100.get_config('smoke')
  c.data.synthetic[split] = size
  images, phases = memory.generated(c)
  pixels, counts = 36 * 3 * 16 ** 2, {'train_per_class': 40, 'test_per_class': 20, split: size}
  assert (images, phases) == (pixels * sum(counts.values()), {f'data.synthetic.{split}': 30 * pixels * size})
  monkeypatch.setattr(backend, 'available_memory', lambda: (24 * GIB, 18 * GIB, None))
  memory._warn.cache_clear()
  if kind == 'refuse':
    with pytest.raises(ValueError, match=f'data.synthetic.{split}={size} is invalid'):
      memory.check(c, images, phases)
  else:
    memory.check(c, images, phases)
  assert ('may not fit in memory' in capsys.readouterr().err) == (kind == 'warn')


@pytest.mark.slow
def test_the_run_compiles_the_checked_programs_once(tmp_path):
  """The check compiles the base step and the evaluation program as the run does, so that the run finds
  them compiled: with the check, the run obtains (compiles, or loads from JAX's cache) no more programs."""
  got = collections.Counter()
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, _, fun_name=None, **kw: got.update([fun_name]) if event.endswith('backend_compile_duration') else 0)
  counts = []
  for check in (True, False):
    jax.clear_caches()
    pipeline.run(tiny_smoke(memory_check=check), str(tmp_path / str(check)))
    counts.append((got.pop('jit(program)'), got.pop('jit(_embed)')))
  assert counts[0] == counts[1] and counts[0][0] == 1, counts


def embed():  # an allocation failure where the evaluation embeds (the name of its loop), from XLA
  jnp.zeros(10 ** 14, jnp.uint8).block_until_ready()


def train_steps():  # one where base training runs, from numpy
  np.ones(10 ** 15, np.uint8)


@pytest.mark.parametrize('fail, field', [(embed, 'eval.batch_size=100000'), (train_steps, 'base.batch_size=80')])
def test_an_allocation_failure_is_one_line_naming_the_field_to_lower(monkeypatch, capsys, fail, field):
  """Exit code 3, as the other faults found once the run has started; the field is its phase's."""
  monkeypatch.setattr(pipeline, 'run', lambda *args, **kwargs: fail())
  assert cli.run_mode(tiny_smoke(**{'eval.batch_size': 100000}), '/nonexistent', 'train', None, {'changes': {}},
                      None) == 3
  lines = capsys.readouterr().err.splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: out of memory (') and f'lower {field} (' in lines[0]
