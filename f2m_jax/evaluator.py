"""NCM accuracies on the test set for the methods that fine-tune part of the network: the test-view
embedding programs shared by a run (`embed_spec`), and the frozen trunk's test features cached once.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from f2m_jax import evaluation
from f2m_jax import padding
from f2m_jax import sharding
from f2m_jax import trees
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.experiment import Experiment
from f2m_jax.models import split_block


def embed_spec(exp: Experiment, first: int = 0, last: Optional[int] = None) -> tuple:
  """(name, build) of the run's one program (exp.programs) for `evaluation.make_embed`'s test-view
  embedding from pixels (the defaults), the trunk's features before block `last`, or the suffix's
  embedding from the features entering block `first`."""
  bench, bs = exp.bench, exp.config.eval.batch_size
  mean, std = (bench.mean, bench.std) if first == 0 else (None, None)
  return ('embed', first, last), lambda: evaluation.make_embed(exp.model, mean, std, bs, first=first, last=last)


def ncm_runs_spec(exp: Experiment, trainable_paths, first: int) -> tuple:
  """(name, build) of the run's one program (exp.programs) for `evaluation.make_ncm_runs`: a group of
  runs' NCM predictions in one call, from the test images (first=0) or the trunk's cached features
  entering block `first`, the run axis split over `sharding.runs_mesh()`."""
  bench, c = exp.bench, exp.config.eval
  mean, std = (bench.mean, bench.std) if first == 0 else (None, None)
  paths = tuple(trainable_paths)
  return ('ncm_runs', paths, first), lambda: evaluation.make_ncm_runs(
      exp.model, mean, std, c.batch_size, paths, first, c.normalize_prototypes, sharding.runs_mesh())


class Evaluator:
  """Test-set NCM accuracies. When only suffix blocks change after session 1, the frozen trunk's
  features of the test set are computed once, kept on the device, and each evaluation runs only the
  suffix."""

  def __init__(self, exp: Experiment, base_variables, trainable_paths):
    self.exp = exp
    self.embed_full = exp.programs.get(*embed_spec(exp))
    self.paths, self.batch_stats = tuple(trainable_paths), base_variables['batch_stats']
    self._trunk = None
    self.block = block = self.trunk_block(exp, trainable_paths)
    if block:
      self._trunk = exp.programs.get(*embed_spec(exp, last=block))(base_variables, exp.bench.test.images,
                                                                    keep_on_device=True)
      self.embed_suffix = exp.programs.get(*embed_spec(exp, first=block))
    self._static = None

  @staticmethod
  def trunk_block(exp: Experiment, trainable_paths) -> int:
    """The first block that `trainable_paths` change, where the test set's features are cached
    before it (fine-tuning on, eval.cache_trunk); 0 for no cache."""
    first = split_block(exp.model, trainable_paths) if trainable_paths else 0
    cache = exp.config.incremental.finetune and exp.config.eval.cache_trunk  # eval.cache_trunk=False: no cache
    return first if cache and 0 < first < exp.model.num_blocks else 0

  def embeddings(self, variables, changed: bool) -> np.ndarray:
    """Embeddings of the whole test set under `variables` (`changed`: differs from phi*)."""
    if self._trunk is not None and changed:
      return self.embed_suffix(variables, self._trunk)
    if changed:
      return self.embed_full(variables, self.exp.bench.test.images)
    if self._static is None:
      self._static = self.embed_full(variables, self.exp.bench.test.images)
    return self._static

  def accuracies(self, variables, protos: np.ndarray, session: int, changed: bool) -> dict:
    bench = self.exp.bench
    idx = protocol_lib.test_indices(bench, session)
    emb = self.embeddings(variables, changed)[idx]
    return evaluation.ncm_accuracies(emb, bench.test.labels[idx], protos, bench.num_base_classes,
                                     self.exp.config.eval.normalize_prototypes, pad_to=evaluation.eval_shapes(bench))

  def accuracies_runs(self, run_params: list, protos: list, session: int) -> list:
    """`accuracies` (changed) of several runs, whose params differ on the trainable paths only and
    share session 1's batch_stats: their NCM predictions over the whole test set in one call
    (`evaluation.make_ncm_runs`), then each run's accuracies on the session's test images (BN in eval
    mode and NCM are row by row, so these rows' predictions are those of embedding them alone)."""
    if not self.paths:
      raise ValueError('Evaluator.accuracies_runs evaluates fine-tuned runs; this evaluator has no trainable paths')
    seen = {len(p) for p in protos}
    if len(seen) != 1 or len(protos) != len(run_params):
      raise ValueError(f'one prototype array of the same number of classes per run expected; got {len(protos)} '
                       f'arrays of {sorted(seen)} classes for {len(run_params)} runs')
    bench = self.exp.bench
    classes = evaluation.eval_shapes(bench)[1]
    inputs = self._trunk if self._trunk is not None else bench.test.images
    ncm_runs = self.exp.programs.get(*ncm_runs_spec(self.exp, self.paths, self.block))
    pred = ncm_runs([trees.split(p, self.paths)[0] for p in run_params], trees.split(run_params[0], self.paths)[1],
                    self.batch_stats, inputs, [padding.pad_rows(p, classes) for p in protos], seen.pop())
    idx = protocol_lib.test_indices(bench, session)
    return [evaluation.accuracies_from_predictions(p[idx], bench.test.labels[idx], bench.num_base_classes)
            for p in pred]
