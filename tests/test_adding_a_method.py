"""docs/development.md's smallest complete method (a subclass of NCMRunner), read from the doc and
registered for these tests only: it runs end to end through the pipeline, resumes, and does what it
says; and the test helpers serve every registered method."""
import re
import types

import numpy as np
import pytest

from conftest import REPO, resumed_after_interruption, tiny_method_run, tiny_protocol, without_provenance
from f2m_jax import registry
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.methods.ncm import NCMRunner
from f2m_jax.run import pipeline

DOC = REPO / 'docs' / 'development.md'


def example_module() -> types.ModuleType:
  """The first ```python block under 'The shortest route' in docs/development.md, as a module."""
  text = DOC.read_text().split('### The shortest route', 1)[1]
  code = re.search(r'```python\n(.*?)```', text, re.S).group(1)
  module = types.ModuleType('shrunk_from_the_docs')
  exec(compile(code, f'{DOC}:shortest route', 'exec'), module.__dict__)  # pylint: disable=exec-used
  return module


@pytest.fixture(scope='module')
def shrunk(tmp_path_factory):
  """The example, and its tiny run with the example registered as method 'shrunk' while it runs."""
  example = example_module()
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(registry.METHODS, example.SHRUNK.name, example.SHRUNK)
    run = tiny_method_run(tmp_path_factory, lambda: tiny_protocol('shrunk'))
  return example, run


def test_tiny_protocol_serves_every_registered_method():
  for name in registry.METHODS:
    assert pipeline.resolve(tiny_protocol(name), reads_data=False).method == name
  with pytest.raises(ValueError, match="'baseline' owns no config section"):
    tiny_protocol('baseline', epochs=3)


@pytest.mark.slow
def test_the_example_runs_end_to_end_and_is_registered_for_the_tests_only(shrunk):
  example, run = shrunk
  assert run.results['method'] == 'shrunk'
  assert 'shrunk' not in registry.METHODS  # registered only while the tests run it
  assert example.SHRUNK.runner is example.ShrunkRunner and issubclass(example.ShrunkRunner, NCMRunner)


@pytest.mark.slow
def test_the_example_shrinks_novel_prototypes_and_nothing_else(shrunk):
  example, run = shrunk
  exp, first = run.exp, run.first
  plain, ours = NCMRunner(exp, first), example.ShrunkRunner(exp, first)
  shots = protocol_lib.session_shots(exp.bench, exp.config.data.protocol, 0, 2, exp.config.data.shots, exp.config.seed)
  (p_params, p_protos), p_info = plain.update(plain.start(), 0, 2, shots)
  (s_params, s_protos), s_info = ours.update(ours.start(), 0, 2, shots)
  base = len(first['prototypes'])
  np.testing.assert_array_equal(s_protos[:base], p_protos[:base])
  np.testing.assert_allclose(s_protos[base:], 0.9 * p_protos[base:] + 0.1 * first['prototypes'].mean(axis=0),
                             rtol=1e-6, atol=1e-6)
  assert s_info == p_info and np.all(s_protos[base:] != p_protos[base:])


@pytest.mark.slow
def test_the_example_resumes_and_evaluates(shrunk, tmp_path):
  example, run = shrunk
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(registry.METHODS, 'shrunk', example.SHRUNK)
    resumed = resumed_after_interruption(lambda: tiny_protocol('shrunk'), str(tmp_path / 'w'), run=1, session=2)
    assert without_provenance(resumed) == without_provenance(run.results)
    evaluated = pipeline.run(tiny_protocol('shrunk'), str(tmp_path / 'w'), mode='eval')
    assert without_provenance(evaluated) == without_provenance(run.results)
