"""NCM accuracies on the test set for the methods that fine-tune part of the network, with the frozen
trunk's test features computed once.
"""
from __future__ import annotations

import numpy as np

from f2m_jax import evaluation
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.experiment import Experiment
from f2m_jax.models import split_block


def embedder(exp: Experiment, first: int = 0, last=None):
  """`evaluation.make_embed` of the run's network in the test view: from pixels (the defaults), the
  trunk's features before block `last`, or the suffix's embedding from the features entering `first`."""
  bench = exp.bench
  mean, std = (bench.mean, bench.std) if first == 0 else (None, None)
  return evaluation.make_embed(exp.model, mean, std, exp.config.eval.batch_size, first=first, last=last)


class Evaluator:
  """Test-set NCM accuracies; where only suffix blocks change after session 1, the frozen trunk's test
  features are computed once and each evaluation runs only the suffix."""

  def __init__(self, exp: Experiment, base_variables, trainable_paths):
    self.exp = exp
    self.embed_full = embedder(exp)
    self._trunk = self._static = None
    block = self.trunk_block(exp, trainable_paths)
    if block:
      self._trunk = embedder(exp, last=block)(base_variables, exp.bench.test.images, keep_on_device=True)
      self.embed_suffix = embedder(exp, first=block)

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
                                     self.exp.config.eval.normalize_prototypes, pad_to=evaluation.eval_shapes(bench),
                                     session_ends=evaluation.session_ends(bench, session))
