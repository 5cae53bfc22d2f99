"""Embeddings, prototypes, NCM accuracies and the summary statistics of the results table."""
from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from f2m_jax import objectives
from f2m_jax.padding import pad_rows
from f2m_jax.data import augment as augment_lib
from f2m_jax.data.types import Benchmark
from f2m_jax.models import ResNet


@functools.lru_cache(maxsize=None)
def make_embed(model: ResNet, mean, std, batch_size: int = 500, first: int = 0,
               last: Optional[int] = None, logits: bool = False) -> Callable:
  """embed(variables, inputs) -> numpy in the model's accumulation dtype, BN in eval mode, in batches padded
  to one size so one (cached) compiled program serves every call. first=0: uint8 images; else the
  activations entering block `first`. `last`: the activation before block `last`; `logits`: the classifier's."""

  @jax.jit
  def _embed(variables, inputs):
    return embed_inputs(model, variables, inputs, mean, std, first, last, logits)

  def embed(variables, inputs, keep_on_device: bool = False):
    """The outputs for `inputs` (host or device arrays) as one numpy array, or (`keep_on_device`) as
    one device array, e.g. the trunk's features that every later evaluation reads again."""
    xp = jnp if keep_on_device else np
    out = []
    for start in range(0, len(inputs), batch_size):
      chunk = inputs[start:start + batch_size]
      out.append(xp.asarray(_embed(variables, pad_rows(chunk, batch_size)))[:len(chunk)])
    return xp.concatenate(out)

  return embed


def embed_inputs(model: ResNet, variables, inputs, mean, std, first: int = 0, last: Optional[int] = None,
                 logits: bool = False):
  """`make_embed`'s outputs for one batch of `inputs`, traced: the test view, BN in eval mode."""
  x = augment_lib.normalize(inputs, mean, std) if first == 0 else inputs
  out = model.apply(variables, x, train=False, first=first, last=last)
  return out if last is not None else out[1 if logits else 0]


def prototypes(embeddings: np.ndarray, labels: np.ndarray, classes: Sequence[int]) -> np.ndarray:
  """Eq. 1 for the given classes: [len(classes), D] means of their embeddings."""
  out = []
  for c in classes:
    members = embeddings[labels == c]
    if len(members) == 0:
      raise ValueError(f'no images of class {c} to build its prototype from')
    out.append(members.mean(axis=0))
  return np.stack(out).astype(np.result_type(embeddings.dtype, np.float32))


@functools.partial(jax.jit, static_argnames='normalize')
def ncm_predict_padded(embeddings, protos, num_classes, normalize: bool):
  """NCM predictions (PN first when `normalize`) where only the first `num_classes` rows of `protos`
  are classes: one compiled program for every session padded to the same shapes."""
  p = objectives.normalize_prototypes(protos) if normalize else protos
  return objectives.ncm_predict(embeddings, p, num_classes)


def eval_shapes(bench: Benchmark) -> tuple:
  """(test images, classes) of the whole benchmark: the sizes its NCM evaluations are padded to."""
  return len(bench.test.labels), bench.num_seen_classes(bench.num_sessions)


def ncm_dtype(*dtypes):
  """The dtype NCM compares embeddings and prototypes in: float32, or float64 where either is (the
  float64 tests)."""
  return functools.reduce(jnp.promote_types, dtypes, jnp.dtype(jnp.float32))


def ncm_accuracies(embeddings: np.ndarray, labels: np.ndarray, protos: np.ndarray, num_base: int,
                   normalize: bool, pad_to: Optional[tuple] = None, session_ends: Sequence[int] = ()) -> dict:
  """NCM over all seen classes: acc, acc_base, acc_novel (None without novel images), hm, in percent, and
  acc_sessions where `session_ends` is given. `pad_to` = (rows, classes) pads so that every session runs
  one compiled program."""
  dtype = ncm_dtype(np.asarray(embeddings).dtype, np.asarray(protos).dtype)
  embeddings, protos = np.asarray(embeddings, dtype), np.asarray(protos, dtype)
  rows, classes = pad_to or (len(embeddings), len(protos))
  pred = ncm_predict_padded(pad_rows(embeddings, rows), pad_rows(protos, classes), np.int32(len(protos)), normalize)
  return accuracies_from_predictions(np.asarray(pred)[:len(embeddings)], labels, num_base, session_ends)


def session_ends(bench: Benchmark, session: int) -> tuple:
  """The classes seen after each session up to `session`: class ids are in session order, so session
  i's classes are those from session_ends[i - 1] (0 for i = 0) to session_ends[i]."""
  return tuple(bench.num_seen_classes(t) for t in range(1, session + 1))


def accuracies_from_predictions(pred: np.ndarray, labels: np.ndarray, num_base: int,
                                session_ends: Sequence[int] = ()) -> dict:
  """acc, acc_base, acc_novel (None without novel images) and hm, in percent; with `session_ends`,
  acc_sessions: the accuracy on each session's classes (None for a session without test images)."""
  correct = np.asarray(pred) == labels
  base = labels < num_base
  acc_base = 100.0 * correct[base].mean()
  acc_novel = 100.0 * correct[~base].mean() if (~base).any() else None
  out = {'acc': 100.0 * correct.mean(), 'acc_base': acc_base, 'acc_novel': acc_novel,
         'hm': harmonic_mean(acc_base, acc_novel) if acc_novel is not None else None}
  if session_ends:
    groups = [(labels >= lo) & (labels < hi) for lo, hi in zip((0,) + tuple(session_ends[:-1]), session_ends)]
    out['acc_sessions'] = [100.0 * float(correct[g].mean()) if g.any() else None for g in groups]
  return out


