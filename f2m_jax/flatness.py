"""Flatness of a trained base model (the paper's flatness table): I = mean_i (L_i - L*)^2 and
sigma^2 = var_i(L_i) of the loss at theta* + eps_i over N bounded draws on the noise set."""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from f2m_jax import base as base_lib
from f2m_jax import noise as noise_lib
from f2m_jax import padding
from f2m_jax.data.augment import normalize
from f2m_jax.evaluation import make_embed
from f2m_jax.models import ResNet


def flatness_stats(clean_loss: float, losses) -> dict:
  """I = mean (L_i - L*)^2 and sigma^2 = var(L_i) (population variance) from the N draws."""
  losses = np.asarray(losses, np.float64)
  return {'L_star': float(clean_loss), 'I': float(np.mean((losses - clean_loss) ** 2)),
          'sigma2': float(np.var(losses)), 'mean_loss': float(losses.mean()), 'num_draws': int(len(losses))}


def noisy_losses(model: ResNet, variables, images: np.ndarray, labels: np.ndarray, paths, split: int,
                 bound: float, distribution: str, num_draws: int, chunk: int, key: jax.Array, mean, std,
                 batch_size: int = 500, progress: str = '') -> tuple:
  """(L*, [L_1..L_N]) on (images, labels). Draw i uses key fold_in(key, i), whatever the chunking.
  `progress`: the title of a bar over the draws (none where empty)."""
  trunk = make_embed(model, mean, std, batch_size, last=split)(variables, images) if split > 0 else None
  inputs = trunk if trunk is not None else images

  def dataset_loss(noise):
    """Mean CE over the whole set with `noise` ({path: array}, or empty) added to the noise set, in
    batches (a scan, so memory stays bounded)."""
    params = base_lib.perturb(variables['params'], noise)
    n = len(inputs)
    rows = padding.round_up(n, batch_size)
    x, y = jnp.asarray(padding.pad_rows(inputs, rows)), jnp.asarray(padding.pad_rows(labels, rows))
    w = padding.pad_rows(jnp.ones((n,)), rows)  # the padding rows weigh 0
    x = x.reshape((-1, batch_size) + x.shape[1:])
    y, w = y.reshape(-1, batch_size), w.reshape(-1, batch_size)

    def body(total, batch):
      xb, yb, wb = batch
      if split == 0:
        xb = normalize(xb, mean, std)
      _, logits = model.apply({'params': params, 'batch_stats': variables['batch_stats']}, xb, train=False,
                              first=split)
      ce = -jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32)), yb[:, None], 1)[:, 0]
      return total + jnp.sum(ce * wb), None

    total, _ = jax.lax.scan(body, jnp.zeros(()), (x, y, w))
    return total / n

  @jax.jit
  def chunk_losses(keys):
    def one(k):
      eps = noise_lib.sample_noise(k, variables['params'], paths, 1, bound, distribution)
      return dataset_loss({p: e[0] for p, e in eps.items()})
    return jax.vmap(one)(keys)

  clean = float(jax.jit(dataset_loss)({}))
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(num_draws))
  out = []
  with tqdm(total=num_draws, desc=progress, unit='draw', file=sys.stdout, disable=not progress,
            mininterval=2.0) as bar:
    for start in range(0, num_draws, chunk):
      k = keys[start:start + chunk]
      k = padding.repeat_last(k, chunk)  # the last chunk filled up: one compiled shape
      out.append(np.asarray(chunk_losses(k))[:min(chunk, num_draws - start)])
      bar.update(len(out[-1]))
  return clean, np.concatenate(out)
