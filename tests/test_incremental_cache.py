"""The incremental phase's trunk cache (eval.cache_trunk) changes nothing but the time it takes:
test embeddings from cached trunk features equal the full network's, and a whole run gives the
same results.json with and without the cache."""
import json
import os

import numpy as np
import pytest

from conftest import tiny_smoke, without_provenance
from f2m_jax import evaluator
from f2m_jax import experiment as experiment_lib
from f2m_jax import trees
from f2m_jax.data import sources
from f2m_jax.run import pipeline


def test_cached_suffix_embeddings_equal_full_network(smoke_config):
  smoke_config.data.synthetic.num_sessions, smoke_config.base.steps = 4, 5  # sessions, base steps
  config = pipeline.resolve(smoke_config)  # eval.cache_trunk: True, the default
  exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
  state = exp.init_state()
  base = {'params': state.params, 'batch_stats': state.batch_stats}
  paths = exp.trainable_paths(state.params)
  cached = evaluator.Evaluator(exp, base, paths)
  assert cached._trunk is not None  # pylint: disable=protected-access
  config.eval.cache_trunk = False
  full = evaluator.Evaluator(exp, base, paths)
  assert full._trunk is None  # pylint: disable=protected-access
  # A fine-tuned network: every noise-set kernel moved.
  flat = trees.flatten(state.params)
  tuned = trees.unflatten({p: v + 0.01 * np.sign(np.asarray(v)) if p in set(paths) else v
                               for p, v in flat.items()})
  variables = {'params': tuned, 'batch_stats': state.batch_stats}
  a, b = cached.embeddings(variables, changed=True), full.embeddings(variables, changed=True)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()))
  assert not np.allclose(b, full.embeddings(base, changed=False))  # the change is visible


@pytest.mark.slow
def test_results_identical_with_and_without_cache(reference, tmp_path):
  """conftest's reference run (cache on, the default) and the same config with the cache off, from the
  reference's base model (--checkpoint): the same results."""
  workdir, cached = reference
  uncached = pipeline.run(tiny_smoke(**{'eval.cache_trunk': False}), str(tmp_path / 'uncached'), checkpoint=workdir)
  assert without_provenance(cached) == without_provenance(uncached)
  on_disk = [json.loads(open(os.path.join(d, 'results.json')).read()) for d in (workdir, str(tmp_path / 'uncached'))]
  assert without_provenance(on_disk[0]) == without_provenance(on_disk[1])
  assert cached['sessions'][-1]['acc_novel'] is not None