def harmonic_mean(a: float, b: float) -> float:
  return 0.0 if a + b == 0 else 2.0 * a * b / (a + b)


def summarize(values: Sequence[float]) -> dict:
  """Mean and 95% interval over runs: 1.96 * std / sqrt(R), population std as the original."""
  v = np.asarray(values, np.float64)
  return {'mean': float(v.mean()), 'ci95': float(1.96 * v.std() / np.sqrt(len(v))), 'runs': v.tolist()}


def performance_drop(first: Sequence[float], last: Sequence[float]) -> dict:
  """PD = acc(session 1) - acc(last session), per run, summarised."""
  s = summarize(np.asarray(first) - np.asarray(last))
  return {'mean': s['mean'], 'ci95': s['ci95']}


def average_accuracy(per_session: np.ndarray) -> dict:
  """AVG = mean over sessions, per run ([runs, sessions] in), summarised."""
  s = summarize(np.asarray(per_session).mean(axis=1))
  return {'mean': s['mean'], 'ci95': s['ci95']}


def prototype_norms(prototypes: np.ndarray, num_base: int) -> dict:
  """The paper's norm table for one run: mean and (population) std of the L2 norms of the base
  prototypes (the first `num_base` rows) and of the novel ones (the rest; None without any)."""
  norms = np.linalg.norm(np.asarray(prototypes, np.float64), axis=-1)
  base, novel = norms[:num_base], norms[num_base:]
  return {'base_mean': float(base.mean()), 'base_std': float(base.std()),
          'novel_mean': float(novel.mean()) if novel.size else None,
          'novel_std': float(novel.std()) if novel.size else None}


def build_results(dataset: str, method: str, protocol: str, num_classes: Sequence[int],
                  per_run: Sequence[Sequence[dict]], norms: Optional[Sequence[dict]] = None) -> dict:
  """The results.json document from per-run, per-session accuracy dicts ([runs][sessions]) and,
  optionally, per-run prototype norm statistics after the last session (`prototype_norms`)."""
  runs = len(per_run)
  sessions = []
  for t, n in enumerate(num_classes):
    entry = {'session': t + 1, 'num_classes': int(n)}
    for key in ('acc', 'acc_base', 'acc_novel', 'hm'):
      vals = [per_run[r][t][key] for r in range(runs)]
      entry[key] = None if any(v is None for v in vals) else summarize(vals)
    sessions.append(entry)
  acc = np.asarray([[s['acc'] for s in run] for run in per_run])
  out = {'dataset': dataset, 'method': method, 'protocol': protocol, 'runs': runs, 'sessions': sessions,
         'pd': performance_drop(acc[:, 0], acc[:, -1]), 'avg': average_accuracy(acc)}
  if norms:
    out['prototype_norms'] = {key: None if any(n[key] is None for n in norms) else summarize([n[key] for n in norms])
                              for key in norms[0]}
  matrix = accuracy_matrix(per_run)
  if matrix:
    out['accuracy_matrix'] = matrix
  return out


def accuracy_matrix(per_run: Sequence[Sequence[dict]]) -> Optional[dict]:
  """The accuracy on the classes of session i after session j (None for j < i), as mean and 95% interval
  over runs and per run, from the runs' acc_sessions; None where one lacks them."""
  if not all('acc_sessions' in s for run in per_run for s in run):
    return None
  n = len(per_run[0])
  values = np.full((len(per_run), n, n), np.nan)  # [run, session of origin, after session]
  for r, run in enumerate(per_run):
    for j, s in enumerate(run):
      values[r, :j + 1, j] = [np.nan if v is None else v for v in s['acc_sessions']]
  cells = [[_cell(values[:, i, j]) for j in range(n)] for i in range(n)]
  return {'rows': 'session whose classes are tested', 'columns': 'after session',
          'mean': [[c and c['mean'] for c in row] for row in cells],
          'ci95': [[c and c['ci95'] for c in row] for row in cells],
          'runs': np.where(np.isnan(values), None, values).tolist()}


def _cell(values: np.ndarray) -> Optional[dict]:
  """`summarize` of one cell's values over runs; None where a run has none (NaN)."""
  return None if np.isnan(values).any() else summarize(values)


def results_rows(results: dict) -> list:
  """Flat rows (one per session) for results.csv."""
  rows = []
  for s in results['sessions']:
    row = {'session': s['session'], 'num_classes': s['num_classes']}
    for key in ('acc', 'acc_base', 'acc_novel', 'hm'):
      row[f'{key}_mean'] = None if s[key] is None else round(s[key]['mean'], 4)
      row[f'{key}_ci95'] = None if s[key] is None else round(s[key]['ci95'], 4)
    rows.append(row)
  return rows
