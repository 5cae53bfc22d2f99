"""Every loss of the paper, one pure function per equation (numbers refer to the paper)."""
import jax
import jax.numpy as jnp
import optax

DISTANCES = ('squared_euclidean', 'euclidean')


def cross_entropy(logits, labels):
  """Mean softmax cross-entropy over the batch."""
  logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))  # float64 stays float64
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def class_means(embeddings, labels, num_classes):
  """Eq. 1: p_c = mean of the embeddings of class c. Returns (means [C, D], counts [C]); classes
  absent from `labels` get a zero mean and count 0."""
  onehot = jax.nn.one_hot(labels, num_classes, dtype=embeddings.dtype)
  counts = onehot.sum(axis=0)
  means = (onehot.T @ embeddings) / jnp.maximum(counts, 1.0)[:, None]
  return means, counts


def prototype_fixing(clean, noisy, labels, num_classes):
  """Eq. 4 (PF) as the authors' code estimates it on a batch (docs/method.md, 'Base session'): the
  mean over the classes present in `labels` of ||p_c - p_c^j||^2, p_c the batch's mean clean
  embedding of class c and p_c^j its mean noisy one. Differentiable in both embeddings."""
  p, counts = class_means(clean, labels, num_classes)
  q, _ = class_means(noisy, labels, num_classes)
  present = (counts > 0).astype(clean.dtype)
  total = jnp.sum(present * jnp.sum((p - q) ** 2, axis=-1))
  return total / jnp.maximum(present.sum(), 1.0)


@jax.custom_vjp
def unbiased_std(x):
  """torch.std(x), differentiated as PyTorch does: d std / dx = (x - mean(x)) / ((n - 1) std), 0
  where std = 0 (tests/test_torch_fixtures.py holds us to PyTorch's gradient)."""
  return jnp.std(x, ddof=1)


def _unbiased_std_fwd(x):
  std = jnp.std(x, ddof=1)
  return std, (x, std)


def _unbiased_std_bwd(residuals, g):
  """PyTorch's std backward: g / (2 std), set to 0 where std = 0 (equal losses, e.g. at b = 0; the
  formula would give inf * 0 = NaN there), times d var / dx."""
  x, std = residuals
  n = len(x)
  positive = std > 0
  scale = jnp.where(positive, g / (2.0 * jnp.where(positive, std, 1.0)), 0.0)
  return ((2.0 / (n - 1)) * scale * (x - jnp.mean(x)),)


unbiased_std.defvjp(_unbiased_std_fwd, _unbiased_std_bwd)


def pairwise_distance(x, prototypes, distance):
  """[N, D] x [C, D] -> [N, C] distances: 'squared_euclidean' (the original) or 'euclidean'."""
  sq = jnp.sum(x * x, -1, keepdims=True) - 2.0 * x @ prototypes.T + jnp.sum(prototypes ** 2, -1)
  sq = jnp.maximum(sq, 0.0)
  return jnp.sqrt(sq + 1e-12) if distance == 'euclidean' else sq


def metric_loss(embeddings, labels, stored, distance, num_seen=None, unit_prototypes=False):
  """Eq. 5: softmax over -d(f(x), p_c) for every seen class c, the batch's mean embedding for
  classes in the batch, the stored prototypes for the others; `unit_prototypes`: every prototype at
  unit norm. The mean over the batch, as the authors' code. Rows labelled -1 are ignored; only the
  first `num_seen` rows of `stored` are classes."""
  batch_means, counts = class_means(embeddings, labels, len(stored))  # label -1: a zero one-hot row
  prototypes = jnp.where((counts > 0)[:, None], batch_means, stored)
  if unit_prototypes:
    prototypes = normalize_prototypes(prototypes)
  d = pairwise_distance(embeddings, prototypes, distance)
  logits = -d.astype(jnp.promote_types(d.dtype, jnp.float32))
  if num_seen is not None:
    logits = jnp.where(jnp.arange(len(stored)) < num_seen, logits, -jnp.inf)
  valid = labels >= 0
  per_row = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(valid, labels, 0))
  return jnp.sum(jnp.where(valid, per_row, 0.0)) / jnp.maximum(valid.sum(), 1)


def normalize_prototypes(prototypes):
  """Prototype normalisation (PN): each prototype scaled to unit L2 norm."""
  return prototypes / jnp.maximum(jnp.linalg.norm(prototypes, axis=-1, keepdims=True), 1e-12)


def ncm_predict(embeddings, prototypes, num_classes=None):
  """Nearest class mean: argmin_c ||f(x) - p_c||^2. With `num_classes` (may be traced) only the
  first num_classes rows of `prototypes` are classes; the rest are padding."""
  d = pairwise_distance(embeddings, prototypes, 'squared_euclidean')
  if num_classes is not None:
    d = jnp.where(jnp.arange(len(prototypes)) < num_classes, d, jnp.inf)
  return jnp.argmin(d, axis=-1)
