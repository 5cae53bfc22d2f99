"""Embeddings, prototypes, NCM accuracies and the prototype norms (the results' statistics:
f2m_jax/stats.py)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from f2m_jax import objectives
from f2m_jax.data import augment as augment_lib
from f2m_jax.padding import pad_rows


@functools.cache
def make_embed(model, mean, std, batch_size=500, first=0, last=None, logits=False):
  """embed(variables, inputs) -> numpy in the model's accumulation dtype, BN in eval mode, in
  batches padded to one size so one (cached) compiled program serves every call. first=0: uint8
  images; else the activations entering block `first`. `last`: the activation before block
  `last`; `logits`: the classifier's."""

  @jax.jit
  def _embed(variables, inputs):  # the test view, BN in eval mode
    x = augment_lib.normalize(inputs, mean, std) if first == 0 else inputs
    out = model.apply(variables, x, train=False, first=first, last=last)
    return out if last is not None else out[1 if logits else 0]

  def embed(variables, inputs, keep_on_device=False):
    """The outputs for host or device `inputs` as one numpy array, or one device array
    (`keep_on_device`)."""
    xp = jnp if keep_on_device else np
    chunks = (inputs[start:start + batch_size] for start in range(0, len(inputs), batch_size))
    return xp.concatenate([xp.asarray(_embed(variables, pad_rows(c, batch_size)))[:len(c)]
                           for c in chunks])

  embed.program = _embed  # compiled ahead by the memory check (f2m_jax/run/memory.py)
  return embed


def prototypes(embeddings, labels, classes):
  """Eq. 1 for the given classes: [len(classes), D] means of their embeddings."""
  missing = next((c for c in classes if not (labels == c).any()), None)
  if missing is not None:
    raise ValueError(f'no images of class {missing} to build its prototype from')
  means = np.stack([embeddings[labels == c].mean(axis=0) for c in classes])
  return means.astype(np.result_type(embeddings.dtype, np.float32))


@functools.partial(jax.jit, static_argnames='normalize')
def ncm_predict_padded(embeddings, protos, num_classes, normalize):
  """NCM predictions (PN first when `normalize`) over the first `num_classes` rows of `protos` (the
  rest padding)."""
  p = objectives.normalize_prototypes(protos) if normalize else protos
  return objectives.ncm_predict(embeddings, p, num_classes)


def ncm_accuracies(embeddings, labels, protos, num_base, normalize, pad_to=None, session_ends=()):
  """`accuracies_from_predictions` of NCM over all seen classes; `pad_to` = (rows, classes) pads so
  that every session runs one compiled program."""
  dtype = np.result_type(np.asarray(embeddings).dtype, np.asarray(protos).dtype, np.float32)
  embeddings, protos = np.asarray(embeddings, dtype), np.asarray(protos, dtype)
  rows, classes = pad_to or (len(embeddings), len(protos))
  pred = ncm_predict_padded(pad_rows(embeddings, rows), pad_rows(protos, classes),
                            np.int32(len(protos)), normalize)
  return accuracies_from_predictions(np.asarray(pred)[:len(embeddings)], labels, num_base,
                                     session_ends)


def session_ends(bench, session):
  """The classes seen after each session up to `session`: class ids are in session order, so session
  i's classes are those from session_ends[i - 1] (0 for i = 0) to session_ends[i]."""
  return tuple(bench.num_seen_classes(t) for t in range(1, session + 1))


def accuracies_from_predictions(pred, labels, num_base, session_ends=()):
  """acc, acc_base, acc_novel (None without novel images) and hm, in percent; with `session_ends`,
  acc_sessions: the accuracy on each session's classes (None for a session without test images)."""
  correct = np.asarray(pred) == labels
  base = labels < num_base
  acc_base = 100.0 * correct[base].mean()
  acc_novel = 100.0 * correct[~base].mean() if (~base).any() else None
  # hm: 0 where both are 0
  hm = None if acc_novel is None else 2.0 * acc_base * acc_novel / (acc_base + acc_novel or 1.0)
  out = {'acc': 100.0 * correct.mean(), 'acc_base': acc_base, 'acc_novel': acc_novel, 'hm': hm}
  if session_ends:
    groups = [(labels >= lo) & (labels < hi)
              for lo, hi in zip((0, *session_ends[:-1]), session_ends)]
    out['acc_sessions'] = [100.0 * float(correct[g].mean()) if g.any() else None for g in groups]
  return out


def prototype_norms(prototypes, num_base):
  """The paper's norm table for one run: mean and (population) std of the L2 norms of the base
  prototypes (the first `num_base` rows) and of the novel ones (the rest; None without any)."""
  norms = np.linalg.norm(np.asarray(prototypes, np.float64), axis=-1)
  parts, stats = {'base': norms[:num_base], 'novel': norms[num_base:]}, (('mean', np.mean),
                                                                         ('std', np.std))
  return {f'{part}_{name}': float(f(v)) if v.size else None
          for part, v in parts.items() for name, f in stats}
