"""The config's shared fields, checked before anything is written: a bad value stops with a message
naming the field, the value and what is allowed. Each method checks its own section
(`Method.validate`, f2m_jax/methods), with the same `need`.
"""
from __future__ import annotations

import os

import ml_collections

from f2m_jax import base as base_lib
from f2m_jax import noise as noise_lib
from f2m_jax import incremental as incremental_lib
from f2m_jax import programs as programs_lib
from f2m_jax.data import cifar100
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.data import sources
from f2m_jax.models import HEADS

SAMPLERS = ('task_epochs', 'balanced', 'shuffle')
MEMBER_MAPS = ('auto', 'vmap', 'unroll')
BACKWARD_WEIGHTS = ('noisy', 'clean')


def need(ok: bool, field: str, value, allowed: str) -> None:
  """Raises ValueError('<field>=<value> is invalid: <allowed>') unless `ok`."""
  if not ok:
    raise ValueError(f'{field}={value!r} is invalid: {allowed}')


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming the field, its value and what is allowed (the fields every method
  reads; a method's own section is its `Method.validate`'s)."""
  need(c.noise.M >= 1, 'noise.M', c.noise.M, 'must be >= 1')
  need(c.noise.bound >= 0, 'noise.bound', c.noise.bound, 'must be >= 0')
  need(c.noise.distribution in noise_lib.DISTRIBUTIONS, 'noise.distribution', c.noise.distribution,
       f'allowed: {noise_lib.DISTRIBUTIONS}')
  need(c.noise.backward_weights in BACKWARD_WEIGHTS, 'noise.backward_weights', c.noise.backward_weights,
       f'allowed: {BACKWARD_WEIGHTS}')
  need(c.noise.bn_updates in base_lib.BN_UPDATES, 'noise.bn_updates', c.noise.bn_updates,
       f'allowed: {base_lib.BN_UPDATES}')
  need(c.noise.pf_weight >= 0 and c.noise.std_weight >= 0, 'noise.pf_weight/std_weight',
       (c.noise.pf_weight, c.noise.std_weight), 'must be >= 0')
  need(c.runs >= 1, 'runs', c.runs, 'must be >= 1')
  need(c.base.steps >= 1, 'base.steps', c.base.steps, 'must be >= 1')
  need(c.base.sampler in SAMPLERS, 'base.sampler', c.base.sampler, f'allowed: {SAMPLERS}')
  if c.base.sampler == 'task_epochs':
    need(c.base.batch_size % c.base.shots == 0, 'base.batch_size', c.base.batch_size,
         f'the task_epochs sampler needs a multiple of base.shots={c.base.shots}')
  need(c.base.select_every >= 1, 'base.select_every', c.base.select_every, 'must be >= 1')
  need(c.base.ways >= 1 and c.base.shots >= 1, 'base.ways/shots', (c.base.ways, c.base.shots), 'must be >= 1')
  need(c.base.lr > 0, 'base.lr', c.base.lr, 'must be > 0')
  need(c.base.data_placement in ('auto', 'host', 'device'), 'base.data_placement', c.base.data_placement,
       "'auto', 'host' or 'device'")
  need(c.incremental.parallel_runs >= 0, 'incremental.parallel_runs', c.incremental.parallel_runs,
       'must be >= 0 (0: automatic)')
  need(c.base.steps_per_call >= 0, 'base.steps_per_call', c.base.steps_per_call, 'must be >= 0 (0: automatic)')
  need(c.base.prefetch >= 0, 'base.prefetch', c.base.prefetch, 'must be >= 0 (0: no background thread)')
  need(c.base.checkpoint_every >= 1, 'base.checkpoint_every', c.base.checkpoint_every, 'must be >= 1')
  need(c.incremental.trainable in ('noise_set', 'all'), 'incremental.trainable', c.incremental.trainable,
       "'noise_set' or 'all'")
  need(c.incremental.steps >= 0, 'incremental.steps', c.incremental.steps, 'must be >= 0')
  need(c.incremental.lr > 0, 'incremental.lr', c.incremental.lr, 'must be > 0')
  need(not c.incremental.round_steps or c.noise.bound > 0, 'incremental.round_steps', c.incremental.round_steps,
       f'rounds steps to multiples of noise.bound/2, so it needs noise.bound > 0 (is {c.noise.bound})')
  need(c.incremental.prototype_norm in incremental_lib.PROTOTYPE_NORMS, 'incremental.prototype_norm',
       c.incremental.prototype_norm, f'allowed: {incremental_lib.PROTOTYPE_NORMS}')
  need(c.incremental.distance in ('squared_euclidean', 'euclidean'), 'incremental.distance',
       c.incremental.distance, "'squared_euclidean' or 'euclidean'")
  need(c.data.protocol in protocol_lib.PROTOCOLS, 'data.protocol', c.data.protocol,
       f'allowed: {protocol_lib.PROTOCOLS}')
  need(c.data.source in sources.SOURCES, 'data.source', c.data.source, f'allowed: {sources.SOURCES}')
  need(c.data.shots >= 1, 'data.shots', c.data.shots, 'must be >= 1')
  if c.data.split:
    need(c.data.split in cifar100.SPLITS and c.data.dataset == 'cifar100'
         and c.data.source in ('tfds', 'trainsplit'), 'data.split', c.data.split,
         f'one of {sorted(cifar100.SPLITS)} for CIFAR-100 (tfds or trainsplit source), or empty')
    need(c.data.protocol in ('draws', 'validation'), 'data.protocol', c.data.protocol,
         "the class splits have no TOPIC lists: use 'draws' (or 'validation')")
  need(c.model.dtype in ('float32', 'bfloat16'), 'model.dtype', c.model.dtype, "'float32' or 'bfloat16'")
  need(c.model.head in HEADS, 'model.head', c.model.head, f'allowed: {HEADS}')
  need(c.members.map in MEMBER_MAPS, 'members.map', c.members.map, f'allowed: {MEMBER_MAPS}')
  need(c.compile_ahead in programs_lib.MODES, 'compile_ahead', c.compile_ahead, f'allowed: {programs_lib.MODES}')


def check_data_folder(c: ml_collections.ConfigDict) -> None:
  """Raises ValueError where the config's source reads a data folder that is unset or missing."""
  help_text = sources.how_to_get(c)
  if c.data.source in ('trainsplit', 'folder') and not sources.data_dir(c):
    raise ValueError(f'data.source={c.data.source!r} needs a data folder: set F2M_DATA_DIR or '
                     '--config.data.data_dir' + (f'.\n{help_text}' if help_text else ''))
  if sources.data_dir(c) and not os.path.isdir(sources.data_dir(c)):
    raise ValueError(f'data folder {sources.data_dir(c)!r} (data.data_dir or F2M_DATA_DIR) does not exist'
                     + (f'.\n{help_text}' if help_text else ''))
