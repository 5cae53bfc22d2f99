"""Compiling the sessions' programs ahead, in a background thread while session 1 trains
(f2m_jax/programs.py): after base training the main thread compiles none of them, and the results
are those of compiling them at their first call."""
import json
import os
import threading

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import without_provenance
from f2m_jax import evaluation
from f2m_jax import pipeline
from f2m_jax import programs as programs_lib

SESSION_PROGRAMS = ('jit(_embed)', 'jit(finetune_padded)', 'jit(finetune_runs_padded)', 'jit(ncm_predict_padded)',
                    'jit(predict_runs)')


class MainThreadCompiles:
  """The names of the programs the main thread compiles while `on` (a program found in the
  persistent compilation cache counts too: it goes through the same compile call)."""

  def __init__(self):
    self.on, self.names = True, []

  def __call__(self, event, duration, **kw):
    del duration
    if event == '/jax/core/compile/backend_compile_duration' and self.on and threading.current_thread().name == 'MainThread':
      self.names.append(kw.get('fun_name'))

  def __enter__(self):
    jax.monitoring.register_event_duration_secs_listener(self)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self)


def _run_counting_compiles(config, workdir):
  """pipeline.run, and the session programs the main thread compiled after the last base step."""
  evaluation.ncm_predict_padded.clear_cache()  # module-level: an earlier run in this process compiled it
  with MainThreadCompiles() as compiles:
    compiles.on = False

    def hook(kind, **kw):
      if kind == 'base_step' and kw['step'] == config.base.steps:
        compiles.on = True

    results = pipeline.run(config, workdir, hook=hook)
  return results, sorted(set(compiles.names) & set(SESSION_PROGRAMS))


@pytest.mark.slow
# Runner.update and accuracies one run a call; finetune.runs and Evaluator.accuracies_runs over the runs
@pytest.mark.parametrize('parallel_runs', [1, 2])
def test_compiled_ahead_the_sessions_compile_nothing_and_results_are_unchanged(smoke_config, tmp_path, parallel_runs):
  smoke_config.base.steps = 10
  smoke_config.incremental.parallel_runs = parallel_runs
  smoke_config.compile_ahead = 'off'
  off, compiled_off = _run_counting_compiles(smoke_config, str(tmp_path / 'off'))
  smoke_config.compile_ahead = 'on'
  on, compiled_on = _run_counting_compiles(smoke_config, str(tmp_path / 'on'))
  group = ['jit(finetune_padded)'] if parallel_runs == 1 else ['jit(finetune_runs_padded)', 'jit(predict_runs)']
  assert compiled_off == sorted(['jit(_embed)', *group, 'jit(ncm_predict_padded)'])  # what compiling ahead takes away
  assert compiled_on == []
  assert without_provenance(on) == without_provenance(off)
  with open(os.path.join(tmp_path, 'on', 'metrics.jsonl')) as f:
    ahead = [json.loads(line) for line in f if '"compile_ahead"' in line]
  # the test-view embedding, the frozen trunk, then one run a call: the suffix and the fine-tuning; or
  # the two runs a call: their fine-tuning and their evaluation; NCM (session 1)
  assert len(ahead) == 1 and ahead[0]['programs'] == 5 and ahead[0]['failed'] == []


def test_programs_are_built_once_and_get_waits_for_their_compile():
  programs = programs_lib.Programs()
  built = []

  def build():
    built.append(1)
    return jax.jit(lambda x: jnp.sin(x) * 2)

  x = jax.ShapeDtypeStruct((3,), jnp.float32)
  programs.compile_ahead(lambda: [('f', build, lambda f: f.lower(x)),
                                  ('bad', build, lambda f: f.lower(x, 'no such arg'))])
  with MainThreadCompiles() as compiles:
    f = programs.get('f', build)  # waits for its compile
    np.testing.assert_allclose(f(np.ones(3, np.float32)), 2 * np.sin(np.ones(3)), rtol=1e-6)
  assert compiles.names == []  # the call found the program compiled ahead
  assert programs.get('bad', build) is not f  # another name, another program
  done = programs.wait()
  assert len(built) == 2 and done['programs'] == 1
  assert len(done['failed']) == 1 and done['failed'][0].startswith('bad: TypeError')  # reported, not raised
  programs.close()
  unlisted = programs_lib.Programs()
  unlisted.compile_ahead(lambda: 1 / 0)
  assert unlisted.wait()['failed'] == ['listing the programs: ZeroDivisionError: division by zero']
  unlisted.close()


def test_compile_ahead_modes(smoke_config):
  assert programs_lib.enabled('on') and not programs_lib.enabled('off')
  assert programs_lib.enabled('auto') == (jax.default_backend() != 'cpu')
  smoke_config.compile_ahead = 'yes'
  with pytest.raises(ValueError, match="compile_ahead='yes' is invalid: allowed: \\('auto', 'on', 'off'\\)"):
    pipeline.resolve(smoke_config)


@pytest.mark.parametrize('placement,members,mapping', [('host', 1, 'unroll'), ('device', 2, 'vmap')])
def test_the_base_step_compiled_while_the_states_are_made_is_the_step_the_loop_runs(tmp_path, placement, members,
                                                                                    mapping, capsys):
  """compile_ahead='on': the base step compiles in a background thread while the states are
  initialised (or restored) and the images placed; the main thread then compiles no base step, and the
  trained states are those of compiling at the first call: one run on the host path, and a sweep of
  2 members mapped with vmap on the device path."""
  from conftest import tiny_protocol
  from f2m_jax import train_loop, workdir as workdir_lib
  from f2m_jax.checkpoint import Checkpoints
  from f2m_jax.data import sources
  from f2m_jax.experiment import Experiment
  config = tiny_protocol('f2m')
  config.base.update(steps=4, log_every=2, checkpoint_every=2, data_placement=placement, steps_per_call=2)
  bench = sources.load_benchmark(config)
  step_programs = {'jit(unrolled)', 'jit(multi_step)', 'jit(train_step)'}  # vmap keeps the step's name
  final, compiled = {}, {}
  for mode in ('off', 'on'):
    config.compile_ahead = mode
    exps, folders = [], [str(tmp_path / mode / str(i)) for i in range(members)]
    for i in range(members):
      config.seed = i
      exps.append(Experiment.create(config, bench))
    ckpts = [Checkpoints(f) for f in folders]
    with MainThreadCompiles() as compiles:
      final[mode] = jax.device_get(train_loop.train_base_sessions(
          exps, ckpts, [workdir_lib.MetricsLog(f) for f in folders], 'base session', mapping=mapping))
    for c in ckpts:
      c.close()
    compiled[mode] = set(compiles.names) & step_programs
  assert len(compiled['off']) == 1, compiled['off']  # the loop's one step program
  assert compiled['on'] == set()
  assert 'compiled in the background in' in capsys.readouterr().out
  chex.assert_trees_all_equal(final['on'], final['off'])
