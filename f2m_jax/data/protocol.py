"""Which images each session trains on: TOPIC fixed lists or F2M's seeded draws (docs/data.md,
'Protocols')."""
import hashlib
import itertools

import numpy as np

from f2m_jax.data.types import check_session_indices

PROTOCOLS = ('topic', 'draws', 'validation')


def _by_class(labels, pool):
  """[indices of `pool` of each class], classes ascending."""
  pool_labels = labels[pool]
  return [pool[pool_labels == c] for c in np.unique(pool_labels)]


def session_shots(benchmark, protocol, run, session, shots, seed):
  """Indices into `benchmark.train` of the few-shot images of `session` (2..T) in run `run`:
  'topic' the fixed list; else `shots` images of each new class's pool, drawn with an RNG
  seeded by (seed, run, session)."""
  if not 2 <= session <= benchmark.num_sessions:
    raise ValueError(f'session must be in [2, {benchmark.num_sessions}], got {session}')
  if protocol == 'topic':
    if benchmark.topic_shots is None:
      raise ValueError(f"data.protocol='topic' is invalid: it needs the TOPIC lists, which dataset "
                       f"{benchmark.name!r} lacks; use 'draws'")
    indices = benchmark.topic_shots[session - 2]
  elif protocol in ('draws', 'validation'):  # the validation protocol draws its shots as 'draws'
    rng = np.random.default_rng([seed, run, session])
    pool_labels = benchmark.train.labels[benchmark.shot_pool]
    picks = []
    for c in benchmark.session_classes[session - 1]:
      candidates = benchmark.shot_pool[pool_labels == c]
      if len(candidates) < shots:
        raise ValueError(f'data.shots={shots} is invalid: class {c} has {len(candidates)} images '
                         'in the shot pool, fewer than that')
      picks.append(np.sort(rng.choice(candidates, shots, replace=False)))
    indices = np.concatenate(picks)
  else:
    raise ValueError(f'protocol={protocol!r} is not one of {PROTOCOLS}')
  check_session_indices(benchmark, indices, session, shots)
  return indices


def shot_draws(benchmark, protocol, shots, seed, runs):
  """Every run's shots (`session_shots`) in brief: `digest`, a hash of their indices and labels
  run by run (equal digests, equal draws: what a paired comparison needs), and `same`: whether
  every run trains on the same images (TOPIC's lists, or shot pools of `shots` images a
  class), so the runs are no draws of them."""
  digest, draws = hashlib.sha256(), []
  for run in range(runs):
    indices = np.concatenate([np.zeros(0, np.int64)] +
                             [session_shots(benchmark, protocol, run, s, shots, seed)
                              for s in range(2, benchmark.num_sessions + 1)])
    digest.update(np.stack([indices, benchmark.train.labels[indices]]).astype(np.int64).tobytes())
    draws.append(indices)
  same = runs > 1 and all(np.array_equal(d, draws[0]) for d in draws)
  return {'digest': digest.hexdigest()[:16], 'same': same}


def class_aware_epoch(labels, pool, per_class, seed, epoch, stream=()):
  """One epoch (max-class-size x classes samples) of cRT's class-aware sampling: classes in a
  random order, `per_class` images a visit from each class's shuffled cycle; a function of
  (seed, stream, epoch)."""
  members = _by_class(labels, pool)
  length = max(len(m) for m in members) * len(members)
  rng = np.random.default_rng([seed, *stream, epoch, 13])

  def cycle(m, order):  # a class's images, reshuffled each time they run out (drawn when needed)
    while True:
      yield from order.tolist()
      order = rng.permutation(m)

  cycles = [cycle(m, rng.permutation(m)) for m in members]
  out = []
  while len(out) < length:
    for c in rng.permutation(len(members)):
      out.extend(itertools.islice(cycles[c], per_class))
  return np.asarray(out[:length], np.int64)


def test_indices(benchmark, session):
  """Indices into `benchmark.test` of every test image of the classes seen up to `session`."""
  return np.flatnonzero(benchmark.test.labels < benchmark.num_seen_classes(session))


