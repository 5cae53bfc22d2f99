"""What is static about a run (config, data, network, noise set, the loss's frozen view, PRNG keys,
base batches), built once. Keys: fold_in(seed, 0) base training, 1 the init,
fold_in(fold_in(fold_in(seed, 2), run), session) a session's fine-tuning; other methods use the
streams 3 and up."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from f2m_jax import base as base_lib
from f2m_jax import optim
from f2m_jax import trees
from f2m_jax.data import augment as augment_lib
from f2m_jax.data import protocol as protocol_lib
from f2m_jax.data.types import Benchmark
from f2m_jax.models import ResNet, build_model, noise_set_paths, split_block, torch_import


class TrainingError(RuntimeError):
  """Training diverged (NaN or inf loss)."""


class Interrupted(Exception):
  """The user asked the run to stop (SIGINT, SIGTERM); raised at a step or session boundary by the
  run's hook(kind, **info), called after every base step ('base_step', step=n) and every saved
  session ('session', run=r, session=t)."""


@dataclasses.dataclass
class Experiment:
  """Everything static about a run, built once from the config and the data."""
  config: ml_collections.ConfigDict
  bench: Benchmark
  model: ResNet
  noise_paths: tuple
  split: int
  loss: ml_collections.FrozenConfigDict  # every field the loss reads (base.loss_view)
  _epoch: tuple = dataclasses.field(default=(None, None), repr=False)  # (epoch, its indices)

  @classmethod
  def create(cls, config, bench):
    m = config.model
    dtype = getattr(jnp, m.dtype)  # 'float32' or 'bfloat16'
    model = build_model(m.arch, bench.num_base_classes, m.width, dtype, head=m.head,
                        conv_backward=m.conv_backward)
    paths = tuple(noise_set_paths(model, config.noise.num_layers))
    return cls(config, bench, model, paths, split_block(model, paths), base_lib.loss_view(config))

  def network(self, num_classes):
    """The config's network with another classifier size (joint training, cRT)."""
    return self.model.clone(num_classes=num_classes)

  def key(self, *path):
    return functools.reduce(jax.random.fold_in, path, jax.random.key(self.config.seed))

  def optimizer_settings(self):
    """`optim.sgd`'s arguments for the base.* budget, hashable."""
    b = self.config.base
    return (b.lr, b.momentum, b.weight_decay, tuple(b.milestones), b.lr_gamma,
            b.classifier_lr if b.classifier_lr > 0 else None)

  def trainable_paths(self, params):
    if self.config.incremental.trainable == 'noise_set':
      return self.noise_paths
    return tuple(p for p in trees.flatten(params) if p[0] != 'fc')

  def batch_indices(self, step):
    """Indices of base step `step`'s batch: a pure function of (seed, step) for every sampler."""
    b, seed, bench = self.config.base, self.config.seed, self.bench
    labels, base = bench.train.labels, bench.base_train
    if b.sampler == 'task_epochs':
      per_epoch = protocol_lib.task_epoch_batches(bench.num_base_classes, b.shots, b.batch_size)
      epoch, pos = divmod(step, per_epoch)
      if self._epoch[0] != epoch:
        self._epoch = (epoch, protocol_lib.task_epoch(labels, base, b.shots, seed, epoch))
      return self._epoch[1][pos * b.batch_size:(pos + 1) * b.batch_size]
    if b.sampler == 'balanced':
      return protocol_lib.balanced_batch(labels, base, b.ways, b.shots, seed, step)
    return protocol_lib.shuffled_batch(base, b.batch_size, seed, step)

  def train_view(self, indices):
    """Training images as prototypes see them: the test transform (a centre crop where the stored
    images are larger than the network input), no augmentation (Eq. 1)."""
    return augment_lib.eval_view(self.bench.train.images[indices], self.bench.image_size)

  def state_shapes(self, network=None):
    """The train state's shapes and dtypes (jax.ShapeDtypeStruct) for `network` (default: the
    config's), without running the init."""
    return jax.eval_shape(self.init_program(network), self.key(1), None, None)

  def state_template(self, network=None):
    """Host zeros of the train state's shapes for `network` (default: the config's), to restore
    checkpoints into without running (or compiling) the init."""
    return _zeros(self.state_shapes(network))

  def variables_template(self, network=None):
    """`state_template`'s {'params', 'batch_stats'} (no optimizer state), to restore a saved network
    into."""
    shapes = self.state_shapes(network)
    return _zeros({'params': shapes.params, 'batch_stats': shapes.batch_stats})

  def embedding_dim(self):
    """D, the size of the network's embedding (prototypes are [classes, D]): the last stage's
    width."""
    return self.model.widths[-1]

  def init_program(self, network=None):
    """init(key, params, batch_stats) -> a fresh train state of `network` (default: the config's)
    with the base optimizer (`base_lib.init_state`) as one jitted program."""
    return _init_program(network or self.model, self.bench.image_size, self.optimizer_settings())

  def init_state(self, network=None, key=None):
    """A fresh train state of `network` (default: the config's) from `key` (default: the init's
    stream), with model.pretrained's trunk where set; a classifier of another size than the file's
    stays `key`'s init."""
    key = self.key(1) if key is None else key
    network = network or self.model
    params = batch_stats = None
    if self.config.model.pretrained:
      params, batch_stats = torch_import.load_torchvision_resnet18(
          self.config.model.pretrained, network, self.bench.image_size, key=key)
    return self.init_program(network)(key, params, batch_stats)


@functools.cache
def _init_program(network, image_size, sgd_settings):
  """`Experiment.init_program`, one per (network, image size, optimizer), so that a sweep's runs
  compile it once."""
  tx = optim.sgd(*sgd_settings)
  return jax.jit(lambda key, params, batch_stats: base_lib.init_state(network, key, image_size, tx,
                                                                      params, batch_stats))


def _zeros(shapes):
  """Host zeros of a tree of jax.ShapeDtypeStruct."""
  return jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes)
