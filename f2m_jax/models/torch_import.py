"""torchvision ResNet-18 weights (a `.pth` state dict) -> our Flax ResNet-18 params and batch
stats, by name (ours follow torchvision). The classifier converts only when its shape matches;
any other missing, unexpected or mis-shaped entry is an error. Reading a `.pth` needs PyTorch."""
import os
import re
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from f2m_jax import trees

TORCHVISION_URL = 'https://download.pytorch.org/models/resnet18-f37072fd.pth'  # IMAGENET1K_V1


class WeightsError(ValueError):
  """Pretrained weights missing, unreadable or not matching the model; the message says what to
  do."""


def torch_name(collection, path):
  """The torchvision state-dict key of our leaf `path` in `collection` ('params' or
  'batch_stats')."""
  *module, leaf = path
  name = re.sub(r'layer(\d+)_(\d+)', r'layer\1.\2', '.'.join(module))
  name = name.replace('downsample_conv', 'downsample.0').replace('downsample_bn', 'downsample.1')
  if collection == 'batch_stats':
    leaf = 'running_' + leaf
  else:
    leaf = {'kernel': 'weight', 'scale': 'weight'}.get(leaf, leaf)
  return f'{name}.{leaf}'


def _transposed(path, value, to_torch=False):
  """A conv kernel OIHW <-> HWIO, a classifier [out, in] <-> [in, out]; any other leaf as it is."""
  if path[-1] != 'kernel':
    return value
  if value.ndim == 2:
    return value.T
  return np.transpose(value, (3, 2, 0, 1) if to_torch else (2, 3, 1, 0))


def _to_flax(path, value):
  if hasattr(value, 'detach'):  # a torch tensor
    value = value.detach().cpu().float().numpy()
  return _transposed(path, np.asarray(value, np.float32))


def clean_state_dict(state_dict):
  """Unwraps {'state_dict': ...} / {'model': ...} checkpoints, strips a DataParallel 'module.' and
  drops BN's num_batches_tracked."""
  for key in ('state_dict', 'model'):
    if key in state_dict and isinstance(state_dict[key], Mapping):
      state_dict = state_dict[key]
  return {k.removeprefix('module.'): v for k, v in state_dict.items()
          if not k.endswith('num_batches_tracked')}


def convert_state_dict(state_dict, params_template, batch_stats_template):
  """(params, batch_stats) with every leaf of the templates taken from `state_dict` (torchvision
  names), except `fc` when its shape differs; a WeightsError for a missing, unknown or
  mis-shaped key."""
  sd = clean_state_dict(state_dict)
  wrong = {'missing': [], 'of another shape': []}
  result = {}
  for collection, template in (('params', params_template), ('batch_stats', batch_stats_template)):
    flat = trees.flatten(template)
    for path, leaf in flat.items():
      name = torch_name(collection, path)
      raw = sd.pop(name, None)
      value = None if raw is None else _to_flax(path, raw)
      if value is not None and value.shape == np.shape(leaf):
        flat[path] = jnp.asarray(value)
      elif path[0] == 'fc':  # a classifier of another size (or none): ours stays
        continue
      elif value is None:
        wrong['missing'].append(name)
      else:
        wrong['of another shape'].append(f'{name}: {tuple(np.shape(raw))} in the file, '
                                         f'{np.shape(leaf)} expected here (as {"/".join(path)})')
    result[collection] = trees.unflatten(flat)
  wrong['unexpected'] = sorted(sd)
  problems = [f'{len(names)} {what}: {"; ".join(names[:8])}{" ..." if len(names) > 8 else ""}'
              for what, names in wrong.items() if names]
  if problems:
    raise WeightsError('the state dict does not match this ResNet (is it a torchvision resnet18 of '
                       'the same width?): ' + ' | '.join(problems))
  return result['params'], result['batch_stats']


def read_state_dict(pth_path):
  """The state dict in a `.pth` file, read on the CPU with PyTorch (imported here, optional)."""
  path = os.path.expanduser(os.path.expandvars(str(pth_path)))
  if not os.path.isfile(path):
    expanded = f' (expanded: {path})' if path != str(pth_path) else ''
    raise WeightsError(
        f'pretrained weights {pth_path!r} not found{expanded}. '
        f'Download torchvision\'s ImageNet ResNet-18 ({TORCHVISION_URL}) and point '
        '--config.model.pretrained (or F2M_CUB_PRETRAINED for configs/cub200.py) at it; '
        "--config.model.pretrained='' trains from a random init instead.")
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise WeightsError(f'reading {path} needs PyTorch, an optional extra of f2m_jax: pip install '
                       'torch (the CPU build is enough)') from e
  try:
    state = torch.load(path, map_location='cpu', weights_only=True)
  except Exception as e:  # pickle/zip errors of many types
    raise WeightsError(f'could not read {path} as a PyTorch state dict: {type(e).__name__}: '
                       f'{e}') from e
  if not isinstance(state, Mapping):
    raise WeightsError(f'{path} holds a {type(state).__name__}, not a state dict')
  return dict(state)


def load_torchvision_resnet18(pth_path, model, image_size, key=None):
  """(params, batch_stats) for `model` (our `resnet18`) from a torchvision ResNet-18 `.pth` file;
  `key` inits the templates (and the classifier where the file's has another size)."""
  state_dict = read_state_dict(pth_path)
  key = jax.random.key(0) if key is None else key
  images = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
  variables = jax.jit(lambda k: model.init(k, images, train=False))(key)
  return convert_state_dict(state_dict, variables['params'], variables['batch_stats'])


def to_state_dict(params, batch_stats):
  """The inverse mapping: numpy arrays under torchvision names (for tests and export)."""
  return {torch_name(collection, path):
          _transposed(path, np.asarray(leaf, np.float32), to_torch=True)
          for collection, tree in (('params', params), ('batch_stats', batch_stats))
          for path, leaf in trees.flatten(tree).items()}
