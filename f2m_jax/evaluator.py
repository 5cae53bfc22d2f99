"""Accuracies on the test images of the classes seen so far; for the methods that fine-tune part of
the network, NCM with the frozen trunk's test features computed once."""
from f2m_jax import evaluation
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.models import split_block


def embedder(exp, first=0, last=None, network=None, logits=False):
  """`evaluation.make_embed` of `network` (default: the run's) in the test view: from pixels (the
  defaults), the trunk's features before block `last`, the suffix's embedding from the features
  entering `first`, or (`logits`) the classifier's logits."""
  mean, std = (exp.bench.mean, exp.bench.std) if first == 0 else (None, None)
  return evaluation.make_embed(network or exp.model, mean, std, exp.config.eval.batch_size, first,
                               last, logits)


def seen_accuracies(exp, session, values, prototypes=None):
  """The accuracies on the test images of the classes seen by `session` (their indices `idx`):
  `values(idx)` are their embeddings, classified by the nearest of `prototypes`, or with no
  prototypes the predicted classes."""
  bench = exp.bench
  idx = protocol_lib.test_indices(bench, session)
  labels, ends = bench.test.labels[idx], evaluation.session_ends(bench, session)
  if prototypes is None:
    return evaluation.accuracies_from_predictions(values(idx), labels, bench.num_base_classes, ends)
  # padded to the whole benchmark's test images and classes: one program for every session
  pad_to = len(bench.test.labels), bench.num_seen_classes(bench.num_sessions)
  return evaluation.ncm_accuracies(values(idx), labels, prototypes, bench.num_base_classes,
                                   exp.config.eval.normalize_prototypes, pad_to, ends)


class Evaluator:
  """Test-set NCM accuracies; where only suffix blocks change after session 1, the frozen trunk's
  test features are computed once and each evaluation runs only the suffix."""

  def __init__(self, exp, base_variables, trainable_paths):
    self.exp, self.embed_full, self._trunk, self._static = exp, embedder(exp), None, None
    block = self.trunk_block(exp, trainable_paths)
    if block:
      self._trunk = embedder(exp, last=block)(base_variables, exp.bench.test.images,
                                              keep_on_device=True)
      self.embed_suffix = embedder(exp, first=block)

  @staticmethod
  def trunk_block(exp, trainable_paths):
    """The first block that `trainable_paths` change, where the test set's features are cached
    before it (fine-tuning on, eval.cache_trunk); 0 for no cache."""
    block = split_block(exp.model, trainable_paths) if trainable_paths else 0
    cache = exp.config.incremental.finetune and exp.config.eval.cache_trunk
    return block if cache and 0 < block < exp.model.num_blocks else 0

  def embeddings(self, variables, changed):
    """Embeddings of the whole test set under `variables` (`changed`: differs from phi*)."""
    if self._trunk is not None and changed:
      return self.embed_suffix(variables, self._trunk)
    if changed:
      return self.embed_full(variables, self.exp.bench.test.images)
    if self._static is None:
      self._static = self.embed_full(variables, self.exp.bench.test.images)
    return self._static

  def accuracies(self, variables, protos, session, changed):
    return seen_accuracies(self.exp, session, lambda idx: self.embeddings(variables, changed)[idx],
                           protos)