def balanced_batch(labels, pool, ways, shots, seed, step):
  """`ways` distinct classes x `shots` images each, in class-contiguous blocks (the original's
  TaskSampler, which prototype fixing relies on); a function of (seed, step), so a resumed run
  sees the same batches."""
  rng = np.random.default_rng([seed, step])
  members = _by_class(labels, pool)
  if ways > len(members):
    raise ValueError(f'data.ways={ways} exceeds the {len(members)} base classes')
  chosen = [members[i] for i in rng.choice(len(members), ways, replace=False)]
  return np.concatenate([rng.choice(m, shots, replace=len(m) < shots) for m in chosen])


def task_epoch(labels, pool, shots, seed, epoch, stream=()):
  """One epoch of the authors' TaskSampler: every class of the pool in a random order, `shots`
  images of each without replacement, class by class; a function of (seed, stream, epoch)."""
  rng = np.random.default_rng([seed, *stream, epoch, 16])
  by_class = _by_class(labels, pool)
  blocks = []
  for i in rng.permutation(len(by_class)):
    members = by_class[i]
    if len(members) < shots:
      raise ValueError(f'class {labels[members[0]]} has {len(members)} base training images, fewer '
                       f'than the base.shots={shots} a batch takes of each class (base.batch_size '
                       '/ base.ways where base.shots=0): lower base.batch_size or raise base.ways')
    blocks.append(members[rng.permutation(len(members))[:shots]])
  return np.concatenate(blocks)


def sampler_shots(sampler, batch, ways, shots):
  """base.shots as the run uses it, the images per class in a batch of the class-aware samplers:
  0 means batch / ways; a set value must give that batch ('task_epochs'); under 'shuffle', 0
  where batch is no multiple of ways. Raises ValueError naming base.shots."""
  if ways < 1 or (shots and (sampler != 'task_epochs' or shots * ways == batch)):
    # balanced: ways x shots is the batch, base.batch_size is not read; ways < 1 is refused
    return shots
  if shots:
    raise ValueError(f'base.shots={shots} is invalid: the task_epochs sampler keeps '
                     f'base.ways={ways} classes a batch, so base.ways x base.shots must be '
                     f'base.batch_size={batch} (is {ways * shots}); leave base.shots=0 (batch_size '
                     '/ ways images a class), or set base.ways = base.batch_size / base.shots')
  if batch % ways == 0:
    return batch // ways
  # the samplers that fill a batch with base.ways classes
  if sampler in ('task_epochs', 'balanced'):
    near = ' or '.join(str(m) for m in (batch // ways * ways, (batch // ways + 1) * ways) if m)
    raise ValueError(f'base.batch_size={batch} is invalid: the {sampler} sampler takes '
                     f'base.ways={ways} classes per batch, base.batch_size / base.ways images each '
                     f'(base.shots=0), so it needs a multiple of {ways} (e.g. {near}); or set '
                     'base.ways, or base.shots with base.ways = base.batch_size / base.shots')
  return 0


def task_epoch_batches(num_classes, shots, batch):
  """Batches per TaskSampler epoch: the epoch's num_classes x shots indices cut into `batch`-sized
  batches, the remainder dropped (the original's DataLoader with drop_last=True)."""
  if batch % shots:
    raise ValueError(f'base.batch_size={batch} must be a multiple of base.shots={shots}: each '
                     'batch is whole blocks of one class (prototype fixing relies on it)')
  per_epoch = num_classes * shots // batch
  if per_epoch < 1:
    raise ValueError(f'base.batch_size={batch} exceeds one epoch of {num_classes} classes x '
                     f'{shots} shots: allowed up to {num_classes * shots}')
  return per_epoch


def shuffled_batch(pool, batch, seed, step, stream=()):
  """Plain shuffled batches: epoch e is a permutation seeded by (seed, *stream, e); a function of
  (seed, stream, step). `stream` tells apart trainings that share a seed (a run's session)."""
  if batch > len(pool):
    raise ValueError(f'batch size {batch} exceeds the {len(pool)} training images')
  per_epoch = len(pool) // batch  # drop_last, as the original
  epoch, pos = divmod(step, per_epoch)
  order = np.random.default_rng([seed, *stream, epoch, 7]).permutation(len(pool))
  return pool[order[pos * batch:(pos + 1) * batch]]
