"""Flatness of a trained base model (the paper's flatness table): I = mean_i (L_i - L*)^2 and
sigma^2 = var_i(L_i) of the loss at theta* + eps_i over N bounded draws on the noise set."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from f2m_jax import base as base_lib
from f2m_jax import noise as noise_lib
from f2m_jax import padding
from f2m_jax import trees
from f2m_jax.data.augment import normalize
from f2m_jax.evaluation import make_embed
from f2m_jax.progress import bar


def flatness_stats(clean_loss, losses):
  """I = mean (L_i - L*)^2 and sigma^2 = var(L_i) (population variance) from the N draws."""
  losses = np.asarray(losses, np.float64)
  return {'L_star': float(clean_loss), 'I': float(np.mean((losses - clean_loss) ** 2)),
          'sigma2': float(np.var(losses)), 'mean_loss': float(losses.mean()),
          'num_draws': len(losses)}


def noisy_losses(model, variables, images, labels, paths, split, bound, distribution, num_draws,
                 chunk, key, mean, std, batch_size=500, progress=''):
  """(L*, [L_1..L_N]) on (images, labels). Draw i uses key fold_in(key, i), whatever the chunking.
  `progress`: the title of a bar over the draws (none where empty)."""
  inputs = images
  if split:  # the unperturbed trunk once
    inputs = make_embed(model, mean, std, batch_size, last=split)(variables, images)
  rows = padding.round_up(len(inputs), batch_size)
  batches = [padding.pad_rows(a, rows).reshape((-1, batch_size) + a.shape[1:])  # padding weighs 0
             for a in (inputs, labels, np.ones(len(inputs)))]

  def dataset_loss(noise):
    """Mean CE over the whole set with `noise` ({path: array}, or empty) added to the noise set, in
    batches (a scan, so memory stays bounded)."""
    params = base_lib.perturb(variables['params'], noise)

    def body(total, batch):
      xb, yb, wb = batch
      if split == 0:
        xb = normalize(xb, mean, std)
      _, logits = model.apply({'params': params, 'batch_stats': variables['batch_stats']}, xb,
                              train=False, first=split)
      ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), yb)
      return total + jnp.sum(ce * wb), None

    return jax.lax.scan(body, jnp.zeros(()), batches)[0] / len(inputs)

  draw = lambda k: noise_lib.sample_noise(k, variables['params'], paths, 1, bound, distribution)
  chunk_losses = jax.jit(jax.vmap(lambda k: dataset_loss(trees.index(draw(k), 0))))

  clean = float(jax.jit(dataset_loss)({}))
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(num_draws))
  out = []
  with bar(num_draws, progress, unit='draw', disable=not progress) as drawn:
    for start in range(0, num_draws, chunk):
      k = keys[start:start + chunk]
      losses = chunk_losses(padding.repeat_last(k, chunk))  # one compiled shape
      out.append(np.asarray(losses)[:len(k)])
      drawn.update(len(k))
  return clean, np.concatenate(out)
